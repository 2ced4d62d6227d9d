//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/syncbuf"
)

// proxyLimit is what the proxy test's limit admits per key: a token
// bucket of 20 that refills 20 a day (one token every 72 minutes), so
// that no window boundary falls inside the test.
const proxyLimit = 20

const (
	proxyTestLimits = `limits:
  api: {limit: 20, window: 24h, algorithm: token_bucket}
`
	proxyTestRules = `timeout: 5s
failure: open
rules:
  - match: /api/
    limit: api
    key: header:X-K
`
)

// hostProxy is a sluice proxy the test runs on this host.
type hostProxy struct {
	base, admin string
	stderr      *syncbuf.Buffer
	cmd         *exec.Cmd
	exited      chan error
}

// startHostProxy runs bin/sluice proxy with args (listening on
// 127.0.0.1, the admin endpoints too) and returns it once it listens; it
// is stopped (SIGTERM) when the test ends. It fails the test when the
// proxy exits first.
func startHostProxy(t *testing.T, args ...string) *hostProxy {
	t.Helper()
	p := &hostProxy{stderr: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(sluiceBin, append([]string{"proxy", "--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			t.Error("the proxy did not stop on SIGINT")
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", p.stderr.String())
		}
	})
	admin := regexp.MustCompile(`^proxy admin on (\S+)`)
	listening := regexp.MustCompile(`^proxy listening on (\S+)`)
	deadline := time.After(30 * time.Second)
	for p.base == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the proxy exited before listening: %v\n%s", <-p.exited, p.stderr.String())
			}
			if m := admin.FindStringSubmatch(l); m != nil {
				p.admin = "http://" + m[1]
			}
			if m := listening.FindStringSubmatch(l); m != nil {
				p.base = "http://" + m[1]
			}
		case <-deadline:
			t.Fatalf("the proxy did not listen within 30 s:\n%s", p.stderr.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	return p
}

// proxyRefuses runs bin/sluice proxy with args, which must exit (refuse
// to start) within 30 s, and returns its exit code and stderr.
func proxyRefuses(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBin, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil || strings.Contains(stdout.String(), "proxy listening") {
		t.Fatalf("the proxy started instead of refusing: %s%s", stdout.String(), stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return code, stderr.String()
}

// proxyGet sends GET url with X-K: key and returns the status.
func proxyGet(hc *http.Client, url, key string) (int, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-K", key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Issue 21: sluice proxy in front of the mTLS cluster of containers. With
// the suite's client certificate it starts, ready, and of 3 × the limit
// requests per key (5 keys, 8 at a time, spread by the proxy over the
// three nodes) exactly the limit per key reaches the app and every other
// one is answered 429; its /metrics count them. Without a client
// certificate, or with one from another CA, it refuses to start, naming
// the flag (it used to start and let every request through unlimited).
// Then every node is killed: requests follow the rules' failure: open
// (all reach the app), /readyz turns 503, and the proxy's log holds a
// few warnings, not one per node per request.
func TestProxyInFrontOfTheMTLSCluster(t *testing.T) {
	requireDocker(t)
	secrets := newSecrets(t)
	makePKI(t, secrets)
	pki = secrets
	if err := os.WriteFile(filepath.Join(secrets, "limits.yaml"), []byte(proxyTestLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, project: envOr("SLUICE_E2E_PROJECT_PREFIX", "sluicee2e") + "proxy", nodes: map[string]*node{}, ids: map[string]string{},
		files: []string{"docker-compose.yml", "docker-compose.proxy.yml"}}
	c.prepare(secrets, allNodes, func(i int, _ string) string { return fmt.Sprintf("%s.%d", netPrefix, 11+i) }, clientDialOption(t))
	c.start(base...)
	c.waitRing(base...)

	var reached atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	defer app.Close()
	rules := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(rules, []byte(proxyTestRules), 0o644); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, name := range base {
		addrs = append(addrs, c.nodes[name].grpcAddr())
	}
	common := []string{"--upstream", app.URL, "--cluster", strings.Join(addrs, ","), "--rules", rules}

	// Refusals first: nothing is counted by them.
	caFile := filepath.Join(pki, "ca", "ca.pem")
	code, stderr := proxyRefuses(t, append(common, "--tls-ca", caFile)...)
	if code != 2 || !strings.Contains(stderr, "invalid --tls-cert:") || !strings.Contains(stderr, "demands a client certificate") {
		t.Errorf("no client certificate: exit %d: %s", code, stderr)
	}
	other := t.TempDir()
	if out, err := run(30*time.Second, nil, sluiceBin, "tls", "ca", "create", "--out", filepath.Join(other, "ca")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := run(30*time.Second, nil, sluiceBin, "tls", "cert", "create", "--ca", filepath.Join(other, "ca"), "--client", "stranger", "--out", other); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	stranger := filepath.Join(other, "stranger.pem")
	code, stderr = proxyRefuses(t, append(common, "--tls-ca", caFile, "--tls-cert", stranger, "--tls-key", filepath.Join(other, "stranger-key.pem"))...)
	if code != 2 || !strings.Contains(stderr, "invalid --tls-cert:") || !strings.Contains(stderr, "refused the client certificate "+stranger) {
		t.Errorf("a client certificate of another CA: exit %d: %s", code, stderr)
	}
	code, stderr = proxyRefuses(t, common...)
	if code != 2 || !strings.Contains(stderr, "invalid --tls-ca:") {
		t.Errorf("plaintext: exit %d: %s", code, stderr)
	}

	p := startHostProxy(t, append(common, cliSecurityArgs()...)...)
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	if code, err := proxyGet(hc, p.admin+"/readyz", ""); err != nil || code != 200 {
		t.Fatalf("/readyz: %d %v, want 200", code, err)
	}
	const keys = 5
	const perKey = 3 * proxyLimit
	var mu sync.Mutex
	answers := map[string]map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= keys*perKey {
					return
				}
				key := fmt.Sprintf("e2e-proxy-%d", i%keys)
				code, err := proxyGet(hc, p.base+"/api/items", key)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if answers[key] == nil {
					answers[key] = map[int]int{}
				}
				answers[key][code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("e2e-proxy-%d", k)
		if got := answers[key]; got[200] != proxyLimit || got[429] != perKey-proxyLimit || len(got) != 2 {
			t.Errorf("%s: answers %v, want %d × 200 and %d × 429, nothing else", key, got, proxyLimit, perKey-proxyLimit)
		}
	}
	if n := reached.Load(); n != keys*proxyLimit {
		t.Errorf("the app saw %d requests, want %d", n, keys*proxyLimit)
	}
	t.Logf("through the proxy: %v; the app saw %d", answers, reached.Load())
	m := proxyMetrics(t, hc, p.admin)
	if m[`sluice_proxy_requests_total{outcome="passed"}`] != keys*proxyLimit || m[`sluice_proxy_requests_total{outcome="limited"}`] != keys*(perKey-proxyLimit) {
		t.Errorf("proxy metrics: %v", m)
	}
	if w := strings.Count(p.stderr.String(), "level=WARN"); w != 0 {
		t.Errorf("%d warnings with the cluster up:\n%s", w, p.stderr.String())
	}

	// Every node down: fail open, not ready, a few warnings.
	for _, name := range base {
		c.kill(name)
	}
	const down = 50
	for i := range down {
		if code, err := proxyGet(hc, p.base+"/api/items", "e2e-proxy-down"); err != nil || code != 200 {
			t.Fatalf("request %d with the cluster down: %d %v, want 200 (failure: open)", i, code, err)
		}
	}
	if n := reached.Load(); n != keys*proxyLimit+down {
		t.Errorf("the app saw %d requests, want %d", n, keys*proxyLimit+down)
	}
	if code, err := proxyGet(hc, p.admin+"/readyz", ""); err != nil || code != 503 {
		t.Errorf("/readyz with the cluster down: %d %v, want 503", code, err)
	}
	warns := strings.Count(p.stderr.String(), "level=WARN") + strings.Count(p.stderr.String(), "level=ERROR")
	t.Logf("%d warnings for %d requests on 3 dead nodes:\n%s", warns, down, p.stderr.String())
	if warns > 6 {
		t.Errorf("%d warnings for %d requests with the cluster down; want a few (one per kind per 10 s)", warns, down)
	}
}

// proxyMetrics reads the proxy's /metrics and returns its sluice_proxy_
// series by name and labels.
func proxyMetrics(t *testing.T, hc *http.Client, admin string) map[string]float64 {
	t.Helper()
	resp, err := hc.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "sluice_proxy_") {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		var v float64
		if _, err := fmt.Sscan(l[sp+1:], &v); err == nil {
			m[l[:sp]] = v
		}
	}
	return m
}
