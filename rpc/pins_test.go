package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Pins: what tombs, pulls and takeovers do, asserted through the peer and
// client APIs before rpc is split into rooms (issue 18), so that the move
// cannot change them unnoticed. What they reach inside a node goes through
// the few helpers at the end of this file.

// TestPinPulledKeyGoesToThePuller: a key pulled from its owner (the
// puller's ring is ahead) leaves a tomb, so the owner, whose ring still
// gives it the key, sends the key's checks on to the puller, entered at
// the owner or forwarded to it, and never decides them from a fresh
// window.
func TestPinPulledKeyGoesToThePuller(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 3, clock)
	n1, n2 := nodes[0], nodes[1]
	k := keyOwnedBy(t, n1, "pin-tomb", "node1")
	rc := &sluicev1.RateLimitCheck{Name: "pin-tomb", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, n2.client, rc); !d.Allowed || d.Owner != "node1" {
			t.Fatalf("before the pull: %+v, want allowed by node1", d)
		}
	}
	key := ring.Key(nil, "pin-tomb", k)
	// node3 pulls the key as a new owner does, under a ring node1 never
	// built; node1's ring changed moments ago (the cluster formed), so it
	// gives the key up.
	resp, err := dialPeer(t, n1.GRPCAddr()).Pull(context.Background(),
		&sluicev1.PullRequest{Sender: "node3", RingFingerprint: "0123456789abcdef", Keys: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.States) != 1 {
		t.Fatalf("pull gave %d states, want the key's 1", len(resp.States))
	}
	if got := remainingIn(t, resp.States[0].State, clock.Now()); got != 5 {
		t.Fatalf("pulled state has %d left, want 5", got)
	}
	if _, ok := n1.Store().Get(string(key)); ok {
		t.Fatal("node1 still holds the pulled key's state")
	}
	// Entered at the owner, and forwarded to it: both go to node3, which
	// holds nothing of the key (its state is in the response above), so
	// it answers 9 left; node1 deciding from a fresh window would answer
	// owner node1.
	for _, via := range []*testNode{n1, n2} {
		d := check(t, via.client, rc)
		// (node1's store may hold the key again after the first: node3,
		// which does not own it, hands it home after deciding.)
		if d.Owner != "node3" {
			t.Fatalf("check via %s after the pull: %+v, want sent on to the puller node3", via.Name(), d)
		}
	}
	if got := n1.Server().Stats().Reforwarded; got < 2 {
		t.Errorf("node1 reforwarded %d checks, want at least 2", got)
	}
}

// TestPinFirstTouchPullsMovedState: a new owner whose hand-off has not
// arrived pulls the key's state on first touch and decides from it; the
// member pulled from keeps a tomb, so its checks of the key come to the
// puller too.
func TestPinFirstTouchPullsMovedState(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 2, clock)
	n1, n2 := nodes[0], nodes[1]
	waitPushesIdle(t, nodes)
	k := keyOwnedBy(t, n1, "pin-pull", "node1")
	rc := &sluicev1.RateLimitCheck{Name: "pin-pull", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, n1.client, rc); !d.Allowed || d.Owner != "node1" {
			t.Fatalf("before the pull: %+v", d)
		}
	}
	key := ring.Key(nil, "pin-pull", k)
	pullsBefore, handedBefore := n2.Server().Stats().Pulls, n1.Server().Stats().HandedOff
	firstTouchAwaitingNode1(t, n2, key) // node2's first touch of a key it awaits from node1
	if got := n2.Server().Stats().Pulls - pullsBefore; got != 1 {
		t.Fatalf("node2 made %d pulls, want 1", got)
	}
	if got := n1.Server().Stats().HandedOff - handedBefore; got != 1 {
		t.Fatalf("node1 handed off %d keys, want 1", got)
	}
	if _, ok := n1.Store().Get(string(key)); ok {
		t.Fatal("node1 still holds the pulled key")
	}
	if _, ok := n2.Store().Get(string(key)); !ok {
		t.Fatal("node2 holds no state of the pulled key")
	}
	// node1's ring still gives it the key: the check goes to node2,
	// which decides it from the pulled state (5 used: 4 left).
	d := check(t, n1.client, rc)
	if !d.Allowed || d.Owner != "node2" || d.Remaining != 4 {
		t.Fatalf("check at node1 after the pull: %+v, want node2 deciding with 4 left", d)
	}
}

// TestPinCopyTakesOverForAKilledOwner: when a key's owner is killed, the
// key's new owner takes over the copy a successor holds (a replica stands
// in for the lost state): the count goes on from the copy. The first
// check after the kill is the new owner's first touch: it pulls the key
// from the holder, or, when that pull does not get through in time (a
// loaded machine), the check goes to the holder, which decides it from
// the copy (degraded); either way the count goes on from the copy, and
// once the hand-off is over the new owner decides from the copy and that
// hit.
func TestPinCopyTakesOverForAKilledOwner(t *testing.T) {
	clock := windowClock()
	cfg := NodeConfig{ForwardTimeout: time.Second, Replication: ReplicationConfig{Interval: 20 * time.Millisecond}}
	nodes := []*testNode{startNodeWith(t, "node1", clock, cfg)}
	for _, name := range []string{"node2", "node3"} {
		nodes = append(nodes, startNodeWith(t, name, clock, cfg, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	victim := nodes[0]
	k := keyOwnedBy(t, nodes[1], "pin-copy", victim.Name())
	rc := &sluicev1.RateLimitCheck{Name: "pin-copy", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, nodes[1].client, rc); !d.Allowed || d.Owner != victim.Name() {
			t.Fatalf("before the kill: %+v", d)
		}
	}
	key := string(ring.Key(nil, "pin-copy", k))
	eventually(t, "the copy to reach a successor with all 5 hits", func() bool {
		for _, n := range nodes[1:] {
			if copyRemaining(n, key, clock.Now()) == 5 {
				return true
			}
		}
		return false
	})
	victim.Kill()
	survivors := nodes[1:]
	eventually(t, "the survivors' rings to drop the victim", func() bool {
		for _, n := range survivors {
			if n.Server().Owner("pin-copy", k) == victim.Name() || len(n.Server().view.Load().ring.Members()) != 2 {
				return false
			}
		}
		return true
	})
	newOwner := survivors[0].Server().Owner("pin-copy", k)
	d := check(t, survivors[1].client, rc)
	if !d.Allowed || d.Remaining != 4 || (!d.Degraded && d.Owner != newOwner) {
		t.Fatalf("check after the kill: %+v, want %s deciding from the copy (or the holder, degraded), 4 left", d, newOwner)
	}
	waitPushesIdle(t, survivors)
	if d := check(t, survivors[1].client, rc); !d.Allowed || d.Owner != newOwner || d.Remaining != 3 || d.Degraded {
		t.Fatalf("check after the hand-off: %+v, want %s deciding from the copy and the first hit, 3 left", d, newOwner)
	}
	var takeovers int64
	for _, n := range survivors {
		takeovers += n.Server().Stats().ReplicaTakeovers
	}
	if takeovers < 1 {
		t.Fatalf("no survivor counted a replica takeover")
	}
}

// remainingIn returns what a fixed window of 10 hits per hour has left
// under the encoded state b at now.
func remainingIn(t *testing.T, b []byte, now time.Time) int64 {
	t.Helper()
	var st window.State
	if err := st.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	return remainingOf(st, now)
}

func remainingOf(st window.State, now time.Time) int64 {
	s := window.NewStore(window.StoreConfig{Clock: window.NewManualClock(now)})
	s.MergeState("k", st, now)
	d, err := s.Apply("k", window.Check{Algorithm: window.FixedWindow, Limit: 10, Window: time.Hour}, now)
	if err != nil {
		return -1
	}
	return d.Remaining
}

// The pins' view inside a node: re-pointed, not rewritten, when the code
// they reach moves.

// copyRemaining returns what n's copy of key has left (see remainingOf),
// or -1 when n holds no copy of it.
func copyRemaining(n *testNode, key string, now time.Time) int64 {
	st, ok := n.Server().replicas.Get(key)
	if !ok {
		return -1
	}
	return remainingOf(st, now)
}

// waitPushesIdle waits until every node's last hand-off pass was under
// its current ring: no push is pending, so none runs until a signal.
func waitPushesIdle(t *testing.T, nodes []*testNode) {
	t.Helper()
	eventually(t, "the hand-off passes to end", func() bool {
		for _, n := range nodes {
			s := n.Server()
			if s.custody.LastPush() != s.view.Load().ring.Fingerprint() {
				return false
			}
		}
		return true
	})
}

// firstTouchAwaitingNode1 makes n settle key as a new owner does on its
// first touch while it still awaits node1's hand-off (the key's partition
// moved to it, node1 not done): n pulls the key from node1.
func firstTouchAwaitingNode1(t *testing.T, n *testNode, key []byte) {
	t.Helper()
	s := n.Server()
	cur := s.view.Load()
	// A ring that gives n the key, which node1 never built: node1 takes
	// the pull because its own ring changed moments ago.
	r, err := ring.New([]string{n.Name()}, cur.ring.Config())
	if err != nil {
		t.Fatal(err)
	}
	v := &view{ring: r, members: cur.members, peers: cur.peers, epoch: cur.epoch}
	parts := make([]bool, r.Config().PartitionCount)
	parts[r.Partition(key)] = true
	mi := custody.NewMovingIn(r, cur.ring, parts, []string{"node1"}, time.Now().Add(time.Minute))
	s.settle(context.Background(), v, mi, key)
}
