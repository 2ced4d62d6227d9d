package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/window"
)

// t0 is a Unix time that is a whole multiple of every window used here.
var t0 = time.Unix(3600*500_000, 0)

var secret = []byte("0123456789abcdef-test-secret")

// env is one real node on a manual clock, and a client to it.
type env struct {
	clock  *window.ManualClock
	client *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	clock := window.NewManualClock(t0)
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: clock, Limits: "limits:\n  named:\n    limit: 3\n    window: 1m\n"})
	c, err := client.New(client.Config{Addrs: testcluster.Addrs(nodes), FailureMode: client.FailClosed, Timeout: 5 * time.Second, Logger: testcluster.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &env{clock: clock, client: c}
}

// handler returns the middleware of cfg (Checker and Now filled in)
// around a handler answering 200 "ok".
func (e *env) handler(t *testing.T, cfg middleware.Config) http.Handler {
	t.Helper()
	cfg.Checker, cfg.Now = e.client, e.clock.Now
	cfg.Logger = testcluster.Logger()
	m, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
}

// do sends a request from remote with the given headers (name, value
// pairs) and returns the answer.
func do(h http.Handler, method, remote string, headers ...string) *http.Response {
	r := httptest.NewRequest(method, "/x", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

func fixed(limit int64, w time.Duration) *client.Limit {
	return &client.Limit{Limit: limit, Window: w}
}

func byIP(t *testing.T, cfg middleware.IPConfig) middleware.KeyFunc {
	t.Helper()
	cfg.Secret = secret
	k, err := middleware.ClientIP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// C15: limit 3 per 60 s, 5 requests: 200 x3, 429 x2; remaining 2, 1, 0,
// 0, 0; limit 3 on all five; the draft fields and the reset agree.
func TestC15RemainingNeverLies(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		cfg  middleware.Config
	}{
		{"inline", middleware.Config{Name: "c15", Limit: fixed(3, time.Minute)}},
		{"named", middleware.Config{Name: "named", Window: time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Key = byIP(t, middleware.IPConfig{})
			h := e.handler(t, tc.cfg)
			for i, want := range []struct {
				code      int
				remaining string
			}{{200, "2"}, {200, "1"}, {200, "0"}, {429, "0"}, {429, "0"}} {
				resp := do(h, "GET", "192.0.2.15:4000")
				hd := resp.Header
				if resp.StatusCode != want.code || hd.Get("X-RateLimit-Remaining") != want.remaining || hd.Get("X-RateLimit-Limit") != "3" {
					t.Fatalf("request %d: %d remaining %q limit %q; want %d remaining %s limit 3",
						i+1, resp.StatusCode, hd.Get("X-RateLimit-Remaining"), hd.Get("X-RateLimit-Limit"), want.code, want.remaining)
				}
				wantReset := strconv.FormatInt(t0.Unix()+60, 10)
				if hd.Get("X-RateLimit-Reset") != wantReset {
					t.Errorf("request %d: X-RateLimit-Reset %q, want %s (Unix seconds)", i+1, hd.Get("X-RateLimit-Reset"), wantReset)
				}
				name := tc.cfg.Name
				if p := hd.Get("RateLimit-Policy"); p != fmt.Sprintf(`"%s";q=3;w=60`, name) {
					t.Errorf("request %d: RateLimit-Policy %q", i+1, p)
				}
				if s := hd.Get("RateLimit"); s != fmt.Sprintf(`"%s";r=%s;t=60`, name, want.remaining) {
					t.Errorf("request %d: RateLimit %q", i+1, s)
				}
				if want.code == 429 {
					body, _ := io.ReadAll(resp.Body)
					if hd.Get("Retry-After") != "60" || hd.Get("Cache-Control") != "no-store" ||
						string(body) != fmt.Sprintf(`{"error":"rate_limited","limit":"%s","retry_after":60}`+"\n", name) ||
						hd.Get("Content-Type") != "application/json" {
						t.Errorf("429 %d: Retry-After %q Cache-Control %q body %q", i+1, hd.Get("Retry-After"), hd.Get("Cache-Control"), body)
					}
				} else if hd.Get("Retry-After") != "" || hd.Get("Cache-Control") != "" {
					t.Errorf("200 %d carries Retry-After %q / Cache-Control %q", i+1, hd.Get("Retry-After"), hd.Get("Cache-Control"))
				}
			}
		})
	}
}

// C16: Retry-After is delta seconds, rounded up, never 0 or negative.
func TestC16RetryAfterIsDeltaSeconds(t *testing.T) {
	e := newEnv(t)
	key := byIP(t, middleware.IPConfig{})
	h := e.handler(t, middleware.Config{Name: "c16", Limit: fixed(5, time.Minute), Key: key, ResetDelta: true})
	const from = "192.0.2.16:1"
	for i := range 5 {
		if resp := do(h, "GET", from); resp.StatusCode != 200 {
			t.Fatalf("hit %d at t=0: %d", i+1, resp.StatusCode)
		}
	}
	for _, tc := range []struct {
		at          time.Duration
		code        int
		retry, left string
		reset       string
	}{
		{10 * time.Second, 429, "50", "0", "50"},
		{59500 * time.Millisecond, 429, "1", "0", "1"},
		{60 * time.Second, 200, "", "4", "60"},
	} {
		e.clock.Set(t0.Add(tc.at))
		resp := do(h, "GET", from)
		hd := resp.Header
		if resp.StatusCode != tc.code || hd.Get("Retry-After") != tc.retry || hd.Get("X-RateLimit-Remaining") != tc.left || hd.Get("X-RateLimit-Reset") != tc.reset {
			t.Errorf("t=%s: %d Retry-After %q remaining %q reset %q; want %d %q %q %q", tc.at, resp.StatusCode,
				hd.Get("Retry-After"), hd.Get("X-RateLimit-Remaining"), hd.Get("X-RateLimit-Reset"), tc.code, tc.retry, tc.left, tc.reset)
		}
	}

	e.clock.Set(t0.Add(time.Hour))
	tb := e.handler(t, middleware.Config{Name: "c16tb", Limit: &client.Limit{Limit: 5, Window: time.Minute, Algorithm: client.TokenBucket}, Key: key})
	for i := range 5 {
		if resp := do(tb, "GET", from); resp.StatusCode != 200 {
			t.Fatalf("token bucket hit %d: %d", i+1, resp.StatusCode)
		}
	}
	if resp := do(tb, "GET", from); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "12" {
		t.Fatalf("token bucket 6th hit: %d Retry-After %q, want 429 and 12", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// C17: forwarding headers count only from trusted proxies, and then the
// right-most untrusted hop is the client.
func TestC17ForgedXForwardedFor(t *testing.T) {
	e := newEnv(t)
	allowed := func(h http.Handler, remote string, headers ...[]string) int {
		n := 0
		for _, hs := range headers {
			if do(h, "GET", remote, hs...).StatusCode == 200 {
				n++
			}
		}
		return n
	}
	forged := func(header string, format string) [][]string {
		var out [][]string
		for i := range 5 {
			out = append(out, []string{header, fmt.Sprintf(format, i)})
		}
		return out
	}
	// No trusted proxies: the socket address is the client.
	h := e.handler(t, middleware.Config{Name: "c17a", Limit: fixed(2, time.Minute), Key: byIP(t, middleware.IPConfig{})})
	if n := allowed(h, "198.51.100.7:1234", forged("X-Forwarded-For", "203.0.113.%d")...); n != 2 {
		t.Fatalf("no trusted proxies, 5 forged X-Forwarded-For: %d allowed, want 2", n)
	}
	if n := allowed(h, "198.51.100.7:1234", forged("Forwarded", "for=203.0.113.%d")...); n != 0 {
		t.Fatalf("no trusted proxies, forged Forwarded: %d allowed, want 0 (same client, spent)", n)
	}

	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	h = e.handler(t, middleware.Config{Name: "c17b", Limit: fixed(2, time.Minute), Key: byIP(t, middleware.IPConfig{TrustedProxies: trusted})})
	if n := allowed(h, "10.1.2.3:80", forged("X-Forwarded-For", "198.18.0.%d, 203.0.113.9, 10.0.0.2")...); n != 2 {
		t.Fatalf("trusted 10/8, forged left-most: %d allowed, want 2", n)
	}
	// Another client behind the same proxies has its own budget, also when
	// the proxies split the header over lines.
	if n := allowed(h, "10.1.2.3:80", []string{"X-Forwarded-For", "203.0.113.9", "X-Forwarded-For", "203.0.113.10, 10.9.9.9"}); n != 1 {
		t.Fatalf("another client: %d allowed, want 1", n)
	}
	// An untrusted peer's headers are ignored even when they name a
	// spent client.
	if n := allowed(h, "198.51.100.8:1", []string{"X-Forwarded-For", "203.0.113.9"}); n != 1 {
		t.Fatalf("untrusted peer: %d allowed, want 1", n)
	}

	// The same with RFC 7239 Forwarded.
	h = e.handler(t, middleware.Config{Name: "c17c", Limit: fixed(2, time.Minute), Key: byIP(t, middleware.IPConfig{TrustedProxies: trusted, Header: "Forwarded"})})
	if n := allowed(h, "10.1.2.3:80", forged("Forwarded", `for=198.18.0.%d, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`)...); n != 2 {
		t.Fatalf("Forwarded, forged left-most: %d allowed, want 2", n)
	}
	// X-Forwarded-For is not read when the proxies write Forwarded.
	if n := allowed(h, "10.1.2.3:80", forged("X-Forwarded-For", "198.18.1.%d")...); n != 2 {
		t.Fatalf("Forwarded mode, X-Forwarded-For sent: %d allowed, want 2 (client = the proxy, all headers ignored)", n)
	}
}

// C18: IPv6 grouped by /64, spellings and IPv4-mapped forms are one
// client, zones stripped.
func TestC18IPv6ByPrefix(t *testing.T) {
	e := newEnv(t)
	h := e.handler(t, middleware.Config{Name: "c18", Limit: fixed(3, time.Minute), Key: byIP(t, middleware.IPConfig{})})
	for i, tc := range []struct {
		remote string
		code   int
	}{
		{"[2001:db8:a:b::1]:443", 200},
		{"[2001:db8:a:b::2]:443", 200},
		{"[2001:db8:a:b:ffff:ffff:ffff:ffff]:443", 200},
		{"[2001:0db8:000a:000b:0000:0000:0000:0003]:443", 429},
		{"[2001:db8:a:c::1]:443", 200},
		{"[::ffff:192.0.2.1]:1", 200},
		{"[::ffff:192.0.2.1]:2", 200},
		{"192.0.2.1:3", 200},
		{"192.0.2.1:4", 429},
		{"[fe80::1%eth0]:5", 200},
		{"[fe80::1]:5", 200},
		{"[fe80::2%lo]:5", 200},
		{"[fe80::3]:5", 429},
	} {
		if resp := do(h, "GET", tc.remote); resp.StatusCode != tc.code {
			t.Errorf("request %d from %s: %d, want %d", i+1, tc.remote, resp.StatusCode, tc.code)
		}
	}
	// Another prefix length: /48 puts ::b: and ::c: together.
	h = e.handler(t, middleware.Config{Name: "c18b", Limit: fixed(1, time.Minute), Key: byIP(t, middleware.IPConfig{IPv6Prefix: 48})})
	if do(h, "GET", "[2001:db8:a:b::1]:1").StatusCode != 200 || do(h, "GET", "[2001:db8:a:c::1]:1").StatusCode != 429 {
		t.Error("/48: two /64s of one /48 are not one client")
	}
}

// C19: a user id that looks like an IP and the client at that IP, and
// composite parts ("ab","c") and ("a","bc"), have separate budgets.
func TestC19KeysNeverCollide(t *testing.T) {
	e := newEnv(t)
	key := middleware.FirstOf(middleware.UserFromHeader("X-User"), byIP(t, middleware.IPConfig{}))
	h := e.handler(t, middleware.Config{Name: "c19", Limit: fixed(1, time.Minute), Key: key})
	if do(h, "GET", "192.0.2.4:1", "X-User", "192.0.2.4").StatusCode != 200 ||
		do(h, "GET", "192.0.2.4:1").StatusCode != 200 ||
		do(h, "GET", "192.0.2.4:1").StatusCode != 429 {
		t.Fatal("user 192.0.2.4 and the client at 192.0.2.4 share a budget")
	}
	// Raw user ids equal to another kind's key: still their own.
	ipKey, _ := byIP(t, middleware.IPConfig{})(httptest.NewRequest("GET", "/", nil))
	if do(h, "GET", "198.51.100.1:1", "X-User", ipKey).StatusCode != 200 {
		t.Fatal("a user id spelled like an IP key shares its budget")
	}

	comp := middleware.Composite(middleware.Field("a"), middleware.Field("b"))
	hc := e.handler(t, middleware.Config{Name: "c19c", Limit: fixed(1, time.Minute), Key: comp})
	post := func(body string) int {
		r := httptest.NewRequest("POST", "/signin", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		hc.ServeHTTP(w, r)
		return w.Code
	}
	if post("a=ab&b=c") != 200 || post("a=a&b=bc") != 200 || post("a=ab&b=c") != 429 {
		t.Fatal(`("ab","c") and ("a","bc") share a budget`)
	}
	for _, pair := range [][2][]middleware.KeyFunc{
		{{middleware.Const("ab"), middleware.Const("c")}, {middleware.Const("a"), middleware.Const("bc")}},
		{{middleware.Const("a:"), middleware.Const("")}, {middleware.Const("a"), middleware.Const(":")}},
		{{middleware.Const("1:a")}, {middleware.Const("1"), middleware.Const("a")}},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		k1, _ := middleware.Composite(pair[0]...)(r)
		k2, _ := middleware.Composite(pair[1]...)(r)
		if k1 == k2 {
			t.Errorf("composite keys collide: %q", k1)
		}
	}
}

// A front server's signed client IP counts only when the signature is
// valid and fresh; otherwise the socket address does.
func TestSignedClientIP(t *testing.T) {
	e := newEnv(t)
	signing := []byte("another-secret-for-ssr-signing")
	key, err := middleware.SignedClientIP(middleware.IPConfig{Secret: secret},
		middleware.SignedIPConfig{Secret: signing, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h := e.handler(t, middleware.Config{Name: "signed", Limit: fixed(2, time.Minute), Key: key})
	client := netip.MustParseAddr("203.0.113.50")
	now := e.clock.Now()
	valid := middleware.SignIP(signing, client, now.Add(-30*time.Second))
	// Two different front servers, one client: one budget.
	if do(h, "GET", "198.51.100.1:1", "X-Signed-Client-IP", valid).StatusCode != 200 ||
		do(h, "GET", "198.51.100.2:1", "X-Signed-Client-IP", valid).StatusCode != 200 ||
		do(h, "GET", "198.51.100.3:1", "X-Signed-Client-IP", valid).StatusCode != 429 {
		t.Fatal("a valid signed IP is not the key")
	}
	// The same client seen directly shares that budget.
	if do(h, "GET", "203.0.113.50:9").StatusCode != 429 {
		t.Fatal("the signed IP's key differs from the direct client's")
	}
	i := 10
	for name, v := range map[string]string{
		"altered":     strings.Replace(valid, "203.0.113.50", "203.0.113.51", 1),
		"stale":       middleware.SignIP(signing, client, now.Add(-61*time.Second)),
		"future":      middleware.SignIP(signing, client, now.Add(time.Minute)),
		"wrong key":   middleware.SignIP([]byte("not-the-signing-secret"), client, now),
		"garbage":     "203.0.113.50",
		"no time":     "203.0.113.50;;",
		"bad base64":  "203.0.113.50;1;***",
		"empty parts": ";;",
	} {
		// Ignored: the socket address (fresh each time) is the key.
		i++
		remote := fmt.Sprintf("198.51.100.%d:1", i)
		if resp := do(h, "GET", remote, "X-Signed-Client-IP", v); resp.StatusCode != 200 {
			t.Errorf("%s signature: %d, want 200 (keyed by the socket address)", name, resp.StatusCode)
		}
	}
}

// Exempt methods and routes are never checked; the others are.
func TestExempt(t *testing.T) {
	e := newEnv(t)
	h := e.handler(t, middleware.Config{Name: "exempt", Limit: fixed(1, time.Minute), Key: byIP(t, middleware.IPConfig{}),
		Exempt: func(r *http.Request) bool { return r.Method == "POST" && r.URL.Path == "/jobs" }})
	for range 3 {
		resp := do(h, "OPTIONS", "192.0.2.9:1")
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("OPTIONS: %d, headers %v", resp.StatusCode, resp.Header)
		}
		r := httptest.NewRequest("POST", "/jobs", nil)
		r.RemoteAddr = "192.0.2.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("POST /jobs: %d", w.Code)
		}
	}
	if do(h, "GET", "192.0.2.9:1").StatusCode != 200 || do(h, "GET", "192.0.2.9:1").StatusCode != 429 {
		t.Fatal("GET not limited after exempt requests")
	}
	h = e.handler(t, middleware.Config{Name: "exempt2", Limit: fixed(1, time.Minute), Key: byIP(t, middleware.IPConfig{}), ExemptMethods: []string{}})
	if do(h, "OPTIONS", "192.0.2.9:1").StatusCode != 200 || do(h, "OPTIONS", "192.0.2.9:1").StatusCode != 429 {
		t.Fatal("ExemptMethods: [] still exempts OPTIONS")
	}
}

// Field puts the body back for the handler, whole.
func TestFieldKeepsTheBody(t *testing.T) {
	big := strings.Repeat("x", middleware.MaxFieldBody)
	body := `{"email":" Alice@Example.COM ","pad":"` + big + `"}`
	r := httptest.NewRequest("POST", "/", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	if k, err := middleware.Field("email")(r); !errors.Is(err, middleware.ErrNoKey) || k != "" {
		// Only MaxFieldBody bytes are read: the field cannot be seen.
		t.Errorf("over-long JSON: %q, %v; want \"\", ErrNoKey", k, err)
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != body {
		t.Fatalf("body after Field: %d bytes, want %d", len(got), len(body))
	}
	r = httptest.NewRequest("POST", "/", strings.NewReader(`{"email":" Alice@Example.COM ","n":1}`))
	r.Header.Set("Content-Type", "application/json")
	if k, _ := middleware.Field("email")(r); k != "alice@example.com" {
		t.Fatalf("Field(email) = %q", k)
	}
}

// fakeChecker answers with a fixed decision and error.
type fakeChecker struct {
	d   client.Decision
	err error
}

func (f fakeChecker) Check(context.Context, client.Check) (client.Decision, error) { return f.d, f.err }

// Fail open passes with no rate-limit headers; fail closed answers 503;
// a key that cannot be found 400; New names bad fields.
func TestFailureAnswers(t *testing.T) {
	mk := func(c middleware.Checker) http.Handler {
		m, err := middleware.New(middleware.Config{Checker: c, Name: "api", Key: middleware.UserFromHeader("X-User"), Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, ok := middleware.DecisionFrom(r.Context()); !ok || !d.Degraded {
				w.WriteHeader(418)
			}
		}))
	}
	open := mk(fakeChecker{d: client.Decision{Allowed: true, Degraded: true, Cause: client.ErrUnavailable}})
	if resp := do(open, "GET", "192.0.2.1:1", "X-User", "u"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("fail open: %d %v", resp.StatusCode, resp.Header)
	}
	closed := mk(fakeChecker{d: client.Decision{Degraded: true}, err: fmt.Errorf("%w: no answer", client.ErrUnavailable)})
	if resp := do(closed, "GET", "192.0.2.1:1", "X-User", "u"); resp.StatusCode != 503 {
		t.Fatalf("fail closed: %d", resp.StatusCode)
	}
	if resp := do(open, "GET", "192.0.2.1:1"); resp.StatusCode != 400 {
		t.Fatalf("no key: %d, want 400", resp.StatusCode)
	}
	for _, tc := range []struct {
		cfg   middleware.Config
		field string
	}{
		{middleware.Config{Name: "a", Key: middleware.Const("k")}, "Config.Checker"},
		{middleware.Config{Checker: fakeChecker{}, Key: middleware.Const("k")}, "Config.Name"},
		{middleware.Config{Checker: fakeChecker{}, Name: "a"}, "Config.Key"},
		{middleware.Config{Checker: fakeChecker{}, Name: "a", Key: middleware.Const("k"), Limit: &client.Limit{Window: time.Second}}, "Config.Limit.Limit"},
	} {
		if _, err := middleware.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New: %v, want an error naming %s", err, tc.field)
		}
	}
	if _, err := middleware.ClientIP(middleware.IPConfig{Secret: []byte("short")}); err == nil || !strings.Contains(err.Error(), "IPConfig.Secret") {
		t.Errorf("short secret: %v", err)
	}
}

// PassOverLimit: over the limit the handler still runs and sees the
// denial; no 429 and no Retry-After.
func TestPassOverLimit(t *testing.T) {
	e := newEnv(t)
	cfg := middleware.Config{Name: "pass", Limit: fixed(1, time.Minute), Key: middleware.Const("k"), PassOverLimit: true,
		Checker: e.client, Now: e.clock.Now}
	m, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var seen []bool
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.DecisionFrom(r.Context())
		seen = append(seen, d.Allowed)
	}))
	for range 2 {
		resp := do(h, "DELETE", "192.0.2.1:1")
		if resp.StatusCode != 200 || resp.Header.Get("Retry-After") != "" || resp.Header.Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("pass over limit: %d %v", resp.StatusCode, resp.Header)
		}
	}
	if len(seen) != 2 || !seen[0] || seen[1] {
		t.Fatalf("handler saw allowed %v, want [true false]", seen)
	}
}
