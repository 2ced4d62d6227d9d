package rpc

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Faults on the forwarding path, found by an adversarial review of the
// seventh session's batcher and stream (each failed on that code before
// its fix).

// ctlStream is a client ForwardStream under the test's control.
type ctlStream struct {
	grpc.ClientStream
	ctx   context.Context
	mu    sync.Mutex
	sends int
	block func(n int) bool // Send n (0-based) blocks until ctx ends
	sent  chan *sluicev1.ForwardRequest
	resps chan *sluicev1.ForwardResponse
}

func (s *ctlStream) Send(r *sluicev1.ForwardRequest) error {
	s.mu.Lock()
	n := s.sends
	s.sends++
	s.mu.Unlock()
	if s.block != nil && s.block(n) {
		<-s.ctx.Done()
		return io.EOF
	}
	select {
	case s.sent <- r:
	case <-s.ctx.Done():
		return io.EOF
	}
	return nil
}

func (s *ctlStream) Recv() (*sluicev1.ForwardResponse, error) {
	select {
	case r := <-s.resps:
		return r, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

type ctlClient struct {
	sluicev1.PeerServiceClient
	mu      sync.Mutex
	streams []*ctlStream
	block   func(n int) bool
	openErr func() error
}

func (c *ctlClient) ForwardStream(ctx context.Context, _ ...grpc.CallOption) (sluicev1.PeerService_ForwardStreamClient, error) {
	if c.openErr != nil {
		if err := c.openErr(); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &ctlStream{ctx: ctx, block: c.block, sent: make(chan *sluicev1.ForwardRequest, 1000), resps: make(chan *sluicev1.ForwardResponse, 1000)}
	c.streams = append(c.streams, s)
	return s, nil
}

func (c *ctlClient) stream(i int) *ctlStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[i]
}

func answerOf(req *sluicev1.ForwardRequest) *sluicev1.ForwardResponse {
	resp := &sluicev1.ForwardResponse{}
	for _, c := range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Owner: c.Key})
	}
	return resp
}

func newCtlBatcher(c *ctlClient, cfg BatchConfig, timeout time.Duration) *batcher {
	p := &peer{name: "ctl", addr: "ctl:1", client: c, stats: &peerStats{}}
	p.stream = &peerStream{client: c}
	return newBatcher(p, cfg.withDefaults(), timeout, "test")
}

// close does not wait for the launcher's Send that flow control holds
// (Server.Close, holding its lock, closes every peer in turn).
func TestBatcherCloseDoesNotWaitForABlockedSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &ctlClient{block: func(n int) bool { return n == 1 }}
		b := newCtlBatcher(c, BatchConfig{MaxWait: time.Hour}, 10*time.Second)
		qa, _ := b.enqueue(context.Background(), &sluicev1.RateLimitCheck{Key: "a"})
		synctest.Wait()
		qb, _ := b.enqueue(context.Background(), &sluicev1.RateLimitCheck{Key: "b"}) // queued behind a
		synctest.Wait()
		s := c.stream(0)
		s.resps <- answerOf(<-s.sent) // a answered: b goes via the launcher, whose Send blocks
		synctest.Wait()
		if r := <-qa.reply; r.err != nil {
			t.Fatal(r.err)
		}
		start := time.Now()
		b.close()
		if time.Since(start) > time.Second {
			t.Errorf("close blocked %v behind the launcher's Send", time.Since(start))
		}
		<-qb.reply
		b.p.stream.close()
	})
}

// call gives up by its context's deadline while the stream is still being
// opened to an owner whose connection never becomes ready.
func TestPeerStreamCallHonoursCtxWhileOpening(t *testing.T) {
	addr := testnet.SilentAddr(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ps := &peerStream{client: sluicev1.NewPeerServiceClient(conn)}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := ps.call(ctx, &sluicev1.ForwardRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("call returned %v after %v, want DeadlineExceeded", err, time.Since(start))
		}
	case <-time.After(3 * time.Second):
		t.Errorf("call still blocked after 3s with a 200ms ctx")
		conn.Close() // the open then fails
		<-done
	}
	conn.Close()
	ps.close()
}

// A request answered right at its deadline: its timer does not then drop
// the stream and fail the other requests on it.
func TestPeerStreamAnsweredAtItsDeadlineKeepsStream(t *testing.T) {
	bad := 0
	for range 300 {
		synctest.Test(t, func(t *testing.T) {
			c := &ctlClient{}
			ps := &peerStream{client: c}
			defer ps.close()
			t0 := time.Now()
			ra := make(chan streamReply, 1)
			rb := make(chan streamReply, 1)
			ps.start(t0.Add(time.Second), &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "a"}}},
				func(r *sluicev1.ForwardResponse, err error) { ra <- streamReply{r, err} })
			ps.start(t0.Add(time.Hour), &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "b"}}},
				func(r *sluicev1.ForwardResponse, err error) { rb <- streamReply{r, err} })
			s := c.stream(0)
			a, b := <-s.sent, <-s.sent
			time.Sleep(time.Second) // a's deadline
			s.resps <- answerOf(a)
			synctest.Wait()
			s.resps <- answerOf(b)
			synctest.Wait()
			x, y := <-ra, <-rb
			if x.err == nil && y.err != nil {
				bad++
			}
		})
	}
	if bad > 0 {
		t.Errorf("%d/300: a answered, yet b (deadline 1h) failed because a's timer dropped the stream", bad)
	}
}

// A request the owner decided (counted) while it drained must still get
// its response; otherwise the sender answers it degraded and counts it a
// second time.
func TestForwardStreamDrainAnswersWhatItDecided(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookDecideOwned = func(s *Server, k []byte) {
		if bytes.Contains(k, []byte("slow")) {
			once.Do(func() { close(entered); <-release })
		}
	}
	t.Cleanup(func() { testHookDecideOwned = nil })
	n := startNode(t, "solo", windowClock())
	st, err := dialPeer(t, n.GRPCAddr()).ForwardStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := &sluicev1.RateLimitCheck{Name: "api", Key: "slow", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}
	if err := st.Send(&sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{c}}); err != nil {
		t.Fatal(err)
	}
	<-entered
	n.Server().Drain()
	time.Sleep(100 * time.Millisecond) // lets the handler see the drain first (a pass either way is no false failure)
	close(release)
	resp, rerr := st.Recv()
	peek, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "slow", Hits: proto.Int64(0), Limit: 10, WindowMs: 60000}}})
	if err != nil {
		t.Fatal(err)
	}
	if rerr != nil || len(resp.Decisions) != 1 || !resp.Decisions[0].Allowed || resp.Decisions[0].Remaining != 9 {
		t.Fatalf("the sender got %v, %v; want the decision (allowed, 9 left)", resp, rerr)
	}
	if got := peek.Decisions[0].Remaining; got != 9 {
		t.Fatalf("the owner has %d left, want 9: the one hit counted once", got)
	}
}

// A member whose gRPC port accepts TCP but never completes the HTTP/2
// handshake (a hung process, a proxy, a half-dead host): a check it owns
// must be answered within the forward timeout (1s here).
func TestSilentOwnerAnsweredWithinForwardTimeout(t *testing.T) {
	addr := testnet.SilentAddr(t)
	s, err := NewServer(ServerConfig{
		Name:           "node1",
		Store:          window.NewStore(window.StoreConfig{Clock: windowClock(), MaxKeys: 10_000}),
		Logger:         testLogger(),
		ForwardTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetMembers([]cluster.Member{
		{Name: "node1", GRPCAddr: "127.0.0.1:1", State: cluster.Alive},
		{Name: "ghost", GRPCAddr: addr, State: cluster.Alive},
	}); err != nil {
		t.Fatal(err)
	}
	var k string
	for i := 0; ; i++ {
		k = "user:" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if s.Owner("api", k) == "ghost" {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, nb := range []bool{false, true} {
		start := time.Now()
		resp, err := s.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
			{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000, NoBatching: nb},
		}})
		took := time.Since(start)
		if err != nil || len(resp.Decisions) != 1 || !resp.Decisions[0].Degraded {
			t.Fatalf("no_batching=%v: %v, %v; want one degraded decision", nb, resp, err)
		}
		if took > 2*time.Second {
			t.Errorf("no_batching=%v: answered after %v, over the 1s forward timeout", nb, took)
		}
	}
}

// A leaving node holds a check it sends on to the key's next owner until
// its hand-off pass has ended (the next owner decides a reforwarded check
// at once, so the key's state must be there first), and for at most half
// the forward timeout. (e2e's TestScaleOutAndInKeepsCounts admitted 101
// on a key before: a check reforwarded while the state was on its way.)
func TestLeavingNodeHoldsReforwardsUntilHandedOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewServer(ServerConfig{
			Name:           "node1",
			Store:          window.NewStore(window.StoreConfig{Clock: windowClock(), MaxKeys: 1000}),
			Logger:         testLogger(),
			ForwardTimeout: 2 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.awaitLeaveHandOff(context.Background()) // not leaving: returns at once
		handing := make(chan struct{})
		s.handingOff.Store(&handing)
		done := make(chan struct{})
		go func() { s.awaitLeaveHandOff(context.Background()); close(done) }()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("a reforward went on while the hand-off was still running")
		default:
		}
		close(handing)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("the reforward still held after the hand-off ended")
		}
		stuck := make(chan struct{})
		s.handingOff.Store(&stuck)
		start := time.Now()
		s.awaitLeaveHandOff(context.Background())
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("held %s by a hand-off that never ends, want half the 2s forward timeout", waited)
		}
	})
}
