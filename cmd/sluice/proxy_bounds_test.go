package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcluster"
)

// sluice proxy's bounds: a declared body over --max-body-bytes gets 413 and
// never reaches the upstream, headers over --max-header-bytes get 431, and
// a client dribbling its headers is cut off at --read-header-timeout while
// the proxy goes on serving.
func TestProxyBounds(t *testing.T) {
	nodes := testcluster.Start(t, 1, testcluster.Options{Clock: hourClock(), Limits: proxyLimits})
	dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": proxyRules})
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(up.Close)
	base := startProxy(t, []string{"--upstream", up.URL, "--cluster", strings.Join(testcluster.Addrs(nodes), ","),
		"--rules", filepath.Join(dir, "proxy.yaml"), "--read-header-timeout", "300ms", "--max-header-bytes", "4096",
		"--max-body-bytes", "100"}, testSecrets)

	// POST /api/jobs is exempt from limits: it goes straight upstream.
	if resp, body := send(t, "POST", base+"/api/jobs", "203.0.113.9", strings.Repeat("b", 100)); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("a 100-byte body: %d %q", resp.StatusCode, body)
	}
	if resp, _ := send(t, "POST", base+"/api/jobs", "203.0.113.9", strings.Repeat("b", 101)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a 101-byte body: %d, want 413", resp.StatusCode)
	}
	if n := reached.Load(); n != 1 {
		t.Fatalf("the upstream saw %d requests, want 1 (the over-size body must not reach it)", n)
	}
	if resp, _ := send(t, "POST", base+"/api/jobs", "203.0.113.9", "", "X-Big", strings.Repeat("h", 16<<10)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("16 KiB of headers: %d, want 431", resp.StatusCode)
	}

	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "POST /api/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 50) + "\r\n\r\n"
	closed := make(chan error, 1)
	go func() {
		buf := make([]byte, 512)
		_, err := c.Read(buf)
		for err == nil {
			_, err = c.Read(buf)
		}
		closed <- err
	}()
	sent := 0
	cut := false
	for ; sent < len(req) && !cut; sent++ {
		if _, err := c.Write([]byte{req[sent]}); err != nil {
			cut = true
			break
		}
		select {
		case <-closed:
			cut = true
		case <-time.After(500 * time.Millisecond):
		}
	}
	if !cut || sent > 20 {
		t.Fatalf("the dribbling client: cut %v after %d of %d bytes, want cut within a few", cut, sent, len(req))
	}
	if resp, body := send(t, "POST", base+"/api/jobs", "203.0.113.9", "x"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("after the dribbler: %d %q", resp.StatusCode, body)
	}
}
