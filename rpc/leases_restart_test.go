package rpc

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// restartInproc restarts old under its name and config, as a deploy does
// (issue 35): graceful gives back what the region has not admitted and
// hands its allocators' records over, as Node.Close does for a region's
// only member (a SIGTERM), before the
// process goes; otherwise it is killed (kill -9). The new process starts
// with nothing of the old one's state, and the cluster's member lists are
// set again. It returns the new node.
func restartInproc(t *testing.T, old *inprocNode, cfg NodeConfig, graceful bool) *inprocNode {
	t.Helper()
	if graceful {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		old.srv.leaving.Store(true) // Leave: checks are refused from here on
		old.srv.leases.giveBackAll(ctx)
		old.srv.leases.handOverAll(ctx)
		cancel()
	}
	old.Kill()
	c := old.c
	c.mu.Lock()
	c.nodes = slices.DeleteFunc(c.nodes, func(n *inprocNode) bool { return n == old })
	c.mu.Unlock()
	n := c.start(cfg)
	// The others' connections to the old process may be backing off
	// after its death (the address is the same): reconnect them at once,
	// as a real peer's next dial would after its backoff.
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	for _, o := range nodes {
		if p := o.srv.view.Load().peers[old.name]; p != nil {
			if cc, ok := p.Conn().(interface{ ResetConnectBackoff() }); ok {
				cc.ResetConnectBackoff()
			}
			// A connection that was up to the old process fails its next
			// call once: wait (bounded) until one reaches the new one.
			for i := 0; i < 50 && connectPeer(p.Client()) != nil; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	c.join()
	return n
}

// leaseFlood sends rc to nodes in turn until the deadline (wall time:
// leases travel between real gRPC servers), pausing a little after each
// denial so that requests and grants can move, and returns the checks
// allowed: every allowed answer, degraded ones included.
func leaseFlood(t *testing.T, nodes []*inprocNode, rc *sluicev1.RateLimitCheck, within time.Duration) int {
	t.Helper()
	allowed := 0
	deadline := time.Now().Add(within)
	for i := 0; time.Now().Before(deadline); i++ {
		d := check(t, nodes[i%len(nodes)].client, rc)
		if d.Error != "" {
			t.Fatalf("check: %v", d)
		}
		if d.Allowed {
			allowed++
			continue
		}
		time.Sleep(2 * time.Millisecond)
	}
	return allowed
}

// A graceful restart (or a kill) of a region's only node mid-window never
// admits a global limit twice (issue 35: it did, 60 of 30 on every key
// after a SIGTERM): the restarted process cannot know what its region
// admitted, so its holders are blind and count what the allocator
// recorded for the region as spent. For every algorithm that leases,
// with the key's allocator in another region and in the restarted one,
// after the region spent the whole limit, the regions together admit
// exactly the limit in the hour: the restart adds nothing.
func TestRestartOfARegionsOnlyNodeNeverAdmitsTwice(t *testing.T) {
	for _, alg := range []sluicev1.Algorithm{sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW, sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET} {
		for _, graceful := range []bool{true, false} {
			for _, allocInA := range []bool{false, true} {
				name := fmt.Sprintf("%s/graceful=%v/allocator-in-a=%v", alg, graceful, allocInA)
				t.Run(name, func(t *testing.T) {
					clock := windowClock()
					regions, _ := region.Parse("a,b,c")
					byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
					// Past the start's window: the first process is not blind.
					clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour)
					a := byRegion["a"][0]
					const limit = 30
					rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 3_600_000, Algorithm: alg}
					for i := 0; rc.Key == ""; i++ {
						if k := fmt.Sprintf("deploy-%d", i); (a.srv.leases.order(region.SeedOf("api", k))[0] == "a") == allocInA {
							rc.Key = k
						}
					}
					// A sliding window's region admits alone at most the
					// limit less the other regions' bases (they still
					// count in its next window): 20 of 30.
					want := limit
					if alg == sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW {
						want = limit - 2*5
					}
					before := leaseCheckUntil(t, byRegion["a"], rc, want, 10*time.Second)
					if before != want {
						t.Fatalf("before the restart: a admitted %d, want %d", before, want)
					}
					clock.Advance(10 * time.Second) // mid-window
					a2 := restartInproc(t, a, NodeConfig{Name: a.name, Region: "a", Regions: regions, Clock: clock}, graceful)
					more := leaseFlood(t, []*inprocNode{a2, byRegion["b"][0], byRegion["c"][0]}, rc, 1500*time.Millisecond)
					if before+more > limit {
						t.Fatalf("after the restart: %d more admitted in the hour, %d of %d", more, before+more, limit)
					}
					t.Logf("%d before the restart, %d after: %d of %d", before, more, before+more, limit)
					if n := a2.srv.leases.st.blindSpent.Load(); n == 0 {
						t.Errorf("the restarted node counted nothing as spent by its former process")
					}
				})
			}
		}
	}
}

// A graceful restart costs nothing when the region had not spent its
// slice: the leaving node gives back what it had not admitted, so the
// allocator (in another region) knows exactly what the region admitted,
// and the restarted node's blind holder is counted at that. The regions
// still admit the whole limit in the hour. A killed node gives nothing
// back: its region is counted at the slice it held (under-admission,
// never over).
func TestGracefulRestartKeepsTheRestOfTheLimit(t *testing.T) {
	for _, graceful := range []bool{true, false} {
		t.Run(fmt.Sprintf("graceful=%v", graceful), func(t *testing.T) {
			clock := windowClock()
			regions, _ := region.Parse("a,b,c")
			byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
			clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour)
			a := byRegion["a"][0]
			const limit, used = 30, 12
			rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 3_600_000}
			for i := 0; rc.Key == ""; i++ {
				if k := fmt.Sprintf("keep-%d", i); a.srv.leases.order(region.SeedOf("api", k))[0] != "a" {
					rc.Key = k
				}
			}
			// a asks for more than it uses: a slice above its count.
			rcBig := &sluicev1.RateLimitCheck{Name: rc.Name, Key: rc.Key, Limit: limit, WindowMs: rc.WindowMs}
			if got := leaseCheckUntil(t, byRegion["a"], rcBig, used, 10*time.Second); got != used {
				t.Fatalf("a admitted %d, want %d", got, used)
			}
			clock.Advance(10 * time.Second)
			a2 := restartInproc(t, a, NodeConfig{Name: a.name, Region: "a", Regions: regions, Clock: clock}, graceful)
			more := leaseFlood(t, []*inprocNode{a2, byRegion["b"][0], byRegion["c"][0]}, rc, 2*time.Second)
			total := used + more
			if total > limit {
				t.Fatalf("%d of %d admitted in the hour", total, limit)
			}
			if graceful && total != limit {
				t.Errorf("graceful: %d of %d admitted in the hour, want all of it", total, limit)
			}
			t.Logf("graceful=%v: %d of %d admitted in the hour (%d before the restart)", graceful, total, limit, used)
		})
	}
}

// A slice denial while the region waits for its share (its node just
// started, or it asked for more) says so: slice_pending, with a
// retry_after of about a lease round trip, not the window's end; a retry
// at that time passes. A denial of a region whose share is what it is
// (the limit spent) has no slice_pending and retries at the window's end.
func TestSliceDenialWhileWaitingRetriesSoon(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
	clock.Advance(30 * time.Second) // mid-window of the start: blind, and waiting
	a := byRegion["a"][0]
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "soon", Limit: 30, WindowMs: 60_000}
	d := check(t, a.client, rc)
	if d.Allowed || !d.SliceExhausted || !d.SlicePending {
		t.Fatalf("first check after the start: %v, want denied, slice_exhausted and slice_pending", d)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > 1000 {
		t.Fatalf("retry_after %d ms, want about a lease round trip (the window ends in 30 s)", d.RetryAfter)
	}
	time.Sleep(time.Duration(d.RetryAfter) * time.Millisecond)
	if d := check(t, a.client, rc); !d.Allowed {
		t.Fatalf("the retry at retry_after: %v, want allowed", d)
	}
	// Spend the limit everywhere: the last denial is no wait.
	leaseFlood(t, []*inprocNode{a, byRegion["b"][0], byRegion["c"][0]}, rc, time.Second)
	var last *sluicev1.Decision
	for range 3 {
		last = check(t, byRegion["b"][0].client, rc)
		time.Sleep(300 * time.Millisecond)
	}
	if last.Allowed || last.SlicePending {
		t.Fatalf("with the limit spent: %v, want denied without slice_pending", last)
	}
	if want := int64(30_000); last.RetryAfter < want-2000 {
		t.Errorf("with the limit spent: retry_after %d ms, want the window's end (about %d)", last.RetryAfter, want)
	}
}

// A rolling deploy of a cluster of one node per region within one window
// (each node restarted gracefully in turn, the key's allocator region
// first) with no check of the key between the restarts: every region's
// holder of the key is then blind, and the allocator that learns would
// take the window for a cluster started afresh, but for the records the
// leaving allocators handed over. The key admitted its limit before the
// deploy, and admits nothing more after it.
func TestRollingDeployWithoutChecksBetweenRestarts(t *testing.T) {
	graceful := func(string, int) bool { return true }
	inOrder := func(order []string) []string { return order } // the allocator's region first
	if _, more := reviewRollingDeploy(t, graceful, inOrder); more != 0 {
		t.Fatalf("after the rolling deploy: %d more admitted in the hour, %d of 30", more, 30+more)
	}
}

// A limit changed across a restart (the deploy brought a new limits
// file): the restarted node's holder is blind and of the new limit; the
// allocator of the new limit learns, and counts the region at what the
// other regions' reports leave of it. Lowered from 30 to 20 after 30
// were admitted, the key admits nothing more in the hour; raised to 60,
// at most 30 more (the window admits at most the new limit).
func TestLimitChangedAcrossARestart(t *testing.T) {
	for _, newLimit := range []int64{20, 60} {
		t.Run(fmt.Sprintf("30-to-%d", newLimit), func(t *testing.T) {
			clock := windowClock()
			regions, _ := region.Parse("a,b,c")
			byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
			clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour)
			a := byRegion["a"][0]
			rc := &sluicev1.RateLimitCheck{Name: "api", Key: "changed", Limit: 30, WindowMs: 3_600_000}
			if got := leaseCheckUntil(t, byRegion["a"], rc, 30, 10*time.Second); got != 30 {
				t.Fatalf("before the restart: a admitted %d", got)
			}
			clock.Advance(10 * time.Second)
			a2 := restartInproc(t, a, NodeConfig{Name: a.name, Region: "a", Regions: regions, Clock: clock}, true)
			rc.Limit = newLimit
			more := leaseFlood(t, []*inprocNode{a2, byRegion["b"][0], byRegion["c"][0]}, rc, 2*time.Second)
			if 30+int64(more) > max(30, newLimit) {
				t.Fatalf("limit %d after the restart: %d more, %d in the hour", newLimit, more, 30+more)
			}
			t.Logf("limit 30 then %d across a restart: %d more, %d in the hour", newLimit, more, 30+more)
		})
	}
}
