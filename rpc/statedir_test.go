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
