package rpc

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review (2af14f5): answerUnavailable sends a check whose failed owner has
// left this node's ring to the key's owner under this ring through
// reforward, i.e. marked reforwarded. A reforwarded check is decided by
// its receiver whatever its ring says (Forward: decide, no settle, no
// pull). Rings disagree while a death spreads: when the receiver's ring
// still holds the dead owner, it decides the key from its own, empty,
// window: a fresh budget for as long as the rings disagree. (That state
// also makes the key look settled to its later pull, hadState; the copy
// still arrives by the holder's orphan push once the rings agree.) Before
// 2af14f5 the same check went to the stand-in holder and was decided from
// the dead owner's copy.
func TestReviewCheckOfALeftOwnerReforwardedToALaggingRingStartsFresh(t *testing.T) {
	clock := windowClock()
	nodes := startReplicatedCluster(t, clock)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	// A key node2 owns, that node3 owns once node2 is gone.
	var k string
	after, err := ring.New([]string{"node1", "node3"}, n1.Server().ringCfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; k == ""; i++ {
		c := "user:" + string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+i/676))
		if n1.Server().Owner("left", c) == "node2" && after.Owner(ring.Key(nil, "left", c)) == "node3" {
			k = c
		}
	}
	key := string(ring.Key(nil, "left", k))
	rc := &sluicev1.RateLimitCheck{Name: "left", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 6 {
		if d := check(t, n1.client, rc); !d.Allowed || d.Owner != "node2" {
			t.Fatalf("before the crash: %+v", d)
		}
	}
	waitCopied(t, n2, key, n1, n3)
	n3.Server().hooks.holdMembers.Store(true) // node3 hears of the death late
	n2.Kill()
	eventually(t, "node1 to drop node2", func() bool { return !n1.Server().view.Load().ring.Has("node2") })

	// node1's forward to node2 failed just before its ring dropped node2.
	s := n1.Server()
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	out := make([]*sluicev1.Decision, 1)
	s.answerUnavailable(context.Background(), reqs, []failure{{0, "node2", "test"}}, out)
	if d := out[0]; d.Remaining >= 4 {
		t.Fatalf("a check of a key with 6 of 10 used, sent to node3 (whose ring still holds node2): %+v: decided from a fresh window", d)
	}
}
