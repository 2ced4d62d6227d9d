package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// benchSummary is the result of `sluice bench`; --json prints it.
type benchSummary struct {
	Workload      string           `json:"workload"`
	Nodes         int              `json:"nodes"`
	Concurrency   int              `json:"concurrency"`
	ChecksPerRPC  int              `json:"checks_per_rpc"`
	WindowS       float64          `json:"window_s"` // the measured window, s
	RPCs          int64            `json:"rpcs"`
	ChecksPerSec  float64          `json:"checks_per_sec"` // each check of a batch counts
	P50Ms         float64          `json:"p50_ms"`         // latency per RPC
	P90Ms         float64          `json:"p90_ms"`
	P99Ms         float64          `json:"p99_ms"`
	MaxMs         float64          `json:"max_ms"`
	Allowed       int64            `json:"allowed"`
	Denied        int64            `json:"denied"`
	Errors        int64            `json:"errors"` // failed RPCs plus checks answered with an error (in the window)
	AllowedPerKey map[string]int64 `json:"allowed_per_key,omitempty"`
	// Route is how checks found their node: "any" (the nodes in turn)
	// or "owner" (each straight to its key's owner; a batch split per
	// owner, its parts sent at once and timed as one RPC).
	Route string `json:"route"`
	// Owned is the share of decisions made by the node the check was sent
	// to (the rest were forwarded), 0..1.
	Owned float64 `json:"owned"`
}

// wallNow reads the wall clock for the exact workload's wait; tests replace
// it (their nodes run on a manual clock that never crosses a minute).
var wallNow = time.Now

// Bounds that keep every run finite whatever the flags say.
const (
	benchMaxRPCsPerWorker = 5_000_000
	exactKeys             = 10
	exactLimit            = 100
	exactChecks           = 5000
)

func benchCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "load a cluster with checks and report checks/s, latency and answers",
		Description: "Closed loop: --concurrency goroutines, one connection per node, each goroutine\n" +
			"sending its RPCs round-robin over --addrs; --warmup, then --duration measured.\n" +
			"Every --progress-every it prints checks/s and errors so far to stderr (rewriting one\n" +
			"line on a terminal, a line each time otherwise); once the warm-up is over, its clock\n" +
			"and rate are the measured window's alone.\n" +
			"Workloads:\n" +
			"  spread   uniform random keys out of --keys, token bucket, nothing denied, 1 check per RPC\n" +
			"  hot      every check on one key, otherwise as spread\n" +
			"  batched  as spread with --batch checks per RPC\n" +
			"  exact    10 keys, fixed window 100 per minute, 5000 checks over all nodes;\n" +
			"           reports allowed per key (the right answer: exactly 100 each)\n" +
			"It stops by itself; every goroutine is also capped at 5000000 RPCs.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "addrs", Value: "127.0.0.1:7070", Usage: "gRPC addresses of the nodes, H:P[,H:P...]", Sources: e.of("addrs")},
			&cli.StringFlag{Name: "workload", Value: "spread", Usage: "spread, hot, batched or exact"},
			&cli.IntFlag{Name: "concurrency", Value: 64, Usage: "closed-loop goroutines"},
			&cli.DurationFlag{Name: "duration", Value: 10 * time.Second, Usage: "measured window"},
			&cli.DurationFlag{Name: "warmup", Value: 2 * time.Second, Usage: "load before the measured window, not counted"},
			&cli.IntFlag{Name: "keys", Value: 100000, Usage: "distinct keys for spread and batched"},
			&cli.IntFlag{Name: "batch", Value: 100, Usage: "checks per RPC for batched (1..1000)"},
			&cli.StringFlag{Name: "route", Value: "any", Usage: "any: each RPC to the next node in turn, which forwards checks to their owners (as Envoy calls); owner: each check straight to its key's owner by the cluster's routing table, a batch split per owner (as the Go client and sluice proxy do)"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "deadline of each RPC", Sources: e.of("timeout")},
			&cli.BoolFlag{Name: "json", Usage: "print the summary as one JSON object"},
			&cli.DurationFlag{Name: "progress-every", Value: time.Second, Usage: "print checks/s and errors so far to stderr this often (one line each, rewritten in place on a terminal); 0: never"},
		}, clientAuthFlags(e)...),
		Action: func(ctx context.Context, cmd *cli.Command) error { return runBench(ctx, cmd, e.getenv) },
	}
}

func runBench(ctx context.Context, cmd *cli.Command, getenv func(string) (string, bool)) error {
	if err := noArgs(cmd); err != nil {
		return err
	}
	addrs := splitList(cmd.String("addrs"))
	workload := cmd.String("workload")
	conc, keys, batch := cmd.Int("concurrency"), cmd.Int("keys"), cmd.Int("batch")
	dur, warmup, timeout := cmd.Duration("duration"), cmd.Duration("warmup"), cmd.Duration("timeout")
	seen := map[string]bool{}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return usagef("addrs", "%q is not host:port: %v", a, err)
		}
		if seen[a] {
			return usagef("addrs", "%s is listed twice", a)
		}
		seen[a] = true
	}
	switch {
	case len(addrs) == 0:
		return usagef("addrs", "at least one address is required")
	case workload != "spread" && workload != "hot" && workload != "batched" && workload != "exact":
		return usagef("workload", "want spread, hot, batched or exact, got %q", workload)
	case conc < 1 || conc > 10000:
		return usagef("concurrency", "must be in 1..10000, got %d", conc)
	case dur <= 0 || dur > time.Hour:
		return usagef("duration", "must be in (0, 1h], got %s", dur)
	case warmup < 0 || warmup > time.Hour:
		return usagef("warmup", "must be in [0, 1h], got %s", warmup)
	case keys < 1:
		return usagef("keys", "must be >= 1, got %d", keys)
	case batch < 1 || batch > 1000:
		return usagef("batch", "must be in 1..1000, got %d", batch)
	case timeout <= 0:
		return usagef("timeout", "must be > 0, got %s", timeout)
	case cmd.String("route") != "any" && cmd.String("route") != "owner":
		return usagef("route", "want any or owner, got %q", cmd.String("route"))
	case cmd.Duration("progress-every") < 0:
		return usagef("progress-every", "must be >= 0, got %s", cmd.Duration("progress-every"))
	}
	if gc, set := defaultGCPercent(getenv); set {
		debug.SetGCPercent(gc) // as serve does: the load generator's heap is small too
	}
	clients := make([]sluicev1.RateLimitServiceClient, len(addrs))
	br := &benchRouter{names: make([]string, len(addrs))}
	for i, a := range addrs {
		conn, err := dialNode(cmd, a, rpc.WindowDialOptions()...) // a node's window: no BDP pings
		if err != nil {
			return err
		}
		defer conn.Close()
		clients[i] = sluicev1.NewRateLimitServiceClient(conn)
		name, err := waitServing(ctx, clients[i], a, timeout)
		if err != nil {
			return err
		}
		br.names[i] = name
	}
	if cmd.String("route") == "owner" {
		if err := br.fetch(ctx, clients, addrs, timeout); err != nil {
			return err
		}
	}
	progress := progress{w: cmd.Root().ErrWriter, every: cmd.Duration("progress-every")}
	if f, ok := progress.w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		progress.terminal = true
	}
	var sum benchSummary
	var err error
	if workload == "exact" {
		sum, err = benchExact(ctx, clients, br, conc, timeout, progress)
	} else {
		perRPC := 1
		if workload == "batched" {
			perRPC = batch
		}
		sum, err = benchLoad(ctx, clients, br, workload, conc, perRPC, keys, warmup, dur, timeout, progress)
	}
	if err != nil {
		return err
	}
	sum.Workload, sum.Nodes, sum.Concurrency, sum.Route = workload, len(addrs), conc, cmd.String("route")
	out := cmd.Root().Writer
	if cmd.Bool("json") {
		b, _ := json.Marshal(sum)
		fmt.Fprintf(out, "%s\n", b)
		return nil
	}
	fmt.Fprintf(out, "workload %s: nodes %d, goroutines %d, checks per RPC %d, measured %.1fs\n",
		sum.Workload, sum.Nodes, sum.Concurrency, sum.ChecksPerRPC, sum.WindowS)
	fmt.Fprintf(out, "route     %s: %.1f%% decided by the node called\n", sum.Route, 100*sum.Owned)
	fmt.Fprintf(out, "checks/s  %.0f\n", sum.ChecksPerSec)
	fmt.Fprintf(out, "latency   p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms (per RPC)\n", sum.P50Ms, sum.P90Ms, sum.P99Ms, sum.MaxMs)
	fmt.Fprintf(out, "answers   allowed %d  denied %d  errors %d\n", sum.Allowed, sum.Denied, sum.Errors)
	if sum.AllowedPerKey != nil {
		keys := make([]string, 0, len(sum.AllowedPerKey))
		for k := range sum.AllowedPerKey {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(out, "  %s: %d allowed\n", k, sum.AllowedPerKey[k])
		}
	}
	return nil
}

// waitServing asks a node for its members until it answers, for up to
// timeout, so a bench started with its cluster does not count start-up
// errors and a wrong address fails fast.
func waitServing(ctx context.Context, c sluicev1.RateLimitServiceClient, addr string, timeout time.Duration) (name string, err error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.Members(cctx, &sluicev1.MembersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return "", fmt.Errorf("node %s did not answer within --timeout %s: %w", addr, timeout, err)
	}
	return resp.GetSelf(), nil
}

// workerStats is one goroutine's counts in the measured window.
type workerStats struct {
	lat                     []time.Duration
	rpcs, checks            int64
	allowed, denied, errors int64
	owned                   int64    // decisions by the node called
	_                       [64]byte // no false sharing between workers
}

// benchLoad runs the closed loop of spread, hot and batched.
func benchLoad(ctx context.Context, clients []sluicev1.RateLimitServiceClient, br *benchRouter, workload string, conc, perRPC, keys int,
	warmup, dur, timeout time.Duration, progress progress) (benchSummary, error) {
	// Each goroutine reuses one request and draws fresh keys into it before
	// each RPC (gRPC has marshalled it by the time Check returns): a few
	// nanoseconds a check and no garbage but the key strings. A prebuilt
	// pool of requests cost the load generator more CPU than it saved, the
	// collector marking its 100000 checks over and over.
	seed := uint64(time.Now().UnixNano())
	runID := strconv.FormatUint(seed%1_000_000, 36)
	newRequest := func() *sluicev1.CheckRequest {
		req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, perRPC)}
		for k := range req.Checks {
			req.Checks[k] = &sluicev1.RateLimitCheck{
				Name: "bench." + runID, Key: "hot", Hits: proto.Int64(1), Limit: 1 << 50, WindowMs: 60_000,
				Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET,
			}
		}
		return req
	}
	start := time.Now()
	ws, we := start.Add(warmup), start.Add(warmup+dur)
	stats := make([]workerStats, conc)
	var all, window liveCounts // all answers; those in the measured window
	stop := progress.start(start, warmup, dur, &all, &window)
	var wg sync.WaitGroup
	for g := 0; g < conc; g++ {
		wg.Go(func() {
			st := &stats[g]
			st.lat = make([]time.Duration, 0, 1<<14)
			req := newRequest()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			var buf []byte
			var split benchSplit
			for n := 0; n < benchMaxRPCsPerWorker && ctx.Err() == nil; n++ {
				t0 := time.Now()
				if !t0.Before(we) {
					return
				}
				if workload != "hot" {
					buf = drawKeys(req, rng, keys, buf)
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				resp, owned, err := br.check(cctx, clients, (g+n)%len(clients), req, &split)
				cancel()
				t1 := time.Now()
				if err == nil && len(resp.Decisions) != perRPC {
					err = fmt.Errorf("%d decisions for %d checks", len(resp.Decisions), perRPC)
				}
				all.add(perRPC, err)
				if t1.Before(ws) || !t1.Before(we) {
					continue
				}
				window.add(perRPC, err)
				if err != nil {
					st.errors++
					continue
				}
				st.rpcs++
				st.checks += int64(perRPC)
				st.owned += int64(owned)
				st.lat = append(st.lat, t1.Sub(t0))
				for _, d := range resp.Decisions {
					switch {
					case d.Error != "":
						st.errors++
					case d.Allowed:
						st.allowed++
					default:
						st.denied++
					}
				}
			}
		})
	}
	wg.Wait()
	stop()
	sum := benchSummary{ChecksPerRPC: perRPC, WindowS: dur.Seconds()}
	var lat []time.Duration
	var owned, checks int64
	for i := range stats {
		s := &stats[i]
		owned += s.owned
		checks += s.checks
		sum.RPCs += s.rpcs
		sum.Allowed += s.allowed
		sum.Denied += s.denied
		sum.Errors += s.errors
		sum.ChecksPerSec += float64(s.checks)
		lat = append(lat, s.lat...)
	}
	sum.ChecksPerSec /= dur.Seconds()
	if checks > 0 {
		sum.Owned = float64(owned) / float64(checks)
	}
	slices.Sort(lat)
	ms := func(q float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	sum.P50Ms, sum.P90Ms, sum.P99Ms, sum.MaxMs = ms(0.50), ms(0.90), ms(0.99), ms(1)
	return sum, ctx.Err()
}

// benchExact sends 5000 checks of 1 hit on 10 keys (fixed window, 100 per
// minute) over all nodes and counts the allowed ones per key. It first
// waits, if needed, until at least 30 s remain in the current minute, so
// that all checks fall into one window.
func benchExact(ctx context.Context, clients []sluicev1.RateLimitServiceClient, br *benchRouter, conc int, timeout time.Duration, progress progress) (benchSummary, error) {
	if left := time.Minute - time.Duration(wallNow().UnixNano()%int64(time.Minute)); left < 30*time.Second {
		select {
		case <-time.After(left):
		case <-ctx.Done():
			return benchSummary{}, ctx.Err()
		}
	}
	runID := strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36)
	var next atomic.Int64
	var live liveCounts
	var mu sync.Mutex
	sum := benchSummary{ChecksPerRPC: 1, AllowedPerKey: map[string]int64{}}
	var lat []time.Duration
	var owned int64
	start := time.Now()
	stop := progress.start(start, 0, 0, &live, &live)
	var wg sync.WaitGroup
	for g := 0; g < conc; g++ {
		wg.Go(func() {
			var my benchSummary
			var myOwned int64
			myAllowed := map[string]int64{}
			var myLat []time.Duration
			for {
				n := next.Add(1) - 1
				if n >= exactChecks || ctx.Err() != nil {
					break
				}
				key := "k" + strconv.Itoa(int(n%exactKeys))
				req := &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{
					Name: "bench.exact." + runID, Key: key, Hits: proto.Int64(1), Limit: exactLimit, WindowMs: 60_000,
					Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW,
				}}}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(ctx, timeout)
				resp, owned, err := br.check(cctx, clients, int(n)%len(clients), req, nil)
				cancel()
				myLat = append(myLat, time.Since(t0))
				myOwned += int64(owned)
				if err == nil && (len(resp.Decisions) != 1 || resp.Decisions[0].Error != "") {
					err = errors.New("no decision")
				}
				live.add(1, err)
				switch {
				case err != nil:
					my.Errors++
				case resp.Decisions[0].Allowed:
					my.Allowed++
					myAllowed[key]++
				default:
					my.Denied++
				}
				my.RPCs++
			}
			mu.Lock()
			defer mu.Unlock()
			sum.RPCs += my.RPCs
			owned += myOwned
			sum.Allowed += my.Allowed
			sum.Denied += my.Denied
			sum.Errors += my.Errors
			for k, v := range myAllowed {
				sum.AllowedPerKey[k] += v
			}
			lat = append(lat, myLat...)
		})
	}
	wg.Wait()
	stop()
	for i := 0; i < exactKeys; i++ {
		k := "k" + strconv.Itoa(i)
		sum.AllowedPerKey[k] += 0 // list every key, also one with none allowed
	}
	elapsed := time.Since(start)
	if sum.RPCs > 0 {
		sum.Owned = float64(owned) / float64(sum.RPCs)
	}
	sum.WindowS = elapsed.Seconds()
	sum.ChecksPerSec = float64(sum.RPCs) / elapsed.Seconds()
	slices.Sort(lat)
	if len(lat) > 0 {
		q := func(f float64) float64 {
			return float64(lat[min(len(lat)-1, int(f*float64(len(lat))))]) / float64(time.Millisecond)
		}
		sum.P50Ms, sum.P90Ms, sum.P99Ms, sum.MaxMs = q(0.5), q(0.9), q(0.99), q(1)
	}
	return sum, ctx.Err()
}

// liveCounts are a bench's answers so far, read by its progress reports.
type liveCounts struct {
	checks atomic.Int64 // checks answered, errors included
	errs   atomic.Int64 // RPCs that failed
}

// add counts one RPC of checks checks that ended with err.
func (c *liveCounts) add(checks int, err error) {
	c.checks.Add(int64(checks))
	if err != nil {
		c.errs.Add(1)
	}
}

// progress is where and how often a bench reports its progress.
type progress struct {
	w        io.Writer     // stderr
	every    time.Duration // between reports; 0: none
	terminal bool          // w is a terminal: one line, rewritten in place
}

// start reports progress every p.every from start until the returned
// function is called (see progressLine): during warmup from all, after it
// from window, the counts of the measured window alone. dur is the
// measured window's length (0: unknown).
func (p progress) start(start time.Time, warmup, dur time.Duration, all, window *liveCounts) (stop func()) {
	if p.w == nil || p.every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(p.every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if p.terminal {
					fmt.Fprint(p.w, "\r\033[K")
				}
				return
			case now := <-tick.C:
				el := now.Sub(start)
				c := all
				if el >= warmup {
					c = window
				}
				line := progressLine(el, warmup, dur, c.checks.Load(), c.errs.Load())
				if p.terminal {
					fmt.Fprint(p.w, "\r\033[K"+line)
				} else {
					fmt.Fprintln(p.w, line)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// progressLine is the report at el after a bench's start: while warming
// up (el < warmup), the time into the warm-up and its rate so far; then
// the time into the measured window (the warm-up left out) of dur (0:
// unknown), and the window's rate and errors so far (checks and errs
// count the phase's answers only).
func progressLine(el, warmup, dur time.Duration, checks, errs int64) string {
	rate := func(d time.Duration) float64 {
		if d <= 0 {
			return 0
		}
		return float64(checks) / d.Seconds()
	}
	if el < warmup {
		return fmt.Sprintf("warming up %.1fs of %s: %.0f checks/s, %d errors (not counted)", el.Seconds(), warmup, rate(el), errs)
	}
	m := el - warmup
	of := ""
	if dur > 0 {
		of = " of " + dur.String()
	}
	return fmt.Sprintf("measuring %.1fs%s: %.0f checks/s, %d errors", m.Seconds(), of, rate(m), errs)
}

// drawKeys gives each check of req a key drawn uniformly at random out of
// "k0".."k<keys-1>", and returns buf, the scratch space it built them in.
func drawKeys(req *sluicev1.CheckRequest, rng *rand.Rand, keys int, buf []byte) []byte {
	for _, c := range req.Checks {
		buf = strconv.AppendInt(append(buf[:0], 'k'), int64(rng.IntN(keys)), 10)
		c.Key = string(buf)
	}
	return buf
}
