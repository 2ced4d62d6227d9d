package main

import (
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// startManualNode runs a node whose clock stands still at a minute's start.
func startManualNode(t *testing.T, name string, join ...string) *rpc.Node {
	t.Helper()
	n, err := rpc.StartNode(rpc.NodeConfig{
		Name: name, GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", Join: join,
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second,
		Clock: window.NewManualClock(time.Unix(60*30_000_000, 0)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(t.Context()) })
	return n
}

func TestBenchExactAndSpread(t *testing.T) {
	old := wallNow
	wallNow = func() time.Time { return time.Unix(60*30_000_000, 0) } // a minute just began
	defer func() { wallNow = old }()
	n1 := startManualNode(t, "b1")
	n2 := startManualNode(t, "b2", n1.GossipAddr())
	addrs := n1.GRPCAddr() + "," + n2.GRPCAddr()
	deadline := time.Now().Add(15 * time.Second)
	agreed := func() bool {
		m, err := n1.Server().Members(t.Context(), &sluicev1.MembersRequest{})
		return err == nil && len(m.Members) == 2 && n1.Server().RingFingerprint() == n2.Server().RingFingerprint()
	}
	for !agreed() {
		if time.Now().After(deadline) {
			t.Fatal("rings never agreed")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Exact stays exact on every route; --route owner sends each check to
	// its owner (every decision made by the node called), --route any
	// round robin (about half forwarded on two nodes).
	for _, route := range []string{"any", "owner"} {
		code, out, errOut := sluice(t, "bench", "--addrs", addrs, "--workload", "exact", "--concurrency", "16", "--json", "--route", route)
		if code != 0 {
			t.Fatalf("exact, route %s: exit %d: %s", route, code, errOut)
		}
		var s benchSummary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if s.Allowed != 1000 || s.Denied != 4000 || s.Errors != 0 || len(s.AllowedPerKey) != 10 || s.Route != route {
			t.Fatalf("exact, route %s: %+v", route, s)
		}
		for k, v := range s.AllowedPerKey {
			if v != 100 {
				t.Fatalf("exact, route %s: key %s allowed %d, want 100", route, k, v)
			}
		}
		if (route == "owner" && s.Owned != 1) || (route == "any" && (s.Owned < 0.2 || s.Owned > 0.8)) {
			t.Fatalf("exact, route %s: %.2f decided by the node called", route, s.Owned)
		}

		code, out, errOut = sluice(t, "bench", "--addrs", addrs, "--workload", "batched", "--batch", "10",
			"--concurrency", "4", "--duration", "300ms", "--warmup", "100ms", "--json", "--route", route)
		if code != 0 {
			t.Fatalf("batched, route %s: exit %d: %s", route, code, errOut)
		}
		s = benchSummary{}
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, f := range []string{`"checks_per_sec"`, `"p50_ms"`, `"p90_ms"`, `"p99_ms"`, `"max_ms"`, `"allowed"`, `"denied"`, `"errors"`, `"route"`, `"owned"`} {
			if !strings.Contains(out, f) {
				t.Fatalf("summary lacks %s: %s", f, out)
			}
		}
		if s.ChecksPerRPC != 10 || s.RPCs == 0 || s.Allowed != s.RPCs*10 || s.Denied != 0 || s.Errors != 0 ||
			s.ChecksPerSec <= 0 || s.P50Ms <= 0 || s.P50Ms > s.P90Ms || s.P99Ms > s.MaxMs {
			t.Fatalf("batched, route %s: %+v", route, s)
		}
		if (route == "owner" && s.Owned != 1) || (route == "any" && s.Owned > 0.8) {
			t.Fatalf("batched, route %s: %.2f decided by the node called", route, s.Owned)
		}
	}
	if code, _, errOut := sluice(t, "bench", "--addrs", n1.GRPCAddr(), "--route", "owner", "--duration", "100ms"); code != 2 || !strings.Contains(errOut, "--addrs") {
		t.Fatalf("owner route with a member missing from --addrs: exit %d %s", code, errOut)
	}
	if code, _, errOut := sluice(t, "bench", "--addrs", addrs, "--route", "nearest"); code != 2 || !strings.Contains(errOut, "--route") {
		t.Fatalf("unknown route: exit %d %s", code, errOut)
	}

	if code, _, errOut := sluice(t, "bench", "--addrs", addrs, "--workload", "storm"); code != 2 || !strings.Contains(errOut, "--workload") {
		t.Fatalf("unknown workload: exit %d %s", code, errOut)
	}
}

// drawKeys, which the spread and batched workloads call before every RPC,
// gives each check of the reused request its own key, uniform over
// "k0".."k<keys-1>" and nothing else.
func TestDrawKeysIsUniformOverKeys(t *testing.T) {
	const keys, rpcs, perRPC = 10, 10_000, 10
	req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, perRPC)}
	for i := range req.Checks {
		req.Checks[i] = &sluicev1.RateLimitCheck{Key: "hot"}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	counts := map[string]int{}
	var buf []byte
	sameInRPC := 0
	for range rpcs {
		buf = drawKeys(req, rng, keys, buf)
		for _, c := range req.Checks {
			counts[c.Key]++
		}
		if req.Checks[0].Key == req.Checks[1].Key {
			sameInRPC++
		}
	}
	if len(counts) != keys {
		t.Fatalf("drew %d distinct keys, want %d: %v", len(counts), keys, counts)
	}
	want := rpcs * perRPC / keys // 10000 each
	for i := range keys {
		k := "k" + strconv.Itoa(i)
		if n := counts[k]; n < want*95/100 || n > want*105/100 {
			t.Errorf("key %s drawn %d times, want %d within 5%%", k, n, want)
		}
	}
	// Two checks of one RPC share a key 1 time in 10 when drawn apart.
	if sameInRPC < rpcs/20 || sameInRPC > rpcs*3/20 {
		t.Errorf("checks 0 and 1 of an RPC had the same key in %d of %d RPCs, want about %d", sameInRPC, rpcs, rpcs/10)
	}
}

// A progress report while warming up counts the warm-up; once measuring,
// its clock and rate are the measured window's alone.
func TestProgressLine(t *testing.T) {
	tests := []struct {
		el, warmup, dur time.Duration
		checks, errs    int64
		want            string
	}{
		{time.Second, 2 * time.Second, 10 * time.Second, 5000, 0, "warming up 1.0s of 2s: 5000 checks/s, 0 errors (not counted)"},
		// 4 s after the start is 2 s into the window: 3000 checks there.
		{4 * time.Second, 2 * time.Second, 10 * time.Second, 3000, 1, "measuring 2.0s of 10s: 1500 checks/s, 1 errors"},
		{2 * time.Second, 2 * time.Second, 10 * time.Second, 0, 0, "measuring 0.0s of 10s: 0 checks/s, 0 errors"},
		{1500 * time.Millisecond, 0, 0, 3000, 0, "measuring 1.5s: 2000 checks/s, 0 errors"}, // exact: no warm-up, no set length
	}
	for _, tt := range tests {
		if got := progressLine(tt.el, tt.warmup, tt.dur, tt.checks, tt.errs); got != tt.want {
			t.Errorf("progressLine(%s, %s, %s, %d, %d) = %q, want %q", tt.el, tt.warmup, tt.dur, tt.checks, tt.errs, got, tt.want)
		}
	}
}

// Progress goes to stderr also when it is not a terminal: one line per
// report, no escape codes; while measuring, its clock leaves the warm-up
// out (every measuring report is under the 600 ms warm-up, where counting
// it would put each at 600 ms or more). The summary stays alone on
// stdout.
func TestBenchProgressWithoutATerminal(t *testing.T) {
	n := startManualNode(t, "p1")
	code, out, errOut := sluice(t, "bench", "--addrs", n.GRPCAddr(), "--workload", "spread", "--concurrency", "2",
		"--warmup", "600ms", "--duration", "300ms", "--progress-every", "50ms", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var s benchSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.RPCs == 0 {
		t.Fatalf("stdout is not the summary alone (%v): %q", err, out)
	}
	if strings.ContainsAny(errOut, "\r\033") {
		t.Fatalf("escape codes on a stderr that is no terminal: %q", errOut)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	warming := regexp.MustCompile(`^warming up \d+\.\ds of 600ms: \d+ checks/s, 0 errors \(not counted\)$`)
	measuring := regexp.MustCompile(`^measuring (\d+\.\d)s of 300ms: \d+ checks/s, 0 errors$`)
	var warm, measured int
	for _, l := range lines {
		switch m := measuring.FindStringSubmatch(l); {
		case warming.MatchString(l):
			warm++
		case m != nil:
			measured++
			if sec, _ := strconv.ParseFloat(m[1], 64); sec >= 0.6 {
				t.Errorf("a measuring report at %ss: the warm-up was counted (%q)", m[1], l)
			}
		default:
			t.Errorf("unexpected stderr line %q", l)
		}
	}
	if warm == 0 || measured == 0 {
		t.Fatalf("%d warming up and %d measuring reports, want some of each:\n%s", warm, measured, errOut)
	}
	if code, _, errOut := sluice(t, "bench", "--addrs", n.GRPCAddr(), "--progress-every", "-1s"); code != 2 || !strings.Contains(errOut, "--progress-every") {
		t.Fatalf("a negative --progress-every: exit %d %s", code, errOut)
	}
}
