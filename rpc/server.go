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

	view  atomic.Pointer[view]
	setMu sync.Mutex // serializes SetMembers

	stats counters
}

// view is what routing needs, swapped whole on each membership change.
type view struct {
	ring    *ring.Ring
	members []cluster.Member // sorted by name
	peers   map[string]*peer // by member name, this node excluded
}

// peer is a connection to another member's PeerService.
type peer struct {
	name, addr string
	conn       *grpc.ClientConn
	client     sluicev1.PeerServiceClient
}

// counters count routing events; read them with Server.Stats.
type counters struct {
	localChecks, forwardedChecks, forwardRPCs, forwardErrors, receivedRPCs, receivedChecks atomic.Int64
}

// Stats is a snapshot of a Server's routing counters.
type Stats struct {
	// LocalChecks: checks this node decided as owner, entered here.
	LocalChecks int64
	// ForwardedChecks: checks sent to their owner on another node.
	ForwardedChecks int64
	// ForwardRPCs: Forward calls made to peers.
	ForwardRPCs int64
	// ForwardErrors: Forward calls that failed.
	ForwardErrors int64
	// ReceivedRPCs: Forward calls received from peers.
	ReceivedRPCs int64
	// ReceivedChecks: checks received in those calls.
	ReceivedChecks int64
}

// Stats returns the routing counters.
func (s *Server) Stats() Stats {
	return Stats{
		LocalChecks:     s.stats.localChecks.Load(),
		ForwardedChecks: s.stats.forwardedChecks.Load(),
		ForwardRPCs:     s.stats.forwardRPCs.Load(),
		ForwardErrors:   s.stats.forwardErrors.Load(),
		ReceivedRPCs:    s.stats.receivedRPCs.Load(),
		ReceivedChecks:  s.stats.receivedChecks.Load(),
	}
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
		dialOpts:       append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...),
	}
	r, err := ring.New([]string{cfg.Name}, cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	s.view.Store(&view{ring: r, members: []cluster.Member{{Name: cfg.Name, State: cluster.Alive}}})
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
		peers[m.Name] = &peer{name: m.Name, addr: m.GRPCAddr, conn: conn, client: sluicev1.NewPeerServiceClient(conn)}
	}
	s.view.Store(&view{ring: r, members: ms, peers: peers})
	for name, p := range old.peers {
		if peers[name] != p {
			time.AfterFunc(s.forwardTimeout, func() { _ = p.conn.Close() })
		}
	}
	if r.Fingerprint() != old.ring.Fingerprint() {
		s.log.Info("ring rebuilt", "members", len(ms), "fingerprint", r.Fingerprint())
	}
	return nil
}

// Close closes every peer connection. The Server must not be used after.
func (s *Server) Close() {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	v := s.view.Load()
	for _, p := range v.peers {
		_ = p.conn.Close()
	}
	s.view.Store(&view{ring: v.ring, members: v.members})
}

// Owner returns the name of the member that owns (name, key) under this
// node's current ring.
func (s *Server) Owner(name, key string) string {
	return s.view.Load().ring.Owner(ring.Key(nil, name, key))
}

// RingFingerprint returns the fingerprint of this node's current ring.
func (s *Server) RingFingerprint() string { return s.view.Load().ring.Fingerprint() }

// Check implements RateLimitService.Check: it validates the batch, decides
// the checks this node owns, forwards the others to their owners (one
// Forward call per owner, in parallel) and answers in request order.
func (s *Server) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	reqs, fe := parseChecks(req.GetChecks())
	if fe != nil {
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
	var (
		mu     sync.Mutex
		failed []failure
		wg     sync.WaitGroup
	)
	for owner, is := range remote {
		wg.Go(func() {
			err := s.forward(ctx, v.peers[owner], owner, reqs, is, out)
			if err != nil {
				mu.Lock()
				for _, i := range is {
					failed = append(failed, failure{index: i, owner: owner, err: err.Error()})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// forward sends reqs[i] for i in is to the owner in one Forward call and
// writes the decisions into out.
func (s *Server) forward(ctx context.Context, p *peer, owner string, reqs []request, is []int, out []*sluicev1.Decision) error {
	if p == nil {
		s.stats.forwardErrors.Add(1)
		return fmt.Errorf("owner %s: no connection to it", owner)
	}
	fr := &sluicev1.ForwardRequest{Sender: s.name, Checks: make([]*sluicev1.RateLimitCheck, len(is))}
	for j, i := range is {
		r := reqs[i]
		fr.Checks[j] = &sluicev1.RateLimitCheck{
			Name: r.name, Key: r.key, Hits: r.check.Hits, Limit: r.check.Limit,
			WindowMs: int64(r.check.Window / time.Millisecond), Burst: r.check.Burst,
			Algorithm: sluicev1.Algorithm(r.check.Algorithm),
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.forwardTimeout)
	defer cancel()
	s.stats.forwardRPCs.Add(1)
	s.stats.forwardedChecks.Add(int64(len(is)))
	resp, err := p.client.Forward(ctx, fr)
	if err != nil {
		s.stats.forwardErrors.Add(1)
		return fmt.Errorf("owner %s (%s) unavailable: %w", owner, p.addr, err)
	}
	if len(resp.Decisions) != len(is) {
		s.stats.forwardErrors.Add(1)
		return fmt.Errorf("owner %s answered %d decisions for %d checks", owner, len(resp.Decisions), len(is))
	}
	for j, i := range is {
		out[i] = resp.Decisions[j]
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
	reqs, fe := parseChecks(req.GetChecks())
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
