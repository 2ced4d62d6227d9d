package rpc

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review: a check that reaches a node whose ring names another owner is
// re-forwarded (Server.reforward) with a fresh deadline, now plus the
// forward timeout, instead of the deadline its sender put on it. Peers
// forward over ForwardStream, whose handler calls Forward with the
// stream's context (no deadline), so nothing bounds the new deadline by
// the old one: the final owner applies the check after the entry node has
// given up on it and answered it without the owner (here with deny, which
// is meant to count nothing anywhere).
func TestReviewReforwardedCheckOutlivesItsSendersDeadline(t *testing.T) {
	var slowAt atomic.Pointer[Server]
	hookDecideOwned(t, func(s *Server, k []byte) {
		if s == slowAt.Load() && bytes.Contains(k, []byte("refwd-deadline")) {
			time.Sleep(400 * time.Millisecond) // the owner is slow (a pull, a busy lock)
		}
	})
	clock := windowClock()
	nodes := startCluster(t, 2, clock)
	n1, n2 := nodes[0], nodes[1]
	slowAt.Store(n2.Server())
	k := keyOwnedBy(t, n1, "refwd-deadline", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "refwd-deadline", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000,
		OnOwnerUnavailable: sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY}

	// An entry node whose ring names node1 (rings disagree for a moment)
	// sends the check to node1 over a stream, giving it 150 ms.
	st, err := dialPeer(t, n1.GRPCAddr()).ForwardStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(150 * time.Millisecond)
	if err := st.Send(&sluicev1.ForwardRequest{Sender: "entry", Checks: []*sluicev1.RateLimitCheck{rc},
		DeadlineUnixNs: deadline.UnixNano()}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	t.Logf("node1 answered after the sender's deadline by %s: %+v", answered.Sub(deadline), resp.Decisions)
	if got := peekRemaining(t, n2, rc); got != 10 {
		t.Fatalf("node2 counted %d hit(s) of a check it decided %s after its sender's deadline (the sender answered it without the owner)",
			10-got, answered.Sub(deadline).Round(time.Millisecond))
	}
}
