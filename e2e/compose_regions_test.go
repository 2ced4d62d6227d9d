//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// The user-facing three-region set, deploy/compose/regions: what make
// regions-up starts, started here by its own script under a project, a
// subnet and ports of the suite's.
const (
	composeRegionsDir    = "../deploy/compose/regions"
	composeRegionsScript = composeRegionsDir + "/regions.sh"
	// composeRegionsLimit is the set's named limit "hourly"
	// (deploy/compose/regions/limits.yaml): 30 per hour, fixed window,
	// scope global. The answers' limit and scope are checked against it.
	composeRegionsName   = "hourly"
	composeRegionsLimit  = 30
	composeRegionsWindow = time.Hour
)

// TestComposeRegionsAdmitAGlobalLimitExactly starts the three-region
// compose set (deploy/compose/regions/regions.sh up: us in us-east, eu in
// eu-west, ap in ap-south, plaintext, each region on a network of its own
// plus the shared wan network), waits until every node sees all three
// regions alive, puts a WAN of wanRTT between the regions (regions.sh wan
// on, tc netem; on a kernel without sch_netem the suite's WAN, NFQUEUE,
// as the other region tests), checks that it is there (an exact check
// entering eu-west or ap-south takes at least the round trip to us-east),
// then sends checks of the set's global limit "hourly" (30 per hour) for
// one key through all three regions at once, 4 workers per region
// (retrying a slice_pending denial after its retry_after), until 30 are
// admitted, and 10 s more. Every allowed answer is counted, degraded ones
// included: exactly 30 must be admitted, none after, every check answered,
// all in one window. Then regions.sh down.
//
// Run alone (root, nsenter, and tc or iptables for the WAN, as the other
// region tests): make build && make docker IMAGE=sluice:e2e && (cd e2e &&
// go test -tags e2e -count=1 -v -run TestComposeRegions .). make e2e runs
// it with the rest of the suite.
func TestComposeRegionsAdmitAGlobalLimitExactly(t *testing.T) {
	began := time.Now()
	requireDocker(t)
	names := []string{"us", "eu", "ap"}
	c := &cluster{t: t, project: envOr("SLUICE_E2E_PROJECT_PREFIX", "sluicee2e") + "composeregions",
		files: []string{composeRegionsDir + "/docker-compose.yml"}, nodes: map[string]*node{}, ids: map[string]string{}}
	c.env = append(os.Environ(), "SLUICE_IMAGE="+image, "SLUICE_REGIONS_PROJECT="+c.project,
		"SLUICE_REGIONS_NET="+netPrefix, "SLUICE_BIN="+sluiceBin)
	ports := freePorts(t, 2*len(names))
	for i, name := range names {
		n := &node{name: name, ip: fmt.Sprintf("%s.%d", netPrefix, 11+i), grpcPort: ports[2*i], httpPort: ports[2*i+1]}
		up := strings.ToUpper(name)
		c.env = append(c.env, fmt.Sprintf("SLUICE_REGIONS_GRPC_%s=%d", up, n.grpcPort), fmt.Sprintf("SLUICE_REGIONS_HTTP_%s=%d", up, n.httpPort))
		conn, err := grpc.NewClient(n.grpcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		n.conn, n.rateLimit = conn, sluicev1.NewRateLimitServiceClient(conn)
		c.nodes[name] = n
	}
	// A run that crashed before its cleanup may have left this project.
	c.compose(2*time.Minute, "down", "-v", "--remove-orphans", "--timeout", "5")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.compose(time.Minute, "logs", "--no-color", "--tail", "40")
			t.Logf("containers' last log lines:\n%s", out)
		}
		for _, n := range c.nodes {
			n.conn.Close()
		}
		start := time.Now()
		if out, err := run(3*time.Minute, c.env, composeRegionsScript, "down"); err != nil {
			t.Errorf("regions.sh down: %v\n%s", err, out)
			c.compose(3*time.Minute, "down", "-v", "--remove-orphans", "--timeout", "5")
		}
		t.Logf("regions.sh down: %s; the test took %s in all", time.Since(start).Round(100*time.Millisecond), time.Since(began).Round(time.Second))
	})

	start := time.Now()
	if out, err := run(5*time.Minute, c.env, composeRegionsScript, "up"); err != nil {
		t.Fatalf("regions.sh up: %v\n%s", err, out)
	}
	healthy := time.Since(start)
	settle := c.waitRegions(t, names...)
	t.Logf("regions.sh up: healthy after %s, every node sees the three regions alive %s later",
		healthy.Round(100*time.Millisecond), settle.Round(100*time.Millisecond))

	composeRegionsWAN(t, c, names)
	c.waitRegions(t, names...)
	checkComposeWAN(t, c)

	// Keep the run inside one window of the limit: a fixed window starts
	// at the wall clock's hour.
	if left := time.Until(time.Now().Truncate(composeRegionsWindow).Add(composeRegionsWindow)); left < 3*time.Minute {
		t.Logf("%s to the hour, where the window turns: waiting for it", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}

	key := "user:" + runID()
	const (
		workers  = 4 // per region
		fillFor  = 2 * time.Minute
		afterFor = 10 * time.Second
	)
	type tally struct {
		checks, allowed, after, degraded, pending, exhausted, errors int64
		firstErr                                                     string
	}
	var (
		mu       sync.Mutex
		tallies  = map[string]*tally{}
		resets   = map[int64]int64{} // reset_time of the allowed answers -> count
		wrong    []string            // answers that are not the set's limit
		admitted atomic.Int64
		filledAt atomic.Int64 // Unix ns at which the limit was reached
		stop     atomic.Bool
	)
	for _, n := range names {
		tallies[regionOf[n]] = &tally{}
	}
	loadStart := time.Now()
	var wg sync.WaitGroup
	for _, name := range names {
		r := regionOf[name]
		rl := c.nodes[name].rateLimit
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := rl.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{Name: composeRegionsName, Key: key}}})
					cancel()
					var d *sluicev1.Decision
					if err == nil && len(resp.Decisions) == 1 && resp.Decisions[0].Error == "" {
						d = resp.Decisions[0]
					} else if err == nil {
						err = fmt.Errorf("answer %v", resp.GetDecisions())
					}
					mu.Lock()
					tl := tallies[r]
					tl.checks++
					pause := 250 * time.Millisecond
					switch {
					case d == nil:
						tl.errors++
						if tl.firstErr == "" {
							tl.firstErr = err.Error()
						}
					case d.Allowed:
						tl.allowed++
						if d.Degraded {
							tl.degraded++
						}
						if filledAt.Load() != 0 {
							tl.after++
						}
						resets[d.ResetTime]++
						if d.Limit != composeRegionsLimit || d.Scope != sluicev1.Scope_SCOPE_GLOBAL || d.Region != r {
							wrong = append(wrong, fmt.Sprintf("entering %s: limit %d, scope %s, decided in %q", r, d.Limit, d.Scope, d.Region))
						}
						pause = 0
						if admitted.Add(1) >= composeRegionsLimit {
							filledAt.CompareAndSwap(0, time.Now().UnixNano())
						}
					case d.SlicePending:
						tl.pending++
						pause = min(max(time.Duration(d.RetryAfter)*time.Millisecond, 10*time.Millisecond), time.Second)
					default:
						if d.SliceExhausted {
							tl.exhausted++
						}
						if d.Degraded {
							tl.degraded++
						}
					}
					mu.Unlock()
					time.Sleep(pause)
				}
			}()
		}
	}
	// Until the limit is admitted (at most fillFor), then afterFor more.
	for {
		time.Sleep(50 * time.Millisecond)
		f := filledAt.Load()
		if f == 0 && time.Since(loadStart) > fillFor {
			break
		}
		if f != 0 && time.Since(time.Unix(0, f)) > afterFor {
			break
		}
	}
	stop.Store(true)
	wg.Wait()

	var total, after, errs, checks, degraded int64
	var lines strings.Builder
	for _, name := range names {
		r := regionOf[name]
		tl := tallies[r]
		total, after, errs, checks, degraded = total+tl.allowed, after+tl.after, errs+tl.errors, checks+tl.checks, degraded+tl.degraded
		fmt.Fprintf(&lines, "\n  %-9s %4d checks, %2d admitted (%d after the limit was reached), %d degraded, denials: %d slice_pending, %d slice_exhausted; %d errors %s",
			r, tl.checks, tl.allowed, tl.after, tl.degraded, tl.pending, tl.exhausted, tl.errors, tl.firstErr)
	}
	fill := "never"
	if f := filledAt.Load(); f != 0 {
		fill = time.Unix(0, f).Sub(loadStart).Round(time.Millisecond).String()
	}
	t.Logf("global limit %q (%d per %s) of key %s through the three regions at once: %d checks, %d admitted of %d (degraded answers %d); the limit reached after %s, %d admitted in the %s after%s",
		composeRegionsName, composeRegionsLimit, composeRegionsWindow, key, checks, total, composeRegionsLimit, degraded, fill, after, afterFor, lines.String())

	if errs != 0 {
		t.Errorf("%d checks got no answer: every one must be answered for the count to be exact", errs)
	}
	if total != composeRegionsLimit {
		t.Errorf("the three regions admitted %d, want exactly the limit %d", total, composeRegionsLimit)
	}
	if after != 0 {
		t.Errorf("%d admitted after the limit was reached, want 0", after)
	}
	if len(resets) > 1 {
		t.Errorf("the allowed answers name %d windows (reset times %v): want one", len(resets), resets)
	}
	if len(wrong) > 0 {
		t.Errorf("%d allowed answers are not the set's global limit, e.g. %s", len(wrong), wrong[0])
	}
	// The set is still whole.
	if ok, why := c.regionsAgree(names); !ok {
		t.Errorf("after the load: %s", why)
	}
}

// composeRegionsWAN puts wanRTT between the regions with the set's own
// script (tc netem), or, where the kernel has no netem (the script exits
// 3 saying so) or SLUICE_E2E_WAN=nfqueue asks for it, with the suite's
// WAN (wan_test.go), as the other region tests.
func composeRegionsWAN(t *testing.T, c *cluster, names []string) {
	t.Helper()
	if wanKind(t) != "nfqueue" {
		out, err := run(2*time.Minute, c.env, composeRegionsScript, "wan", "on", strconv.FormatInt(wanRTT.Milliseconds(), 10))
		var exit *exec.ExitError
		switch {
		case err == nil:
			t.Logf("WAN: regions.sh wan on %d (tc netem):\n%s", wanRTT.Milliseconds(), strings.TrimSpace(string(out)))
			return
		case errors.As(err, &exit) && exit.ExitCode() == 3 && wanKind(t) == "":
			t.Logf("WAN: regions.sh wan on found no netem here (%s); using the suite's WAN", lastLines(string(out), 3))
		default:
			t.Fatalf("regions.sh wan on: %v", err)
		}
	}
	newWAN(t, c, regionOf, wanRTT, names...)
}

// checkComposeWAN checks that the WAN is there, between the regions only:
// an exact check (decided in us-east, the home region) entering eu-west or
// ap-south takes at least the round trip; entering us-east, less than half.
func checkComposeWAN(t *testing.T, c *cluster) {
	t.Helper()
	name := "e2e-wan." + runID()
	for _, via := range []string{"us", "eu", "ap"} {
		var lo time.Duration
		for i := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			resp, err := c.nodes[via].rateLimit.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{
				Name: name, Key: "probe:" + via, Limit: 1000, WindowMs: time.Minute.Milliseconds(), Scope: sluicev1.Scope_SCOPE_EXACT}}})
			lat := time.Since(start)
			cancel()
			if err != nil || resp.Decisions[0].Error != "" {
				t.Fatalf("exact check via %s: %v %v", via, err, resp.GetDecisions())
			}
			if d := resp.Decisions[0]; !d.Allowed || d.Region != "us-east" {
				t.Fatalf("exact check via %s: allowed %v, decided in %q, want allowed in us-east", via, d.Allowed, d.Region)
			}
			if i > 0 && (lo == 0 || lat < lo) { // the first may open the node's connection to us-east
				lo = lat
			}
		}
		t.Logf("WAN: an exact check entering %s took at least %s", regionOf[via], lo.Round(100*time.Microsecond))
		switch {
		case via != "us" && lo < wanRTT:
			t.Fatalf("an exact check entering %s took %s, less than the round trip %s to us-east: no WAN?", regionOf[via], lo, wanRTT)
		case via == "us" && lo >= wanRTT/2:
			t.Fatalf("an exact check entering us-east took %s: the WAN delays traffic within a region or from the host", lo)
		}
	}
}
