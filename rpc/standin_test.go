package rpc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// byName returns the node called name.
func byName(t *testing.T, nodes []*testNode, name string) *testNode {
	t.Helper()
	for _, n := range nodes {
		if n.Name() == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return nil
}

// A killed owner's key, under the default policy: the checks that come
// while its death is not yet known are decided by its stand-in holder (the
// member after it on the ring) from the copy plus what it admitted since,
// whichever node they enter by, and what it admits reaches the key's next
// owner: with the copy up to date, the key admits exactly its limit across
// the crash, degraded answers included.
func TestKilledOwnerStandInCountsWhatItAdmits(t *testing.T) {
	clock := windowClock()
	nodes := startReplicatedCluster(t, clock)
	k := keyOwnedBy(t, nodes[0], "standin", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "standin", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	allowed := 0
	for range 6 {
		if d := check(t, nodes[0].client, rc); !d.Allowed || d.Owner != "node2" || d.Degraded {
			t.Fatalf("before the crash: %+v", d)
		}
		allowed++
	}
	key := string(ring.Key(nil, "standin", k))
	holder := nodes[0].Server().standInHolder(nodes[0].Server().view.Load(), "node2")
	if holder == "" || holder == "node2" {
		t.Fatalf("stand-in holder of node2: %q", holder)
	}
	waitCopied(t, nodes[1], key, byName(t, nodes, holder))
	nodes[1].Kill()
	survivors := []*testNode{nodes[0], nodes[2]}
	// Until the survivors drop node2 from their rings, every check is
	// degraded and decided by the holder, through either survivor.
	degraded, degradedAllowed := 0, int64(0)
	for i := 0; i < 8; i++ {
		d := check(t, survivors[i%2].client, rc)
		if !d.Degraded {
			break // the ring changed already
		}
		degraded++
		if d.Owner != holder {
			t.Fatalf("degraded answer %d decided by %s, want the stand-in holder %s: %+v", i, d.Owner, holder, d)
		}
		if d.Allowed {
			allowed++
			degradedAllowed++
		}
	}
	if degraded == 0 {
		t.Skip("the survivors dropped node2 before a check was degraded (not the case under test)")
	}
	waitRingAgrees(t, survivors)
	for i := range 10 {
		if d := check(t, survivors[i%2].client, rc); d.Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("%d allowed across the crash (%d degraded answers), want exactly the limit 10", allowed, degraded)
	}
	var admitted int64
	for _, n := range survivors {
		admitted += n.Server().Stats().StandInAdmitted
	}
	if admitted != degradedAllowed {
		t.Fatalf("the stand-ins counted %d admitted hits, the clients got %d degraded allowed answers", admitted, degradedAllowed)
	}
}

// A stand-in decision for a live owner (an entry node could not reach it,
// its holder can) goes to the owner: the owner's count holds it.
func TestStandInHitsGoBackToALiveOwner(t *testing.T) {
	clock := windowClock()
	nodes := startReplicatedCluster(t, clock)
	k := keyOwnedBy(t, nodes[0], "standin", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "standin", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, nodes[0].client, rc); !d.Allowed || d.Degraded {
			t.Fatalf("before: %+v", d)
		}
	}
	key := string(ring.Key(nil, "standin", k))
	s := nodes[0].Server()
	holder := s.standInHolder(s.view.Load(), "node2")
	waitCopied(t, nodes[1], key, byName(t, nodes, holder))
	// As if node1's forwards to node2 had failed.
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc, rc, rc}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	out := make([]*sluicev1.Decision, 3)
	fails := []failure{{0, "node2", "test"}, {1, "node2", "test"}, {2, "node2", "test"}}
	s.answerUnavailable(context.Background(), reqs, fails, out)
	for i, d := range out {
		if !d.Allowed || !d.Degraded || d.Owner != holder {
			t.Fatalf("stand-in answer %d: %+v, want allowed, degraded, by %s", i, d, holder)
		}
		if want := int64(10 - 5 - 1 - i); d.Remaining != want {
			t.Fatalf("stand-in answer %d: remaining %d, want %d (the copy's 5 counted)", i, d.Remaining, want)
		}
	}
	// The owner gets the 3 hits: 2 left.
	eventually(t, "the stand-in hits to reach the owner", func() bool {
		st, ok := nodes[1].Store().Get(key)
		return ok && st.Expires().After(clock.Now()) && peekRemaining(t, nodes[1], rc) == 2
	})
	allowed := 0
	for range 5 {
		if d := check(t, nodes[2].client, rc); d.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("%d allowed after the stand-in hits went back, want 2", allowed)
	}
}

// A node decides stand-in checks for a live owner that is not the owner
// of its copies (an entry node's ring still names a dead owner whose
// holder this node was, while this node's ring gives the key to another
// member; no newer copy of the key comes here): the hits it handed on to
// the owner still count in its window. A window that forgot them (they
// went to the owner, and were taken out of it to wait for a copy that
// never comes) admitted the key's whole budget again after every flush.
func TestStandInWindowKeepsTheHitsItHandedOn(t *testing.T) {
	clock := windowClock()
	nodes := startReplicatedCluster(t, clock)
	s := nodes[0].Server()
	// The member after node1 on the ring: its copies go to the third
	// member, never to node1.
	owner := s.view.Load().ring.SuccessorsOf("node1", 1)[0]
	k := keyOwnedBy(t, nodes[0], "handed-on", owner)
	rc := &sluicev1.RateLimitCheck{Name: "handed-on", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	key := ring.Key(nil, "handed-on", k)
	admitted := 0
	for cycle := range 3 {
		for range 10 {
			if d := s.standInDecide(key, reqs[0], ""); d.Allowed {
				admitted++
			}
		}
		// What the stand-in loop does every replication interval (twice:
		// a window with nothing left to hand on may be dropped).
		for range 2 {
			if failed := s.flushStandIns(context.Background()); len(failed) > 0 {
				t.Fatalf("cycle %d: flush failed: %v", cycle, failed)
			}
		}
	}
	if admitted != 10 {
		t.Fatalf("node1 admitted %d stand-in hits of a limit of 10 over 3 flushes", admitted)
	}
	eventually(t, "the owner to count the 10 hits", func() bool {
		return peekRemaining(t, byName(t, nodes, owner), rc) == 0
	})
}

// peekRemaining peeks rc's key at n.
func peekRemaining(t *testing.T, n *testNode, rc *sluicev1.RateLimitCheck) int64 {
	t.Helper()
	p := proto.CloneOf(rc)
	p.Hits = proto.Int64(0)
	return check(t, n.client, p).Remaining
}

// A forwarded check that reaches its owner after the sender's deadline is
// not applied (the sender answered it without the owner); one within it
// is.
func TestForwardAfterItsDeadlineIsNotApplied(t *testing.T) {
	clock := windowClock()
	n := startNode(t, "node1", clock)
	peer := dialPeer(t, n.GRPCAddr())
	rc := &sluicev1.RateLimitCheck{Name: "late", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	resp, err := peer.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node9", Checks: []*sluicev1.RateLimitCheck{rc},
		DeadlineUnixNs: time.Now().Add(-time.Millisecond).UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Allowed || d.Error != errExpired {
		t.Fatalf("late check: %+v, want not applied (%q)", d, errExpired)
	}
	if _, ok := n.Store().Get(string(ring.Key(nil, "late", "k"))); ok {
		t.Fatalf("the late check was counted")
	}
	if got := n.Server().Stats().Expired; got != 1 {
		t.Fatalf("Expired = %d, want 1", got)
	}
	resp, err = peer.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node9", Checks: []*sluicev1.RateLimitCheck{rc},
		DeadlineUnixNs: time.Now().Add(time.Minute).UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; !d.Allowed || d.Remaining != 9 || d.AppliedAtNs != clock.Now().UnixNano() {
		t.Fatalf("check in time: %+v, want allowed, 9 left, applied at the owner's clock", d)
	}
}

// A Check of several limits consumes all or none: with B used up, A is
// given back (wherever the two keys' owners are), the answer says so, and
// A's budget is whole afterwards.
func TestCheckOfSeveralLimitsIsAllOrNothing(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 3, clock)
	for round, sameOwner := range []bool{false, true} {
		ka := keyOwnedBy(t, nodes[0], "wide", "node2")
		owner := "node3"
		if sameOwner {
			owner = "node2"
		}
		kb := keyOwnedBy(t, nodes[0], "tight", owner)
		a := &sluicev1.RateLimitCheck{Name: "wide", Key: ka, Hits: proto.Int64(2), Limit: 5, WindowMs: 60_000}
		b := &sluicev1.RateLimitCheck{Name: "tight", Key: kb, Hits: proto.Int64(1), Limit: 1, WindowMs: 60_000}
		if sameOwner { // other algorithms too: every one refunds
			a.Key = keyOwnedBy(t, nodes[0], "wide", owner)
			a.Algorithm = sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET
			b.Algorithm = sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW
		}
		if d := check(t, nodes[0].client, b); !d.Allowed {
			t.Fatalf("using up B: %+v", d)
		}
		for i, via := range nodes {
			resp, err := via.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{a, b}, AllOrNothing: true})
			if err != nil {
				t.Fatal(err)
			}
			da, db := resp.Decisions[0], resp.Decisions[1]
			if da.Allowed || !da.Refunded || da.Remaining != 5 || da.RetryAfter != 0 || da.AppliedAtNs != 0 {
				t.Fatalf("same owner %v, try %d via %s: A answered %+v, want refunded, not allowed, 5 left", sameOwner, i, via.Name(), da)
			}
			if db.Allowed || db.Refunded {
				t.Fatalf("B answered %+v, want denied", db)
			}
		}
		if got := peekRemaining(t, nodes[1], a); got != 5 {
			t.Fatalf("same owner %v: A has %d left after 3 refused requests, want 5 (untouched)", sameOwner, got)
		}
		var refunds int64
		for _, n := range nodes {
			refunds += n.Server().Stats().Refunds
		}
		if want := int64(3 * (round + 1)); refunds != want { // one per refused request
			t.Fatalf("%d refunds counted, want %d", refunds, want)
		}
	}
}

// 40 concurrent requests of [wide, tight]: exactly tight's limit of them
// are allowed, and wide counts exactly those: a refused request charges
// neither.
func TestConcurrentSeveralLimitsChargeNoRefusedRequest(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 3, clock)
	wide := &sluicev1.RateLimitCheck{Name: "wide", Key: keyOwnedBy(t, nodes[0], "wide", "node2"), Hits: proto.Int64(1), Limit: 1000, WindowMs: 60_000}
	tight := &sluicev1.RateLimitCheck{Name: "tight", Key: keyOwnedBy(t, nodes[0], "tight", "node3"), Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	results := make(chan bool, 40)
	for i := range 40 {
		go func() {
			resp, err := nodes[i%3].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{wide, tight}, AllOrNothing: true})
			if err != nil {
				t.Error(err)
				results <- false
				return
			}
			ok := resp.Decisions[0].Allowed && resp.Decisions[1].Allowed
			if !ok && resp.Decisions[0].Allowed != resp.Decisions[1].Allowed {
				t.Errorf("half-allowed request: %+v", resp.Decisions)
			}
			results <- ok
		}()
	}
	allowed := 0
	for range 40 {
		if <-results {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("%d requests allowed, want 10 (tight's limit)", allowed)
	}
	if got := peekRemaining(t, nodes[0], wide); got != 1000-10 {
		t.Fatalf("wide has %d left, want %d: refused requests were charged", got, 1000-10)
	}
}

// A client may not send a refund.
func TestClientRefundIsRefused(t *testing.T) {
	n := startNode(t, "node1", windowClock())
	_, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "a", Key: "k", Limit: 1, WindowMs: 1000, RefundAtNs: 5}}})
	if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "checks[0].refund_at_ns:") {
		t.Fatalf("err = %v, want INVALID_ARGUMENT naming checks[0].refund_at_ns", err)
	}
}

// Without all_or_nothing a Check's checks are independent (a batch of
// many callers' checks): B's denial leaves A counted.
func TestCheckBatchWithoutAllOrNothingIsIndependent(t *testing.T) {
	n := startNode(t, "node1", windowClock())
	a := &sluicev1.RateLimitCheck{Name: "a", Key: "k", Hits: proto.Int64(1), Limit: 5, WindowMs: 60_000}
	b := &sluicev1.RateLimitCheck{Name: "b", Key: "k", Hits: proto.Int64(2), Limit: 1, WindowMs: 60_000}
	resp, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; !d.Allowed || d.Refunded || d.Remaining != 4 {
		t.Fatalf("A: %+v, want allowed with 4 left", d)
	}
	if got := peekRemaining(t, n, a); got != 4 {
		t.Fatalf("A has %d left, want 4", got)
	}
}

// A node killed and restarted under its name at new ports at once, while
// the cluster still holds its old process alive or suspect: the new
// process does not join (it is not serving, and refuses checks) until the
// old one is declared dead, so two processes never decide one key; meanwhile
// the old one's keys are decided by its stand-in holder, counted; once
// joined the new process gets its keys' copies and the stand-in hits, so
// the key admits exactly its limit across the crash and the restart.
func TestRestartBeforeTheOldProcessIsDeclaredDead(t *testing.T) {
	clock := windowClock()
	nodes := startReplicatedCluster(t, clock)
	k := keyOwnedBy(t, nodes[0], "restart", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "restart", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	allowed := 0
	for range 5 {
		if d := check(t, nodes[0].client, rc); !d.Allowed || d.Owner != "node2" {
			t.Fatalf("before the crash: %+v", d)
		}
		allowed++
	}
	key := string(ring.Key(nil, "restart", k))
	waitCopied(t, nodes[1], key, nodes[0], nodes[2])
	nodes[1].Kill()
	back := startNodeWith(t, "node2", clock, fastReplication, nodes[0].GossipAddr())
	if err := back.Ready(); err == nil {
		t.Fatalf("the new node2 is ready while its old process is not yet declared dead")
	}
	if _, err := back.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a check at the new node2 before it joined: %v, want UNAVAILABLE", err)
	}
	// Two hits while the new process waits: degraded, counted.
	for i := range 2 {
		d := check(t, nodes[i%2*2].client, rc)
		if d.Allowed {
			allowed++
		}
	}
	all := []*testNode{nodes[0], back, nodes[2]}
	waitRingAgrees(t, all)
	eventually(t, "the new node2 to be ready", func() bool { return back.Ready() == nil })
	for i := range 6 {
		d := check(t, all[i%3].client, rc)
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		logStats(t, all)
		t.Fatalf("%d allowed across the crash and the restart, want exactly the limit 10", allowed)
	}
}

// A leaving node that cannot pass a forwarded check on to the key's next
// owner decides nothing itself (what it counted could not reach the owner
// once the others have taken it out of their rings): it answers the check
// undecided, and its sender answers it as one whose owner it could not
// reach (e2e: a graceful scale-in admitted 201 of 200 so).
func TestLeavingNodeDecidesNothingItCannotPassOn(t *testing.T) {
	s, err := NewServer(ServerConfig{Name: "node1", Store: window.NewStore(window.StoreConfig{Clock: windowClock()}),
		Logger: testLogger(), ForwardTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	members := []cluster.Member{{Name: "node1", State: cluster.Alive}, {Name: "node2", GRPCAddr: testnet.DeadAddr(t), State: cluster.Alive}}
	if err := s.SetMembers(members); err != nil {
		t.Fatal(err)
	}
	s.leaving.Store(true)
	if err := s.SetMembers(members); err != nil { // the ring without node1: node2 owns every key
		t.Fatal(err)
	}
	rc := &sluicev1.RateLimitCheck{Name: "leave", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	resp, err := s.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node2", Checks: []*sluicev1.RateLimitCheck{rc}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Allowed || d.Error != errNotDecided {
		t.Fatalf("answer %+v, want not decided (%q)", d, errNotDecided)
	}
	if n := s.fbKeys.Load(); n != 0 || s.store.Len() != 0 {
		t.Fatalf("the leaving node counted the check: %d stand-in windows, %d keys", n, s.store.Len())
	}
	out := make([]*sluicev1.Decision, 1)
	if late := s.answered("node1", []int{0}, resp.Decisions, out); len(late) != 1 || out[0] != nil {
		t.Fatalf("the sender takes the answer as %+v, late %v; want it as not reached", out[0], late)
	}
}

// A stand-in holder that pushed a dead owner's copy to the key's new owner
// (its ring dropped the dead owner) no longer decides the key from what it
// holds: stand-in checks that still come to it (from an entry node whose
// ring lags, still naming the dead owner) go to the new owner, which
// counts them with the copy. Decided at the holder, they started from a
// window without the copy (or one behind the owner's count).
func TestStandInChecksAfterTheHoldersPushGoToTheNewOwner(t *testing.T) {
	clock := windowClock()
	cfg := NodeConfig{ForwardTimeout: time.Second, Replication: ReplicationConfig{Interval: 20 * time.Millisecond}}
	nodes := []*testNode{startNodeWith(t, "node1", clock, cfg)}
	for _, name := range []string{"node2", "node3", "node4"} {
		nodes = append(nodes, startNodeWith(t, name, clock, cfg, nodes[0].GossipAddr()))
	}
	waitRingsAgreeOnKeys(t, nodes)
	r0 := nodes[0].Server().view.Load().ring
	// A victim, a key of it whose new owner is not its holder, and an
	// entry node that is neither.
	var victim, holder, newOwner, entry *testNode
	var k string
	for _, o := range nodes {
		var rest []string
		for _, n := range nodes {
			if n != o {
				rest = append(rest, n.Name())
			}
		}
		after, err := ring.New(rest, r0.Config())
		if err != nil {
			t.Fatal(err)
		}
		h := r0.SuccessorsOf(o.Name(), 1)[0]
		for i := range 1000 {
			key := fmt.Sprintf("user:%d", i)
			sk := ring.Key(nil, "pushed", key)
			if c := after.Owner(sk); r0.Owner(sk) == o.Name() && c != h {
				victim, holder, newOwner, k = o, byName(t, nodes, h), byName(t, nodes, c), key
				break
			}
		}
		if victim != nil {
			break
		}
	}
	if victim == nil {
		t.Fatal("no key whose new owner is not its holder")
	}
	for _, n := range nodes {
		if n != victim && n != holder && n != newOwner {
			entry = n
		}
	}
	rc := &sluicev1.RateLimitCheck{Name: "pushed", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000}
	for range 5 {
		if d := check(t, entry.client, rc); !d.Allowed || d.Owner != victim.Name() {
			t.Fatalf("before the kill: %+v", d)
		}
	}
	key := string(ring.Key(nil, "pushed", k))
	waitCopied(t, victim, key, holder)
	// The entry node's ring keeps the victim (gossip slow to reach it).
	entry.Server().hooks.holdMembers.Store(true)
	victim.Kill()
	defer func() {
		if t.Failed() {
			st, _ := newOwner.Store().Get(key)
			t.Logf("victim %s, holder %s (ring %v, tomb %q), new owner %s (%d hits), entry %s", victim.Name(), holder.Name(),
				holder.Server().view.Load().ring.Members(), holder.Server().custody.TombFor([]byte(key)), newOwner.Name(), fixedHits(st, clock.Now()), entry.Name())
		}
	}()
	eventually(t, "the holder to hand the copy to the new owner", func() bool {
		st, ok := newOwner.Store().Get(key)
		return ok && fixedHits(st, clock.Now()) == 5 && holder.Server().custody.TombFor([]byte(key)) == newOwner.Name()
	})
	allowed := 0
	for range 10 {
		if d := check(t, entry.client, rc); d.Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("%d of 10 checks allowed through the lagging entry node after the copy's 5 hits, want 5", allowed)
	}
}
