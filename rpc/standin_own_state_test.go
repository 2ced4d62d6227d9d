package rpc

import (
	"testing"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// A member that restarts gives a node's keys to it again: the node's ring
// names the new process as their owner before that process answers (or
// while it still refuses the node's push, its ring not agreeing yet), so a
// check of such a key is decided in the stand-in, and the stand-in holder
// is often the node itself, which holds no copy of a key it owned (its
// copies are on its successor) but holds the key's state, not handed off
// yet. The fallback window started from zero: a used-up key admitted its
// budget again, degraded (the e2e rolling restart: 'key user:23 admitted
// 101 (1 of them degraded)', decided by the previous owner with remaining
// 99). It must start from the node's own state of the key, and hand on only
// the hits it admitted beyond it (the state goes with the push).
func TestStandInStartsFromTheNodesOwnStateOfTheKey(t *testing.T) {
	clock := windowClock()
	nodes := startScenarioCluster(t, 3, clock)
	n2 := nodes[1]
	key := keyOwnedBy(t, nodes[0], "standin", "node2")
	storeKey := ring.Key(nil, "standin", key)
	rc := func(hits int64) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "standin", Key: key, Hits: &hits, Limit: 10, WindowMs: 3_600_000}
	}
	for i := range 9 {
		if d := check(t, nodes[0].client, rc(1)); !d.Allowed || d.Owner != "node2" || d.Remaining != int64(9-i) {
			t.Fatalf("hit %d: %+v, want allowed by node2", i+1, d)
		}
	}
	s := n2.Server()
	if _, ok := s.replicas.Get(string(storeKey)); ok {
		t.Fatal("node2 holds a copy of its own key")
	}
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc(1)}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	if d := s.standInDecide(storeKey, reqs[0], ""); !d.Allowed || !d.Degraded || d.Remaining != 0 {
		t.Fatalf("the 10th hit, in the stand-in at node2 (9 of 10 in its window): %+v, want allowed, degraded, 0 remaining", d)
	}
	if d := s.standInDecide(storeKey, reqs[0], ""); d.Allowed {
		t.Fatalf("the 11th hit, in the stand-in at node2: %+v, want denied (the key is used up)", d)
	}
	// What goes on to the key's owner is the one hit admitted beyond
	// node2's state, which goes with the push.
	d, _, ok := s.standInHits(string(storeKey), s.store.Now())
	if !ok {
		t.Fatal("no stand-in hits to hand on, want the 10th hit")
	}
	w := window.NewStore(window.StoreConfig{Clock: clock})
	w.MergeState("k", d, clock.Now())
	peek := reqs[0].check
	peek.Hits = 0
	if got, err := w.Apply("k", peek, clock.Now()); err != nil || got.Remaining != 9 {
		t.Fatalf("stand-in hits to hand on: a window of them has %d of 10 left (%v), want 9: one hit", got.Remaining, err)
	}
}
