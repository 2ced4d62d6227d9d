package lab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/scenario"
)

// needLabLeases skips a lease test of the lab unless SLUICE_LAB_LEASES is
// set: they run clusters for about two minutes under the race detector,
// and make test runs them in a step of their own, after the packages'
// tests (beside the rpc package's timing-sensitive tests on two cores
// they made those flaky).
func needLabLeases(t *testing.T) {
	t.Helper()
	if os.Getenv("SLUICE_LAB_LEASES") == "" {
		t.Skip("set SLUICE_LAB_LEASES=1 (make test runs them alone)")
	}
}

// testSeed returns a random plan seed (0..999), or SLUICE_LEASE_SEED's
// to run a failing one again.
func testSeed() uint64 {
	var s uint64
	if v := os.Getenv("SLUICE_LEASE_SEED"); v != "" {
		if _, err := fmt.Sscan(v, &s); err == nil {
			return s
		}
	}
	return rand.Uint64() % 1000
}

// leaseRun is one scenario's figures on a lab (issue 20's done-when).
type leaseRun struct {
	name             string
	over, maxOver    int64
	util, utilLater  float64 // admitted / oracle: all windows, and from the second on
	utilFollow       float64 // move: from the second window after the move on (-1: not a move)
	admitted, oracle int64
	msgs             int64   // lease messages and forwards between nodes
	perKeyRegionSec  float64 // msgs per (key, region) per second
	lateMsgs         float64 // the same from the third window on (-1: the run had no third window)
	p99              float64 // ms, the worst region's
	errors           int64
}

// lateWindow is the window from which a run's messages are counted as
// its running state: the third (window 3), or SLUICE_LEASE_LATE's.
func lateWindow(t *testing.T) int64 {
	late := int64(3)
	if v := os.Getenv("SLUICE_LEASE_LATE"); v != "" {
		if _, err := fmt.Sscan(v, &late); err != nil || late < 1 {
			t.Fatalf("SLUICE_LEASE_LATE=%q: want a window number, 1 or more", v)
		}
	}
	return late
}

// runLeases runs s on a fresh lab (nodes per region, jitter on each
// one-way delay) and returns its figures; the full report is logged.
func runLeases(t *testing.T, s *scenario.Scenario, nodes int, jitter time.Duration, during func(*Lab, time.Time)) leaseRun {
	return runLeasesWarm(t, s, nodes, jitter, false, during)
}

// runLeasesWarm is runLeases; warm starts the load only when the nodes'
// allocators are past their learning horizon (rpc.LeaseLearningHorizon:
// a cluster's steady state, not its first seconds).
func runLeasesWarm(t *testing.T, s *scenario.Scenario, nodes int, jitter time.Duration, warm bool, during func(*Lab, time.Time)) leaseRun {
	t.Helper()
	p, err := scenario.NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{Plan: p, NodesPerRegion: nodes, Jitter: jitter}
	if v := os.Getenv("SLUICE_LEASE_BASE"); v != "" {
		// The nodes' LeaseBase (1: leases off, fixed slices), to compare.
		if _, err := fmt.Sscan(v, &cfg.LeaseBase); err != nil || cfg.LeaseBase <= 0 || cfg.LeaseBase > 1 {
			t.Fatalf("SLUICE_LEASE_BASE=%q: want 0 < f <= 1", v)
		}
	}
	l, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if warm {
		time.Sleep(rpc.LeaseLearningHorizon(s.Limit.Window))
	}
	tg, err := l.Target(fmt.Sprintf("%s.%d", s.Name, time.Now().UnixNano()), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if during != nil {
		go during(l, time.Now())
	}
	// Messages from the third window on: once the allocators learnt the
	// demand and set standing slices (the first windows' requests, grants
	// and lowers are the ramp, not the running state). SLUICE_LEASE_LATE
	// moves it (e.g. past a cut's or a move's recovery, with
	// SLUICE_LEASE_WINDOWS making the run longer).
	lateFrom := lateWindow(t)
	late := make(chan int64, 1)
	began := time.Now()
	go func() {
		select {
		case <-time.After(time.Until(began.Add(time.Duration(lateFrom) * s.Limit.Window))):
			late <- tg.CrossRegionMessages()
		case <-ctx.Done():
		}
	}()
	res, err := scenario.Run(ctx, p, tg, scenario.Options{Workers: 256})
	if err != nil {
		t.Fatal(err)
	}
	rep := scenario.NewReport(p, res)
	var b strings.Builder
	_ = rep.WriteText(&b)
	t.Logf("%s (seed %d, %s):\n%s", s.Name, s.Seed, l.Describe(), b.String())
	for reg, ns := range l.nodes {
		for _, n := range ns {
			st := n.Server().Stats()
			t.Logf("%s %s: lease requests %d grants %d (%d hits) lowers %d acks %d stands %d give-backs %d given back %d exhausted %d msgs %d replies %d calls %d errs %d",
				reg, n.Name(), st.LeaseRequests, st.LeaseGrants, st.LeaseGrantedHits, st.LeaseLowers, st.LeaseAcks, st.LeaseStands, st.LeaseGiveBacks, st.LeaseGivenBack,
				st.SliceExhausted, st.LeaseMessages, st.LeaseReplies, st.LeaseCalls, st.LeaseCallErrors)
		}
	}
	if rep.Totals.Over > 0 {
		// The over-admitted key's admissions, to read what happened.
		var b strings.Builder
		for _, c := range res.Checks {
			if c.Key == rep.Totals.MaxOverKey && c.Err == nil && c.Answer.Allowed {
				fmt.Fprintf(&b, "  %8.1f ms  %-9s slice %3d remaining %3d latency %.1f ms\n", float64(c.Sent)/1e6, c.Region,
					c.Answer.Slice, c.Answer.Remaining, float64(c.Answer.Latency)/1e6)
			}
		}
		t.Logf("%s's admissions (sent, region, slice):\n%s", rep.Totals.MaxOverKey, b.String())
	}
	r := leaseRun{name: s.Name, over: rep.Totals.Over, maxOver: rep.Totals.MaxOver, util: rep.Totals.Utilisation,
		admitted: rep.Totals.Admitted, oracle: rep.Totals.OracleAdmitted, msgs: res.CrossRegionMessages, errors: rep.Totals.Errors}
	var adm, orc, fAdm, fOrc int64
	moved := int64(max(s.Windows/2, 1)) // Move's demand moves at this window's start
	for _, w := range rep.Windows {
		if w.Window >= 1 {
			adm += w.Admitted
			orc += w.OracleAdmitted
		}
		if w.Window >= moved+2 && w.Window < int64(s.Windows) {
			fAdm += w.Admitted
			fOrc += w.OracleAdmitted
		}
	}
	if orc > 0 {
		r.utilLater = float64(adm) / float64(orc)
	}
	r.utilFollow = -1
	if s.Name == "move" && fOrc > 0 {
		r.utilFollow = float64(fAdm) / float64(fOrc)
	}
	secs := float64(rep.DurationMs) / 1000
	r.perKeyRegionSec = float64(r.msgs) / (float64(s.Keys.Count) * float64(len(s.Regions)) * secs)
	r.lateMsgs = -1
	if lateSecs := secs - float64(lateFrom)*s.Limit.Window.Seconds(); lateSecs > 0 {
		select {
		case m := <-late:
			r.lateMsgs = float64(r.msgs-m) / (float64(s.Keys.Count) * float64(len(s.Regions)) * lateSecs)
		default:
		}
	}
	for _, x := range rep.Regions {
		r.p99 = max(r.p99, x.P99Ms)
	}
	return r
}

// Issue 20 on a real cluster, 3 regions 100 ms apart: every scenario of
// the done-when (steady, 90/10 skew, a flood at a window start, a region
// cut off for two windows, clocks ±50 ms apart, a key used in one region,
// demand that moves from one region to another) admits never more than
// the limit (every allowed answer counted, degraded ones too), on a seed
// drawn at random (logged), with 10 ms of jitter on each one-way delay
// (messages overtake one another). Utilisation is logged; steady load and
// the one-region key (from its second window on, when the allocator
// learnt the demand) must reach 85 % of what one central limiter admits
// (make bench-leases measures the full matrix; BENCHMARKS.md has it).
func TestLeasesNeverOverAdmit(t *testing.T) {
	needLabLeases(t)
	seed := testSeed()
	p := scenario.DefaultParams()
	p.Keys, p.Seed = 3, seed
	for _, s := range scenario.Leases(p) {
		t.Run(s.Name, func(t *testing.T) {
			r := runLeases(t, s, 1, 10*time.Millisecond, nil)
			if r.over != 0 {
				t.Errorf("seed %d: over-admission %d (max %d in a key's window), want 0", seed, r.over, r.maxOver)
			}
			if r.errors != 0 || r.admitted == 0 {
				t.Errorf("seed %d: %d errors, %d admitted", seed, r.errors, r.admitted)
			}
			if (s.Name == "steady" || s.Name == "oneregion") && r.utilLater < 0.85 {
				t.Errorf("seed %d: utilisation from the second window %.3f, want at least 0.85", seed, r.utilLater)
			}
		})
	}
}

// Buckets too: a global token and leaky bucket's shares of rate and burst
// follow demand, and the regions together never admit more than the
// bucket would (the report's bucket bound: any interval admits at most
// the burst plus the rate over it), on steady load, 90/10 skew and a key
// used in one region.
func TestLeasedBucketsNeverOverAdmit(t *testing.T) {
	needLabLeases(t)
	seed := testSeed()
	for _, alg := range []string{"token_bucket", "leaky_bucket"} {
		p := scenario.DefaultParams()
		p.Keys, p.Seed, p.Algorithm = 3, seed, alg
		for _, s := range []*scenario.Scenario{scenario.Steady(p), scenario.Skew(p), scenario.OneRegion(p)} {
			t.Run(alg+"/"+s.Name, func(t *testing.T) {
				r := runLeases(t, s, 1, 10*time.Millisecond, nil)
				if r.over != 0 {
					t.Errorf("seed %d: over-admission %d (max %d on a key), want 0", seed, r.over, r.maxOver)
				}
				if r.errors != 0 || r.admitted == 0 {
					t.Errorf("seed %d: %d errors, %d admitted", seed, r.errors, r.admitted)
				}
			})
		}
	}
}

// The allocator lost mid-window: 2 nodes per region, load in every region
// but the last, and at 1.5 windows one node of the last region (the
// allocator of the keys whose allocator region it is and it owns there)
// is killed. The other node of its region takes over in learning mode
// (no grants until every region reported); the regions never admit more
// than the limit. (A node that holds counts, killed, loses up to a
// replication interval of them, as in one region: that is the kill
// test's bound, not the leases', so the killed node here holds none.)
func TestLeasesAllocatorCrash(t *testing.T) {
	needLabLeases(t)
	p := scenario.DefaultParams()
	p.Keys, p.Seed = 6, testSeed()
	s := scenario.Steady(p)
	s.Name, s.Limit.Name = "allocator-crash", "scenario.allocator-crash"
	last := s.Regions[len(s.Regions)-1].Name
	var arr []scenario.Arrival
	for _, reg := range s.Regions[:len(s.Regions)-1] {
		arr = append(arr, scenario.Arrival{Region: reg.Name, Rate: s.Arrivals[0].Rate})
	}
	s.Arrivals = arr
	killed := make(chan string, 1)
	r := runLeases(t, s, 2, 0, func(l *Lab, began time.Time) {
		time.Sleep(time.Until(began.Add(1500 * time.Millisecond)))
		n := l.Nodes(last)[0]
		n.Kill()
		killed <- n.Name()
	})
	select {
	case name := <-killed:
		t.Logf("killed %s mid-run", name)
	default:
		t.Fatal("the run ended before the kill")
	}
	if r.over != 0 {
		t.Errorf("seed %d: over-admission %d (max %d), want 0", p.Seed, r.over, r.maxOver)
	}
}

// The full matrix of issue 20's done-when, for BENCHMARKS.md (make
// bench-leases): 3 and 5 regions, round trips of 50 and 200 ms, every
// scenario on SLUICE_LEASE_SEEDS random seeds (default 2); then token and
// leaky buckets under steady, skewed, one-region and cut load, and
// sliding windows under every scenario, 3 regions 100 ms apart. Set
// SLUICE_LEASE_MATRIX=1 to run it (about 26 minutes a seed).
func TestLeaseMatrix(t *testing.T) {
	if os.Getenv("SLUICE_LEASE_MATRIX") == "" {
		t.Skip("set SLUICE_LEASE_MATRIX=1 (make bench-leases)")
	}
	seeds := 2
	if v := os.Getenv("SLUICE_LEASE_SEEDS"); v != "" {
		_, _ = fmt.Sscan(v, &seeds)
	}
	// Narrowing it, to look at one cell: SLUICE_LEASE_REGIONS (e.g. "5"),
	// SLUICE_LEASE_RTTS (e.g. "200ms"), SLUICE_LEASE_ONLY (a scenario's
	// name; it also leaves the buckets out).
	regionsList, rtts := []int{3, 5}, []time.Duration{50 * time.Millisecond, 200 * time.Millisecond}
	if v := os.Getenv("SLUICE_LEASE_REGIONS"); v != "" {
		regionsList = nil
		for _, f := range strings.Split(v, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil {
				t.Fatalf("SLUICE_LEASE_REGIONS: %v", err)
			}
			regionsList = append(regionsList, n)
		}
	}
	if v := os.Getenv("SLUICE_LEASE_RTTS"); v != "" {
		rtts = nil
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(f)
			if err != nil {
				t.Fatalf("SLUICE_LEASE_RTTS: %v", err)
			}
			rtts = append(rtts, d)
		}
	}
	only := os.Getenv("SLUICE_LEASE_ONLY")
	// SLUICE_LEASE_WINDOWS: the fixed-window runs' length in windows (8).
	windows := 8
	if v := os.Getenv("SLUICE_LEASE_WINDOWS"); v != "" {
		if _, err := fmt.Sscan(v, &windows); err != nil || windows < 4 {
			t.Fatalf("SLUICE_LEASE_WINDOWS=%q: want 4 or more", v)
		}
	}
	// SLUICE_LEASE_COLD=1 starts the load at once (allocators learning).
	warm := os.Getenv("SLUICE_LEASE_COLD") == ""
	sliding := os.Getenv("SLUICE_LEASE_SLIDING") != ""
	buckets := os.Getenv("SLUICE_LEASE_BUCKETS") != ""
	if sliding || buckets {
		regionsList = nil // the sliding windows' or the buckets' rows alone
	}
	var rows []string
	// Each row is logged as it is made too, so that a run stopped by a
	// failure keeps the rows before it.
	row := func(r string) {
		rows = append(rows, r)
		t.Logf("row: %s", r)
	}
	// leaseRows runs every lease scenario of p (narrowed by only), a row
	// each: where (regions and round trip), then the seed, the scenario
	// and alg (an algorithm column, or "").
	leaseRows := func(p scenario.Params, where, alg, what string) {
		for _, s := range scenario.Leases(p) {
			if only != "" && s.Name != only {
				continue
			}
			r := runLeasesWarm(t, s, 1, 10*time.Millisecond, warm, nil)
			if r.over != 0 {
				t.Errorf("%s, seed %d, %s: over-admission %d", what, p.Seed, s.Name, r.over)
			}
			follow := ""
			if r.utilFollow >= 0 {
				follow = fmt.Sprintf("  2-after-move %.3f", r.utilFollow)
			}
			row(fmt.Sprintf("%s  %5d  %-10s %sover %d  util %.3f  from-w2 %.3f%s  msgs/key-region/s %.2f (from w%d %.2f)  worst p99 %.2f ms  errors %d",
				where, p.Seed, s.Name, alg, r.over, r.util, r.utilLater, follow, r.perKeyRegionSec, lateWindow(t), r.lateMsgs, r.p99, r.errors))
		}
	}
	for _, regions := range regionsList {
		for _, rtt := range rtts {
			for range seeds {
				p := scenario.DefaultParams()
				p.Regions, p.RTT, p.Seed, p.Windows = regions, rtt, rand.Uint64()%100000, windows
				if v := os.Getenv("SLUICE_LEASE_SEED"); v != "" {
					p.Seed = testSeed()
				}
				leaseRows(p, fmt.Sprintf("%d  %4s", regions, rtt), "", fmt.Sprintf("%d regions, %s", regions, rtt))
			}
		}
	}
	// Buckets: 3 regions 100 ms apart.
	// (SLUICE_LEASE_BUCKETS=1 runs them alone, with SLUICE_LEASE_ONLY and
	// SLUICE_LEASE_SEED narrowing them too.)
	for i := 0; i < seeds && (only == "" && !sliding || buckets); i++ {
		for _, alg := range []string{"token_bucket", "leaky_bucket"} {
			p := scenario.DefaultParams()
			p.Seed, p.Windows, p.Algorithm = rand.Uint64()%100000, 6, alg
			if v := os.Getenv("SLUICE_LEASE_SEED"); v != "" {
				p.Seed = testSeed()
			}
			for _, s := range []*scenario.Scenario{scenario.Steady(p), scenario.Skew(p), scenario.OneRegion(p), scenario.Partition(p)} {
				if only != "" && s.Name != only {
					continue
				}
				r := runLeasesWarm(t, s, 1, 10*time.Millisecond, warm, nil)
				if r.over != 0 {
					t.Errorf("%s, seed %d, %s: over-admission %d", alg, p.Seed, s.Name, r.over)
				}
				row(fmt.Sprintf("3  100ms  %5d  %-10s %-12s over %d  util %.3f  from-w2 %.3f  msgs/key-region/s %.2f (from w%d %.2f)  worst p99 %.2f ms  errors %d",
					p.Seed, s.Name, alg, r.over, r.util, r.utilLater, r.perKeyRegionSec, lateWindow(t), r.lateMsgs, r.p99, r.errors))
			}
		}
	}
	// Sliding windows: 3 regions 100 ms apart, every scenario
	// (SLUICE_LEASE_SLIDING=1 runs them alone, with SLUICE_LEASE_ONLY
	// narrowing them too).
	for i := 0; i < seeds && (only == "" && !buckets || sliding); i++ {
		p := scenario.DefaultParams()
		p.Seed, p.Windows, p.Algorithm = rand.Uint64()%100000, windows, "sliding_window"
		if v := os.Getenv("SLUICE_LEASE_SEED"); v != "" {
			p.Seed = testSeed()
		}
		leaseRows(p, "3  100ms", fmt.Sprintf("%-14s ", p.Algorithm), p.Algorithm)
	}
	t.Logf("regions rtt seed scenario:\n%s", strings.Join(rows, "\n"))
}
