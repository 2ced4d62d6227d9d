package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// reviewStandInSetup starts node1 (its peer connections stallable) and
// node2..node3 with fast replication, and gives node1 a fallback window
// holding one stand-in hit of a key node2 owns (as if node1 had decided
// it in node2's stead). The stall is on when it returns.
func reviewStandInSetup(t *testing.T, name string) (n1, n2 *testNode, stall *stallDialer, rc *sluicev1.RateLimitCheck, storeKey []byte) {
	t.Helper()
	clock := windowClock()
	stall = newStallDialer()
	n1cfg := fastReplication
	n1cfg.DialOptions = []grpc.DialOption{stall.option()}
	n1 = startNodeWith(t, "node1", clock, n1cfg)
	n2 = startNodeWith(t, "node2", clock, fastReplication, n1.GossipAddr())
	n3 := startNodeWith(t, "node3", clock, fastReplication, n1.GossipAddr())
	waitRingAgrees(t, []*testNode{n1, n2, n3})
	k := keyOwnedBy(t, n1, name, "node2")
	rc = &sluicev1.RateLimitCheck{Name: name, Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	if got := peekRemaining(t, n2, rc); got != 10 { // also opens node1's connections
		t.Fatalf("fresh key: %d left", got)
	}
	check(t, n1.client, &sluicev1.RateLimitCheck{Name: name, Key: keyOwnedBy(t, n1, name, "node3"), Hits: proto.Int64(0), Limit: 10, WindowMs: 1000})
	stall.set(true)
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	storeKey = ring.Key(nil, name, k)
	if d := n1.Server().standInDecide(storeKey, reqs[0], ""); !d.Allowed {
		t.Fatalf("stand-in decision: %+v", d)
	}
	return n1, n2, stall, rc, storeKey
}

// Review: node1's stand-in loop hands its stand-in hits to the key's
// owner (flushStandIns: standInHits, the HandOff, then sentStandIn), and
// a Pull of the key takes the same hits out of node1's fallback window
// (takeStandIn) in PullResponse.stand_in. Nothing orders the two: the
// flush does not mark its keys outgoing (as pushBatch does, so that a
// Pull waits for the batch), so a Pull that lands while a flush is in
// flight returns hits the flush is delivering too. Both follow a ring
// change (the flush is signalled by it, the new owner's first touch
// pulls), so they meet in practice. The one hit is delivered twice.
func TestReviewStandInHitsDeliveredTwiceByPullAndFlush(t *testing.T) {
	n1, n2, stall, rc, storeKey := reviewStandInSetup(t, "pull-flush")
	time.Sleep(300 * time.Millisecond) // the stand-in loop's flush has read the hit and waits on the stalled path
	resp, err := n1.Server().Pull(context.Background(), &sluicev1.PullRequest{Sender: "node2",
		RingFingerprint: n2.Server().RingFingerprint(), Keys: [][]byte{storeKey}})
	if err != nil {
		t.Fatal(err)
	}
	var pulled int64
	for _, ks := range resp.StandIn {
		var st window.State
		if err := st.UnmarshalBinary(ks.State); err != nil {
			t.Fatal(err)
		}
		pulled++
	}
	stall.set(false)
	time.Sleep(time.Second) // the flush lands; node2 folds what it got
	viaFlush := 10 - peekRemaining(t, n2, rc)
	if pulled+viaFlush != 1 {
		t.Fatalf("one stand-in hit was delivered %d times: %d in the Pull's stand_in, %d by the stand-in flush", pulled+viaFlush, pulled, viaFlush)
	}
}
