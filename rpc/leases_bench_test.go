package rpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// regionBench runs f as a sub-benchmark per load and lease mode, on
// three regions a, b and c of one node each (in-process, gRPC on
// loopback), the clock past the windows a start leaves unsure, f given
// the node of region a and 64 checks of a global limit on keys of their
// own. "spare" keys have a limit no region's slice runs out of in the
// run (no lease message: the check path alone), "spent" keys one spent
// at once (every check after the first few is denied from the region's
// slice, as in a key wanted beyond the limit); "leases" is the default
// LeaseBase, "fixed" LeaseBase 1 (fixed slices). The clock does not
// move.
func regionBench(b *testing.B, f func(b *testing.B, n *inprocNode, checks []*sluicev1.RateLimitCheck, leased bool)) {
	for _, load := range []struct {
		name  string
		limit int64
	}{{"spare", 1_000_000_000}, {"spent", 10}} {
		for _, mode := range []struct {
			name string
			base float64
		}{{"leases", 0}, {"fixed", 1}} {
			b.Run(load.name+"/"+mode.name, func(b *testing.B) {
				clock := windowClock()
				byRegion := startRegions(b, "a,b,c", 1, NodeConfig{Clock: clock, LeaseBase: mode.base})
				clock.Advance(time.Duration(standReach(time.Minute)+3) * time.Minute)
				checks := make([]*sluicev1.RateLimitCheck, 64)
				for i := range checks {
					checks[i] = &sluicev1.RateLimitCheck{Name: "api", Key: fmt.Sprintf("k%d", i),
						Limit: load.limit, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_GLOBAL}
				}
				f(b, byRegion["a"][0], checks, mode.base == 0)
			})
		}
	}
}

// BenchmarkRegionCheck is the in-region cost of a check of a global
// limit with leases against fixed slices (see regionBench): checks
// entering the node of region a that owns their keys there, from 16
// goroutines per GOMAXPROCS, keys in turn. The node's allocations and
// CPU are in the figures; the ratio of leases to fixed, measured back to
// back, is what counts.
func BenchmarkRegionCheck(b *testing.B) {
	regionBench(b, func(b *testing.B, n *inprocNode, checks []*sluicev1.RateLimitCheck, _ bool) {
		reqs := make([]*sluicev1.CheckRequest, len(checks))
		for i, c := range checks {
			reqs[i] = &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{c}}
		}
		ctx := context.Background()
		b.SetParallelism(16)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				resp, err := n.client.Check(ctx, reqs[i%len(reqs)])
				if err != nil || len(resp.Decisions) != 1 || resp.Decisions[0].Error != "" {
					b.Errorf("check: %v %v", resp, err)
					return
				}
			}
		})
	})
}

// BenchmarkDecideRegion is the deciding node's part of
// BenchmarkRegionCheck alone (no gRPC): a validated check, scoped as on
// entry (applyScopes), decided by its key's owner in region a
// (Server.decide), from one goroutine, keys in turn. With leases a check
// also takes its key's holder lock, counts its demand and asks itself
// whether to ask for more (wantMore); with fixed slices it is the
// store's window alone.
func BenchmarkDecideRegion(b *testing.B) {
	regionBench(b, func(b *testing.B, n *inprocNode, checks []*sluicev1.RateLimitCheck, leased bool) {
		s := n.srv
		reqs, fe := parseChecks(checks, nil, false)
		if fe != nil {
			b.Fatal(fe)
		}
		s.applyScopes(reqs, false)
		if reqs[0].leased != leased {
			b.Fatalf("leased %v, want %v", reqs[0].leased, leased)
		}
		sks := make([][]byte, len(reqs))
		for i, r := range reqs {
			sks[i] = ring.Key(nil, r.name, r.key)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i = (i + 1) % len(reqs)
			r := reqs[i]
			if d := s.decide(sks[i], &r); d.Error != "" {
				b.Fatal(d.Error)
			}
		}
	})
}
