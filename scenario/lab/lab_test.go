package lab

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/scenario"
)

// run starts a lab for s (nodes per region, RTT scaled by scale), runs s
// with scope and returns the report and the cross-region forwards.
func run(t *testing.T, s *scenario.Scenario, scope string, nodes int, scale float64) (*scenario.Report, int64) {
	t.Helper()
	s.Limit.Scope = scope
	p, err := scenario.NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Start(ctx, Config{Plan: p, NodesPerRegion: nodes, RTTScale: scale})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tg, err := l.Target(fmt.Sprintf("%s.%s.%d", s.Name, scope, time.Now().UnixNano()), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	res, err := scenario.Run(ctx, p, tg, scenario.Options{Workers: 256})
	if err != nil {
		t.Fatal(err)
	}
	rep := scenario.NewReport(p, res)
	var b bytes.Buffer
	_ = rep.WriteText(&b)
	t.Logf("%s, %s, %s:\n%s", s.Name, scope, l.Describe(), b.String())
	checks, _ := l.CrossRegionForwards()
	for r, ns := range l.nodes {
		for _, n := range ns {
			st := n.Server().Stats()
			t.Logf("%s %s: lease requests %d grants %d granted hits %d lowers %d acks %d given back %d exhausted %d msgs %d calls %d errs %d",
				r, n.Name(), st.LeaseRequests, st.LeaseGrants, st.LeaseGrantedHits, st.LeaseLowers, st.LeaseAcks, st.LeaseGivenBack, st.SliceExhausted, st.LeaseMessages, st.LeaseCalls, st.LeaseCallErrors)
		}
	}
	return rep, checks
}

// short is the done-when parameters over 3 windows and 3 keys (the
// test's time: the flood is 100x the limit per key in every region, and
// CI runs this under the race detector beside other packages; make
// bench-regions runs the full ones).
func short() scenario.Params {
	p := scenario.DefaultParams()
	p.Windows, p.Keys = 3, 3
	return p
}

// Issue 19's done-when on a real cluster, 3 regions 100 ms apart, one
// node per region: a global limit is never exceeded, under steady load
// of 3x the limit, a 90/10 skew, a flood of 100x the limit in every region
// at a window start, a region cut off for two windows, and clocks 50 ms
// apart; no check crosses regions; under-admission is reported (logged).
func TestGlobalNeverOverAdmits(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for about 30 s")
	}
	for _, s := range scenario.DoneWhen(short()) {
		t.Run(s.Name, func(t *testing.T) {
			rep, cross := run(t, s, "global", 1, 0)
			if rep.Totals.Over != 0 || !rep.BoundOK {
				t.Errorf("over-admission %d (max %d on %s), want 0", rep.Totals.Over, rep.Totals.MaxOver, rep.Totals.MaxOverKey)
			}
			if cross != 0 {
				t.Errorf("%d checks crossed regions, want 0", cross)
			}
			if rep.Totals.Admitted == 0 || rep.Totals.Errors != 0 {
				t.Errorf("admitted %d, errors %d", rep.Totals.Admitted, rep.Totals.Errors)
			}
		})
	}
}

// regional stays within (regions-1) x limit per window; exact admits no
// more than the limit, its checks from other regions crossing to the
// home region at the round trip. Three nodes per region: inside a region
// the checks are forwarded to the key's owner in the region.
func TestRegionalAndExactOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for about 20 s")
	}
	p := short()
	rep, cross := run(t, scenario.Steady(p), "regional", 3, 0)
	if !rep.BoundOK || rep.Totals.MaxOver > 2*p.Limit || cross != 0 {
		t.Errorf("regional: max over %d per window (bound %d), %d crossed regions", rep.Totals.MaxOver, 2*p.Limit, cross)
	}
	if rep.Totals.MaxOver == 0 {
		t.Error("regional under 3x the limit admitted no more than the limit: the regions are not enforcing on their own")
	}
	rep, cross = run(t, scenario.Steady(p), "exact", 3, 0)
	if rep.Totals.Over != 0 || !rep.BoundOK {
		t.Errorf("exact: over-admission %d, want 0", rep.Totals.Over)
	}
	// The checks entering the other regions crossed to the home region,
	// each once, and took at least the round trip (a floor: load only
	// adds to it); those entering the home region did not cross.
	var away int64
	for _, r := range rep.Regions {
		if r.Region == rep.Regions[0].Region {
			continue
		}
		away += r.Checks
		if r.P50Ms < 100 {
			t.Errorf("exact from %s: p50 %.1f ms, want at least the 100 ms round trip", r.Region, r.P50Ms)
		}
	}
	if cross != away {
		t.Errorf("exact: %d checks crossed regions, want the %d that entered the other regions", cross, away)
	}
	// exact with a region cut off from the home region for two windows:
	// its checks are answered degraded under local, from a window of the
	// entering node's own (README: up to one limit per window more in each
	// region that loses the home region; they once got a fresh window
	// every replication interval).
	rep, _ = run(t, scenario.Partition(p), "exact", 1, 0)
	if rep.Totals.MaxOver > p.Limit || rep.Totals.Degraded == 0 || rep.Totals.Errors != 0 {
		t.Errorf("exact with a region cut off: max over %d per key and window (want at most the limit %d), %d degraded, %d errors",
			rep.Totals.MaxOver, p.Limit, rep.Totals.Degraded, rep.Totals.Errors)
	}
}

// Lab.Restart stops a node (a crash, or a graceful stop) and starts it
// again under its name at a new gRPC address; the lab's Targets follow it.
// A crashed node started again at once is one the others still list as
// alive: the new process refutes it. While a region's only node is down,
// its checks fail (errors, not answers).
func TestLabRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster for about 15 s")
	}
	s := scenario.Steady(short())
	p, err := scenario.NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Start(ctx, Config{Plan: p})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tg, err := l.Target(fmt.Sprintf("restart.%d", time.Now().UnixNano()), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	r := p.RegionNames()[0]
	check := func(when string) {
		t.Helper()
		if _, err := tg.Check(ctx, r, "k0", 1); err != nil {
			t.Fatalf("%s: a check in %s: %v", when, r, err)
		}
	}
	check("before")
	old := l.Nodes(r)[0]
	if err := l.Restart(ctx, old.Name(), Kill, 0); err != nil {
		t.Fatal(err)
	}
	n := l.Nodes(r)[0]
	if n == old || n.Name() != old.Name() || n.GRPCAddr() == old.GRPCAddr() {
		t.Fatalf("after a restart: %s at %s, was %s at %s", n.Name(), n.GRPCAddr(), old.Name(), old.GRPCAddr())
	}
	t.Logf("%s: gossip %s, was %s", n.Name(), n.GossipAddr(), old.GossipAddr())
	check("after a kill")

	done := make(chan error, 1)
	go func() { done <- l.Restart(ctx, n.Name(), Graceful, 2*time.Second) }()
	time.Sleep(time.Second) // stopped, not started again yet
	if _, err := tg.Check(ctx, r, "k0", 1); err == nil {
		t.Error("a check to a region whose only node is down was answered")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	check("after a graceful restart")
	if err := tg.Restart(ctx, scenario.Restart{Region: r, Node: 1}); err == nil || !strings.Contains(err.Error(), "no node 1") {
		t.Errorf("a restart of node 1 of a region of one: %v", err)
	}
	if err := l.Restart(ctx, "nobody", Graceful, 0); err == nil {
		t.Error("a restart of no node succeeded")
	}
	if err := l.Restart(ctx, n.Name(), RestartKind(7), 0); err == nil {
		t.Error("an unknown kind of restart succeeded")
	}
	if got := len(l.all()); got != len(p.RegionNames())+2 {
		t.Errorf("%d nodes counted (the replaced ones too), want %d", got, len(p.RegionNames())+2)
	}
}
