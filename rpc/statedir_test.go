package rpc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// stateKeys is the keys of the state tests: 60 keys over the four
// algorithms, limit 20 an hour, and how many of each the tests admit
// before the stop (1..19: never all).
type stateKeys struct {
	keys     []string
	rcs      []*sluicev1.RateLimitCheck
	admitted []int // allowed answers so far, by key
}

const stateLimit = 20

func newStateKeys() *stateKeys {
	sk := &stateKeys{}
	for i := range 60 {
		k := fmt.Sprintf("user:%d", i)
		sk.keys = append(sk.keys, k)
		sk.rcs = append(sk.rcs, &sluicev1.RateLimitCheck{Name: "persist", Key: k, Hits: proto.Int64(1), Limit: stateLimit,
			WindowMs: 3_600_000, Algorithm: algorithms[i%len(algorithms)]})
		sk.admitted = append(sk.admitted, 0)
	}
	return sk
}

// hit sends n(i) checks of each key i, round robin over nodes, and counts
// the allowed answers.
func (sk *stateKeys) hit(t *testing.T, nodes []*testNode, n func(i int) int) {
	t.Helper()
	c := 0
	for i, rc := range sk.rcs {
		for range n(i) {
			if d := check(t, nodes[c%len(nodes)].client, rc); d.Allowed {
				sk.admitted[i]++
			}
			c++
		}
	}
}

// wantRemaining peeks at every key through the nodes in turn and wants
// exactly the limit minus what was admitted; then it spends each key's
// budget (limit+3 checks round robin) and wants the allowed answers of
// both sides of the restart to add up to the limit exactly.
func (sk *stateKeys) wantRemaining(t *testing.T, nodes []*testNode, what string) {
	t.Helper()
	for i, rc := range sk.rcs {
		p := proto.Clone(rc).(*sluicev1.RateLimitCheck)
		p.Hits = proto.Int64(0)
		d := check(t, nodes[i%len(nodes)].client, p)
		if want := int64(stateLimit - sk.admitted[i]); d.Remaining != want {
			t.Errorf("%s: key %s (%s) remaining %d, want %d (%d admitted before)", what, rc.Key, rc.Algorithm, d.Remaining, want, sk.admitted[i])
		}
	}
	before := append([]int(nil), sk.admitted...)
	sk.hit(t, nodes, func(int) int { return stateLimit + 3 })
	for i, rc := range sk.rcs {
		if sk.admitted[i] != stateLimit {
			t.Errorf("%s: key %s (%s) admitted %d in all (%d before the restart), want exactly %d", what, rc.Key, rc.Algorithm, sk.admitted[i], before[i], stateLimit)
		}
	}
}

// startStateCluster starts node1..node3 on the state dirs, joined through
// node1, and waits until their rings agree and their hand-offs have run.
func startStateCluster(t *testing.T, clock window.Clock, dirs []string, cfg NodeConfig) []*testNode {
	t.Helper()
	c := cfg
	c.StateDir = dirs[0]
	nodes := []*testNode{startNodeWith(t, "node1", clock, c)}
	for i := 2; i <= 3; i++ {
		c.StateDir = dirs[i-1]
		nodes = append(nodes, startNodeWith(t, fmt.Sprintf("node%d", i), clock, c, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	waitPushesIdle(t, nodes)
	return nodes
}

// savedKeys reads the state files in dirs and counts each store key's
// appearances in them.
func savedKeys(t *testing.T, dirs []string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i, d := range dirs {
		f, err := readStateFile(filepath.Join(d, stateFileName(fmt.Sprintf("node%d", i+1))))
		if err != nil {
			t.Fatal(err)
		}
		if f == nil {
			continue
		}
		for _, k := range f.keys {
			seen[k]++
		}
	}
	return seen
}

// Three nodes stopped whole (Close at once, as SIGTERM to all) and started
// again on their state dirs, at new ports, keep every count: each key has
// exactly its limit minus what was admitted left, and the allowed answers
// before and after add up to the limit. Every key is in exactly one file.
func TestWholeClusterRestartKeepsCounts(t *testing.T) {
	clock := windowClock()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStateCluster(t, clock, dirs, NodeConfig{ForwardTimeout: 2 * time.Second})
	sk := newStateKeys()
	sk.hit(t, nodes, func(i int) int { return i%19 + 1 })
	for i, n := range sk.admitted {
		if n != i%19+1 {
			t.Fatalf("key %s: %d admitted before the stop, want all %d", sk.keys[i], n, i%19+1)
		}
	}

	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_ = n.Close(ctx) // the last ones cannot hand off: they say so
		})
	}
	wg.Wait()
	seen := savedKeys(t, dirs)
	for _, k := range sk.keys {
		if sk := string(ring.Key(nil, "persist", k)); seen[sk] != 1 {
			t.Errorf("key %s is in %d state files, want 1", k, seen[sk])
		}
	}

	nodes = startStateCluster(t, clock, dirs, NodeConfig{ForwardTimeout: 2 * time.Second})
	sk.wantRemaining(t, nodes, "after the restart")
	for i, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, stateFileName(fmt.Sprintf("node%d", i+1)))); err == nil {
			t.Errorf("%s: the state file applied at start is still there", d)
		}
	}
}

// A crash of the whole cluster (Kill ×3) after each node wrote a snapshot
// (SaveState, as every --state-interval does): started again, every key
// has its count as of the snapshots; the hits admitted after them are what
// the crash lost.
func TestWholeClusterCrashRestartsFromSnapshots(t *testing.T) {
	clock := windowClock()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStateCluster(t, clock, dirs, NodeConfig{ForwardTimeout: 2 * time.Second})
	sk := newStateKeys()
	sk.hit(t, nodes, func(i int) int { return i%17 + 1 })
	for _, n := range nodes {
		if err := n.SaveState(); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := append([]int(nil), sk.admitted...)
	sk.hit(t, nodes, func(int) int { return 2 }) // after the snapshots: lost in the crash
	for _, n := range nodes {
		n.Kill()
	}
	if seen := savedKeys(t, dirs); len(seen) != len(sk.keys) {
		t.Fatalf("the snapshots hold %d keys, want %d", len(seen), len(sk.keys))
	}
	nodes = startStateCluster(t, clock, dirs, NodeConfig{ForwardTimeout: 2 * time.Second})
	sk.admitted = snapshot
	sk.wantRemaining(t, nodes, "after the crash")
}

// One node crashes while the others run: they hold copies of its keys,
// which stand in for it and come back to its new process. Its snapshot is
// then not applied (it would count those hits twice), and removed.
func TestCrashedNodeSnapshotNotAppliedInLiveCluster(t *testing.T) {
	clock := windowClock()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStateCluster(t, clock, dirs, fastReplication)
	rc := func(k string) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "crash", Key: k, Hits: proto.Int64(1), Limit: stateLimit, WindowMs: 3_600_000}
	}
	var keys []string
	for i := 0; len(keys) < 10; i++ {
		if k := fmt.Sprintf("user:%d", i); nodes[0].Server().Owner("crash", k) == "node2" {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		for range 8 {
			if d := check(t, nodes[0].client, rc(k)); !d.Allowed {
				t.Fatalf("key %s: denied before its limit", k)
			}
		}
		waitCopied(t, nodes[1], string(ring.Key(nil, "crash", k)), nodes[0], nodes[2])
	}
	if err := nodes[1].SaveState(); err != nil {
		t.Fatal(err)
	}
	nodes[1].Kill()
	eventually(t, "node2 to leave the others' rings", func() bool {
		return !nodes[0].Server().view.Load().ring.Has("node2") && !nodes[2].Server().view.Load().ring.Has("node2")
	})
	cfg := fastReplication
	cfg.StateDir = dirs[1]
	back := startNodeWith(t, "node2", clock, cfg, nodes[0].GossipAddr())
	all := []*testNode{nodes[0], back, nodes[2]}
	waitRingAgrees(t, all)
	waitPushesIdle(t, all)
	if _, err := os.Stat(filepath.Join(dirs[1], stateFileName("node2"))); !os.IsNotExist(err) {
		t.Errorf("node2's snapshot is still there (%v)", err)
	}
	for i, k := range keys {
		p := rc(k)
		p.Hits = proto.Int64(0)
		if d := check(t, all[i%3].client, p); d.Remaining != stateLimit-8 {
			t.Errorf("key %s: remaining %d after node2's restart, want %d (8 admitted, counted once)", k, d.Remaining, stateLimit-8)
		}
	}
}

// A node that leaves while another runs hands its keys off and removes its
// snapshot (its counts live on at the other); the last node to leave writes
// every key. Started again alone after two minutes, the keys of a
// one-minute window start afresh, those of an hour keep their counts.
func TestLeaveHandsOffOrSavesLast(t *testing.T) {
	clock := windowClock()
	dirs := []string{t.TempDir(), t.TempDir()}
	n1 := startNodeWith(t, "node1", clock, NodeConfig{StateDir: dirs[0]})
	n2 := startNodeWith(t, "node2", clock, NodeConfig{StateDir: dirs[1]}, n1.GossipAddr())
	waitRingAgrees(t, []*testNode{n1, n2})
	rc := func(k string, w time.Duration) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "last" + w.String(), Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: w.Milliseconds()}
	}
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for i, k := range keys {
		for range 4 {
			check(t, []*testNode{n1, n2}[i%2].client, rc(k, time.Minute))
			check(t, []*testNode{n1, n2}[i%2].client, rc(k, time.Hour))
		}
	}
	if err := n2.SaveState(); err != nil {
		t.Fatal(err)
	}
	n2file := filepath.Join(dirs[1], stateFileName("node2"))
	if _, err := os.Stat(n2file); err != nil {
		t.Fatalf("no snapshot: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n2.Close(ctx); err != nil {
		t.Fatalf("node2's leave: %v", err)
	}
	if _, err := os.Stat(n2file); !os.IsNotExist(err) {
		t.Errorf("node2 handed its keys off, yet its state file is there (%v)", err)
	}
	if err := n1.Close(ctx); err != nil {
		t.Fatalf("node1's leave: %v", err)
	}
	if seen := savedKeys(t, dirs[:1]); len(seen) != 2*len(keys) {
		t.Fatalf("node1, the last, saved %d keys, want %d", len(seen), 2*len(keys))
	}
	clock.Advance(2 * time.Minute)
	n1 = startNodeWith(t, "node1", clock, NodeConfig{StateDir: dirs[0]})
	for _, k := range keys {
		p := rc(k, time.Minute)
		p.Hits = proto.Int64(0)
		if d := check(t, n1.client, p); d.Remaining != 10 {
			t.Errorf("key %s, 1 min: remaining %d, want 10 (its window ended)", k, d.Remaining)
		}
		p = rc(k, time.Hour)
		p.Hits = proto.Int64(0)
		if d := check(t, n1.client, p); d.Remaining != 6 {
			t.Errorf("key %s, 1 h: remaining %d, want 6", k, d.Remaining)
		}
	}
}
