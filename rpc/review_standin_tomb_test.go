package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review: Forward's stand-in path consults the tombs (keys a member
// pulled away) only for keys this node does not own under its ring; a
// key it owns goes to decideOwned without reroute, which decides it here
// even when a tomb says the key's state went to the puller. So when a
// member with a newer ring has pulled a key from this node (its ring
// behind), and an entry node with an even older ring (the key's old
// owner still in it, unreachable) sends the key's checks here as the
// stand-in holder, they are decided from a fresh window: the key admits
// its limit again. Regular forwards of the same key follow the tomb.
func TestReviewStandInForwardIgnoresTombOfAnOwnedKey(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 3, clock)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	k := keyOwnedBy(t, n1, "tomb", "node1")
	rc := &sluicev1.RateLimitCheck{Name: "tomb", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, n2.client, rc); !d.Allowed || d.Owner != "node1" {
			t.Fatalf("before: %+v", d)
		}
	}
	// node3 pulls the key from node1 (as Server.Pull does: state out,
	// tomb in), while node1's ring still gives node1 the key.
	key := string(ring.Key(nil, "tomb", k))
	st, ok, err := n1.Server().custody.GiveUp(context.Background(), key, "node3", "", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("node1 holds no state of the key")
	}
	n3.Store().MergeState(key, st, clock.Now())
	handedOff := n3.Server().handoff.Counters.HandedOff.Load()

	// A regular forward follows the tomb: decided at node3, 4 left.
	d := check(t, n2.client, rc)
	if d.Owner == "node3" && d.Remaining == 9 {
		// node3 does not own the key under its ring: a hand-off pass of
		// its own (one pending since the cluster formed) sent the merged
		// state home before the check came. Not the case under test.
		t.Skip("node3 handed the pulled state home before the check")
	}
	if !d.Allowed || d.Owner != "node3" || d.Remaining != 4 {
		t.Fatalf("regular check after the pull: %+v, want decided by node3 with 4 left", d)
	}
	// A stand-in forward of the same key (an entry node whose ring still
	// names a dead owner, whose successor is node1).
	resp, err := dialPeer(t, n1.GRPCAddr()).Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node2", StandIn: true,
		UnreachableOwner: "node0", DeadlineUnixNs: time.Now().Add(2 * time.Second).UnixNano(), Checks: []*sluicev1.RateLimitCheck{rc}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Remaining != 3 {
		if n3.Server().handoff.Counters.HandedOff.Load() > handedOff {
			// As above, between the two checks: node3 sent the key
			// home, so the tomb's member has no state of it. Not the
			// case under test (seen once in CI).
			t.Skipf("node3 handed the pulled state home before the stand-in check (%+v)", d)
		}
		t.Fatalf("stand-in check after the pull: %+v, want 3 left (the key's count is at node3): decided from a fresh window", d)
	}
}
