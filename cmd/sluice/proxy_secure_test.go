package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/internal/testnet"
)

// The secure tests' limits and rules: api admits secureLimit requests an
// hour per X-K header; login is a second name, for tokens' prefixes.
const (
	secureLimit  = 7
	secureLimits = `
limits:
  api: {limit: 7, window: 1h}
  login: {limit: 2, window: 1h}
`
	secureRules = `
timeout: 20s
rules:
  - match: /api/
    limit: api
    key: header:X-K
`
	// secureRulesLogin also limits /login by login (a name a token
	// covering api only may not check).
	secureRulesLogin = secureRules + `  - match: /login
    limit: login
    key: header:X-K
`
)

// countingApp answers 200 "ok" and counts the requests that reach it.
func countingApp(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(s.Close)
	return s, &n
}

// refusal runs `sluice proxy` with args, which must refuse to start, and
// returns its exit code and stderr. A proxy that starts instead fails
// the test (and is stopped).
func refusal(t *testing.T, args []string, env map[string]string) (int, string) {
	t.Helper()
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut syncbuf.Buffer
	code := run(ctx, append([]string{"sluice", "proxy", "--listen", "127.0.0.1:0", "--probe-timeout", "3s"}, args...), getenv, &out, &errOut)
	t.Logf("exit %d: %s", code, errOut.String())
	if strings.Contains(out.String(), "proxy listening") {
		t.Fatalf("the proxy started (exit %d after the test's deadline): %s%s", code, out.String(), errOut.String())
	}
	return code, errOut.String()
}

// sendN sends n requests GET base+path with X-K: key from 4 goroutines
// and returns how many got each status.
func sendN(t *testing.T, base, path, key string, n int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	got := map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, err := http.NewRequest("GET", base+path, nil)
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("X-K", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				got[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

// metricsOf reads the proxy's /metrics at admin and returns each
// sluice_proxy_ series (name and labels as written) by its value.
func metricsOf(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sluice_proxy_") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		m[line[:sp]] = v
	}
	return m
}

// (a) The proxy in front of a three-node cluster that takes only mutual
// TLS, with a client certificate from the cluster's CA: of 3 × limit
// requests with one key, sent 4 at a time, exactly limit reach the app
// and every other one is answered 429; another key has its own budget;
// the proxy's metrics count them.
func TestProxyMutualTLSClusterLimitsExactly(t *testing.T) {
	pki := testcluster.NewPKI(t, "sluice test CA")
	nodes := testcluster.Start(t, 3, testcluster.Options{Clock: hourClock(), Limits: secureLimits, PKI: pki})
	cert, key := pki.Issue(t, certs.Client, "proxy")
	app, reached := countingApp(t)
	dir := writeFiles(t, map[string]string{"proxy.yaml": secureRules})
	p := startProxyLogging(t, []string{"--upstream", app.URL, "--cluster", strings.Join(testcluster.Addrs(nodes), ","),
		"--rules", filepath.Join(dir, "proxy.yaml"), "--admin-addr", "127.0.0.1:0", "--log-level", "warn",
		"--tls-ca", pki.CAFile, "--tls-cert", cert, "--tls-key", key}, nil)

	const n = 3 * secureLimit
	got := sendN(t, p.base, "/api/items", "k1", n)
	if got[200] != secureLimit || got[429] != n-secureLimit || len(got) != 2 {
		t.Fatalf("answers %v; want %d × 200 and %d × 429, nothing else", got, secureLimit, n-secureLimit)
	}
	if r := reached.Load(); r != secureLimit {
		t.Fatalf("the app saw %d requests, want %d", r, secureLimit)
	}
	if got := sendN(t, p.base, "/api/items", "k2", 1); got[200] != 1 {
		t.Fatalf("another key: %v, want 200", got)
	}
	m := metricsOf(t, p.admin)
	for series, want := range map[string]float64{
		`sluice_proxy_requests_total{outcome="passed"}`:        secureLimit + 1,
		`sluice_proxy_requests_total{outcome="limited"}`:       n - secureLimit,
		`sluice_proxy_requests_total{outcome="failed_open"}`:   0,
		`sluice_proxy_cluster_errors_total{kind="no_answer"}`:  0,
		`sluice_proxy_cluster_ready`:                           1,
		`sluice_proxy_probes_total{result="ok"}`:               1,
		`sluice_proxy_probes_total{result="refused"}`:          0,
		`sluice_proxy_requests_total{outcome="failed_closed"}`: 0,
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
	if log := p.stderr.String(); strings.Contains(log, "level=WARN") || strings.Contains(log, "level=ERROR") {
		t.Errorf("warnings with a healthy cluster:\n%s", log)
	}
}

// (b) A client certificate the cluster cannot take (signed by another
// CA), a CA that does not sign the nodes' certificates, a certificate and
// key that are not a pair, or a file that cannot be read: the proxy
// refuses to start, and the message names the flag and the file.
func TestProxyRefusesWrongCertificates(t *testing.T) {
	pki := testcluster.NewPKI(t, "sluice test CA")
	other := testcluster.NewPKI(t, "another CA")
	nodes := testcluster.Start(t, 2, testcluster.Options{Limits: secureLimits, PKI: pki})
	good, goodKey := pki.Issue(t, certs.Client, "proxy")
	bad, badKey := other.Issue(t, certs.Client, "proxy")
	app, reached := countingApp(t)
	dir := writeFiles(t, map[string]string{"proxy.yaml": secureRules})
	base := []string{"--upstream", app.URL, "--cluster", strings.Join(testcluster.Addrs(nodes), ","), "--rules", filepath.Join(dir, "proxy.yaml")}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"certificate of another CA", []string{"--tls-ca", pki.CAFile, "--tls-cert", bad, "--tls-key", badKey}, exitUsage,
			[]string{"invalid --tls-cert:", "refused the client certificate " + bad, "not signed by the CA of --tls-ca " + pki.CAFile}},
		{"CA that does not sign the nodes", []string{"--tls-ca", other.CAFile, "--tls-cert", good, "--tls-key", goodKey}, exitUsage,
			[]string{"invalid --tls-ca:", "does not verify against --tls-ca " + other.CAFile, "x509: certificate signed by unknown authority"}},
		{"certificate and key not a pair", []string{"--tls-ca", pki.CAFile, "--tls-cert", good, "--tls-key", badKey}, exitUsage,
			[]string{"invalid --tls-cert:", good, badKey, "private key does not match public key"}},
		{"unreadable certificate", []string{"--tls-ca", pki.CAFile, "--tls-cert", filepath.Join(dir, "none.pem"), "--tls-key", goodKey}, exitUsage,
			[]string{"invalid --tls-cert:", filepath.Join(dir, "none.pem"), "no such file"}},
		{"unreadable CA", []string{"--tls-ca", filepath.Join(dir, "none.pem")}, exitUsage,
			[]string{"invalid --tls-ca:", filepath.Join(dir, "none.pem")}},
		{"a key and no certificate", []string{"--tls-ca", pki.CAFile, "--tls-key", goodKey}, exitUsage,
			[]string{"invalid --tls-cert:", "together"}},
	} {
		code, stderr := refusal(t, append(base, tc.args...), nil)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d: %s", tc.name, code, tc.code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr does not say %q:\n%s", tc.name, w, stderr)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the app saw %d requests", n)
	}
}

// (c) No client certificate against a cluster that takes only mutual
// TLS, or no TLS at all against a TLS cluster: the proxy refuses to start
// (it used to start, warn on every request and let all through).
func TestProxyRefusesWithoutClientCertificate(t *testing.T) {
	pki := testcluster.NewPKI(t, "sluice test CA")
	nodes := testcluster.Start(t, 1, testcluster.Options{Limits: secureLimits, PKI: pki})
	app, _ := countingApp(t)
	dir := writeFiles(t, map[string]string{"proxy.yaml": secureRules})
	base := []string{"--upstream", app.URL, "--cluster", testcluster.Addrs(nodes)[0], "--rules", filepath.Join(dir, "proxy.yaml")}
	code, stderr := refusal(t, append(base, "--tls-ca", pki.CAFile), nil)
	if code != exitUsage || !strings.Contains(stderr, "invalid --tls-cert:") || !strings.Contains(stderr, "demands a client certificate") ||
		!strings.Contains(stderr, "give --tls-cert and --tls-key") {
		t.Errorf("TLS without a client certificate: exit %d: %s", code, stderr)
	}
	code, stderr = refusal(t, base, nil)
	if code != exitUsage || !strings.Contains(stderr, "invalid --tls-ca:") || !strings.Contains(stderr, "does it serve TLS? give --tls-ca") {
		t.Errorf("plaintext to a TLS cluster: exit %d: %s", code, stderr)
	}
	// The same flags from the environment.
	code, stderr = refusal(t, base, map[string]string{"SLUICE_TLS_CA": pki.CAFile})
	if code != exitUsage || !strings.Contains(stderr, "demands a client certificate") {
		t.Errorf("SLUICE_TLS_CA without a client certificate: exit %d: %s", code, stderr)
	}
}

// (d) A cluster that takes tokens (over TLS): the right token works and
// limits exactly; an unknown token, one that may not check a rule's
// limit, or none, and the proxy refuses to start naming where the token
// came from.
func TestProxyToken(t *testing.T) {
	pki := testcluster.NewPKI(t, "sluice test CA")
	const tok = "proxy-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tok+" api\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: hourClock(), Limits: secureLimits, PKI: pki, ClientAuth: "either", TokenFile: tokens})
	dir := writeFiles(t, map[string]string{"proxy.yaml": secureRules, "login.yaml": secureRulesLogin,
		"good": tok + "\n", "wrong": "not-the-token-0123456789abcdef\n"})
	app, reached := countingApp(t)
	base := []string{"--upstream", app.URL, "--cluster", testcluster.Addrs(nodes)[0], "--tls-ca", pki.CAFile}
	rules := func(f string) []string { return []string{"--rules", filepath.Join(dir, f)} }

	p := startProxyLogging(t, append(append(base, rules("proxy.yaml")...), "--token-file", filepath.Join(dir, "good"), "--log-level", "error"), nil)
	got := sendN(t, p.base, "/api/x", "k", secureLimit+3)
	if got[200] != secureLimit || got[429] != 3 || len(got) != 2 || reached.Load() != secureLimit {
		t.Fatalf("with the right token: %v, the app saw %d; want %d × 200 and 3 × 429", got, reached.Load(), secureLimit)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"unknown token", append(rules("proxy.yaml"), "--token-file", filepath.Join(dir, "wrong")), nil,
			[]string{"invalid --token-file:", "refused the token of --token-file " + filepath.Join(dir, "wrong"), "unknown token"}},
		{"unknown token from SLUICE_TOKEN", rules("proxy.yaml"), map[string]string{"SLUICE_TOKEN": "not-the-token-0123456789abcdef"},
			[]string{"invalid SLUICE_TOKEN:", "unknown token"}},
		{"a token that may not check login", append(rules("login.yaml"), "--token-file", filepath.Join(dir, "good")), nil,
			[]string{"invalid --token-file:", "may not check a rule's limit", `"login" is not covered`}},
		{"no token", rules("proxy.yaml"), nil,
			[]string{"invalid --tls-cert:", "demands client authentication", "--token-file"}},
	} {
		code, stderr := refusal(t, append(append([]string{}, base...), tc.args...), tc.env)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d: %s", tc.name, code, exitUsage, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr does not say %q:\n%s", tc.name, w, stderr)
			}
		}
	}
}

// secondLook tells a refusal of the proxy's security from a broken
// connection without racing the node's alert: TLS without a client
// certificate against mutual TLS, a client certificate of another CA, a
// CA that does not sign the node, and plaintext against TLS are refusals;
// the right credentials, a plaintext node and a dead address are not.
func TestProbeSecondLook(t *testing.T) {
	pki := testcluster.NewPKI(t, "sluice test CA")
	other := testcluster.NewPKI(t, "another CA")
	secure := testcluster.Addrs(testcluster.Start(t, 1, testcluster.Options{PKI: pki}))[0]
	plain := testcluster.Addrs(testcluster.Start(t, 1, testcluster.Options{}))[0]
	good, goodKey := pki.Issue(t, certs.Client, "proxy")
	bad, badKey := other.Issue(t, certs.Client, "proxy")
	for _, tc := range []struct {
		name string
		addr string
		auth clientAuth
		want string // "" for nil
	}{
		{"no client certificate", secure, clientAuth{ca: pki.CAFile}, "tls: certificate required"},
		{"a certificate of another CA", secure, clientAuth{ca: pki.CAFile, cert: bad, key: badKey}, "tls: certificate required"},
		{"a CA that does not sign the node", secure, clientAuth{ca: other.CAFile, cert: good, key: goodKey}, "x509:"},
		{"plaintext to TLS", secure, clientAuth{}, "completed a TLS handshake"},
		{"the right certificate", secure, clientAuth{ca: pki.CAFile, cert: good, key: goodKey}, ""},
		{"plaintext to plaintext", plain, clientAuth{}, ""},
		{"a dead address", testnet.DeadAddr(t), clientAuth{ca: pki.CAFile}, ""},
	} {
		err := secondLook(context.Background(), tc.addr, tc.auth)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		case err != nil:
			if v, msg := classifyProbe(tc.addr, status.Error(codes.Unavailable, err.Error()), tc.auth); v != probeRefused {
				t.Errorf("%s: %v classified %d (%v), want refused", tc.name, err, v, msg)
			}
		}
	}
}
