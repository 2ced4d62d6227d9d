package rpc

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// gossipKey returns a new random gossip key.
func gossipKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, cluster.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// Rotating the gossip key in its three steps (install, use, remove) on a
// live cluster taking up to 1000 checks a second (at least 250 under each
// step) loses no check and no
// member: every check is answered, none degraded, each key's count is
// exact, and no node's ring changes (its epoch stays where it was).
func TestGossipKeyRotationUnderLoad(t *testing.T) {
	clock := windowClock()
	oldKey, newKey := gossipKey(t), gossipKey(t)
	cfg := NodeConfig{ForwardTimeout: 2 * time.Second, GossipKeys: [][]byte{oldKey}}
	nodes := []*testNode{startNodeWith(t, "node1", clock, cfg)}
	for i := 2; i <= 3; i++ {
		nodes = append(nodes, startNodeWith(t, fmt.Sprintf("node%d", i), clock, cfg, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	epochs := make([]uint64, len(nodes))
	for i, n := range nodes {
		epochs[i] = n.Server().view.Load().epoch
	}

	const (
		keys    = 50
		limit   = 1_000_000
		maxSent = 20000            // the load stops after this many checks...
		maxFor  = 60 * time.Second // ...or this long, whichever comes first
	)
	rc := func(i int, hits int64) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "rotate", Key: fmt.Sprintf("k%d", i%keys),
			Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: limit, WindowMs: 3_600_000, Hits: &hits}
	}
	var (
		mu       sync.Mutex
		sent     int
		allowed  = make([]int64, keys)
		failures []string
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	var load sync.WaitGroup
	loadCtx, endLoad := context.WithTimeout(context.Background(), maxFor)
	defer endLoad()
	began := time.Now()
	const workers = 4 // each at most one check per 4 ms: about 1000 a second in all
	for w := 0; w < workers; w++ {
		load.Go(func() {
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for i := w; i < maxSent; i += workers {
				select {
				case <-stop:
					return
				case <-loadCtx.Done():
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := nodes[i%len(nodes)].client.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc(i, 1)}})
				cancel()
				mu.Lock()
				sent++
				switch {
				case err != nil:
					failures = append(failures, err.Error())
				case resp.Decisions[0].Error != "" || resp.Decisions[0].Degraded || !resp.Decisions[0].Allowed:
					failures = append(failures, fmt.Sprint(resp.Decisions[0]))
				default:
					allowed[i%keys]++
				}
				mu.Unlock()
			}
		})
	}
	go func() { load.Wait(); close(done) }()

	steps := []struct {
		name string
		ring [][]byte
	}{
		{"install", [][]byte{oldKey, newKey}},
		{"use", [][]byte{newKey, oldKey}},
		{"remove", [][]byte{newKey}},
	}
	// Each step follows at least a second and 250 checks under the one
	// before (a count, not a rate: a busy machine under -race sends
	// fewer checks a second, and then each step waits longer).
	underStep := func() {
		mu.Lock()
		from := sent
		mu.Unlock()
		time.Sleep(time.Second) // let gossip run under the previous step
		eventually(t, "250 checks under the step", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return sent-from >= 250
		})
	}
	for _, s := range steps {
		underStep()
		for _, n := range nodes {
			if err := n.SetGossipKeys(s.ring); err != nil {
				t.Fatalf("%s on %s: %v", s.name, n.Name(), err)
			}
		}
	}
	underStep()
	close(stop)
	<-done

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Errorf("%d of %d checks failed or were degraded during the rotation; first: %s", len(failures), sent, failures[0])
	}
	for i := 0; i < keys; i++ {
		d := check(t, nodes[i%len(nodes)].client, rc(i, 0))
		if got := limit - d.Remaining; got != allowed[i] {
			t.Errorf("key k%d: the owner counted %d, %d were admitted", i, got, allowed[i])
		}
	}
	for i, n := range nodes {
		v := n.Server().view.Load()
		if v.epoch != epochs[i] || len(v.members) != len(nodes) {
			t.Errorf("%s: ring epoch %d -> %d, %d members: a member was lost during the rotation", n.Name(), epochs[i], v.epoch, len(v.members))
		}
	}
	t.Logf("%d checks across the rotation (%.0f a second), %d failed", sent, float64(sent)/time.Since(began).Seconds(), len(failures))
}
