// Package rpc is a sluice node's gRPC face: the public RateLimitService
// (Check, Members), the PeerService that nodes forward checks over, and the
// routing of each check to the owner of its key on the ring.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// DefaultForwardTimeout bounds one forward to a peer when
// ServerConfig.ForwardTimeout is 0.
const DefaultForwardTimeout = 2 * time.Second

// ServerConfig configures a Server.
type ServerConfig struct {
	// Name is this node's member name; a check whose key the ring gives to
	// Name is decided here and never forwarded. (Required)
	Name string
	// Store holds the windows of the keys this node owns. (Required)
	Store *window.Store
	// Ring shapes the ring; every node must use the same. (Optional)
	Ring ring.Config
	// ForwardTimeout bounds one forward to a peer. Default 2 s. (Optional)
	ForwardTimeout time.Duration
	// Logger for routing events. Default slog.Default(). (Optional)
	Logger *slog.Logger
	// DialOptions are added to the options of peer connections (e.g.
	// transport credentials); default plaintext. (Optional)
	DialOptions []grpc.DialOption
	// Batch shapes the per-owner queues of forwarded checks. (Optional)
	Batch BatchConfig
	// Limits holds the named limits that checks without numbers take
	// theirs from; nil: none. (Optional)
	Limits *limits.Source
	// Observer is told of every answered check and every peer call, for
	// metrics; nil: nobody. (Optional)
	Observer Observer
}

// Server implements sluicev1.RateLimitServiceServer and
// sluicev1.PeerServiceServer for one node. It is safe for concurrent use.
// Create it with [NewServer], then call [Server.SetMembers] on every
// membership change.
type Server struct {
	sluicev1.UnimplementedRateLimitServiceServer
	sluicev1.UnimplementedPeerServiceServer

	name           string
	store          *window.Store
	ringCfg        ring.Config
	forwardTimeout time.Duration
	log            *slog.Logger
	dialOpts       []grpc.DialOption
	batch          BatchConfig
	limits         *limits.Source
	obs            Observer

	view       atomic.Pointer[view]
	setMu      sync.Mutex   // serializes SetMembers
	ringBuilds atomic.Int64 // rings built (the first, and one per SetMembers that changed it)

	stats     counters
	peerStats sync.Map // member name -> *peerStats

	draining  chan struct{} // closed by Drain
	drainOnce sync.Once

	retiredMu sync.Mutex
	retired   map[*peer]*time.Timer // peers left the ring, connection closing after a grace; nil once closed
}

// view is what routing needs, swapped whole on each membership change.
type view struct {
	ring    *ring.Ring
	members []cluster.Member // sorted by name
	peers   map[string]*peer // by member name, this node excluded
}

// peer is a connection to another member's PeerService and the queue of
// checks bound for it.
type peer struct {
	name, addr string
	conn       *grpc.ClientConn
	client     sluicev1.PeerServiceClient
	batcher    *batcher
	stats      *peerStats
	stream     *peerStream // forwards go over it; nil (tests' fakes): unary Forward calls
}

// retire stops the peer's queue (failing what is queued) and closes its
// connection after grace, so that calls in flight can finish; Server.Close
// closes it at once.
func (s *Server) retire(p *peer, grace time.Duration) {
	p.batcher.close()
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	if s.retired == nil { // the server is closed
		_ = p.conn.Close()
		return
	}
	s.retired[p] = time.AfterFunc(grace, func() {
		s.retiredMu.Lock()
		delete(s.retired, p)
		s.retiredMu.Unlock()
		_ = p.conn.Close()
	})
}

// counters count routing events; read them with Server.Stats.
type counters struct {
	localChecks, forwardedChecks, noConnection, receivedRPCs, receivedChecks atomic.Int64
}

// PeerStats counts the Forward calls made to one peer.
type PeerStats struct {
	// Batches is the number of Forward calls; Checks the checks they carried
	// (Checks/Batches is the mean batch size).
	Batches, Checks int64
	// Errors is the number of calls that failed.
	Errors int64
	// Latency is the total time spent in those calls.
	Latency time.Duration
}

// Stats is a snapshot of a Server's routing counters.
type Stats struct {
	// LocalChecks: checks this node decided as owner, entered here.
	LocalChecks int64
	// ForwardedChecks: checks sent to their owner on another node.
	ForwardedChecks int64
	// ForwardRPCs: Forward calls made to peers (all peers' Batches).
	ForwardRPCs int64
	// ForwardErrors: Forward calls that failed, and checks whose owner had
	// no connection.
	ForwardErrors int64
	// ReceivedRPCs: Forward calls received from peers.
	ReceivedRPCs int64
	// ReceivedChecks: checks received in those calls.
	ReceivedChecks int64
	// Peers: Forward calls per peer, by member name.
	Peers map[string]PeerStats
}

// Stats returns the routing counters.
func (s *Server) Stats() Stats {
	st := Stats{
		LocalChecks:     s.stats.localChecks.Load(),
		ForwardedChecks: s.stats.forwardedChecks.Load(),
		ForwardErrors:   s.stats.noConnection.Load(),
		ReceivedRPCs:    s.stats.receivedRPCs.Load(),
		ReceivedChecks:  s.stats.receivedChecks.Load(),
		Peers:           s.peerStatsSnapshot(),
	}
	for _, p := range st.Peers {
		st.ForwardRPCs += p.Batches
		st.ForwardErrors += p.Errors
	}
	return st
}

func (s *Server) peerStatsSnapshot() map[string]PeerStats {
	out := map[string]PeerStats{}
	s.peerStats.Range(func(k, v any) bool {
		ps := v.(*peerStats)
		out[k.(string)] = PeerStats{Batches: ps.batches.Load(), Checks: ps.checks.Load(),
			Errors: ps.errors.Load(), Latency: time.Duration(ps.latencyNs.Load())}
		return true
	})
	return out
}

// statsFor returns the counters of the named peer.
func (s *Server) statsFor(name string) *peerStats {
	v, _ := s.peerStats.LoadOrStore(name, &peerStats{obs: s.obs})
	return v.(*peerStats)
}

// NewServer returns a Server whose ring holds only itself. It returns an
// error when Name or Store is missing or the ring config is invalid.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Name == "" {
		return nil, errors.New("rpc: name is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("rpc: store is required")
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = DefaultForwardTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		name:           cfg.Name,
		store:          cfg.Store,
		ringCfg:        cfg.Ring,
		forwardTimeout: cfg.ForwardTimeout,
		log:            cfg.Logger,
		batch:          cfg.Batch.withDefaults(),
		limits:         cfg.Limits,
		obs:            cfg.Observer,
		retired:        map[*peer]*time.Timer{},
		draining:       make(chan struct{}),
		dialOpts:       append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...),
	}
	r, err := ring.New([]string{cfg.Name}, cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	s.view.Store(&view{ring: r, members: []cluster.Member{{Name: cfg.Name, State: cluster.Alive}}})
	s.ringBuilds.Add(1)
	return s, nil
}

// SetMembers rebuilds the ring and the peer connections from the full
// member list and swaps them in; lookups never wait for it. This node is
// always a member, listed or not. Connections to members that are gone or
// moved are closed after the forward timeout, so calls in flight finish.
// When the ring cannot be built (e.g. more members than partitions) it
// keeps the old view and returns the error.
func (s *Server) SetMembers(members []cluster.Member) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	old := s.view.Load()
	ms := slices.Clone(members)
	if !slices.ContainsFunc(ms, func(m cluster.Member) bool { return m.Name == s.name }) {
		ms = append(ms, cluster.Member{Name: s.name, State: cluster.Alive})
	}
	slices.SortFunc(ms, func(a, b cluster.Member) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	r, err := ring.New(names, s.ringCfg)
	if err != nil {
		s.log.Error("cannot build ring; keeping the old one", "members", len(names), "error", err)
		return fmt.Errorf("rpc: %w", err)
	}
	peers := make(map[string]*peer, len(ms))
	for _, m := range ms {
		if m.Name == s.name {
			continue
		}
		if p, ok := old.peers[m.Name]; ok && p.addr == m.GRPCAddr {
			peers[m.Name] = p
			continue
		}
		conn, err := grpc.NewClient(m.GRPCAddr, s.dialOpts...)
		if err != nil {
			s.log.Error("cannot connect to peer; leaving it out of the peer set", "peer", m.Name, "addr", m.GRPCAddr, "error", err)
			continue
		}
		p := &peer{name: m.Name, addr: m.GRPCAddr, conn: conn, client: sluicev1.NewPeerServiceClient(conn), stats: s.statsFor(m.Name)}
		p.stream = &peerStream{client: p.client}
		p.batcher = newBatcher(p, s.batch, s.forwardTimeout, s.name, p.stats)
		peers[m.Name] = p
	}
	s.view.Store(&view{ring: r, members: ms, peers: peers})
	s.ringBuilds.Add(1)
	for name, p := range old.peers {
		if peers[name] != p {
			go s.retire(p, s.forwardTimeout) // off the membership path
		}
	}
	if r.Fingerprint() != old.ring.Fingerprint() {
		s.log.Info("ring rebuilt", "members", len(ms), "fingerprint", r.Fingerprint())
	}
	return nil
}

// Drain ends the peer streams this server answers, so that a graceful stop
// of the gRPC server does not wait for peers to hang up. It is idempotent.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Close closes every peer connection. The Server must not be used after.
func (s *Server) Close() {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	v := s.view.Load()
	s.view.Store(&view{ring: v.ring, members: v.members})
	for _, p := range v.peers {
		p.batcher.close()
		if p.stream != nil {
			p.stream.close()
		}
		_ = p.conn.Close()
	}
	s.retiredMu.Lock()
	for p, t := range s.retired {
		t.Stop()
		_ = p.conn.Close()
	}
	s.retired = nil
	s.retiredMu.Unlock()
}

// Owner returns the name of the member that owns (name, key) under this
// node's current ring.
func (s *Server) Owner(name, key string) string {
	return s.view.Load().ring.Owner(ring.Key(nil, name, key))
}

// RingFingerprint returns the fingerprint of this node's current ring.
func (s *Server) RingFingerprint() string { return s.view.Load().ring.Fingerprint() }

// Check implements RateLimitService.Check: it validates the batch, decides
// the checks this node owns, forwards the others to their owners (owners
// in parallel; see forward) and answers in request order.
func (s *Server) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	reqs, fe := parseChecks(req.GetChecks(), s.limits.Current(), false)
	if fe != nil {
		if s.obs != nil {
			for range min(len(req.GetChecks()), MaxBatch) {
				s.obs.Checked(InlineName, OutcomeInvalid)
			}
		}
		return nil, invalidArgument(fe)
	}
	out := make([]*sluicev1.Decision, len(reqs))
	pending := make([]int, len(reqs))
	for i := range pending {
		pending[i] = i
	}
	// A failed forward is retried once if the ring changed meanwhile: the
	// key may have moved, possibly to this node.
	for attempt := 0; len(pending) > 0; attempt++ {
		v := s.view.Load()
		failed := s.route(ctx, v, reqs, pending, out)
		if len(failed) == 0 || attempt == 1 || s.view.Load() == v {
			for _, f := range failed {
				out[f.index] = &sluicev1.Decision{Limit: reqs[f.index].check.Limit, Owner: f.owner, Error: f.err}
			}
			break
		}
		pending = pending[:0]
		for _, f := range failed {
			pending = append(pending, f.index)
		}
	}
	for i, d := range out {
		r := &reqs[i]
		outcome := OutcomeAllowed
		switch {
		case d.Error != "":
			outcome = OutcomeError
		case !d.Allowed && r.shadow:
			// Shadow mode: report the would-be denial, deny nothing.
			d.Allowed, d.Shadow, d.RetryAfter = true, true, 0
			outcome = OutcomeShadowDenied
		case !d.Allowed:
			outcome = OutcomeDenied
		}
		if s.obs != nil {
			name := InlineName
			if r.named {
				name = r.name
			}
			s.obs.Checked(name, outcome)
		}
	}
	return &sluicev1.CheckResponse{Decisions: out}, nil
}

// failure is a check whose owner could not be reached.
type failure struct {
	index      int
	owner, err string
}

// route decides or forwards the checks reqs[i] for i in idx under view v,
// writing decisions into out, and returns the checks it could not get
// decided.
func (s *Server) route(ctx context.Context, v *view, reqs []request, idx []int, out []*sluicev1.Decision) []failure {
	var (
		remote map[string][]int
		buf    []byte
	)
	for _, i := range idx {
		r := reqs[i]
		buf = ring.Key(buf[:0], r.name, r.key)
		owner := v.ring.Owner(buf)
		if owner == s.name {
			out[i] = s.decide(buf, r.check)
			s.stats.localChecks.Add(1)
			continue
		}
		if remote == nil {
			remote = make(map[string][]int)
		}
		remote[owner] = append(remote[owner], i)
	}
	if len(remote) == 0 {
		return nil
	}
	if len(remote) == 1 { // the common case: no goroutine needed
		for owner, is := range remote {
			return s.forward(ctx, v.peers[owner], owner, reqs, is, out)
		}
	}
	var (
		mu     sync.Mutex
		failed []failure
		wg     sync.WaitGroup
	)
	for owner, is := range remote {
		wg.Go(func() {
			if fs := s.forward(ctx, v.peers[owner], owner, reqs, is, out); len(fs) > 0 {
				mu.Lock()
				failed = append(failed, fs...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// forward gets the checks reqs[i], i in is, decided by their owner p and
// writes the decisions into out; it returns the checks that could not be
// decided, each with its error. A lone check goes through the owner's
// batcher; several checks of one request (or any marked no_batching) go
// together in one call of their own, so the owner applies them in request
// order. Either way nothing waits longer than the forward timeout (plus
// the batch wait).
func (s *Server) forward(ctx context.Context, p *peer, owner string, reqs []request, is []int, out []*sluicev1.Decision) []failure {
	fail := func(err error) []failure {
		fs := make([]failure, len(is))
		for j, i := range is {
			fs[j] = failure{index: i, owner: owner, err: err.Error()}
		}
		return fs
	}
	if p == nil {
		s.stats.noConnection.Add(1)
		return fail(fmt.Errorf("owner %s: no connection to it", owner))
	}
	s.stats.forwardedChecks.Add(int64(len(is)))
	if len(is) == 1 && !reqs[is[0]].pb.NoBatching {
		q, err := p.batcher.enqueue(ctx, reqs[is[0]].pb)
		if err != nil {
			return fail(fmt.Errorf("owner %s: %w", owner, err))
		}
		// The batcher answers by the check's deadline; the timer only
		// guards against a reply that can no longer come (a batcher
		// stopped just as the check went in).
		t := time.NewTimer(time.Until(q.deadline) + s.batch.MaxWait + 100*time.Millisecond)
		defer t.Stop()
		select {
		case r := <-q.reply:
			if r.err != nil {
				return fail(r.err)
			}
			out[is[0]] = r.d
			return nil
		case <-t.C:
			return fail(fmt.Errorf("owner %s: no answer within the forward timeout", owner))
		case <-ctx.Done():
			return fail(fmt.Errorf("owner %s: %w", owner, ctx.Err()))
		}
	}
	req := &sluicev1.ForwardRequest{Sender: s.name, Checks: make([]*sluicev1.RateLimitCheck, len(is))}
	for j, i := range is {
		req.Checks[j] = reqs[i].pb
	}
	cctx, cancel := context.WithTimeout(ctx, s.forwardTimeout)
	defer cancel()
	ds, err := forwardCall(cctx, p, req, p.stats)
	if err != nil {
		return fail(err)
	}
	for j, i := range is {
		out[i] = ds[j]
	}
	return nil
}

// decide applies one validated check to this node's store at the store's
// clock.
func (s *Server) decide(storeKey []byte, c window.Check) *sluicev1.Decision {
	d, err := s.store.ApplyBytes(storeKey, c, s.store.Now())
	if err != nil { // cannot happen: checks are validated on entry
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: err.Error()}
	}
	return toProto(d, s.name)
}

// Forward implements PeerService.Forward. It is terminal: it decides every
// check here, whatever this node's ring says, so a check is never forwarded
// in a loop. A peer's input is validated like a client's.
func (s *Server) Forward(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	reqs, fe := parseChecks(req.GetChecks(), s.limits.Current(), true) // the sender filled in named limits' numbers
	if fe != nil {
		return nil, invalidArgument(fe)
	}
	s.stats.receivedRPCs.Add(1)
	s.stats.receivedChecks.Add(int64(len(reqs)))
	out := make([]*sluicev1.Decision, len(reqs))
	var buf []byte
	for i, r := range reqs {
		buf = ring.Key(buf[:0], r.name, r.key)
		out[i] = s.decide(buf, r.check)
	}
	return &sluicev1.ForwardResponse{Decisions: out}, nil
}

// Members implements RateLimitService.Members.
func (s *Server) Members(ctx context.Context, _ *sluicev1.MembersRequest) (*sluicev1.MembersResponse, error) {
	v := s.view.Load()
	shares := v.ring.Shares()
	resp := &sluicev1.MembersResponse{
		Self:            s.name,
		RingFingerprint: v.ring.Fingerprint(),
		PartitionCount:  int32(v.ring.Config().PartitionCount),
	}
	for _, m := range v.members {
		resp.Members = append(resp.Members, &sluicev1.Member{
			Name: m.Name, GrpcAddr: m.GRPCAddr, GossipAddr: m.GossipAddr, Region: m.Region,
			State: string(m.State), RingShare: shares[m.Name], Version: m.Version,
		})
	}
	return resp, nil
}

var (
	_ sluicev1.RateLimitServiceServer = (*Server)(nil)
	_ sluicev1.PeerServiceServer      = (*Server)(nil)
)
