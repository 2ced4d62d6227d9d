package rpc

import (
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A killed owner restarted under its name at new ports after each delay
// of SLUICE_RESTART_DELAYS (e.g. "1s,3s,6s,12s"; unset: 2s), with checks
// going on meanwhile: the new process joins only once the old one is
// declared dead, and every key admits exactly its limit across the crash
// and the restart (10 keys of the victim, 10 hits each copied before the
// crash, limit 20): none loses its copied count, none admits beyond it.
func TestRestartAfterDelaysKeepsCopiedCounts(t *testing.T) {
	delays := []time.Duration{2 * time.Second}
	if env := os.Getenv("SLUICE_RESTART_DELAYS"); env != "" {
		delays = nil
		for _, f := range strings.Split(env, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("SLUICE_RESTART_DELAYS: %v", err)
			}
			delays = append(delays, d)
		}
	}
	for _, delay := range delays {
		t.Run(delay.String(), func(t *testing.T) {
			clock := windowClock()
			nodes := startReplicatedCluster(t, clock)
			var keys []string
			for i := 0; len(keys) < 10; i++ {
				k := "user:" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + string(rune('a'+i/26))
				if nodes[0].Server().Owner("restart", k) == "node2" {
					keys = append(keys, k)
				}
			}
			rc := func(k string) *sluicev1.RateLimitCheck {
				return &sluicev1.RateLimitCheck{Name: "restart", Key: k, Hits: proto.Int64(1), Limit: 20, WindowMs: 3_600_000}
			}
			allowed := map[string]int{}
			for _, k := range keys {
				for range 10 {
					if d := check(t, nodes[0].client, rc(k)); d.Allowed {
						allowed[k]++
					}
				}
				waitCopied(t, nodes[1], string(ring.Key(nil, "restart", k)), nodes[0], nodes[2])
			}
			nodes[1].Kill()
			// Checks go on through the survivors while node2 is away.
			end := time.Now().Add(delay)
			for i := 0; time.Now().Before(end); i++ {
				k := keys[i%len(keys)]
				if d := check(t, nodes[i%2*2].client, rc(k)); d.Allowed {
					allowed[k]++
				}
				time.Sleep(20 * time.Millisecond) // the stream's pace
			}
			back := startNodeWith(t, "node2", clock, fastReplication, nodes[0].GossipAddr())
			all := []*testNode{nodes[0], back, nodes[2]}
			waitRingAgrees(t, all)
			eventually(t, "the new node2 to be ready", func() bool { return back.Ready() == nil })
			for _, k := range keys {
				for i := range 25 {
					if d := check(t, all[i%3].client, rc(k)); d.Allowed {
						allowed[k]++
					}
				}
			}
			for _, k := range keys {
				if allowed[k] != 20 {
					logStats(t, all)
					t.Errorf("restart after %s: key %s admitted %d, want exactly 20 (10 copied before the crash)", delay, k, allowed[k])
				}
			}
		})
	}
}
