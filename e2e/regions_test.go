//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/scenario"
	"github.com/sluicehq/sluice/scenario/lab"
)

// Issue 19's regions with real binaries: e2e/docker-compose.regions.yml
// runs one node (or two) per region, us-east (us, the home region),
// eu-west (eu) and ap-south (ap), every node with the same --regions and
// its own --region, and wan_test.go puts a WAN between the regions: a
// round trip of wanRTT between any two, none within a region or from the
// test process. The scenarios of scenario/testdata are then run against
// the nodes with package scenario's runner and oracle (a regionTarget: a
// client per region, and the WAN as the runner's Cutter), every allowed
// answer counted, degraded ones included.
const (
	// regionList is every node's --regions: the scenario files' regions,
	// weight 1 each; us-east is the home region.
	regionList = "us-east=1,eu-west=1,ap-south=1"
	// wanRTT is the round-trip time between two regions: the scenario
	// files' rtt, which the tests check.
	wanRTT = 100 * time.Millisecond
	// scenarioFiles is where the scenarios are, from e2e/.
	scenarioFiles = "../scenario/testdata"
)

// regionsTLS: the region nodes run with TLS (peer certificates, mutual
// TLS for clients), as the rest of the suite, unless
// SLUICE_E2E_REGIONS_TLS=0, which runs them in plaintext
// (docker-compose.regions-plain.yml; gossip still encrypted). The switch
// exists because of a readiness bug found by this suite: with --regions
// and TLS a node waits for the certificates of the other regions' members
// to be admitted to its ring, which they never are (rpc/node.go,
// verifying), so it never turns ready (see waitRegionsHealthy).
var regionsTLS = os.Getenv("SLUICE_E2E_REGIONS_TLS") != "0"

// regionDialOption is how the region tests' clients reach the nodes.
func regionDialOption(t *testing.T) grpc.DialOption {
	if regionsTLS {
		return clientDialOption(t)
	}
	return grpc.WithTransportCredentials(insecure.NewCredentials())
}

// regionOf is each service's --region (badregion's is in no list).
var regionOf = map[string]string{
	"us": "us-east", "eu": "eu-west", "ap": "ap-south",
	"us2": "us-east", "eu2": "eu-west", "ap2": "ap-south",
	"badlist": "us-east", "badregion": "mars",
}

// regionNodes are the services of docker-compose.regions.yml, at
// netPrefix.21 onwards in this order.
var regionNodes = []string{"us", "eu", "ap", "us2", "eu2", "ap2", "badlist", "badregion"}

// newRegionCluster is newCluster for docker-compose.regions.yml: a fresh
// gossip key and PKI, the project sluicee2eregions<scenario>, then names
// started and healthy. Cleanup as newCluster's.
func newRegionCluster(t *testing.T, scenarioName string, names ...string) *cluster {
	t.Helper()
	requireDocker(t)
	secrets := newSecrets(t)
	ips := map[string]string{}
	for i, name := range regionNodes {
		ips[name] = fmt.Sprintf("%s.%d", netPrefix, 21+i)
	}
	makePKIFor(t, secrets, regionNodes, ips)
	pki = secrets
	c := &cluster{t: t, project: "sluicee2eregions" + scenarioName, files: []string{"docker-compose.regions.yml"},
		nodes: map[string]*node{}, ids: map[string]string{}}
	if !regionsTLS {
		c.files = append(c.files, "docker-compose.regions-plain.yml")
	}
	c.prepare(secrets, regionNodes, func(_ int, name string) string { return ips[name] }, regionDialOption(t),
		"SLUICE_E2E_REGIONS="+regionList)
	if out, err := c.compose(5*time.Minute, append([]string{"up", "-d", "--no-deps", "--no-recreate"}, names...)...); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	c.waitRegionsHealthy(t, names...)
	return c
}

// waitRegionsHealthy is waitHealthy that says why a node is not ready
// (its /readyz), and fails fast, naming the bug, when nodes that see
// every member alive still wait for the other regions' certificates.
func (c *cluster) waitRegionsHealthy(t *testing.T, names ...string) {
	t.Helper()
	start := time.Now()
	for {
		var unhealthy []string
		for _, name := range names {
			out, err := run(30*time.Second, nil, "docker", "inspect", "--format", "{{.State.Health.Status}}", c.id(name))
			if err != nil || strings.TrimSpace(string(out)) != "healthy" {
				unhealthy = append(unhealthy, name)
			}
		}
		if len(unhealthy) == 0 {
			return
		}
		if waited := time.Since(start); waited > 20*time.Second {
			var why []string
			certs := 0
			for _, name := range unhealthy {
				r := c.readyz(name)
				why = append(why, name+": "+r)
				if strings.Contains(r, "certificates") {
					certs++
				}
			}
			seen, _ := c.regionsAgree(names)
			switch {
			case regionsTLS && certs == len(unhealthy) && seen:
				t.Fatalf("with --regions and TLS the nodes see every member alive yet never turn ready (%s after start): %s. "+
					"A node waits until every member gossip lists is in its ring or has failed to verify (rpc/node.go, Node.verifying), "+
					"and with regions the other regions' members are never in its ring: it must leave them out (members whose region differs). "+
					"SLUICE_E2E_REGIONS_TLS=0 runs these tests in plaintext meanwhile",
					waited.Round(time.Second), strings.Join(why, "; "))
			case waited > ringTimeout:
				t.Fatalf("%v not healthy within %s: %s", unhealthy, ringTimeout, strings.Join(why, "; "))
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// readyz returns what a node's /readyz says (its status and body), or the
// error of the call.
func (c *cluster) readyz(name string) string {
	tr := &http.Transport{}
	scheme := "http"
	if regionsTLS {
		cfg, err := client.TLSConfig(filepath.Join(pki, "ca", "ca.pem"), filepath.Join(pki, "client", "e2e.pem"), filepath.Join(pki, "client", "e2e-key.pem"))
		if err != nil {
			return err.Error()
		}
		tr.TLSClientConfig, scheme = cfg, "https"
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(scheme + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[name].httpPort)) + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("%s %s", resp.Status, strings.TrimSpace(string(body)))
}

// regionsAgree reports whether every node of names sees exactly names,
// all alive, each in its region, and the nodes of each region have one
// ring fingerprint (each region has a ring of its own).
func (c *cluster) regionsAgree(names []string) (bool, string) {
	want := slices.Sorted(slices.Values(names))
	fps := map[string]string{}
	for _, name := range names {
		resp, err := c.members(name)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", name, err)
		}
		var got []string
		for _, m := range resp.Members {
			if m.State != "alive" || m.Region != regionOf[m.Name] {
				return false, fmt.Sprintf("%s sees %s %s in %q", name, m.Name, m.State, m.Region)
			}
			got = append(got, m.Name)
		}
		if !slices.Equal(got, want) {
			return false, fmt.Sprintf("%s sees %v", name, got)
		}
		r := regionOf[name]
		if fp, ok := fps[r]; ok && fp != resp.RingFingerprint {
			return false, fmt.Sprintf("%s's ring %s differs from its region's %s", name, resp.RingFingerprint, fp)
		}
		fps[r] = resp.RingFingerprint
	}
	return true, ""
}

// waitRegions waits until regionsAgree, at most ringTimeout, and returns
// how long that took; it fails t (which must be the running test) after.
func (c *cluster) waitRegions(t *testing.T, names ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, why := c.regionsAgree(names)
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > ringTimeout {
			t.Fatalf("%v did not agree on their regions within %s: %s", names, ringTimeout, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// regionClients returns a client per region, to its nodes among names
// (round robin), with the suite's TLS; closed at cleanup.
func regionClients(t *testing.T, c *cluster, names []string) map[string]*client.Client {
	t.Helper()
	addrs := map[string][]string{}
	for _, n := range names {
		addrs[regionOf[n]] = append(addrs[regionOf[n]], c.nodes[n].grpcAddr())
	}
	out := map[string]*client.Client{}
	for r, a := range addrs {
		cl, err := client.New(client.Config{Addrs: a, Timeout: 5 * time.Second, FailureMode: client.FailOpen,
			Logger: slog.New(slog.DiscardHandler), DialOptions: []grpc.DialOption{regionDialOption(t)},
			Route: client.RouteAny}) // the region's entry nodes, as the test's app calls them
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		out[r] = cl
	}
	return out
}

// runID makes a limit name of its own for each run, so runs share no counts.
func runID() string { return strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36) }

// TestRegionsOnAWAN: three regions of one node each (us, eu, ap) with
// wanRTT between them. In turn:
//   - the WAN: an exact-scope check entering eu or ap takes at least
//     wanRTT (the key's owner in the home region decides it, a round trip
//     away) and says us-east decided it; entering us it does not; global
//     checks are decided where they enter, in-region fast, on the
//     region's slice;
//   - scope global with scenario steady and flood: over-admission 0, and
//     the median latency of the checks decided where they entered under
//     half the round trip (their tail, this machine's, is logged);
//   - scope exact with steady: over-admission 0, every check entering eu
//     or ap at least wanRTT, those entering us in-region fast;
//   - scope regional with flood: over-admission at most (regions−1)×limit
//     per key and window (the report's bound);
//   - scope global with cut: ap-south cut off from both others for two
//     windows by the WAN itself, at the scenario's times (the WAN is the
//     runner's Cutter, so the report says the cuts were enforced):
//     over-admission 0 and packets dropped; then a cut of ap-south alone:
//     an exact check entering it is answered degraded (it cannot reach
//     the home region), and once healed by us-east again; the regions
//     agree again afterwards;
//   - refused configurations: a node with another --regions is refused
//     and exits 1 saying the region lists differ; a node whose --region
//     is not in --regions exits (1 or 2) naming region; the cluster keeps
//     its three members.
//
// The over-admission is the scenario report's (package scenario): every
// allowed answer counted, degraded ones included, each in the window its
// decider counted it in (from the answer's reset time, which the test
// checks against the check's flight: misplaced); a check that got no
// answer is an error, and every run wants none. Every run's figures are
// logged (O: over-admission, U: under-admission against the central
// limiter, latency per region), with a table at the end; with
// SLUICE_E2E_ARTIFACTS set each report is saved there as JSON (and, as
// the suite does, the containers' logs of a failed test).
func TestRegionsOnAWAN(t *testing.T) {
	regionsSuite(t, "wan", []string{"us", "eu", "ap"}, []regionRun{
		{"steady", "global"}, {"flood", "global"}, {"steady", "exact"}, {"flood", "regional"}, {"cut", "global"},
	}, true)
}

// TestRegionsOnAWANTwoPerRegion: the same with two nodes per region (us,
// us2, eu, eu2, ap, ap2): keys spread over each region's ring of two,
// checks entering either node of a region (round robin), exact checks
// forwarded to the key's owner among the home region's two. Scope global
// and exact with steady, and the WAN's check.
func TestRegionsOnAWANTwoPerRegion(t *testing.T) {
	regionsSuite(t, "wan2", []string{"us", "us2", "eu", "eu2", "ap", "ap2"}, []regionRun{
		{"steady", "global"}, {"steady", "exact"},
	}, false)
}

// regionRun is one scenario run: a file of scenarioFiles and the scope.
type regionRun struct{ file, scope string }

// regionFigures are one run's numbers, for the table.
type regionFigures struct {
	run                         regionRun
	checks, admitted, oracle    int64
	over, maxOver, bound, under int64
	degraded, exhausted, errors int64
	p50, p99, minLat            map[string]float64 // per region, ms
	dropped                     int64              // packets the WAN dropped (cuts)
	wall                        time.Duration
	failed                      bool
}

func regionsSuite(t *testing.T, project string, names []string, runs []regionRun, refusals bool) {
	began := time.Now()
	c := newRegionCluster(t, project, names...)
	settle := c.waitRegions(t, names...)
	t.Logf("%d nodes in 3 regions agree (%s after healthy)", len(names), settle.Round(time.Millisecond))
	w := newWAN(t, c, regionOf, wanRTT, names...)
	// Gossip goes over the WAN too: the regions still agree across it.
	c.waitRegions(t, names...)
	clients := regionClients(t, c, names)
	t.Run("wan", func(t *testing.T) { checkWAN(t, c, names) })
	var figs []*regionFigures
	for _, r := range runs {
		f := &regionFigures{run: r}
		figs = append(figs, f)
		t.Run(r.scope+"/"+r.file, func(t *testing.T) {
			defer func() { f.failed = t.Failed() }()
			runRegionScenario(t, w, clients, r, f)
			// After a cut, and to start the next run from a whole cluster.
			took := c.waitRegions(t, names...)
			if r.file == "cut" {
				t.Logf("cut: the regions agreed again %s after the run", took.Round(time.Millisecond))
			}
		})
	}
	if refusals {
		t.Run("refused", func(t *testing.T) { checkRefusals(t, c, names) })
	}
	logRegionTable(t, figs)
	t.Logf("%s: %s in all", t.Name(), time.Since(began).Round(time.Second))
}

// checkWAN checks that the WAN is there, and only between regions.
func checkWAN(t *testing.T, c *cluster, names []string) {
	home := strings.SplitN(regionList, "=", 2)[0]
	name := "e2e-wan." + runID()
	const n = 6
	for _, scope := range []client.Scope{client.ScopeExact, client.ScopeGlobal} {
		for _, via := range names {
			r := regionOf[via]
			one, err := client.New(client.Config{Addrs: []string{c.nodes[via].grpcAddr()}, Timeout: 5 * time.Second,
				FailureMode: client.FailClosed, Logger: slog.New(slog.DiscardHandler), DialOptions: []grpc.DialOption{regionDialOption(t)},
				Route: client.RouteAny}) // through this node: the test measures its path
			if err != nil {
				t.Fatal(err)
			}
			var lats []time.Duration
			var last client.Decision
			for i := range n {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				d, err := one.Check(ctx, client.Check{Name: name, Key: fmt.Sprintf("probe:%s:%d", via, i%2), Hits: 1, Scope: scope,
					Limit: &client.Limit{Limit: 1000, Window: time.Minute}})
				lat := time.Since(start)
				cancel()
				if err != nil {
					t.Fatalf("%s check via %s: %v", scope, via, err)
				}
				if i > 0 { // the first may open the node's connection to the home region
					lats = append(lats, lat)
				}
				last = d
			}
			one.Close()
			slices.Sort(lats)
			lo, med, hi := lats[0], lats[len(lats)/2], lats[len(lats)-1]
			cross := scope == client.ScopeExact && r != home
			decider := r
			if scope == client.ScopeExact {
				decider = home
			}
			t.Logf("%s check entering %s (%s): min %s, median %s, max %s; decided in %s, slice %d of %d",
				scope, r, via, lo.Round(100*time.Microsecond), med.Round(100*time.Microsecond), hi.Round(100*time.Microsecond),
				last.Region, last.Slice, last.Limit)
			switch {
			case last.Region != decider:
				t.Errorf("%s check entering %s: decided in %q, want %q", scope, r, last.Region, decider)
			case cross && lo < wanRTT:
				t.Errorf("exact check entering %s took %s, less than the round trip %s to the home region %s: no WAN?", r, lo, wanRTT, home)
			case !cross && med >= wanRTT/2:
				t.Errorf("%s check entering %s, decided there: median %s, want under %s (the client's traffic must not cross the WAN)", scope, r, med, wanRTT/2)
			}
			// A fixed window's slice follows leases: 0 in the window its
			// node started in until a grant, at most the whole limit.
			if scope == client.ScopeGlobal && (last.Limit != 1000 || last.Slice < 0 || last.Slice > last.Limit) {
				t.Errorf("global check entering %s: slice %d of %d, want a share of 1000", r, last.Slice, last.Limit)
			}
		}
	}
}

// regionTarget is the scenario runner's Target: each region's checks go
// to its client, with the run's limit inline (lab.ClientTarget; an answer
// with Cause set, the client's failure mode answering when no node did,
// is an error, counted as such by the report: the tests want none); the
// WAN cuts regions off.
type regionTarget struct {
	*lab.ClientTarget
	wan *wan
}

// Cut and Heal make the target the runner's Cutter: the scenario's cuts
// are the WAN's.
func (rt *regionTarget) Cut(r string) error  { return rt.wan.Cut(r) }
func (rt *regionTarget) Heal(r string) error { return rt.wan.Heal(r) }

var (
	_ scenario.Target = (*regionTarget)(nil)
	_ scenario.Cutter = (*regionTarget)(nil)
)

// runRegionScenario runs r against the cluster and checks its report.
func runRegionScenario(t *testing.T, w *wan, clients map[string]*client.Client, r regionRun, f *regionFigures) {
	began := time.Now()
	defer func() { f.wall = time.Since(began) }()
	s, err := scenario.Load(filepath.Join(scenarioFiles, r.file+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s.Limit.Scope = r.scope
	s.Limit.Name += "." + runID()
	p, err := scenario.NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	want, err := region.Parse(regionList)
	if err != nil {
		t.Fatal(err)
	}
	if p.Regions.Fingerprint() != want.Fingerprint() {
		t.Fatalf("scenario %s has regions %s, the nodes %s", r.file, p.Regions, want)
	}
	names := p.RegionNames()
	for _, a := range names {
		for _, b := range names {
			if a != b && p.RTT(a, b) != w.rtt {
				t.Fatalf("scenario %s: rtt %s between %s and %s, the WAN's %s", r.file, p.RTT(a, b), a, b, w.rtt)
			}
		}
	}
	target := &regionTarget{ClientTarget: lab.ClientTargetOf(p.Limit, p.Limit.Name, clients), wan: w}
	dropped := w.dropped()
	ctx, cancel := context.WithTimeout(context.Background(), p.Duration+2*p.Limit.Window+time.Minute)
	defer cancel()
	res, err := scenario.Run(ctx, p, target, scenario.Options{Workers: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("scenario %s: %v", r.file, err)
	}
	f.dropped = w.dropped() - dropped
	rep := scenario.NewReport(p, res)
	saveReport(t, rep)
	tot := rep.Totals
	f.checks, f.admitted, f.oracle = tot.Checks, tot.Admitted, tot.OracleAdmitted
	f.over, f.maxOver, f.bound, f.under = tot.Over, tot.MaxOver, rep.Bound, tot.Under
	f.degraded, f.exhausted, f.errors = tot.Degraded, tot.SliceExhausted, tot.Errors
	f.p50, f.p99, f.minLat = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, rs := range rep.Regions {
		f.p50[rs.Region], f.p99[rs.Region] = rs.P50Ms, rs.P99Ms
	}
	for _, res := range res.Checks {
		if res.Err != nil {
			continue
		}
		v := ms(res.Answer.Latency)
		if m, ok := f.minLat[res.Region]; !ok || v < m {
			f.minLat[res.Region] = v
		}
	}
	var b strings.Builder
	for _, rs := range rep.Regions {
		fmt.Fprintf(&b, "\n  %-9s %4d checks, %4d admitted (oracle %4d), U %3d, slice_exhausted %4d, degraded %d, errors %d; latency min %6.1f p50 %6.1f p99 %6.1f max %6.1f ms",
			rs.Region, rs.Checks, rs.Admitted, rs.OracleAdmitted, rs.Under, rs.SliceExhausted, rs.Degraded, rs.Errors,
			f.minLat[rs.Region], rs.P50Ms, rs.P99Ms, rs.MaxMs)
	}
	t.Logf("scenario %s, scope %s: %d checks, %d admitted, the central limiter %d; O %d (worst %d per key and window, bound %d), U %d; cuts enforced %v, %d packets dropped by the WAN; send lag at most %.1f ms%s",
		r.file, r.scope, tot.Checks, tot.Admitted, tot.OracleAdmitted, tot.Over, tot.MaxOver, rep.Bound, tot.Under,
		rep.CutsEnforced, f.dropped, tot.MaxLagMs, b.String())
	defer func() {
		if t.Failed() {
			var txt strings.Builder
			_ = rep.WriteText(&txt)
			t.Logf("report:\n%s", txt.String())
		}
	}()

	if tot.Checks == 0 || tot.Errors != 0 {
		t.Errorf("%d checks, %d unanswered (errors): want some checks and every one answered", tot.Checks, tot.Errors)
	}
	if !rep.CutsEnforced {
		t.Errorf("the scenario's cuts were not enforced")
	}
	if err := rep.Verify(); err != nil {
		t.Error(err)
	}
	if bad := misplaced(p, res); len(bad) > 0 {
		t.Errorf("%d admitted answers name a window (by their reset time) the check was not in flight during, e.g. %s", len(bad), bad[0])
	}
	home := p.Home()
	switch p.Limit.Scope {
	case region.Global, region.Exact:
		if tot.Over != 0 {
			t.Errorf("scope %s: over-admission %d (worst %d in key %s window %d), want 0", r.scope, tot.Over, tot.MaxOver, tot.MaxOverKey, tot.MaxOverWindow)
		}
	}
	// Latency: the round trip is a floor for the checks that cross to the
	// home region (the WAN's delay, a lower bound that load cannot break);
	// the checks decided where they entered are held to half the round
	// trip at the median only: their tail is this small, shared machine's
	// (a flood queues 15,000 checks; other work runs beside the suite),
	// and speed is measured by benchmarks (make bench-regions), not here.
	// Their p99 is logged with the report.
	for _, rs := range rep.Regions {
		cross := p.Limit.Scope == region.Exact && rs.Region != home
		switch {
		case cross && f.minLat[rs.Region] < ms(wanRTT):
			t.Errorf("scope exact, entering %s: a check took %.1f ms, less than the round trip %s to the home region %s", rs.Region, f.minLat[rs.Region], wanRTT, home)
		case !cross && rs.P50Ms >= ms(wanRTT/2):
			t.Errorf("scope %s, entering %s (decided there): p50 %.1f ms, want under %s (half the round trip)", r.scope, rs.Region, rs.P50Ms, wanRTT/2)
		}
	}
	if len(p.Cuts) > 0 {
		if f.dropped == 0 {
			t.Errorf("scenario %s cuts %s off, and the WAN dropped no packet", r.file, p.Cuts[0].Region)
		}
		checkCut(t, w, clients, home, p.Cuts[0].Region)
	}
}

// misplaced returns the admitted fixed-window answers whose reset time
// puts them in a window that does not overlap the check's flight (from
// its send to its answer; the nodes share this machine's clock): the
// report places admitted checks by their reset time, so a node that named
// a wrong window could hide an over-admission there.
func misplaced(p *scenario.Plan, res *scenario.Results) []string {
	if p.Limit.Algorithm.String() != "fixed_window" {
		return nil
	}
	w := p.Limit.Window.Milliseconds()
	var bad []string
	for _, r := range res.Checks {
		if r.Err != nil || !r.Answer.Allowed || r.Answer.ResetTime <= 0 {
			continue
		}
		sent := res.Start.Add(r.Sent).UnixMilli()
		answered := res.Start.Add(r.Sent + r.Answer.Latency).UnixMilli()
		end := r.Answer.ResetTime
		if end-w > answered+1 || end <= sent-1 {
			bad = append(bad, fmt.Sprintf("%s entering %s: sent %d, answered %d (Unix ms), window [%d, %d)", r.Key, r.Region, sent, answered, end-w, end))
		}
	}
	return bad
}

// checkCut cuts region off again, alone: an exact check entering it
// cannot reach the home region, so the node answers it degraded (decided
// from its own count after the forward timeout, or at once once gossip
// suspects the home region's members); once healed, such a check is
// answered by the home region again, at least a round trip later.
func checkCut(t *testing.T, w *wan, clients map[string]*client.Client, home, reg string) {
	chk := client.Check{Name: "e2e-cut." + runID(), Key: "probe", Hits: 1, Scope: client.ScopeExact,
		Limit: &client.Limit{Limit: 1000, Window: time.Minute}}
	if err := w.Cut(reg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d, err := clients[reg].Check(ctx, chk)
	cancel()
	took := time.Since(start)
	if herr := w.Heal(reg); herr != nil {
		t.Fatal(herr)
	}
	t.Logf("cut %s off: an exact check entering it answered after %s: allowed %v, degraded %v, decided in %q (%v)",
		reg, took.Round(time.Millisecond), d.Allowed, d.Degraded, d.Region, cmpErr(err, d.Cause))
	if err == nil && !d.Degraded {
		t.Errorf("cut %s off, an exact check entering it was answered normally (decided in %q, after %s): the cut lets traffic through", reg, d.Region, took)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := clients[reg].Check(ctx, chk)
		cancel()
		took := time.Since(start)
		if err == nil && d.Cause == nil && !d.Degraded && d.Region == home {
			t.Logf("healed: an exact check entering %s answered by %s again, after %s", reg, home, took.Round(time.Millisecond))
			if took < wanRTT {
				t.Errorf("healed: an exact check entering %s took %s, less than the round trip %s", reg, took, wanRTT)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("healed %s 30 s ago, and an exact check entering it is still not answered by %s: degraded %v, region %q (%v)", reg, home, d.Degraded, d.Region, cmpErr(err, d.Cause))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// cmpErr returns err, else cause.
func cmpErr(err, cause error) error {
	if err != nil {
		return err
	}
	return cause
}

// ms converts d to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// saveReport writes rep as JSON into SLUICE_E2E_ARTIFACTS, when set.
func saveReport(t *testing.T, rep *scenario.Report) {
	if artifacts == "" {
		return
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	path := filepath.Join(artifacts, strings.NewReplacer("/", "_", "=", "").Replace(t.Name())+"-"+time.Now().UTC().Format("150405")+".json")
	fh, err := os.Create(path)
	if err == nil {
		err = rep.WriteJSON(fh)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	t.Logf("artifacts: %s (the scenario's report)", path)
}

// logRegionTable logs one line per run.
func logRegionTable(t *testing.T, figs []*regionFigures) {
	if len(figs) == 0 {
		return
	}
	regions := []string{"us-east", "eu-west", "ap-south"}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-9s %-8s %-6s %-5s %-6s %-3s %-4s %-5s %-4s %-5s %-4s %-4s", "scenario", "scope", "checks", "admit", "oracle", "O", "maxO", "bound", "U", "exhst", "degr", "errs")
	for _, r := range regions {
		fmt.Fprintf(&b, " %-19s", r+" p50/p99/min")
	}
	fmt.Fprintf(&b, " %-5s %-5s %s", "drops", "wall", "result")
	for _, f := range figs {
		result := "ok"
		if f.failed {
			result = "FAIL"
		}
		fmt.Fprintf(&b, "\n%-9s %-8s %-6d %-5d %-6d %-3d %-4d %-5d %-4d %-5d %-4d %-4d", f.run.file, f.run.scope, f.checks, f.admitted, f.oracle,
			f.over, f.maxOver, f.bound, f.under, f.exhausted, f.degraded, f.errors)
		for _, r := range regions {
			fmt.Fprintf(&b, " %-19s", fmt.Sprintf("%.1f/%.1f/%.1f", f.p50[r], f.p99[r], f.minLat[r]))
		}
		fmt.Fprintf(&b, " %-5d %-5s %s", f.dropped, f.wall.Round(time.Second), result)
	}
	t.Logf("region runs (O: over-admission, U: under-admission against one central limiter, hits; latency in ms per region entered, min included; drops: packets the WAN dropped for cuts):%s", b.String())
}

// checkRefusals starts the two misconfigured nodes and checks that each
// exits, saying why, and that the cluster stays as it was.
func checkRefusals(t *testing.T, c *cluster, names []string) {
	for _, bad := range []struct {
		name, why string
		codes     []int
		says      []string
	}{
		{"badlist", "a different --regions", []int{1}, []string{"region lists differ"}},
		{"badregion", "a --region not in --regions", []int{1, 2}, []string{"region", "mars"}},
	} {
		code, logs, err := runToExit(c, bad.name, time.Minute)
		if err != nil {
			t.Errorf("%s (%s): %v", bad.name, bad.why, err)
			continue
		}
		last := lastLines(logs, 3)
		t.Logf("%s (%s) exited %d: %s", bad.name, bad.why, code, last)
		if !slices.Contains(bad.codes, code) {
			t.Errorf("%s (%s): exit status %d, want one of %v", bad.name, bad.why, code, bad.codes)
		}
		for _, s := range bad.says {
			if !strings.Contains(logs, s) {
				t.Errorf("%s (%s): its log does not say %q: %s", bad.name, bad.why, s, last)
			}
		}
	}
	// The cluster never took them in: every node still sees exactly
	// names (a refused member would show, alive or suspect).
	if ok, why := c.regionsAgree(names); !ok {
		t.Errorf("after the refusals: %s", why)
	}
}

// runToExit starts a service and waits until its container exits,
// returning its exit status and its whole log.
func runToExit(c *cluster, name string, timeout time.Duration) (int, string, error) {
	if out, err := c.compose(2*time.Minute, "up", "-d", "--no-deps", "--no-recreate", name); err != nil {
		return 0, "", fmt.Errorf("compose up: %w: %s", err, out)
	}
	out, err := c.compose(time.Minute, "ps", "-q", name)
	id := strings.TrimSpace(string(out))
	if err != nil || id == "" {
		return 0, "", fmt.Errorf("no container for %s: %v", name, err)
	}
	out, err = run(timeout, nil, "docker", "wait", id)
	logs, _ := run(time.Minute, nil, "docker", "logs", id)
	if err != nil {
		return 0, string(logs), fmt.Errorf("still running after %s (docker wait: %v); its log ends: %s", timeout, err, lastLines(string(logs), 5))
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return 0, string(logs), errors.New("docker wait: " + string(out))
	}
	return code, string(logs), nil
}

// lastLines returns the last n non-empty lines of s, joined by " | ".
func lastLines(s string, n int) string {
	var ls []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			ls = append(ls, l)
		}
	}
	return strings.Join(ls[max(0, len(ls)-n):], " | ")
}
