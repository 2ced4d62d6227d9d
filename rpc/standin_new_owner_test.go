package rpc

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A node that joins the ring (a restart of a member that left gracefully,
// as each node does in the e2e rolling restart, or a new node) owns keys
// whose state is still at their previous owners, and for a moment the
// others cannot reach it: it is not up yet, or (TLS) it has not verified
// their certificates yet and refuses their peer calls although they have
// verified its own and routed its keys to it. A check of such a key goes
// to the new owner's stand-in holder (the member after it on the ring).
// The holder holds no copy of the key from the new owner (it never had
// it), nor the previous owner's copy (its push loop dropped that as stale
// as soon as its ring changed: the key moved), nor the key's state (a
// third member had it): its stand-in window started from zero, and a used
// up key admitted one more hit (degraded), which reached the new owner
// with the holder's stand-in hits, beyond the limit. The e2e rolling
// restart admitted 101 of 100 so on 4 keys (about half of the restarted
// node's keys have their previous owner elsewhere than at the holder; one
// round of checks fell in the moment).
//
// The test plays the joining node1 as a member nobody can reach yet: its
// members list it, nothing answers at its address.
func TestStandInForAJoiningOwnerDoesNotStartAKeyAfresh(t *testing.T) {
	clock := windowClock()
	c := newInproc(t)
	n2 := c.start(NodeConfig{Name: "node2", Clock: clock})
	n3 := c.start(NodeConfig{Name: "node3", Clock: clock})
	c.join()
	byName := map[string]*inprocNode{"node2": n2, "node3": n3}

	// A key node1 owns once it is back, whose state is at the member that
	// is not node1's stand-in holder.
	cfg := n2.Server().ringCfg
	before, err := ring.New([]string{"node2", "node3"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, err := ring.New([]string{"node1", "node2", "node3"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	holder := after.SuccessorsOf("node1", 1)[0]
	var k string
	for i := 0; k == ""; i++ {
		if i == 10000 {
			t.Fatal("no key moves to node1 from the member that is not its stand-in holder")
		}
		c := fmt.Sprintf("user:%d", i)
		sk := ring.Key(nil, "rejoin", c)
		if after.Owner(sk) == "node1" && before.Owner(sk) != holder {
			k = c
		}
	}
	key := string(ring.Key(nil, "rejoin", k))
	prev := byName[before.Owner([]byte(key))]
	h := byName[holder]
	rc := &sluicev1.RateLimitCheck{Name: "rejoin", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}

	for i := range 10 {
		via := []*inprocNode{n2, n3}[i%2]
		if d := check(t, via.client, rc); !d.Allowed || d.Degraded || d.Owner != prev.Name() {
			t.Fatalf("hit %d via %s: %+v, want allowed by %s", i+1, via.Name(), d, prev.Name())
		}
	}
	if d := check(t, n2.client, rc); d.Allowed {
		t.Fatalf("the 11th hit: %+v, want denied (the key is used up)", d)
	}
	eventually(t, holder+" to hold "+prev.Name()+"'s copy of the used-up key", func() bool {
		st, ok := h.Server().replicas.Get(key)
		return ok && fixedHits(st, clock.Now()) == 10
	})

	// node1 is back in both rings, and cannot be reached yet.
	ms := append(c.members(), cluster.Member{Name: "node1", GRPCAddr: inprocAddr("node1"), Region: testRegion(), State: cluster.Alive})
	for _, n := range []*inprocNode{n2, n3} {
		if err := n.Server().SetMembers(ms); err != nil {
			t.Fatal(err)
		}
	}
	// The holder's push loop drops the previous owner's copy at once (the
	// key moved); the previous owner keeps the key (its push fails).
	eventually(t, holder+" to drop its copy of the key that moved", func() bool {
		_, ok := h.Server().replicas.Get(key)
		return !ok
	})
	if st, ok := prev.Store().Get(key); !ok || fixedHits(st, clock.Now()) != 10 {
		t.Fatalf("%s lost the key's state (held %v): its push to node1 cannot have gone", prev.Name(), ok)
	}

	for _, via := range []*inprocNode{n2, n3} {
		resp, err := via.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
		if err != nil {
			t.Fatalf("check via %s: %v", via.Name(), err)
		}
		if d := resp.Decisions[0]; d.Allowed || d.Error != "" {
			t.Errorf("a hit of the used-up key via %s while its new owner node1 cannot be reached: %+v, want denied (degraded or not): the key's 10 hits are at %s",
				via.Name(), d, prev.Name())
		}
	}
}
