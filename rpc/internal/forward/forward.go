// Package forward carries checks from this node to the owners of their
// keys on other members: one [Peer] per member, holding its gRPC
// connection, the batcher that gathers the checks bound for it, the
// stream they go over, and its counters; and [Retired], the peers that
// left the ring, closed after a grace.
//
// Every forward goes through [Peer.Forward], whatever it is (checks
// batched with other requests' checks, a no_batching request, a check
// re-forwarded by an owner whose ring names another, checks sent to an
// unreachable owner's stand-in): what a forward carries (this node's
// name, its ring fingerprint and epoch as the request is sent, the
// deadline the receiver applies by and the time of sending, the
// reforwarded and stand_in flags) is written by one function, request,
// and what it counts (per-peer [Stats], the [Observer], errors that name
// the owner and the gRPC code only) by one, endCall.
//
// It imports nothing of rpc: rpc's Server uses it through [Dial],
// [Peer.Forward], [Peer.Close], [Retired] and [Stats].
package forward

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Observer is told of every Forward call made to a peer, for metrics
// (rpc.Observer has this method). It is called on the request path: it
// must be cheap, never block, and be safe for concurrent use.
type Observer interface {
	// Forwarded is called once for every call that carried forwarded
	// checks to peer (a member name): how many checks, how long the call
	// took, and its error (nil on success).
	Forwarded(peer string, checks int, took time.Duration, err error)
}

// Config is what a Peer needs besides its member's name and address. A
// node gives all its peers the same, but for DialOptions (credentials may
// differ by member).
type Config struct {
	// Sender is this node's member name, sent with every request.
	// (Required)
	Sender string
	// Timeout bounds every forward: no check waits for its owner longer
	// (plus the batch wait). It must be positive. (Required)
	Timeout time.Duration
	// Batch shapes the peer's queue of batched checks; the defaults fill
	// in what is zero (see BatchConfig.WithDefaults). (Optional)
	Batch BatchConfig
	// View returns this node's ring fingerprint and epoch now; every
	// request carries them as it is sent, so that its receiver can count
	// a sender whose ring differs from its own. It is called on the
	// request path and must be cheap. nil: requests carry none.
	// (Optional)
	View func() (fingerprint string, epoch uint64)
	// Stats counts the peer's calls under its member name; nil: counted
	// where nobody reads them. (Optional)
	Stats *Stats
	// DialOptions are the options of the peer's connection (transport
	// credentials among them). (Optional)
	DialOptions []grpc.DialOption
}

// Peer is this node's connection to another member's PeerService: the
// client of that connection (hand-offs, pulls and replication use it as
// well), the queue of checks bound for the member, the stream they go
// over, and the member's counters. It is safe for concurrent use. Make it
// with [Dial]; end it with [Peer.Close] or [Retired.Retire].
type Peer struct {
	name, addr string
	sender     string
	timeout    time.Duration
	batchWait  time.Duration
	view       func() (string, uint64)
	conn       *grpc.ClientConn
	client     sluicev1.PeerServiceClient
	tr         transport // Forward calls over the peer's stream
	batcher    *batcher
	stats      *peerStats
}

// transport carries a peer's Forward calls over its stream: [peerStream],
// or a fake in tests.
type transport interface {
	// start sends req and returns once it is sent (or failed); done is
	// called exactly once with the response or an error, by deadline.
	start(deadline time.Time, req *sluicev1.ForwardRequest, done func(*sluicev1.ForwardResponse, error))
	// call sends req and waits for its response until ctx ends.
	call(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error)
	// close fails what waits and refuses what comes after.
	close()
}

// Dial returns the Peer of the member name whose PeerService listens at
// addr, over a connection made by grpc.NewClient(addr,
// cfg.DialOptions...): it connects on first use, and reconnects by itself.
// Its batcher starts a goroutine that [Peer.Close] or [Retired.Retire]
// stops. It returns grpc.NewClient's error (e.g. a malformed address).
func Dial(name, addr string, cfg Config) (*Peer, error) {
	conn, err := grpc.NewClient(addr, cfg.DialOptions...)
	if err != nil {
		return nil, err
	}
	client := sluicev1.NewPeerServiceClient(conn)
	return newPeer(name, addr, cfg, conn, client, &peerStream{client: client}), nil
}

// newPeer returns the Peer of name at addr over conn, whose PeerService client is client and whose Forward calls go
// over tr: Dial gives it the stream of client, tests a fake.
func newPeer(name, addr string, cfg Config, conn *grpc.ClientConn, client sluicev1.PeerServiceClient, tr transport) *Peer {
	batch := cfg.Batch.WithDefaults()
	p := &Peer{
		name: name, addr: addr, sender: cfg.Sender, timeout: cfg.Timeout, batchWait: batch.MaxWait, view: cfg.View,
		conn: conn, client: client, tr: tr,
	}
	if cfg.Stats != nil {
		p.stats = cfg.Stats.of(name)
	} else {
		p.stats = &peerStats{}
	}
	p.batcher = newBatcher(p, batch, cfg.Timeout)
	return p
}

// Name returns the peer's member name.
func (p *Peer) Name() string { return p.name }

// Addr returns the address the peer was dialed at.
func (p *Peer) Addr() string { return p.addr }

// Client returns the PeerService client of the peer's connection, for
// the calls that are not forwards (hand-offs, pulls, replication).
func (p *Peer) Client() sluicev1.PeerServiceClient { return p.client }

// Request is one forward: checks of one request for one owner, and how
// they are to go.
type Request struct {
	// Checks go in this order, together in one call, and are answered in
	// it. The peer keeps them (a batch may go after Forward returned on
	// ctx's end): the caller must not change them. (Required)
	Checks []*sluicev1.RateLimitCheck
	// By is the latest the sender waits for the answer (zero: no bound
	// but the forward timeout, which bounds every forward). The receiver
	// is asked to apply the checks by a quarter of the time left earlier
	// (see applyBy). (Optional)
	By time.Time
	// NoBatching sends the checks at once, in a call of their own over
	// the peer's stream, instead of through its batcher. (Optional)
	NoBatching bool
	// Reforwarded marks checks this node received as owner and sends on
	// to the owner under its own ring: the receiver decides them
	// whatever its ring says. (Optional)
	Reforwarded bool
	// StandIn marks checks sent to the stand-in holder of their
	// unreachable owner, UnreachableOwner (a member name). (Optional)
	StandIn          bool
	UnreachableOwner string
	// Trace is the trace context of the sender's span for these checks,
	// carried to the receiver with them (in a batch, one run per
	// request: ForwardRequest.traces); its checks field is set here. nil:
	// untraced, and nothing is carried. (Optional)
	Trace *sluicev1.TraceContext
}

// Forward sends r's checks to the peer and returns its decisions, one per
// check in order, or an error; it returns by r.By or the forward timeout,
// whichever comes first (a batched check may wait MaxWait more), or when
// ctx ends.
//
// Checks go through the peer's batcher, with other requests' checks, over
// its stream; with NoBatching, at once in a call of their own over the
// stream. Reforwarded and stand-in checks go at once in a unary call of
// their own, off the stream: a node sends them while it decides a request
// that came on its own stream from a peer (the stream's receiver decides
// one request at a time), so two nodes that send each other such checks
// on their streams would each wait behind the request the other is
// deciding until the deadline. Batching them would add that wait too.
//
// Every call is counted in the peer's Stats and told to the Observer. The
// error names the owner, and the gRPC code only of a failed call (its
// message may name internal addresses): "owner NAME unavailable: CODE", or
// "owner NAME answered N decisions for M checks", or, of a batched
// forward, "owner NAME: " and the peer removed from the ring (Close or
// Retire), a deadline passed in the queue, no answer in time, or ctx's
// error.
func (p *Peer) Forward(ctx context.Context, r Request) ([]*sluicev1.Decision, error) {
	deadline := time.Now().Add(p.timeout)
	if !r.By.IsZero() && r.By.Before(deadline) {
		deadline = r.By
	}
	if !r.NoBatching && !r.Reforwarded && !r.StandIn {
		return p.batched(ctx, deadline, r.Checks, r.Trace)
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	req := p.request(&r, r.Checks, deadline)
	start := time.Now()
	var (
		resp *sluicev1.ForwardResponse
		err  error
	)
	if r.Reforwarded || r.StandIn {
		resp, err = p.client.Forward(cctx, req)
	} else {
		resp, err = p.tr.call(cctx, req)
	}
	return p.endCall(req, resp, err, time.Since(start))
}

// batched queues checks in the peer's batcher, bounded by deadline, and
// waits for their decisions.
func (p *Peer) batched(ctx context.Context, deadline time.Time, checks []*sluicev1.RateLimitCheck, trace *sluicev1.TraceContext) ([]*sluicev1.Decision, error) {
	q, err := p.batcher.enqueueTraced(ctx, deadline, trace, checks...)
	if err != nil {
		return nil, fmt.Errorf("owner %s: %w", p.name, err)
	}
	// The batcher answers by the checks' deadline; the timer only guards
	// against a reply that can no longer come (a batcher stopped just as
	// the checks went in).
	t := time.NewTimer(time.Until(q.deadline) + p.batchWait + 100*time.Millisecond)
	defer t.Stop()
	select {
	case r := <-q.reply:
		return r.ds, r.err
	case <-t.C:
		return nil, fmt.Errorf("owner %s: no answer within the forward timeout", p.name)
	case <-ctx.Done():
		return nil, fmt.Errorf("owner %s: %w", p.name, ctx.Err())
	}
}

// request returns the ForwardRequest of checks that the sender waits for
// until deadline, with all that a forward carries: this node's name, its
// ring fingerprint and epoch now, the deadline the receiver applies by
// (applyBy), r's flags and trace context (r nil: a batch, which has no
// flags, and whose trace contexts the batcher sets) and the time of
// sending, now. The batcher and Forward build every request with it, as
// they send it.
func (p *Peer) request(r *Request, checks []*sluicev1.RateLimitCheck, deadline time.Time) *sluicev1.ForwardRequest {
	req := &sluicev1.ForwardRequest{Sender: p.sender, Checks: checks, DeadlineUnixNs: applyBy(deadline)}
	if r != nil {
		req.Reforwarded, req.StandIn, req.UnreachableOwner = r.Reforwarded, r.StandIn, r.UnreachableOwner
		if r.Trace != nil {
			r.Trace.Checks = uint32(len(checks))
			req.Traces = []*sluicev1.TraceContext{r.Trace}
		}
	}
	if p.view != nil {
		req.RingFingerprint, req.RingEpoch = p.view()
	}
	req.SentUnixNs = time.Now().UnixNano()
	return req
}

// applyBy returns the deadline (Unix ns) to send with a forwarded request
// that this node waits for until by: a quarter of the time left earlier,
// so that a check the receiver applies still has time for its answer to
// come back, and the receiver's estimate of this node's clock (it errs by
// the quickest transit it has seen) cannot let it apply a check this node
// has already answered without it.
func applyBy(by time.Time) int64 {
	return by.Add(-time.Until(by) / 4).UnixNano()
}

// endCall counts one ended Forward call of req to p that took took, and
// returns its decisions, or an error that names the owner and the gRPC
// code only (the underlying error names internal addresses) or the
// mismatch when the answer has not one decision per check.
func (p *Peer) endCall(req *sluicev1.ForwardRequest, resp *sluicev1.ForwardResponse, err error, took time.Duration) ([]*sluicev1.Decision, error) {
	st := p.stats
	st.batches.Add(1)
	st.checks.Add(int64(len(req.Checks)))
	st.latencyNs.Add(int64(took))
	if st.obs != nil {
		st.obs.Forwarded(p.name, len(req.Checks), took, err)
	}
	switch {
	case err != nil:
		st.errors.Add(1)
		return nil, fmt.Errorf("owner %s unavailable: %w", p.name, status.Error(status.Code(err), status.Code(err).String()))
	case len(resp.Decisions) != len(req.Checks):
		st.errors.Add(1)
		return nil, fmt.Errorf("owner %s answered %d decisions for %d checks", p.name, len(resp.Decisions), len(req.Checks))
	}
	return resp.Decisions, nil
}

// Close ends the peer at once: its stream (first: that also ends a Send
// the batcher's launcher is held in), its batcher (what is queued fails)
// and its connection. Calls in flight fail; Forward fails from then on.
// Closing a peer again, or a retired one, does no harm.
func (p *Peer) Close() {
	p.tr.close()
	p.batcher.close()
	p.closeConn()
}

func (p *Peer) closeConn() { _ = p.conn.Close() }

// Retired holds the peers that left the ring until their connections
// close. The zero value is not ready: use [NewRetired].
type Retired struct {
	mu     sync.Mutex
	timers map[*Peer]*time.Timer // connection closing after a grace; nil once closed
}

// NewRetired returns an empty Retired.
func NewRetired() *Retired { return &Retired{timers: map[*Peer]*time.Timer{}} }

// Retire stops p's batcher (failing what is queued) and closes its
// connection after grace, so that calls in flight can finish; after
// [Retired.Close], at once.
func (r *Retired) Retire(p *Peer, grace time.Duration) {
	p.batcher.close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timers == nil { // closed
		p.closeConn()
		return
	}
	r.timers[p] = time.AfterFunc(grace, func() {
		r.mu.Lock()
		delete(r.timers, p)
		r.mu.Unlock()
		p.closeConn()
	})
}

// Close closes the connections of the peers retired and not closed yet,
// at once; peers retired after are closed at once too.
func (r *Retired) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, t := range r.timers {
		t.Stop()
		p.closeConn()
	}
	r.timers = nil
}

// Stats counts the Forward calls made to each peer, by member name,
// across the peer's reconnections (every Peer dialed with the same Stats
// and name adds to the same counts). It is safe for concurrent use.
type Stats struct {
	obs   Observer
	peers sync.Map // member name -> *peerStats
}

// NewStats returns counters that also tell obs (nil: nobody) of each call.
func NewStats(obs Observer) *Stats { return &Stats{obs: obs} }

// Counts are one peer's Forward calls.
type Counts struct {
	// Batches is the number of calls; Checks the checks they carried.
	Batches, Checks int64
	// Errors is the number of calls that failed (a call's error, an
	// answer without one decision per check, or a batch whose deadline
	// passed before it was sent).
	Errors int64
	// Latency is the total time spent in those calls.
	Latency time.Duration
}

// Snapshot returns each peer's counts by member name.
func (s *Stats) Snapshot() map[string]Counts {
	out := map[string]Counts{}
	s.peers.Range(func(k, v any) bool {
		ps := v.(*peerStats)
		out[k.(string)] = Counts{Batches: ps.batches.Load(), Checks: ps.checks.Load(),
			Errors: ps.errors.Load(), Latency: time.Duration(ps.latencyNs.Load())}
		return true
	})
	return out
}

// of returns the counters of the named peer.
func (s *Stats) of(name string) *peerStats {
	v, _ := s.peers.LoadOrStore(name, &peerStats{obs: s.obs})
	return v.(*peerStats)
}

// peerStats counts one peer's forwards; read them through Stats.Snapshot.
type peerStats struct {
	batches, checks, errors, latencyNs atomic.Int64
	obs                                Observer // told of each call; may be nil
}
