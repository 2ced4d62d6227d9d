package forward

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// The batcher's requests carry their batch's deadline.
func TestBatcherSendsItsDeadline(t *testing.T) {
	f := &fakePeer{}
	b := newTestBatcher(f, BatchConfig{}, 300*time.Millisecond)
	defer b.close()
	before := time.Now()
	ch, err := enq(b, &sluicev1.RateLimitCheck{Name: "n", Key: "k", Limit: 1, WindowMs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	waitReply(t, ch)
	reqs := f.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	// The owner is told three quarters of the time: the rest is for its
	// answer to come back.
	dl := time.Unix(0, reqs[0].DeadlineUnixNs)
	if dl.Before(before.Add(220*time.Millisecond)) || dl.After(time.Now().Add(226*time.Millisecond)) {
		t.Fatalf("deadline %v, want enqueue time + 225 ms (enqueued at %v)", dl, before)
	}
}

// forwardKinds are the four kinds of forward, each with one check named
// after it.
func forwardKinds() []struct {
	name string
	r    Request
} {
	kinds := []struct {
		name string
		r    Request
	}{
		{"batched", Request{}},
		{"no_batching", Request{NoBatching: true}},
		{"reforwarded", Request{Reforwarded: true}},
		{"stand-in", Request{StandIn: true, UnreachableOwner: "node3"}},
	}
	for i := range kinds {
		kinds[i].r.Checks = []*sluicev1.RateLimitCheck{{Key: kinds[i].name}}
	}
	return kinds
}

// Every kind of forward carries the same: this node's name, its ring
// fingerprint and epoch as the request is sent, the deadline the receiver
// applies by (three quarters of the wait, the earlier of By and the
// forward timeout) and the time of sending; and its own flags.
func TestEveryForwardCarriesSenderRingAndDeadline(t *testing.T) {
	f := &fakePeer{}
	var (
		mu    sync.Mutex
		epoch uint64
	)
	view := func() (string, uint64) {
		mu.Lock()
		defer mu.Unlock()
		return "fp-" + string(rune('a'+epoch)), epoch
	}
	p := newFakePeer(f, Config{Sender: "node1", Timeout: time.Second, View: view})
	defer p.batcher.close()
	for i, k := range forwardKinds() {
		mu.Lock()
		epoch = uint64(i + 1) // read when the request is sent
		mu.Unlock()
		if i%2 == 1 {
			k.r.By = time.Now().Add(400 * time.Millisecond) // earlier than the forward timeout
		}
		before := time.Now()
		ds, err := p.Forward(context.Background(), k.r)
		if err != nil || len(ds) != 1 || ds[0].Owner != k.name {
			t.Fatalf("%s: %v, %v", k.name, ds, err)
		}
		reqs := f.requests()
		if len(reqs) != i+1 {
			t.Fatalf("%s: %d requests sent, want %d", k.name, len(reqs), i+1)
		}
		req := reqs[i]
		if req.Sender != "node1" || req.RingEpoch != uint64(i+1) || req.RingFingerprint != "fp-"+string(rune('a'+i+1)) {
			t.Fatalf("%s: sender %q, ring %q epoch %d; want node1 and the ring of epoch %d", k.name, req.Sender, req.RingFingerprint, req.RingEpoch, i+1)
		}
		if req.Reforwarded != k.r.Reforwarded || req.StandIn != k.r.StandIn || req.UnreachableOwner != k.r.UnreachableOwner {
			t.Fatalf("%s: flags reforwarded %v, stand_in %v, unreachable owner %q", k.name, req.Reforwarded, req.StandIn, req.UnreachableOwner)
		}
		if sent := time.Unix(0, req.SentUnixNs); sent.Before(before) || sent.After(time.Now()) {
			t.Fatalf("%s: sent_unix_ns %v, not within the call (%v)", k.name, sent, before)
		}
		wait := time.Second
		if !k.r.By.IsZero() {
			wait = 400 * time.Millisecond
		}
		dl := time.Unix(0, req.DeadlineUnixNs)
		if dl.Before(before.Add(wait*3/4-5*time.Millisecond)) || dl.After(time.Now().Add(wait*3/4)) {
			t.Fatalf("%s: deadline %v after the call started, want %v", k.name, dl.Sub(before), wait*3/4)
		}
	}
}

// observed records the Observer's calls.
type observed struct {
	mu    sync.Mutex
	calls []string
}

func (o *observed) Forwarded(peer string, checks int, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, peer+":"+string(rune('0'+checks))+":"+status.Code(err).String())
}

// Every kind of forward is counted in the peer's stats and told to the
// observer, and its error names the owner and the gRPC code only, never
// the underlying message (which names internal addresses).
func TestEveryForwardIsCountedAndScrubbed(t *testing.T) {
	obs := &observed{}
	stats := NewStats(obs)
	f := &fakePeer{err: status.Error(codes.Unavailable, "connection error: desc = \"transport: dial tcp 10.1.2.3:7001: connect: connection refused\"")}
	p := newFakePeer(f, Config{Sender: "node1", Timeout: time.Second, Stats: stats})
	defer p.batcher.close()
	for _, k := range forwardKinds() {
		_, err := p.Forward(context.Background(), k.r)
		if err == nil || err.Error() != "owner fake unavailable: rpc error: code = Unavailable desc = Unavailable" || status.Code(errors.Unwrap(err)) != codes.Unavailable {
			t.Fatalf("%s: %v, want the owner and the code only", k.name, err)
		}
	}
	f.mu.Lock()
	f.err = nil
	f.mu.Unlock()
	for _, k := range forwardKinds() {
		if _, err := p.Forward(context.Background(), k.r); err != nil {
			t.Fatalf("%s: %v", k.name, err)
		}
	}
	c := stats.Snapshot()["fake"]
	if c.Batches != 8 || c.Checks != 8 || c.Errors != 4 || c.Latency <= 0 {
		t.Fatalf("counts %+v, want 8 calls of 1 check, 4 failed", c)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	want := []string{"fake:1:Unavailable", "fake:1:Unavailable", "fake:1:Unavailable", "fake:1:Unavailable", "fake:1:OK", "fake:1:OK", "fake:1:OK", "fake:1:OK"}
	if strings.Join(obs.calls, " ") != strings.Join(want, " ") {
		t.Fatalf("observer told %v, want %v", obs.calls, want)
	}
}

// twoWayPeer answers Forward both ways, counting which way each request
// came.
type twoWayPeer struct {
	sluicev1.UnimplementedPeerServiceServer
	mu            sync.Mutex
	stream, unary []string // the first check's key of each request
}

func (p *twoWayPeer) answer(req *sluicev1.ForwardRequest, unary bool) *sluicev1.ForwardResponse {
	p.mu.Lock()
	if unary {
		p.unary = append(p.unary, req.Checks[0].Key)
	} else {
		p.stream = append(p.stream, req.Checks[0].Key)
	}
	p.mu.Unlock()
	resp := &sluicev1.ForwardResponse{}
	for _, c := range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Owner: c.Key})
	}
	return resp
}

func (p *twoWayPeer) Forward(_ context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	return p.answer(req, true), nil
}

func (p *twoWayPeer) ForwardStream(st sluicev1.PeerService_ForwardStreamServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if err := st.Send(p.answer(req, false)); err != nil {
			return err
		}
	}
}

// startTwoWayPeer serves a twoWayPeer over bufconn.
func startTwoWayPeer(t *testing.T) (*twoWayPeer, *bufconn.Listener) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	tw := &twoWayPeer{}
	gs := grpc.NewServer()
	sluicev1.RegisterPeerServiceServer(gs, tw)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return tw, lis
}

// A dialed peer sends batched and no_batching checks over its stream, and
// reforwarded and stand-in checks in unary calls of their own.
func TestDialedPeerSendsReforwardsOffTheStream(t *testing.T) {
	tw, lis := startTwoWayPeer(t)
	p, err := Dial("owner", "passthrough:///owner", Config{Sender: "node1", Timeout: 5 * time.Second, DialOptions: bufDialOptions(lis)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Name() != "owner" || p.Addr() != "passthrough:///owner" || p.Client() == nil {
		t.Fatalf("peer %q at %q, client %v", p.Name(), p.Addr(), p.Client())
	}
	for _, k := range forwardKinds() {
		ds, err := p.Forward(context.Background(), k.r)
		if err != nil || len(ds) != 1 || ds[0].Owner != k.name {
			t.Fatalf("%s: %v, %v", k.name, ds, err)
		}
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if strings.Join(tw.stream, " ") != "batched no_batching" || strings.Join(tw.unary, " ") != "reforwarded stand-in" {
		t.Fatalf("over the stream %v, unary %v; want batched and no_batching on the stream", tw.stream, tw.unary)
	}
}

// A retired peer refuses new checks at once and closes its connection
// after the grace, or at once when the Retired are closed; a peer retired
// after that is closed at once. A closed peer refuses checks too.
func TestRetiredPeersCloseAfterTheirGrace(t *testing.T) {
	_, lis := startTwoWayPeer(t)
	dial := func() *Peer {
		t.Helper()
		p, err := Dial("owner", "passthrough:///owner", Config{Sender: "node1", Timeout: 5 * time.Second, DialOptions: bufDialOptions(lis)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Forward(context.Background(), forwardKinds()[0].r); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shut := func(p *Peer) bool { return p.conn.GetState() == connectivity.Shutdown }
	r := NewRetired()
	short, long := dial(), dial()
	r.Retire(short, 10*time.Millisecond)
	r.Retire(long, time.Hour)
	if _, err := long.Forward(context.Background(), forwardKinds()[0].r); !errors.Is(err, errBatcherStopped) {
		t.Fatalf("a check for a retired peer: %v, want errBatcherStopped", err)
	}
	for deadline := time.Now().Add(10 * time.Second); !shut(short) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if !shut(short) || shut(long) {
		t.Fatalf("connections shut down: after 10ms grace %v, after an hour's %v; want true, false", shut(short), shut(long))
	}
	r.Close()
	late := dial()
	r.Retire(late, time.Hour)
	if !shut(long) || !shut(late) {
		t.Fatalf("after Close: the retired peer's connection shut down %v, a peer retired later %v; want both", shut(long), shut(late))
	}
	closed := dial()
	closed.Close()
	if _, err := closed.Forward(context.Background(), forwardKinds()[0].r); !errors.Is(err, errBatcherStopped) || !shut(closed) {
		t.Fatalf("a check for a closed peer: %v (connection shut down %v), want errBatcherStopped", err, shut(closed))
	}
}
