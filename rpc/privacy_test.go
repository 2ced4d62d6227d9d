package rpc

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// No key and no client IP appears in any log line (at debug level) or in
// any error a client gets, through a multi-node run that forwards checks,
// answers degraded checks while an owner is down, refuses bad input and
// keys past the cap, refuses a forged hand-off and hands keys off on a
// graceful leave.
func TestNoKeysOrIPsInLogsOrErrors(t *testing.T) {
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	clock := windowClock()
	cfg := NodeConfig{ForwardTimeout: time.Second, HTTPAddr: "127.0.0.1:0", Logger: logger, MaxKeys: 2048, HandOffTimeout: 2 * time.Second}
	n1 := startNodeWith(t, "node1", clock, cfg)
	n2 := startNodeWith(t, "node2", clock, cfg, n1.GossipAddr())
	n3 := startNodeWith(t, "node3", clock, cfg, n1.GossipAddr())
	nodes := []*testNode{n1, n2, n3}
	waitRingAgrees(t, nodes)

	// Markers no line may hold: keys (some of them IPs) and client IPs.
	const secretKey, ipKey, headerIP = "zq-secret-user-4711", "198.51.100.213", "203.0.113.77"
	markers := []string{secretKey, ipKey, headerIP, "zq-long-", "zq-bad"}
	var clientErrs []string
	checkAll := func(n *testNode, checks ...*sluicev1.RateLimitCheck) {
		resp, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: checks})
		if err != nil {
			clientErrs = append(clientErrs, status.Convert(err).Message())
			return
		}
		for _, d := range resp.Decisions {
			clientErrs = append(clientErrs, d.Error)
		}
	}
	ck := func(key string) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "api", Key: key, Limit: 2, WindowMs: 3_600_000}
	}
	for i := range 30 {
		for _, n := range nodes {
			checkAll(n, ck(fmt.Sprint(secretKey, i)), ck(fmt.Sprint(ipKey, ":", i)))
		}
	}
	// Bad input carrying the markers.
	checkAll(n1, ck("zq-long-"+strings.Repeat("x", 600)))
	checkAll(n1, &sluicev1.RateLimitCheck{Name: "api", Key: secretKey, Limit: -1, WindowMs: 1000})
	checkAll(n1, &sluicev1.RateLimitCheck{Name: "api", Key: "zq-bad\xff", Limit: 1, WindowMs: 1000})
	// Keys past the cap (2048, half for inline names).
	var flood []*sluicev1.RateLimitCheck
	for i := range 1000 {
		flood = append(flood, ck(fmt.Sprint(secretKey, "-flood-", i)))
	}
	checkAll(n1, flood...)
	checkAll(n1, flood...)
	// Over HTTP, with the client IP in the headers a proxy would set.
	for i := range 5 {
		body := fmt.Sprintf(`{"checks":[{"name":"api","key":"%s-http-%d","limit":2,"window_ms":60000}]}`, secretKey, i)
		req, _ := http.NewRequest("POST", "http://"+n2.HTTPAddr()+"/v1/check", strings.NewReader(body))
		req.Header.Set("X-Forwarded-For", headerIP)
		req.Header.Set("X-Real-IP", headerIP)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		clientErrs = append(clientErrs, b.String())
	}
	// A forged hand-off of a marker key.
	fp := n1.Server().RingFingerprint()
	handOff(t, dialPeer(t, n1.GRPCAddr()), &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
		States: []*sluicev1.KeyState{{Key: ring.Key(nil, "api", secretKey), State: encodeState(window.FixedWindow, time.Hour, clock.Now().Add(24*time.Hour), 1, 0, 0)}}})
	// An owner down: degraded answers (their errors are logged at debug).
	n3.Kill()
	for i := range 30 {
		checkAll(n1, ck(fmt.Sprint(secretKey, i)), ck(fmt.Sprint(ipKey, ":", i)))
	}
	// A graceful leave hands keys off.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = n2.Close(ctx)

	out := logs.String()
	if testing.Verbose() {
		msgs := map[string]int{}
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, "msg="); i >= 0 {
				msgs[strings.SplitN(l[i:], " node=", 2)[0]]++
			}
		}
		t.Logf("%d log lines: %v", strings.Count(out, "\n"), msgs)
	}
	if !strings.Contains(out, "hand-off state refused") || !strings.Contains(out, "level=DEBUG") {
		t.Fatalf("the logs miss the scenario's events; the test would show nothing:\n%.2000s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		for _, m := range markers {
			if strings.Contains(line, m) {
				t.Errorf("a log line holds %q: %s", m, line)
			}
		}
	}
	refusedErr := false
	for _, e := range clientErrs {
		for _, m := range markers {
			if strings.Contains(e, m) {
				t.Errorf("an error to a client holds %q: %s", m, e)
			}
		}
		refusedErr = refusedErr || strings.Contains(e, "checks[0].key")
	}
	if !refusedErr {
		t.Fatal("no client error named the bad key field: the bad input was not refused")
	}
}

// Metric labels take configured limit names only: 10000 inline names and
// 10000 client IPs (as keys, and in proxy headers) add at most 10 series
// to /metrics.
func TestMetricSeriesBounded(t *testing.T) {
	n := startInproc(t, NodeConfig{Name: "node1", Clock: windowClock(), HTTPAddr: "127.0.0.1:0", Limits: mustParseLimits(t, testLimits)})[0]
	series := func() map[string]bool {
		_, out := n.httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", "")
		m := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			m[line[:strings.LastIndexByte(line, ' ')]] = true
		}
		return m
	}
	check(t, n.client, named("api", "warm")) // the configured name's series exist before
	before := series()
	for b := range 10 {
		req := &sluicev1.CheckRequest{}
		for i := range 1000 {
			req.Checks = append(req.Checks, &sluicev1.RateLimitCheck{Name: fmt.Sprintf("inline-%d-%d", b, i), Key: "k", Limit: 1, WindowMs: 1000})
		}
		if _, err := n.client.Check(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	for b := range 10 {
		var sb strings.Builder
		sb.WriteString(`{"checks":[`)
		for i := range 1000 {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"name":"api","key":"10.%d.%d.%d"}`, b, i/256, i%256)
		}
		sb.WriteString(`]}`)
		req, _ := http.NewRequest("POST", "http://"+n.HTTPAddr()+"/v1/check", strings.NewReader(sb.String()))
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("192.0.2.%d", b))
		resp, err := n.httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("HTTP batch: %d", resp.StatusCode)
		}
	}
	after := series()
	var added []string
	for s := range after {
		if !before[s] {
			added = append(added, s)
		}
	}
	if len(added) > 10 {
		t.Fatalf("%d series added by 10000 inline names and 10000 IPs, want at most 10: %v", len(added), added[:20])
	}
	for s := range after {
		if strings.Contains(s, "inline-") || strings.Contains(s, "10.") && strings.Contains(s, "key") {
			t.Fatalf("a series names an inline name or a key: %s", s)
		}
	}
	if n.Store().Len() < 10_000 {
		t.Fatalf("only %d keys: the checks did not go through", n.Store().Len())
	}
}
