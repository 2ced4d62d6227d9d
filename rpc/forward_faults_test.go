package rpc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Faults on the forwarding path, found by an adversarial review of the
// seventh session's batcher and stream (each failed on that code before
// its fix).

// A request the owner decided (counted) while it drained must still get
// its response; otherwise the sender answers it degraded and counts it a
// second time.
func TestForwardStreamDrainAnswersWhatItDecided(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hookDecideOwned(t, func(s *Server, k []byte) {
		if bytes.Contains(k, []byte("slow")) {
			once.Do(func() { close(entered); <-release })
		}
	})
	n := startInprocNode(t, "solo", windowClock())
	st, err := n.peer(t).ForwardStream(context.Background())
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
