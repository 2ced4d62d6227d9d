package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testcluster"
)

const pathRules = `
timeout: 20s
limits_file: limits.yaml
client_ip:
  secret_env: T_IP_SECRET
  trusted_proxies: [127.0.0.0/8]
exempt: [options, "get /public/", "post /jobs"]
rules:
  - match: post /auth/login
    limit: signin
    key: ip
  - match: GET /report
    limit: signin
    key: ip
  - match: /keyed/
    limit: signin
    key: header:X-Api-Key
`

// startPathProxy runs the proxy with rules in front of a fresh cluster
// and upstream.
func startPathProxy(t *testing.T, rules string) string {
	t.Helper()
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: hourClock(), Limits: proxyLimits})
	dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": rules})
	up := upstream(t)
	return startProxy(t, []string{"--upstream", up.URL, "--cluster", strings.Join(testcluster.Addrs(nodes), ","),
		"--rules", filepath.Join(dir, "proxy.yaml")}, testSecrets)
}

// Every spelling of a path that an upstream may route to the same handler
// meets the same rule (limit 1 per hour here), in any case, with any
// method case; what goes upstream is the request as sent.
func TestProxyPathSpellingsMeetTheRule(t *testing.T) {
	base := startPathProxy(t, pathRules)
	resp, body := send(t, "POST", base+"/auth/login;jsessionid=1", "203.0.113.60", "")
	if resp.StatusCode != 200 || body != "upstream POST /auth/login;jsessionid=1" || resp.Header.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("first login: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	for _, p := range []string{"/auth/login", "/auth/login/", "//auth/login", "/auth/./login", "/AUTH/LOGIN", "/auth/login;x",
		"/auth/login%20", "/auth/login%09", "/auth/x/../login", "/auth/..;/auth/login", "/Auth//Login/;a=b", "/auth/log%69n"} {
		if resp, body := send(t, "POST", base+p, "203.0.113.60", ""); resp.StatusCode != 429 {
			t.Errorf("POST %s: %d %q, want 429", p, resp.StatusCode, body)
		}
	}
	if resp, _ := send(t, "post", base+"/auth/login", "203.0.113.60", ""); resp.StatusCode != 429 {
		t.Errorf("method post: %d, want 429", resp.StatusCode)
	}
	// Another route is another route; another IP its own budget.
	if resp, _ := send(t, "POST", base+"/auth/logout", "203.0.113.60", ""); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Errorf("POST /auth/logout: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := send(t, "POST", base+"/AUTH/LOGIN/", "203.0.113.61", ""); resp.StatusCode != 200 {
		t.Errorf("other IP: %d", resp.StatusCode)
	}
	// GET rules cover HEAD.
	for i, tc := range []struct{ method, path string }{{"HEAD", "/report"}, {"GET", "/Report/"}} {
		if resp, _ := send(t, tc.method, base+tc.path, "203.0.113.62", ""); resp.StatusCode != []int{200, 429}[i] {
			t.Errorf("%s %s: %d", tc.method, tc.path, resp.StatusCode)
		}
	}
	// Exempt, written in lower case: never limited, in any spelling.
	for range 3 {
		for _, tc := range []struct{ method, path string }{{"OPTIONS", "/auth/login"}, {"GET", "/public/a"}, {"GET", "/PUBLIC/a"}, {"POST", "/jobs/"}} {
			if resp, _ := send(t, tc.method, base+tc.path, "203.0.113.63", ""); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("exempt %s %s: %d %v", tc.method, tc.path, resp.StatusCode, resp.Header)
			}
		}
	}
	// ".." out of an exempt subtree is not exempt.
	if resp, _ := send(t, "POST", base+"/public/../auth/login", "203.0.113.60", ""); resp.StatusCode != 429 {
		t.Errorf("POST /public/../auth/login: %d, want 429", resp.StatusCode)
	}
}

// case_sensitive_paths: true compares paths as written.
func TestProxyCaseSensitivePaths(t *testing.T) {
	base := startPathProxy(t, pathRules+"case_sensitive_paths: true\n")
	for i, tc := range []struct {
		path  string
		code  int
		limit string
	}{{"/auth/login", 200, "1"}, {"/auth/login/", 429, "1"}, {"/AUTH/LOGIN", 200, ""}} {
		if resp, _ := send(t, "POST", base+tc.path, "203.0.113.70", ""); resp.StatusCode != tc.code || resp.Header.Get("X-RateLimit-Limit") != tc.limit {
			t.Errorf("%d POST %s: %d limit %q, want %d %q", i, tc.path, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), tc.code, tc.limit)
		}
	}
}

// A key that is not valid UTF-8 is refused with 400, never sent (it used
// to fail open: unlimited); a header too long for a key is 431; a missing
// one 400.
func TestProxyBadKeys(t *testing.T) {
	base := startPathProxy(t, pathRules)
	for i, want := range []int{200, 429, 429} {
		if resp, _ := send(t, "GET", base+"/keyed/x", "", "", "X-Api-Key", "k1"); resp.StatusCode != want {
			t.Fatalf("k1 %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	for i := range 3 {
		resp, body := send(t, "GET", base+"/keyed/x", "", "", "X-Api-Key", "k1\xff")
		if resp.StatusCode != 400 || strings.HasPrefix(body, "upstream") {
			t.Fatalf("k1\\xff %d: %d %q, want 400", i+1, resp.StatusCode, body)
		}
	}
	if resp, _ := send(t, "GET", base+"/keyed/x", "", "", "X-Api-Key", strings.Repeat("k", 2000)); resp.StatusCode != 431 {
		t.Fatalf("2000-byte key: %d, want 431", resp.StatusCode)
	}
	if resp, _ := send(t, "GET", base+"/keyed/x", "", ""); resp.StatusCode != 400 {
		t.Fatalf("no key: %d, want 400", resp.StatusCode)
	}
}
