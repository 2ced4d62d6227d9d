package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// startProxy runs `sluice proxy` with args and env until the test ends,
// and returns its base URL (from its start line).
func startProxy(t *testing.T, args []string, env map[string]string) string {
	t.Helper()
	return startProxyLogging(t, append([]string{"--log-level", "error"}, args...), env).base
}

// runningProxy is a `sluice proxy` that startProxyLogging started.
type runningProxy struct {
	base   string          // http://HOST:PORT of the proxied address
	admin  string          // http://HOST:PORT of --admin-addr; "" when off
	stderr *syncbuf.Buffer // its log
}

// startProxyLogging runs `sluice proxy --listen 127.0.0.1:0` with args
// and env until the test ends (it must then exit 0), and returns its
// addresses (from its start lines) and its log.
func startProxyLogging(t *testing.T, args []string, env map[string]string) runningProxy {
	t.Helper()
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"sluice", "proxy", "--listen", "127.0.0.1:0"}, args...), getenv, &out, &errOut)
	}()
	t.Cleanup(func() {
		// A connection the test's client dialed and never used would
		// hold the proxy's graceful shutdown for 5 s.
		http.DefaultClient.CloseIdleConnections()
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("proxy exited %d: %s", code, errOut.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("proxy did not stop")
		}
	})
	re := regexp.MustCompile(`proxy listening on (\S+)`)
	adminRe := regexp.MustCompile(`proxy admin on (\S+)`)
	wantAdmin := slices.Contains(args, "--admin-addr")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			p := runningProxy{base: "http://" + m[1], stderr: &errOut}
			if a := adminRe.FindStringSubmatch(out.String()); a != nil {
				p.admin = "http://" + a[1]
			} else if wantAdmin {
				t.Fatalf("no admin line:\n%s", out.String())
			}
			return p
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("proxy exited %d before listening:\n%s", code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start line:\n%s%s", out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// echoApp is an app that knows nothing of rate limits: it answers 200
// "NAME METHOD PATH" and echoes the over-limit header it got in the
// header "Name-Over-Limit".
func echoApp(t *testing.T, name string) *httptest.Server {
	t.Helper()
	over := textproto.CanonicalMIMEHeaderKey(name + "-Over-Limit")
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(over, r.Header.Get(overLimitHeader))
		fmt.Fprintf(w, "%s %s %s", name, r.Method, r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s
}

// upstream is the proxy tests' app: echoApp named "upstream".
func upstream(t *testing.T) *httptest.Server { return echoApp(t, "upstream") }

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// send makes one request to base+path from the client IP from (sent as
// X-Forwarded-For: the proxy trusts loopback) with headers (name, value
// pairs) and body, and returns the answer with its body read.
func send(t *testing.T, method, url, from, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if from != "" {
		req.Header.Set("X-Forwarded-For", from)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const proxyLimits = `
limits:
  api:
    limit: 3
    window: 1h
    overrides:
      - key_prefix: "user:"
        limit: 5
  login:
    limit: 2
    window: 1h
  signin:
    limit: 1
    window: 1h
`

const proxyRules = `
timeout: 20s
limits_file: limits.yaml
client_ip:
  secret_env: T_IP_SECRET
  trusted_proxies: [127.0.0.0/8]
user_header: X-User-Id
exempt: [OPTIONS, POST /api/jobs]
rules:
  - match: POST /api/login
    checks:
      - {limit: api, key: user|ip}
      - {limit: login, key: ip}
  - match: DELETE /api/session
    limit: api
    key: user|ip
    over_limit: forward
  - match: POST /signin
    limit: signin
    key: route+ip+field:email
  - match: /api/
    limit: api
    key: user|ip
`

var testSecrets = map[string]string{"T_IP_SECRET": "proxy-test-secret-0123456789"}

// hourClock is a manual clock at the start of the current hour, so that
// windows of an hour are whole and X-RateLimit-Reset is known exactly.
func hourClock() *window.ManualClock {
	return window.NewManualClock(time.Now().Truncate(time.Hour))
}

// The proxy applies the checks of the first matching rule, keys by user
// or IP, exempts what the file says, and answers 429 with the headers and
// body.
func TestProxyRules(t *testing.T) {
	clock := hourClock()
	nodes := testcluster.Start(t, 3, testcluster.Options{Clock: clock, Limits: proxyLimits})
	dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": proxyRules})
	up := upstream(t)
	base := startProxy(t, []string{"--upstream", up.URL, "--cluster", strings.Join(testcluster.Addrs(nodes), ","),
		"--rules", filepath.Join(dir, "proxy.yaml")}, testSecrets)
	reset := strconv.FormatInt(clock.Now().Add(time.Hour).Unix(), 10)

	// Anonymous: 3 per hour by IP; the 4th is 429 with every header.
	for i := 1; i <= 4; i++ {
		resp, body := send(t, "GET", base+"/api/items", "203.0.113.1", "")
		h := resp.Header
		want := []string{"", "2", "1", "0", "0"}[i]
		if h.Get("X-RateLimit-Limit") != "3" || h.Get("X-RateLimit-Remaining") != want || h.Get("X-RateLimit-Reset") != reset ||
			h.Get("RateLimit-Policy") != `"api";q=3;w=3600` || !strings.HasPrefix(h.Get("RateLimit"), `"api";r=`+want+";t=") {
			t.Errorf("anonymous %d: headers %v", i, h)
		}
		if i <= 3 && (resp.StatusCode != 200 || body != "upstream GET /api/items") {
			t.Fatalf("anonymous %d: %d %q", i, resp.StatusCode, body)
		}
		if i == 4 {
			ra, _ := strconv.Atoi(h.Get("Retry-After"))
			if resp.StatusCode != 429 || ra < 1 || ra > 3600 || h.Get("Cache-Control") != "no-store" ||
				body != fmt.Sprintf(`{"error":"rate_limited","limit":"api","retry_after":%d}`+"\n", ra) {
				t.Fatalf("anonymous 4: %d Retry-After %q Cache-Control %q body %q", resp.StatusCode, h.Get("Retry-After"), h.Get("Cache-Control"), body)
			}
		}
	}
	// A signed-in user (same IP): own budget of 5 (override by prefix).
	for i := 1; i <= 6; i++ {
		resp, _ := send(t, "GET", base+"/api/items", "203.0.113.1", "", "X-User-Id", "u-42")
		if (resp.StatusCode == 200) != (i <= 5) || resp.Header.Get("X-RateLimit-Limit") != "5" {
			t.Fatalf("user request %d: %d limit %q", i, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"))
		}
	}
	// Exempt: OPTIONS anywhere, POST /api/jobs; no headers.
	for range 5 {
		for _, m := range []string{"OPTIONS", "POST"} {
			resp, _ := send(t, m, base+"/api/jobs", "203.0.113.1", "")
			if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("exempt %s /api/jobs: %d %v", m, resp.StatusCode, resp.Header)
			}
		}
	}
	// Two checks on POST /api/login: api (3) and login (2), for a fresh IP.
	for i, want := range []int{200, 200, 429} {
		resp, _ := send(t, "POST", base+"/api/login", "203.0.113.2", "")
		if resp.StatusCode != want {
			t.Fatalf("login %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// The rule's checks are one request, counted all or nothing: the
	// refused third login counted against neither limit, so api has
	// counted two logins and allows that IP one more hit.
	for i, want := range []int{200, 429} {
		if resp, _ := send(t, "GET", base+"/api/x", "203.0.113.2", ""); resp.StatusCode != want {
			t.Fatalf("api after logins, request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// over_limit: forward reaches the app, marked; a client's own mark is
	// dropped.
	for i := range 4 {
		resp, body := send(t, "DELETE", base+"/api/session", "203.0.113.3", "", overLimitHeader, "forged")
		over := resp.Header.Get("Upstream-Over-Limit")
		if resp.StatusCode != 200 || body != "upstream DELETE /api/session" || over != []string{"", "", "", "api"}[i] {
			t.Fatalf("logout %d: %d %q over-limit %q", i+1, resp.StatusCode, body, over)
		}
	}
	// Composite key: route + IP + e-mail.
	for i, tc := range []struct {
		from, email string
		code        int
	}{
		{"203.0.113.4", "a@example.com", 200},
		{"203.0.113.4", "A@Example.com", 429},
		{"203.0.113.4", "b@example.com", 200},
		{"203.0.113.5", "a@example.com", 200},
	} {
		resp, body := send(t, "POST", base+"/signin", tc.from, "email="+tc.email, "Content-Type", "application/x-www-form-urlencoded")
		if resp.StatusCode != tc.code {
			t.Fatalf("signin %d: %d, want %d", i+1, resp.StatusCode, tc.code)
		}
		if tc.code == 200 && body != "upstream POST /signin" {
			t.Fatalf("signin %d: body %q", i+1, body)
		}
	}
	// No rule matches: forwarded unlimited.
	for range 5 {
		if resp, _ := send(t, "GET", base+"/public", "203.0.113.1", ""); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("unlimited route: %d", resp.StatusCode)
		}
	}
}

// The cluster unreachable: fail open answers within the timeout with no
// rate-limit headers; fail closed answers 503.
func TestProxyClusterUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	up := upstream(t)
	for _, mode := range []string{"open", "closed"} {
		rules := strings.Replace(proxyRules, "timeout: 20s", "timeout: 300ms\nfailure: "+mode, 1)
		dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": rules})
		base := startProxy(t, []string{"--upstream", up.URL, "--cluster", dead, "--rules", filepath.Join(dir, "proxy.yaml")}, testSecrets)
		for i := range 5 {
			start := time.Now()
			resp, body := send(t, "GET", base+"/api/items", "203.0.113.1", "")
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("%s %d: took %s, timeout 300ms", mode, i, took)
			}
			if mode == "open" && (resp.StatusCode != 200 || body != "upstream GET /api/items" || resp.Header.Get("X-RateLimit-Limit") != "") {
				t.Fatalf("fail open %d: %d %q %v", i, resp.StatusCode, body, resp.Header)
			}
			if mode == "closed" && resp.StatusCode != 503 {
				t.Fatalf("fail closed %d: %d %q", i, resp.StatusCode, body)
			}
		}
	}
}

// Bad flags name the flag (bad rules files: proxyrules'
// TestProxyRefusesBadRules).
func TestProxyRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--cluster", "x:1", "--rules", "r"}, "--upstream: required"},
		{[]string{"proxy", "--upstream", "ftp://x", "--cluster", "x:1", "--rules", "r"}, "--upstream"},
		{[]string{"proxy", "--upstream", "http://x", "--cluster", " , ", "--rules", "r"}, "--cluster"},
		{[]string{"proxy", "--upstream", "http://x", "--cluster", "x:1", "--rules", "r", "--route", "nearest"}, "--route"},
	} {
		code, _, stderr := sluice(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s; want exit 2 naming %s", tc.args, code, stderr, tc.want)
		}
	}
}

// recordingNode is a stand-in cluster of one gRPC node that records every
// Check request and answers each check allowed, and marked degraded when
// its key holds "degraded" (as a node whose policy allowed it with the
// key's owner unreachable).
type recordingNode struct {
	sluicev1.UnimplementedRateLimitServiceServer
	addr string
	mu   sync.Mutex
	reqs []*sluicev1.CheckRequest
}

func (f *recordingNode) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, proto.CloneOf(req))
	f.mu.Unlock()
	resp := &sluicev1.CheckResponse{}
	for _, c := range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9, Owner: "node1",
			Degraded: strings.Contains(c.Key, "degraded")})
	}
	return resp, nil
}

// take returns the requests recorded since the last take.
func (f *recordingNode) take() []*sluicev1.CheckRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.reqs
	f.reqs = nil
	return out
}

func startRecordingNode(t *testing.T) *recordingNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &recordingNode{addr: lis.Addr().String()}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

// failure: closed sends every check with OWNER_UNAVAILABLE_DENY and
// answers a degraded answer (even an allowed one) 503; a rule's own
// failure: open wins over the file's and lets it through, sending no
// policy; a rule with several checks is one call carrying all of them.
func TestProxyFailureModeReachesTheNodes(t *testing.T) {
	node := startRecordingNode(t)
	const rules = `
timeout: 20s
failure: closed
rules:
  - match: POST /login
    checks:
      - {limit: api, key: "header:X-K"}
      - {limit: login, key: "route+header:X-K"}
  - match: /open/
    failure: open
    limit: api
    key: "header:X-K"
  - match: /
    limit: api
    key: "header:X-K"
`
	dir := writeFiles(t, map[string]string{"proxy.yaml": rules})
	base := startProxy(t, []string{"--upstream", upstream(t).URL, "--cluster", node.addr, "--rules", filepath.Join(dir, "proxy.yaml")}, nil)
	deny, unspecified := sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY, sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED
	for _, tc := range []struct {
		method, path, key string
		code              int
		names             []string // the checks of the one request the node got
		policy            sluicev1.OwnerUnavailablePolicy
	}{
		{"GET", "/items", "k1", 200, []string{"api"}, deny},
		{"GET", "/items", "degraded-1", 503, []string{"api"}, deny},
		{"GET", "/open/items", "degraded-2", 200, []string{"api"}, unspecified},
		{"POST", "/login", "k3", 200, []string{"api", "login"}, deny},
		{"POST", "/login", "degraded-4", 503, []string{"api", "login"}, deny},
	} {
		resp, body := send(t, tc.method, base+tc.path, "", "", "X-K", tc.key)
		if resp.StatusCode != tc.code {
			t.Fatalf("%s %s (key %s): %d %q, want %d", tc.method, tc.path, tc.key, resp.StatusCode, body, tc.code)
		}
		if tc.code == 200 && body != "upstream "+tc.method+" "+tc.path {
			t.Fatalf("%s %s: body %q", tc.method, tc.path, body)
		}
		reqs := node.take()
		if len(reqs) != 1 || len(reqs[0].Checks) != len(tc.names) || !reqs[0].AllOrNothing {
			t.Fatalf("%s %s: the node got %v, want one all-or-nothing request of %d checks", tc.method, tc.path, reqs, len(tc.names))
		}
		for i, c := range reqs[0].Checks {
			if c.Name != tc.names[i] || c.OnOwnerUnavailable != tc.policy {
				t.Errorf("%s %s: checks[%d] = %s with %s, want %s with %s", tc.method, tc.path, i, c.Name, c.OnOwnerUnavailable, tc.names[i], tc.policy)
			}
		}
	}
}
