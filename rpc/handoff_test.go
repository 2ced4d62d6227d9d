package rpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/handoff"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// handOffScenario hits 50 keys of a fixed window of 100 per hour through
// a changing set of nodes and counts what each key was allowed.
type handOffScenario struct {
	t       *testing.T
	clock   *window.ManualClock
	keys    []string
	allowed map[string]int
	// tolerateDegraded lets hit take degraded answers instead of failing
	// on them (an allowed one is counted in allowed, as every allowed
	// answer is: what a stand-in admits counts); degraded counts them.
	tolerateDegraded bool
	degraded         int
	degradedFor      map[string]int // degraded answers by key
}

func newHandOffScenario(t *testing.T) *handOffScenario {
	sc := &handOffScenario{t: t, clock: windowClock(), allowed: map[string]int{}, degradedFor: map[string]int{}}
	for i := range 50 {
		sc.keys = append(sc.keys, fmt.Sprintf("user:%d", i))
	}
	return sc
}

// scenarioForwardTimeout is the forward timeout of the hand-off scenarios:
// long, so that a loaded test machine does not turn a slow forward into a
// degraded answer (the scenarios are about counts; degraded answers have
// tests of their own).
const scenarioForwardTimeout = 5 * time.Second

// startScenarioNode starts a node for the hand-off scenarios.
func startScenarioNode(t *testing.T, name string, clock window.Clock, join ...string) *testNode {
	return startNodeWith(t, name, clock, NodeConfig{ForwardTimeout: scenarioForwardTimeout}, join...)
}

// startScenarioCluster starts n scenario nodes named node1..nodeN, joined
// through node1, and waits until their rings agree.
func startScenarioCluster(t *testing.T, n int, clock window.Clock) []*testNode {
	t.Helper()
	nodes := []*testNode{startScenarioNode(t, "node1", clock)}
	for i := 2; i <= n; i++ {
		nodes = append(nodes, startScenarioNode(t, fmt.Sprintf("node%d", i), clock, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	return nodes
}

// hit sends perKey hits on every key, spread round-robin over nodes, from
// 16 goroutines at once; every answer must come without error, not
// degraded, and within twice the forward timeout (a check whose forward
// fails while the ring changes is retried once) plus a margin.
func (sc *handOffScenario) hit(nodes []*testNode, perKey int) (allowed int) {
	t := sc.t
	t.Helper()
	type job struct {
		key string
		via *testNode
	}
	jobs := make(chan job)
	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for j := range jobs {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 3*scenarioForwardTimeout)
				resp, err := j.via.client.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{
					Name: "handoff", Key: j.key, Hits: proto.Int64(1), Limit: 100, WindowMs: 3_600_000}}})
				cancel()
				took := time.Since(start)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Sprintf("%s via %s: %v", j.key, j.via.Name(), err))
				case resp.Decisions[0].Degraded && resp.Decisions[0].Error == "" && sc.tolerateDegraded:
					sc.degraded++
					sc.degradedFor[j.key]++
					if resp.Decisions[0].Allowed {
						sc.allowed[j.key]++
						allowed++
					}
				case resp.Decisions[0].Error != "" || resp.Decisions[0].Degraded:
					errs = append(errs, fmt.Sprintf("%s via %s: %+v", j.key, j.via.Name(), resp.Decisions[0]))
				case took > 2*scenarioForwardTimeout+time.Second:
					errs = append(errs, fmt.Sprintf("%s via %s: answered after %s", j.key, j.via.Name(), took))
				case resp.Decisions[0].Allowed:
					sc.allowed[j.key]++
					allowed++
				}
				mu.Unlock()
			}
		})
	}
	for i := range perKey {
		for ki, k := range sc.keys {
			jobs <- job{k, nodes[(i+ki)%len(nodes)]}
		}
	}
	close(jobs)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d bad answers, e.g. %s", len(errs), errs[0])
	}
	return allowed
}

// wantAllowed fails unless every key was allowed exactly n hits in all. A
// degraded answer (tolerated only where a scenario says so) may stand for
// a hit the owner counted all the same (its answer came after the forward
// timeout): a key may fall short of n by at most its degraded answers,
// never exceed it.
func (sc *handOffScenario) wantAllowed(n int, when string) {
	sc.t.Helper()
	for _, k := range sc.keys {
		if got := sc.allowed[k]; got > n || got < n-sc.degradedFor[k] {
			sc.t.Errorf("%s: key %s allowed %d hits in all with %d degraded answers, want exactly %d", when, k, got, sc.degradedFor[k], n)
		}
	}
}

// logStats logs every node's routing and hand-off counters.
func logStats(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, n := range nodes {
		st := n.Server().Stats()
		st.Peers = nil
		t.Logf("%s: %+v", n.Name(), st)
	}
}

// waitRingsAgreeOnKeys waits until every node's ring has all the nodes
// and one fingerprint, then checks that they name the same owner for 10000
// sample keys.
func waitRingsAgreeOnKeys(t *testing.T, nodes []*testNode) {
	t.Helper()
	waitRingAgrees(t, nodes)
	for i := range 10000 {
		k := fmt.Sprintf("sample:%d", i)
		want := nodes[0].Server().Owner("api", k)
		for _, n := range nodes[1:] {
			if got := n.Server().Owner("api", k); got != want {
				t.Fatalf("key %s: %s names %s, %s names %s", k, n.Name(), got, nodes[0].Name(), want)
			}
		}
	}
}

// noLostState fails if a node counted a key that moved or lost its owner
// without its state.
func noLostState(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, n := range nodes {
		st := n.Server().Stats()
		if st.MovedWithoutState != 0 || st.OwnerLost != 0 || st.HandOffTimeouts != 0 || st.Degraded != 0 {
			t.Errorf("%s: moved without state %d, owner lost %d, hand-off timeouts %d, degraded %d",
				n.Name(), st.MovedWithoutState, st.OwnerLost, st.HandOffTimeouts, st.Degraded)
		}
	}
}

// Done when: 3 nodes, 60 hits on each of 50 keys (fixed window 100 per
// hour), 2 nodes join, 60 more hits per key spread over all 5: exactly 100
// allowed per key. Then 2 nodes leave gracefully and 40 more hits per key
// over the other 3: none allowed.
func TestJoinAndLeaveMoveCounts(t *testing.T) {
	sc := newHandOffScenario(t)
	nodes := startScenarioCluster(t, 3, sc.clock)
	if got := sc.hit(nodes, 60); got != 50*60 {
		t.Fatalf("first 60 hits per key: %d allowed, want all %d", got, 50*60)
	}
	nodes = append(nodes,
		startScenarioNode(t, "node4", sc.clock, nodes[0].GossipAddr()),
		startScenarioNode(t, "node5", sc.clock, nodes[2].GossipAddr()))
	waitRingAgrees(t, nodes)
	// The hits go at once: the hand-off may still be under way, and the
	// new owners pull what has not arrived on first touch.
	sc.hit(nodes, 60)
	sc.wantAllowed(100, "after 2 joined")
	waitRingsAgreeOnKeys(t, nodes)
	moved := int64(0)
	for _, n := range nodes {
		moved += n.Server().Stats().HandedOff
	}
	if moved == 0 {
		t.Fatal("no key was handed off: the joins moved nothing?")
	}
	noLostState(t, nodes)

	// node1 (a first member) and node4 (a newcomer) leave gracefully.
	for _, i := range []int{3, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := nodes[i].Close(ctx); err != nil {
			t.Fatalf("close %s: %v", nodes[i].Name(), err)
		}
		cancel()
	}
	rest := []*testNode{nodes[1], nodes[2], nodes[4]}
	waitRingsAgreeOnKeys(t, rest)
	if got := sc.hit(rest, 40); got != 0 {
		t.Errorf("after 2 left: %d of %d hits allowed, want none", got, 50*40)
	}
	sc.wantAllowed(100, "after 2 left")
	noLostState(t, rest)
}

// replace closes old gracefully and starts a node named name in its place,
// joined through via, and returns the new member list.
func replace(t *testing.T, clock window.Clock, nodes []*testNode, old int, name string, via *testNode) []*testNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[old].Close(ctx); err != nil {
		t.Fatalf("close %s: %v", nodes[old].Name(), err)
	}
	out := append([]*testNode(nil), nodes[:old]...)
	out = append(out, nodes[old+1:]...)
	waitRingAgrees(t, out)
	out = append(out, startScenarioNode(t, name, clock, via.GossipAddr()))
	waitRingsAgreeOnKeys(t, out)
	return out
}

// Done when: a rolling replacement of every node, one at a time, with 20
// hits per key after each step (120 in all): exactly 100 per key.
func TestRollingReplacementKeepsCounts(t *testing.T) {
	sc := newHandOffScenario(t)
	nodes := startScenarioCluster(t, 3, sc.clock)
	sc.hit(nodes, 60)
	for step, name := range []string{"node1", "node2", "node3"} {
		i := 0
		for nodes[i].Name() != name {
			i++
		}
		via := nodes[(i+1)%len(nodes)]
		nodes = replace(t, sc.clock, nodes, i, name+"-b", via)
		sc.hit(nodes, 20)
		if step < 2 {
			sc.wantAllowed(80+20*step, fmt.Sprintf("after replacing %s", name))
		}
	}
	sc.wantAllowed(100, "after every node was replaced")
	noLostState(t, nodes)
	if t.Failed() {
		logStats(t, nodes)
	}
}

// Done when: replacing only the owner of a key keeps every key's count:
// 60 hits, the owner of user:0 is replaced, 60 more: exactly 100 per key.
func TestReplacingAnOwnerKeepsCounts(t *testing.T) {
	sc := newHandOffScenario(t)
	nodes := startScenarioCluster(t, 3, sc.clock)
	sc.hit(nodes, 60)
	owner := nodes[0].Server().Owner("handoff", "user:0")
	i := 0
	for nodes[i].Name() != owner {
		i++
	}
	nodes = replace(t, sc.clock, nodes, i, owner+"-b", nodes[(i+1)%3])
	sc.hit(nodes, 60)
	sc.wantAllowed(100, "after replacing "+owner)
	noLostState(t, nodes)
}

// A pull takes a key's state away from the node that holds it, so on a
// ring that has not changed for a while a member may pull only the keys it
// owns: node2 pulling a key of node1's (through its own pull path, and by a
// Pull call of its own) gets nothing, and node1's exhausted key stays
// exhausted. (A pull that a new owner makes while rings change is taken:
// the join tests above and below exercise it.)
func TestPullOfAKeyNotOwnedIsRefused(t *testing.T) {
	clock := windowClock()
	nodes := startCluster(t, 2, clock)
	s1, s2 := nodes[0].Server(), nodes[1].Server()
	eventually(t, "node1's ring to be stable past the churn window", func() bool {
		return time.Since(s1.rings.LastChange()) > handoff.PullChurnWindow
	})
	k := keyOwnedBy(t, nodes[0], "pull", "node1")
	rc := &sluicev1.RateLimitCheck{Name: "pull", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}
	for range 10 {
		if !check(t, nodes[0].client, rc).Allowed {
			t.Fatal("denied under the limit")
		}
	}
	key := ring.Key(nil, "pull", k)
	v := s2.view.Load()
	mi := custody.NewMovingIn(v.ring, v.ring, make([]bool, v.ring.Config().PartitionCount), []string{"node1"}, time.Now().Add(time.Minute))
	s2.settle(context.Background(), v, mi, key)
	resp, err := dialPeer(t, nodes[0].GRPCAddr()).Pull(context.Background(),
		&sluicev1.PullRequest{Sender: "node2", RingFingerprint: v.ring.Fingerprint(), Keys: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.States) != 0 || len(resp.Replicas) != 0 {
		t.Fatalf("node1 gave node2 a key node2 does not own: %v", resp)
	}
	// Under a ring node1 never built (a made-up fingerprint), on a ring
	// that has not changed for a while: refused too.
	resp, err = dialPeer(t, nodes[0].GRPCAddr()).Pull(context.Background(),
		&sluicev1.PullRequest{Sender: "node2", RingFingerprint: "0123456789abcdef", Keys: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.States) != 0 || len(resp.Replicas) != 0 {
		t.Fatalf("node1 gave node2 a key under a made-up ring: %v", resp)
	}
	if _, ok := s1.store.Get(string(key)); !ok {
		t.Fatal("node1 lost the key's state to a pull")
	}
	for _, n := range nodes {
		if d := check(t, n.client, rc); d.Allowed || d.Owner != "node1" || d.Remaining != 0 {
			t.Fatalf("check via %s after the pulls: %+v, want node1 deciding, used up", n.Name(), d)
		}
	}
	if got := s1.Stats().HandOffRefused; got < 3 {
		t.Errorf("node1 counted %d refused pulls, want at least 3", got)
	}
}

// Beyond the scenario: 2 nodes join while hits are under way (40
// per key before, 40 during the joins, 40 after over all 5): the owners
// still admit exactly 100 per key. The joins' hand-offs race the hits; the
// new owners pull what has not arrived. A few checks racing a join can
// find their forward failing twice and get a degraded answer (which the
// issue allows: "correct or marked degraded"; about 1 in 1000 here). The
// owner may have counted such a check (its answer came too late), so a
// key may fall short of 100 by its degraded answers, never exceed it; and
// there must be few.
func TestJoinDuringHitsKeepsCounts(t *testing.T) {
	sc := newHandOffScenario(t)
	nodes := startScenarioCluster(t, 3, sc.clock)
	sc.hit(nodes, 40)
	sc.tolerateDegraded = true
	var wg sync.WaitGroup
	wg.Go(func() { sc.hit(nodes, 40) })
	more := []*testNode{
		startScenarioNode(t, "node4", sc.clock, nodes[0].GossipAddr()),
		startScenarioNode(t, "node5", sc.clock, nodes[1].GossipAddr())}
	wg.Wait()
	all := append(nodes, more...)
	waitRingAgrees(t, all)
	sc.tolerateDegraded = false
	sc.hit(all, 40)
	sc.wantAllowed(100, "joins during hits")
	if checks := 40 * len(sc.keys); sc.degraded*50 > checks {
		t.Errorf("%d of the %d checks racing the joins were degraded, want under 2%%", sc.degraded, checks)
	}
	t.Logf("%d degraded answers while the nodes joined", sc.degraded)
	if t.Failed() {
		logStats(t, all)
	}
}

// TestCheckDecidedAsTheRingChangesGoesToTheNewOwner: a check that an
// owner took under its old view, and would decide only after the key was
// handed off (the e2e scale test lost such a hit on a loaded machine: 101
// admitted of 100), goes to the key's new owner instead, which counts it
// with the rest. The check is held inside the owner's decision until the
// owner's leave is over and the others have seen it leave.
func TestCheckDecidedAsTheRingChangesGoesToTheNewOwner(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var (
		armed    atomic.Bool
		once     sync.Once
		storeKey []byte
	)
	hookDecideOwned(t, func(s *Server, k []byte) {
		if s.name == "node2" && armed.Load() && string(k) == string(storeKey) {
			once.Do(func() { close(entered); <-release })
		}
	})
	clock := windowClock()
	nodes := startScenarioCluster(t, 3, clock)
	key := keyOwnedBy(t, nodes[0], "handoff", "node2")
	storeKey = ring.Key(nil, "handoff", key)
	rc := lateCheck(key)
	for range 10 {
		if d := check(t, nodes[0].client, rc(1)); !d.Allowed || d.Owner != "node2" {
			t.Fatalf("hit before the leave: %+v, want allowed by node2", d)
		}
	}
	armed.Store(true)
	late := make(chan *sluicev1.Decision, 1)
	go func() {
		resp, err := nodes[0].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc(1)}})
		if err != nil || len(resp.Decisions) != 1 {
			t.Errorf("the late check: %v %v", resp, err)
			late <- nil
			return
		}
		late <- resp.Decisions[0]
	}()
	<-entered
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		closed <- nodes[1].Close(ctx)
	}()
	// node2's hand-off is over once it leaves the gossip: Close leaves
	// only after it.
	rest := []*testNode{nodes[0], nodes[2]}
	eventually(t, "node1 and node3 to see node2 leave", func() bool {
		for _, n := range rest {
			for _, m := range n.cluster.Members() {
				if m.Name == "node2" {
					return false
				}
			}
		}
		return true
	})
	close(release)
	d := <-late
	if d == nil {
		t.FailNow()
	}
	newOwner := nodes[0].Server().Owner("handoff", key)
	if !d.Allowed || d.Degraded || d.Owner != newOwner || d.Remaining != 100-11 {
		t.Fatalf("the late check: %+v, want allowed by %s with 89 remaining (the 11th hit, counted by the new owner)", d, newOwner)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close node2: %v", err)
	}
	waitRingAgrees(t, rest)
	wantRemaining(t, rest, rc, 100-11)
}

// lateCheck returns the check of key the late-check tests send, of hits.
func lateCheck(key string) func(hits int64) *sluicev1.RateLimitCheck {
	return func(hits int64) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "handoff", Key: key, Hits: proto.Int64(hits), Limit: 100, WindowMs: 3_600_000}
	}
}

// wantRemaining peeks with rc via every node of nodes and fails unless each
// answers want, from an owner among nodes.
func wantRemaining(t *testing.T, nodes []*testNode, rc func(int64) *sluicev1.RateLimitCheck, want int64) {
	t.Helper()
	names := map[string]bool{}
	for _, n := range nodes {
		names[n.Name()] = true
	}
	for _, n := range nodes {
		if d := check(t, n.client, rc(0)); !names[d.Owner] || d.Remaining != want {
			t.Errorf("peek via %s: owner %s remaining %d, want %d from one of %v", n.Name(), d.Owner, d.Remaining, want, names)
		}
	}
}

// TestFinishLeaveHandsOffLateKeys: a hit decided by a leaving node after
// its hand-off (a reforwarded check is decided wherever it lands) is
// handed off by FinishLeave, which Close calls once no call is in flight.
func TestFinishLeaveHandsOffLateKeys(t *testing.T) {
	clock := windowClock()
	nodes := startScenarioCluster(t, 3, clock)
	key := keyOwnedBy(t, nodes[0], "handoff", "node2")
	rc := lateCheck(key)
	for range 10 {
		if d := check(t, nodes[0].client, rc(1)); !d.Allowed || d.Owner != "node2" {
			t.Fatalf("hit before the leave: %+v, want allowed by node2", d)
		}
	}
	s := nodes[1].Server()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.FinishLeave(ctx); err == nil {
		t.Fatal("FinishLeave before Leave: no error")
	}
	if err := s.Leave(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	if n := s.store.Len(); n != 0 {
		t.Fatalf("%d keys left on node2 after its hand-off, want 0", n)
	}
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{rc(1)}, nil, false)
	if fe != nil {
		t.Fatal(fe)
	}
	if d := s.decide(ring.Key(nil, "handoff", key), &reqs[0]); !d.Allowed || d.Remaining != 99 {
		t.Fatalf("the late hit: %+v", d)
	}
	if err := s.FinishLeave(ctx); err != nil {
		t.Fatalf("finish leave: %v", err)
	}
	if n := s.store.Len(); n != 0 {
		t.Fatalf("%d keys left on node2 after FinishLeave, want 0", n)
	}
	rest := []*testNode{nodes[0], nodes[2]}
	wantRemaining(t, rest, rc, 100-11)
}
