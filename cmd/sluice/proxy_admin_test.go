package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/proxyrules"
	"github.com/sluicehq/sluice/window"
)

// get sends GET url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// (e) --admin-addr serves the proxy's /healthz, /readyz and /metrics; on
// the proxied address those paths are the app's (a rule limits them like
// any other path). Readiness follows the cluster: a proxy whose cluster
// is out of reach is alive and not ready, and says why.
func TestProxyAdminEndpoints(t *testing.T) {
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: hourClock(), Limits: proxyLimits})
	dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": proxyRules})
	up := upstream(t)
	args := []string{"--upstream", up.URL, "--rules", filepath.Join(dir, "proxy.yaml"), "--admin-addr", "127.0.0.1:0", "--log-level", "error"}
	p := startProxyLogging(t, append(args, "--cluster", testcluster.Addrs(nodes)[0]), testSecrets)

	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if code, body := get(t, p.admin+path); code != 200 || body != want {
			t.Errorf("admin %s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	// On the proxied address: the app's, never the proxy's.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, body := send(t, "GET", p.base+path, "203.0.113.1", "")
		if resp.StatusCode != 200 || body != "upstream GET "+path {
			t.Errorf("proxied %s: %d %q, want the app's answer", path, resp.StatusCode, body)
		}
	}
	// /api/ is limited (3 an hour by IP); /api/metrics is no exception.
	for i, want := range []int{200, 200, 200, 429} {
		if resp, body := send(t, "GET", p.base+"/api/metrics", "203.0.113.2", ""); resp.StatusCode != want {
			t.Fatalf("proxied /api/metrics %d: %d %q, want %d", i+1, resp.StatusCode, body, want)
		}
	}
	if code, _ := get(t, p.admin+"/api/metrics"); code != http.StatusNotFound {
		t.Errorf("admin /api/metrics: %d, want 404", code)
	}
	resp, err := http.Post(p.admin+"/readyz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST admin /readyz: %d, want 405", resp.StatusCode)
	}
	m := metricsOf(t, p.admin)
	for series, want := range map[string]float64{
		`sluice_proxy_requests_total{outcome="unchecked"}`:     3,
		`sluice_proxy_requests_total{outcome="passed"}`:        3,
		`sluice_proxy_requests_total{outcome="limited"}`:       1,
		`sluice_proxy_requests_total{outcome="failed_open"}`:   0,
		`sluice_proxy_requests_total{outcome="failed_closed"}`: 0,
		`sluice_proxy_requests_total{outcome="bad_request"}`:   0,
		`sluice_proxy_cluster_ready`:                           1,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if _, body := get(t, p.admin+"/metrics"); !strings.Contains(body, "go_goroutines ") || strings.Contains(body, "203.0.113") {
		t.Errorf("/metrics: want the Go collector and no client IP:\n%s", body)
	}

	down := startProxyLogging(t, append(args, "--cluster", testnet.DeadAddr(t)), testSecrets)
	if code, _ := get(t, down.admin+"/healthz"); code != 200 {
		t.Errorf("healthz, cluster down: %d, want 200", code)
	}
	if code, body := get(t, down.admin+"/readyz"); code != 503 || !strings.Contains(body, "not ready: no node of --cluster answered") ||
		!strings.Contains(body, "connection refused") {
		t.Errorf("readyz, cluster down: %d %q", code, body)
	}
	if m := metricsOf(t, down.admin); m[`sluice_proxy_cluster_ready`] != 0 || m[`sluice_proxy_probes_total{result="unreachable"}`] != 1 {
		t.Errorf("metrics, cluster down: %v", m)
	}
}

// startProxyConfig runs runProxy(cfg) until the test ends and returns its
// base URL and admin URL.
func startProxyConfig(t *testing.T, cfg proxyConfig) (base, admin string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() { done <- runProxy(ctx, cfg, func(a, b string) { addrs <- [2]string{a, b} }) }()
	t.Cleanup(func() {
		// A connection the test's client dialed and never used would
		// hold the proxy's graceful shutdown for 5 s.
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return "http://" + a[0], "http://" + a[1]
	case err := <-done:
		t.Fatalf("proxy did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not start")
	}
	return "", ""
}

// warnings returns the warning and error lines of a text log.
func warnings(log string) []string {
	var out []string
	for l := range strings.Lines(log) {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// (f) Every node down: requests are answered by the failure policy
// (open: through to the app, closed: 503), and the log holds one line
// per kind of failure however many requests fail, until the interval
// (10 s on the proxy's clock, a manual one here) has passed: then the
// next line of a kind says how many were left out.
func TestProxyClusterDownLogsAreRateLimited(t *testing.T) {
	const n = 60
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			clock := window.NewManualClock(time.Now())
			dir := writeFiles(t, map[string]string{"proxy.yaml": strings.Replace(secureRules, "timeout: 20s", "timeout: 2s\nfailure: "+mode, 1)})
			rs, err := proxyrules.Load(filepath.Join(dir, "proxy.yaml"), noEnv)
			if err != nil {
				t.Fatal(err)
			}
			app, reached := countingApp(t)
			up, _ := url.Parse(app.URL)
			var logs syncbuf.Buffer
			base, admin := startProxyConfig(t, proxyConfig{
				listen: "127.0.0.1:0", admin: "127.0.0.1:0", upstream: up, rules: rs, maxBody: 1 << 20,
				addrs:         []string{testnet.DeadAddr(t), testnet.DeadAddr(t), testnet.DeadAddr(t)},
				probeInterval: time.Hour, probeTimeout: 2 * time.Second, logEvery: proxyLogEvery, now: clock.Now,
				logLevel: "warn", logFormat: "text", logTo: &logs,
			})
			got := sendN(t, base, "/api/x", "k", n)
			switch {
			case mode == "open" && (got[200] != n || reached.Load() != n):
				t.Fatalf("fail open: %v, the app saw %d; want all %d through", got, reached.Load(), n)
			case mode == "closed" && (got[503] != n || reached.Load() != 0):
				t.Fatalf("fail closed: %v, the app saw %d; want all %d answered 503", got, reached.Load(), n)
			}
			// Without the rate limit: a warning per node per request
			// (3n), and under fail closed an error per request.
			lines := warnings(logs.String())
			if len(lines) > 4 {
				t.Fatalf("%d warning lines for %d failed requests on 3 nodes, want at most 4 (one per kind):\n%s", len(lines), n, strings.Join(lines, ""))
			}
			for _, l := range lines {
				if strings.Contains(l, "suppressed=") {
					t.Errorf("a line says suppressed within the first interval: %s", l)
				}
			}
			if m := metricsOf(t, admin); m[`sluice_proxy_cluster_errors_total{kind="no_answer"}`] != n ||
				m[`sluice_proxy_requests_total{outcome="failed_`+mode+`"}`] != n {
				t.Errorf("metrics: %v; want %d no_answer and %d failed_%s", m, n, n, mode)
			}

			clock.Advance(proxyLogEvery)
			sendN(t, base, "/api/x", "k", 1)
			more := warnings(logs.String())[len(lines):]
			re := regexp.MustCompile(`msg="rate limit check failed".* code=Unavailable.* suppressed=(\d+)`)
			found := false
			for _, l := range more {
				if m := re.FindStringSubmatch(l); m != nil {
					found = true
					// At least one left out per request: one node each
					// (in fact all three).
					if s, _ := strconv.Atoi(m[1]); s < n {
						t.Errorf("suppressed=%d, want >= %d: %s", s, n, l)
					}
				}
			}
			if !found || len(more) > 4 {
				t.Fatalf("after the interval: %d new lines, want the client's warning again with suppressed=N:\n%s", len(more), strings.Join(more, ""))
			}
		})
	}
}

// The log's rate limit: below warn everything passes; at warn and above
// one record per level, message and code per interval, the next one
// saying how many were left out; handlers made by With share the count.
func TestThrottleHandler(t *testing.T) {
	clock := window.NewManualClock(time.Unix(1_800_000_000, 0))
	var buf bytes.Buffer
	base := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	log := slog.New(newThrottleHandler(base, 10*time.Second, clock.Now))
	with := log.With("package", "client")
	for i := range 3 {
		log.Info("info", "i", i)
	}
	for range 5 {
		with.Warn("check failed", "code", "Unavailable", "addr", "a")
		log.Warn("check failed", "code", "Unavailable", "addr", "b")
	}
	log.Warn("check failed", "code", "DeadlineExceeded")
	log.Error("check failed")
	log.Error("check failed")
	log.Warn("other")
	clock.Advance(9 * time.Second)
	log.Warn("check failed", "code", "Unavailable")
	clock.Advance(time.Second)
	log.Warn("check failed", "code", "Unavailable", "addr", "c")
	log.Warn("check failed", "code", "Unavailable")
	want := `level=INFO msg=info i=0
level=INFO msg=info i=1
level=INFO msg=info i=2
level=WARN msg="check failed" package=client code=Unavailable addr=a
level=WARN msg="check failed" code=DeadlineExceeded
level=ERROR msg="check failed"
level=WARN msg=other
level=WARN msg="check failed" code=Unavailable addr=c suppressed=10
`
	if buf.String() != want {
		t.Fatalf("log:\n%s\nwant:\n%s", buf.String(), want)
	}
}

// Probe errors are sorted by what they say: a node that answered (or
// speaks gRPC with the proxy's credentials), a node out of reach, or a
// security the proxy cannot meet, named by its flag.
func TestClassifyProbe(t *testing.T) {
	unavailable := func(msg string) error {
		return status.Error(codes.Unavailable, "connection error: desc = \""+msg+"\"")
	}
	tlsAuth := clientAuth{ca: "ca.pem", cert: "c.pem", key: "k.pem"}
	tokenAuth := clientAuth{ca: "ca.pem", token: "t", tokenFrom: "--token-file tok"}
	for _, tc := range []struct {
		err     error
		auth    clientAuth
		verdict probeVerdict
		says    string
	}{
		{nil, tlsAuth, probeOK, ""},
		{status.Error(codes.Unimplemented, "unknown service"), clientAuth{}, probeOK, ""},
		{status.Error(codes.InvalidArgument, `no limit called "x"`), tokenAuth, probeOK, `answered, but: no limit called "x"`},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), tlsAuth, probeUnreachable, "n1: DeadlineExceeded"},
		{unavailable("transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"), tlsAuth, probeUnreachable, "connection refused"},
		{unavailable("error reading server preface: EOF"), tlsAuth, probeUnreachable, "server preface"},
		{unavailable("error reading server preface: EOF"), clientAuth{}, probeRefused, "invalid --tls-ca: node n1: hung up on a plaintext call"},
		{status.Error(codes.Unavailable, "transport: per-RPC creds failed due to error: client: not sending a token over plaintext to \"10.0.0.5\": use TLS"),
			clientAuth{token: "t", tokenFrom: "SLUICE_TOKEN"}, probeRefused, "invalid --tls-ca: node n1: transport: per-RPC creds failed"},
		{unavailable("transport: authentication handshake failed: tls: first record does not look like a TLS handshake"), tlsAuth, probeRefused,
			"invalid --tls-ca: node n1: does not serve TLS"},
		{unavailable("transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate is valid for a, not n1"), tlsAuth, probeRefused,
			"invalid --tls-ca: node n1: its certificate does not verify against --tls-ca ca.pem for the address n1"},
		{unavailable("error reading server preface: remote error: tls: bad certificate"), tlsAuth, probeRefused, "invalid --tls-cert: node n1: refused the client certificate c.pem"},
		{unavailable("error reading server preface: remote error: tls: certificate required"), clientAuth{ca: "ca.pem"}, probeRefused, "invalid --tls-cert: node n1: demands a client certificate"},
		{unavailable("error reading server preface: remote error: tls: protocol version not supported"), clientAuth{ca: "ca.pem"}, probeRefused, "invalid --tls-ca: node n1: the TLS handshake failed"},
		{status.Error(codes.Unauthenticated, "unknown token"), tokenAuth, probeRefused, "invalid --token-file: node n1: refused the token of --token-file tok: unknown token"},
		{status.Error(codes.Unauthenticated, "client auth token: send Authorization: Bearer TOKEN"), tlsAuth, probeRefused, "invalid --token-file: node n1: refused the client certificate c.pem"},
		{status.Error(codes.Unauthenticated, "client auth mtls: present a client certificate"), clientAuth{}, probeRefused, "invalid --tls-cert: node n1: demands client authentication"},
		{status.Error(codes.PermissionDenied, `checks[0].name: "login" is not covered`), tokenAuth, probeRefused, "invalid --token-file: node n1: the token of --token-file tok may not check"},
		{status.Error(codes.PermissionDenied, "no"), tlsAuth, probeRefused, "invalid --tls-cert: node n1: refused the proxy's calls"},
		{errors.New("not a status"), tlsAuth, probeUnreachable, "n1: Unknown: not a status"},
	} {
		v, err := classifyProbe("n1", tc.err, tc.auth)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		var ue usageError
		if v != tc.verdict || !strings.Contains(msg, tc.says) || (v == probeRefused) != errors.As(err, &ue) {
			t.Errorf("%v (%+v): %d %q; want %d saying %q (a usageError when refused)", tc.err, tc.auth, v, msg, tc.verdict, tc.says)
		}
	}
}

// Bad values of the new flags are refused, naming the flag, before
// anything is probed or listened on.
func TestProxyRefusesBadAdminAndProbeFlags(t *testing.T) {
	dir := writeFiles(t, map[string]string{"proxy.yaml": secureRules})
	base := []string{"--upstream", "http://127.0.0.1:1", "--cluster", testnet.DeadAddr(t), "--rules", filepath.Join(dir, "proxy.yaml")}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--probe-interval", "0s"}, "invalid --probe-interval: must be > 0"},
		{[]string{"--probe-timeout", "-1s"}, "invalid --probe-timeout: must be > 0"},
		{[]string{"--admin-addr", "127.0.0.1:99999"}, "invalid --admin-addr:"},
		{[]string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, "invalid --tls-ca: required with --tls-cert and --tls-key"},
		{[]string{"--token-file", filepath.Join(dir, "none")}, "invalid --token-file:"},
	} {
		code, stderr := refusal(t, append(append([]string{}, base...), tc.args...), nil)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d %q, want %d naming %q", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
}
