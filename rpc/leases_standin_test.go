package rpc

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A stand-in never admits a leased global key (issue 35: two nodes per
// region, each killed in turn, admitted 1-2 hits over). The region's
// slice of such a key is its owner's lease; the allocator lowers a region
// below its base when another region wants more, so the base a stand-in
// used to decide against may be spent elsewhere. Here region b takes all
// it can of a limit of 30 after region a admitted 2; a's owner of the
// key is killed, and checks through a's other node go to the stand-in:
// denied (degraded, nothing counted, retry after the forward timeout).
// Every allowed answer in both regions adds up to at most the limit, for
// every algorithm that leases.
func TestStandInNeverAdmitsALeasedGlobalKey(t *testing.T) {
	for _, alg := range []sluicev1.Algorithm{sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW, sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := windowClock()
			byRegion := startRegions(t, "a,b", 2, NodeConfig{Clock: clock})
			clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour) // past the start's window
			a1, a2 := byRegion["a"][0], byRegion["a"][1]
			const limit = 30
			rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 3_600_000, Algorithm: alg}
			for i := 0; rc.Key == ""; i++ {
				k := fmt.Sprintf("standin-%d", i)
				if a2.srv.view.Load().ring.Owner(ring.Key(nil, "api", k)) == a1.name {
					rc.Key = k
				}
			}
			inA, _ := countAllowed(t, []*inprocNode{a1, a2}, rc, 2)
			if inA != 2 {
				t.Fatalf("region a admitted %d of its first 2 checks, want 2", inA)
			}
			inB := leaseCheckUntil(t, byRegion["b"], rc, limit-inA, 3*time.Second)
			if inA+inB > limit {
				t.Fatalf("before the kill: %d in a, %d in b, over the limit %d", inA, inB, limit)
			}
			a1.Kill()
			stand, ds := countAllowed(t, []*inprocNode{a2}, rc, 10)
			for _, d := range ds {
				if d.Allowed || !d.Degraded || d.RetryAfter <= 0 {
					t.Fatalf("a check of a leased key whose owner is dead, at its stand-in: %v, want denied, degraded, with a retry_after", d)
				}
			}
			if n := a2.srv.Stats().StandInLeasedDenied; n == 0 {
				t.Errorf("a2 counted no leased stand-in denial")
			}
			more, _ := countAllowed(t, byRegion["b"], rc, 10)
			if total := inA + inB + stand + more; total > limit {
				t.Errorf("%d in a, %d in b, %d at a's stand-in, %d more in b: %d of %d", inA, inB, stand, more, total, limit)
			}
			t.Logf("%d in a, %d in b, then %d at a's stand-in and %d more in b", inA, inB, stand, more)
		})
	}
}
