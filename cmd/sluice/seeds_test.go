package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/proxyrules"
	"github.com/sluicehq/sluice/window"
)

// The seed deployments of testdata/seeds (SEEDS.md) replayed end to end:
// a 3-node cluster loading the seed's limits.yaml, the proxy with its
// proxy.yaml in front of an app that knows nothing of rate limits, and
// real HTTP requests. The nodes and the proxy share a manual clock at the
// start of the current hour, so windows and headers are exact.

const seedsDir = "../../testdata/seeds"

var seedSecrets = map[string]string{
	"S1_IP_KEY":          "s1-ip-key-0123456789abcdef",
	"S2_IP_KEY":          "s2-ip-key-0123456789abcdef",
	"S2_SSR_SIGNING_KEY": "s2-ssr-signing-key-0123456789",
	"S3_IP_KEY":          "s3-ip-key-0123456789abcdef",
}

// seed is one seed's cluster and clock.
type seed struct {
	dir   string
	clock *window.ManualClock
	t0    time.Time
	addrs []string
}

func startSeed(t *testing.T, name string) *seed {
	t.Helper()
	dir := filepath.Join(seedsDir, name)
	lim, err := os.ReadFile(filepath.Join(dir, "limits.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clock := hourClock()
	nodes := testcluster.Start(t, 3, testcluster.Options{Clock: clock, Limits: string(lim)})
	return &seed{dir: dir, clock: clock, t0: clock.Now(), addrs: testcluster.Addrs(nodes)}
}

// proxy starts the seed's proxy (its proxy.yaml passed through edit, if
// given) in front of app, reaching the cluster at addrs, logging to log
// (if not nil), and returns its base URL.
func (s *seed) proxy(t *testing.T, app *httptest.Server, addrs []string, edit func(string) string, log io.Writer) string {
	return s.proxyTimeout(t, app, addrs, edit, log, false)
}

// proxyTimeout is proxy; short keeps the file's timeout, otherwise it is
// raised to 20 s.
func (s *seed) proxyTimeout(t *testing.T, app *httptest.Server, addrs []string, edit func(string) string, log io.Writer, short bool) string {
	t.Helper()
	file := filepath.Join(s.dir, "proxy.yaml")
	if edit != nil {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lim, _ := os.ReadFile(filepath.Join(s.dir, "limits.yaml"))
		tmp := writeFiles(t, map[string]string{"proxy.yaml": edit(string(data)), "limits.yaml": string(lim)})
		file = filepath.Join(tmp, "proxy.yaml")
	}
	rs, err := proxyrules.Load(file, func(k string) (string, bool) { v, ok := seedSecrets[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	rs.Now = s.clock.Now
	if !short {
		// A loaded machine (the race detector, other tests) must not be
		// mistaken for an outage: only failOpen keeps the file's timeout.
		rs.Timeout = 20 * time.Second
	}
	logger := testcluster.Logger()
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	c, err := client.New(client.Config{Addrs: addrs, Timeout: rs.Timeout, FailureMode: rs.Failure, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	up, _ := url.Parse(app.URL)
	h, err := newProxyHandler(rs, up, c, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// want checks an answer's status and headers (name -> value; "" means
// absent).
func want(t *testing.T, what string, resp *http.Response, code int, headers map[string]string) {
	t.Helper()
	if resp.StatusCode != code {
		t.Fatalf("%s: status %d, want %d (headers %v)", what, resp.StatusCode, code, resp.Header)
	}
	for k, v := range headers {
		if got := resp.Header.Get(k); got != v {
			t.Fatalf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// body429 is the proxy's 429 body.
func body429(limit string, retry int) string {
	return fmt.Sprintf(`{"error":"rate_limited","limit":"%s","retry_after":%d}`+"\n", limit, retry)
}

// failOpen checks that with the cluster unreachable, requests reach the
// app within the seed's timeout (plus slack), with no rate-limit headers.
func failOpen(t *testing.T, s *seed, app *httptest.Server, timeout time.Duration, method, path string, headers ...string) string {
	t.Helper()
	var logs syncbuf.Buffer
	base := s.proxyTimeout(t, app, []string{testnet.DeadAddr(t), testnet.SilentAddr(t)}, nil, &logs, true)
	for i := range 4 {
		start := time.Now()
		resp, body := send(t, method, base+path, "203.0.113.250", "", headers...)
		if took := time.Since(start); took > timeout+2*time.Second { // slack for a loaded machine; a hung node alone would never answer
			t.Errorf("fail open %d: took %s, timeout %s", i, took, timeout)
		}
		want(t, "fail open", resp, 200, map[string]string{"X-RateLimit-Limit": "", "Retry-After": ""})
		if !strings.HasPrefix(body, "app ") {
			t.Fatalf("fail open %d: body %q", i, body)
		}
	}
	return logs.String()
}

// app is the seed's app: echoApp named "app" (the over-limit mark comes
// back in App-Over-Limit).
func app(t *testing.T) *httptest.Server { return echoApp(t, "app") }

// S1: a ranking and voting site.
func TestSeedS1(t *testing.T) {
	s := startSeed(t, "s1")
	a := app(t)
	base := s.proxy(t, a, s.addrs, nil, nil)
	reset := unix(s.t0.Add(2 * time.Minute)) // sliding window: full again once this window's hits have aged out

	// Anonymous: 10 per 60 s by IP, every header; the 11th is 429.
	for i := 1; i <= 10; i++ {
		resp, body := send(t, "GET", base+"/api/posts", "203.0.113.10", "")
		want(t, fmt.Sprintf("anonymous %d", i), resp, 200, map[string]string{
			"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": strconv.Itoa(10 - i), "X-RateLimit-Reset": reset,
			"RateLimit-Policy": `"api";q=10;w=60`, "RateLimit": fmt.Sprintf(`"api";r=%d;t=120`, 10-i), "Retry-After": "",
		})
		if body != "app GET /api/posts" {
			t.Fatalf("anonymous %d: body %q", i, body)
		}
	}
	// Sliding window 10/60 s, 10 hits at 0: the next fits once the
	// previous window's weight drops by one hit, 66 s from now.
	resp, body := send(t, "GET", base+"/api/posts", "203.0.113.10", "")
	want(t, "anonymous 11", resp, 429, map[string]string{
		"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset,
		"Retry-After": "66", "Cache-Control": "no-store", "Content-Type": "application/json",
	})
	if body != body429("api", 66) {
		t.Fatalf("429 body %q", body)
	}
	// Signed in (same IP): the user's own budget of 30.
	for i := 1; i <= 31; i++ {
		resp, _ := send(t, "GET", base+"/api/feed", "203.0.113.10", "", "X-User-Id", "u-1")
		code := 200
		if i == 31 {
			code = 429
		}
		want(t, fmt.Sprintf("user %d", i), resp, code, map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": strconv.Itoa(max(30-i, 0))})
	}
	// A user id that is an IP is not that IP's budget.
	resp, _ = send(t, "GET", base+"/api/feed", "198.51.100.1", "", "X-User-Id", "203.0.113.10")
	want(t, "user 203.0.113.10", resp, 200, map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "29"})
	// Votes are their own scope: the anonymous client out of api budget votes.
	resp, _ = send(t, "POST", base+"/api/vote", "203.0.113.10", "")
	want(t, "vote", resp, 200, map[string]string{"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "RateLimit-Policy": `"vote";q=10;w=60`})
	resp, _ = send(t, "POST", base+"/api/vote", "203.0.113.10", "", "X-User-Id", "u-1")
	want(t, "vote signed in", resp, 200, map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "29"})
	// The auth routes, by IP.
	for _, r := range []struct {
		path, limit string
		n           int
		window      time.Duration
	}{{"/auth/signup", "auth.signup", 5, time.Hour}, {"/auth/signin", "auth.signin", 20, time.Minute}, {"/auth/forgot-password", "auth.forgot-password", 3, time.Hour}} {
		for i := 1; i <= r.n+1; i++ {
			resp, body := send(t, "POST", base+r.path, "192.0.2.77", "")
			if i <= r.n {
				want(t, r.path, resp, 200, map[string]string{"X-RateLimit-Limit": strconv.Itoa(r.n), "X-RateLimit-Remaining": strconv.Itoa(r.n - i)})
				continue
			}
			// n hits at 0 of a sliding window W: the next fits after W + W/n.
			retry := int((r.window + r.window/time.Duration(r.n) + time.Second - 1) / time.Second)
			want(t, r.path+" over", resp, 429, map[string]string{"X-RateLimit-Limit": strconv.Itoa(r.n), "X-RateLimit-Remaining": "0",
				"Retry-After": strconv.Itoa(retry), "RateLimit-Policy": fmt.Sprintf(`"%s";q=%d;w=%d`, r.limit, r.n, int(r.window/time.Second))})
			if body != body429(r.limit, retry) {
				t.Fatalf("%s: body %q", r.path, body)
			}
		}
	}
	// CORS preflights are never limited.
	resp, _ = send(t, "OPTIONS", base+"/api/posts", "203.0.113.10", "")
	want(t, "OPTIONS", resp, 200, map[string]string{"X-RateLimit-Limit": ""})
	// Two windows later the anonymous client is back at 10.
	s.clock.Set(s.t0.Add(2 * time.Minute))
	resp, _ = send(t, "GET", base+"/api/posts", "203.0.113.10", "")
	want(t, "anonymous after 2 min", resp, 200, map[string]string{"X-RateLimit-Remaining": "9"})

	failOpen(t, s, a, 250*time.Millisecond, "GET", "/api/posts")
}

// S2: a student-portal API.
func TestSeedS2(t *testing.T) {
	s := startSeed(t, "s2")
	a := app(t)
	base := s.proxy(t, a, s.addrs, nil, nil)
	realIP := func(ip string, more ...string) []string { return append([]string{"X-Real-IP", ip}, more...) }

	// 600 per IP per 60 s, every route together (and cookies are no part
	// of the key: a campus behind one NAT shares its quota).
	routes := []struct{ method, path string }{{"GET", "/courses"}, {"POST", "/grades"}, {"PUT", "/profile"}, {"GET", "/timetable/week"}}
	for i := 1; i <= 600; i++ {
		r := routes[i%len(routes)]
		resp, _ := send(t, r.method, base+r.path, "", "", realIP("198.51.100.20", "Cookie", fmt.Sprintf("session=%d", i))...)
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(600-i) {
			t.Fatalf("request %d: %d remaining %q", i, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
		}
	}
	// Sliding 600/60 s with 600 hits at 0: the next fits at 60.1 s.
	resp, body := send(t, "GET", base+"/courses", "", "", realIP("198.51.100.20")...)
	want(t, "601st", resp, 429, map[string]string{"Cache-Control": "no-store", "Retry-After": "61", "X-RateLimit-Limit": "600",
		"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": unix(s.t0.Add(2 * time.Minute))})
	if body != body429("production.api", 61) {
		t.Fatalf("429 body %q", body)
	}
	// Exempt: preflights and the job callback, even over quota.
	for _, r := range []struct{ method, path string }{{"OPTIONS", "/courses"}, {"POST", "/jobs"}} {
		resp, body := send(t, r.method, base+r.path, "", "", realIP("198.51.100.20")...)
		want(t, r.method+" "+r.path, resp, 200, map[string]string{"X-RateLimit-Limit": ""})
		if body != "app "+r.method+" "+r.path {
			t.Fatalf("%s %s: body %q", r.method, r.path, body)
		}
	}
	// Logout over quota still reaches the app, marked.
	resp, body = send(t, "DELETE", base+"/auth/login", "", "", realIP("198.51.100.20")...)
	want(t, "logout over quota", resp, 200, map[string]string{"App-Over-Limit": "production.api", "X-RateLimit-Remaining": "0"})
	if body != "app DELETE /auth/login" {
		t.Fatalf("logout: body %q", body)
	}
	// Login: 30 per 60 s, counted in the 600 too.
	for i := 1; i <= 31; i++ {
		resp, _ := send(t, "POST", base+"/auth/login", "", "", realIP("198.51.100.21")...)
		code := 200
		if i == 31 {
			code = 429
		}
		want(t, fmt.Sprintf("login %d", i), resp, code, map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": strconv.Itoa(max(30-i, 0))})
	}
	resp, _ = send(t, "GET", base+"/courses", "", "", realIP("198.51.100.21")...)
	want(t, "api after logins", resp, 200, map[string]string{"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": strconv.Itoa(600 - 31)})
	// IPv6 by /64.
	for i, tc := range []struct{ ip, remaining string }{
		{"2001:db8:5:6::1", "599"}, {"2001:db8:5:6:ffff::2", "598"}, {"2001:db8:5:7::1", "599"}, {"::ffff:198.51.100.21", strconv.Itoa(600 - 32)},
	} {
		resp, _ := send(t, "GET", base+"/courses", "", "", realIP(tc.ip)...)
		want(t, fmt.Sprintf("ipv6 %d (%s)", i, tc.ip), resp, 200, map[string]string{"X-RateLimit-Remaining": tc.remaining})
	}
	// The renderer's signed client IP counts when valid and fresh; forged,
	// altered, stale or wrongly keyed values are ignored (X-Real-IP counts).
	key := []byte(seedSecrets["S2_SSR_SIGNING_KEY"])
	visitor := netip.MustParseAddr("203.0.113.30")
	now := s.clock.Now()
	for i, tc := range []struct {
		what, signed, realIP, remaining string
	}{
		{"valid", middleware.SignIP(key, visitor, now.Add(-59*time.Second)), "192.0.2.200", "599"},
		{"the visitor directly", "", "203.0.113.30", "598"},
		{"altered", strings.Replace(middleware.SignIP(key, visitor, now), "203.0.113.30", "203.0.113.31", 1), "192.0.2.201", "599"},
		{"stale", middleware.SignIP(key, visitor, now.Add(-61*time.Second)), "192.0.2.202", "599"},
		{"session secret", middleware.SignIP([]byte("the-session-secret-0123456789"), visitor, now), "192.0.2.203", "599"},
		{"valid again", middleware.SignIP(key, visitor, now), "192.0.2.204", "597"},
	} {
		hs := realIP(tc.realIP)
		if tc.signed != "" {
			hs = append(hs, "X-Signed-Client-IP", tc.signed)
		}
		resp, _ := send(t, "GET", base+"/courses", "", "", hs...)
		want(t, fmt.Sprintf("signed %d (%s)", i, tc.what), resp, 200, map[string]string{"X-RateLimit-Remaining": tc.remaining})
	}
	// Preview never shares production's counters.
	preview := s.proxy(t, a, s.addrs, func(f string) string { return strings.ReplaceAll(f, "production.", "preview.") }, nil)
	resp, _ = send(t, "GET", preview+"/courses", "", "", realIP("198.51.100.20")...)
	want(t, "preview", resp, 200, map[string]string{"X-RateLimit-Remaining": "599", "RateLimit-Policy": `"preview.api";q=600;w=60`})
	// The next window: sliding, so the previous 600 still weigh; 61 s in,
	// 600*(59/60) = 590 of them count.
	s.clock.Set(s.t0.Add(61 * time.Second))
	resp, _ = send(t, "GET", base+"/courses", "", "", realIP("198.51.100.20")...)
	want(t, "61 s later", resp, 200, map[string]string{"X-RateLimit-Remaining": "9"})

	// Fail open within the 1 s timeout; the event is logged without the
	// key, the IP or error text.
	logs := failOpen(t, s, a, time.Second, "GET", "/courses", realIP("198.51.100.99")...)
	if !strings.Contains(logs, "event=rate_limit.unavailable") || strings.Contains(logs, "198.51.100.99") || strings.Contains(logs, "ip:") {
		t.Fatalf("fail-open log:\n%s", logs)
	}
}

// S3: a SaaS starter kit: only its sensitive routes are limited, exactly.
func TestSeedS3(t *testing.T) {
	s := startSeed(t, "s3")
	a := app(t)
	base := s.proxy(t, a, s.addrs, nil, nil)
	form := []string{"Content-Type", "application/x-www-form-urlencoded"}
	signin := func(path, ip, email string) *http.Response {
		resp, _ := send(t, "POST", base+path, ip, "email="+url.QueryEscape(email)+"&password=x", form...)
		return resp
	}
	reset := unix(s.t0.Add(time.Minute))

	// Sign-in by route + IP + e-mail: 5 per minute.
	for i := 1; i <= 5; i++ {
		want(t, fmt.Sprintf("signin %d", i), signin("/api/auth/signin/password", "203.0.113.40", "ann@example.com"), 200,
			map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": strconv.Itoa(5 - i), "X-RateLimit-Reset": reset})
	}
	want(t, "signin 6 (spelled otherwise)", signin("/api/auth/signin/password", "203.0.113.40", " Ann@Example.COM"), 429,
		map[string]string{"Retry-After": "60", "Cache-Control": "no-store"})
	want(t, "other e-mail", signin("/api/auth/signin/password", "203.0.113.40", "bob@example.com"), 200, map[string]string{"X-RateLimit-Remaining": "4"})
	want(t, "other IP", signin("/api/auth/signin/password", "203.0.113.41", "ann@example.com"), 200, map[string]string{"X-RateLimit-Remaining": "4"})
	want(t, "code sign-in", signin("/api/auth/signin/code", "203.0.113.40", "ann@example.com"), 200, map[string]string{"X-RateLimit-Remaining": "4"})

	// Exact under concurrency (the kit undercounted): 40 at once, 5 allowed,
	// every answer a real decision (with headers), none failed open.
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			resp := signin("/api/auth/signin/password", "203.0.113.42", "cat@example.com")
			switch {
			case resp.Header.Get("X-RateLimit-Limit") != "5":
			case resp.StatusCode == 200:
				allowed.Add(1)
			case resp.StatusCode == 429:
				denied.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 5 || denied.Load() != 35 {
		t.Fatalf("40 concurrent sign-ins: %d allowed, %d denied; want exactly 5 and 35", allowed.Load(), denied.Load())
	}

	// MFA and recovery codes by user id, wherever the user comes from.
	for _, r := range []struct {
		path string
		n    int
	}{{"/api/mfa/enroll/verify", 5}, {"/api/mfa/challenge", 5}, {"/api/mfa/recovery-codes", 3}} {
		for i := 1; i <= r.n+1; i++ {
			resp, _ := send(t, "POST", base+r.path, fmt.Sprintf("198.51.100.%d", i), "", "X-User-Id", "user-1")
			code := 200
			if i > r.n {
				code = 429
			}
			want(t, fmt.Sprintf("%s %d", r.path, i), resp, code, map[string]string{"X-RateLimit-Limit": strconv.Itoa(r.n)})
		}
		resp, _ := send(t, "POST", base+r.path, "198.51.100.1", "", "X-User-Id", "user-2")
		want(t, r.path+" other user", resp, 200, map[string]string{"X-RateLimit-Remaining": strconv.Itoa(r.n - 1)})
	}
	resp, _ := send(t, "POST", base+"/api/mfa/recovery-codes", "198.51.100.1", "", "X-User-Id", "user-1")
	want(t, "recovery over", resp, 429, map[string]string{"Retry-After": "3600"})

	// Guest checkout and the payment webhook by route + IP: separate.
	for _, r := range []struct {
		path string
		n    int
	}{{"/api/checkout/guest", 10}, {"/api/webhooks/payment", 100}} {
		for i := 1; i <= r.n+1; i++ {
			resp, _ := send(t, "POST", base+r.path, "192.0.2.60", "")
			code := 200
			if i > r.n {
				code = 429
			}
			want(t, fmt.Sprintf("%s %d", r.path, i), resp, code, map[string]string{"X-RateLimit-Limit": strconv.Itoa(r.n)})
		}
	}
	// Everything else is not limited.
	for i := range 30 {
		for _, r := range []struct{ method, path string }{{"GET", "/api/projects"}, {"POST", "/api/projects"}, {"GET", "/"}} {
			resp, body := send(t, r.method, base+r.path, "192.0.2.60", "")
			want(t, fmt.Sprintf("%s %s %d", r.method, r.path, i), resp, 200, map[string]string{"X-RateLimit-Limit": ""})
			if body != "app "+r.method+" "+r.path {
				t.Fatalf("%s %s: body %q", r.method, r.path, body)
			}
		}
	}
	// A minute later the sign-in budget is back (fixed window, exact).
	s.clock.Set(s.t0.Add(time.Minute))
	want(t, "signin next window", signin("/api/auth/signin/password", "203.0.113.40", "ann@example.com"), 200, map[string]string{"X-RateLimit-Remaining": "4"})

	failOpen(t, s, a, 500*time.Millisecond, "POST", "/api/checkout/guest")
}
