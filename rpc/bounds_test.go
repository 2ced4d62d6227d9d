package rpc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

func inline(name, key string) *sluicev1.RateLimitCheck {
	return &sluicev1.RateLimitCheck{Name: name, Key: key, Limit: 3, WindowMs: 3_600_000}
}

// Bad sizes are refused over a real RPC, each with the field named: a
// batch over 1000 checks, a key over 512 bytes, a name over 256 bytes; a
// message over 1 MiB is refused by the transport before it is decoded.
func TestGRPCRequestBounds(t *testing.T) {
	n := startNodeCfg(t, NodeConfig{Name: "node1", Clock: windowClock()})
	ctx := context.Background()
	batch := func(k int, key string) *sluicev1.CheckRequest {
		req := &sluicev1.CheckRequest{}
		for i := range k {
			req.Checks = append(req.Checks, inline("api", fmt.Sprint(key, i)))
		}
		return req
	}
	for _, tc := range []struct {
		what  string
		req   *sluicev1.CheckRequest
		code  codes.Code
		field string
	}{
		{"1001 checks", batch(MaxBatch+1, "k"), codes.InvalidArgument, "checks: at most 1000 checks per call, got 1001"},
		{"a 513-byte key", &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{inline("api", strings.Repeat("k", 513))}}, codes.InvalidArgument, "checks[0].key: must be at most 512 bytes, got 513"},
		{"a 257-byte name", &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{inline(strings.Repeat("n", 257), "k")}}, codes.InvalidArgument, "checks[0].name: must be at most 256 bytes, got 257"},
		{"a 1.3 MiB message", batch(2600, strings.Repeat("k", 500)), codes.ResourceExhausted, "larger than max"},
	} {
		_, err := n.client.Check(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.field) {
			t.Errorf("%s: %v, want %s naming %q", tc.what, err, tc.code, tc.field)
		}
	}
	// At the bounds: 1000 checks with 512-byte keys and 256-byte names go.
	req := &sluicev1.CheckRequest{}
	for i := range MaxBatch {
		req.Checks = append(req.Checks, inline(strings.Repeat("n", 256), fmt.Sprintf("%0512d", i)))
	}
	if resp, err := n.client.Check(ctx, req); err != nil || len(resp.Decisions) != MaxBatch || !resp.Decisions[999].Allowed {
		t.Fatalf("1000 checks at the size bounds: %v", err)
	}
	if n.Store().Len() != MaxBatch {
		t.Fatalf("%d keys, want %d", n.Store().Len(), MaxBatch)
	}
}

// --max-inflight: a call that would take the node over its bound is
// refused with RESOURCE_EXHAUSTED (HTTP 429) and counted; concurrent calls
// release what they took, so the node takes calls again after a burst.
func TestMaxInflight(t *testing.T) {
	n := startNodeCfg(t, NodeConfig{Name: "node1", Clock: windowClock(), HTTPAddr: "127.0.0.1:0",
		GRPC: GRPCBounds{MaxInflight: 50}})
	ctx := context.Background()
	big := &sluicev1.CheckRequest{}
	for i := range 51 {
		big.Checks = append(big.Checks, inline("api", fmt.Sprint("k", i)))
	}
	_, err := n.client.Check(ctx, big)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_inflight") {
		t.Fatalf("51 checks over a bound of 50: %v, want RESOURCE_EXHAUSTED", err)
	}
	if got := n.Server().Stats().InflightRefused; got != 1 {
		t.Fatalf("InflightRefused = %d, want 1", got)
	}
	body := `{"checks":[` + strings.Repeat(`{"name":"api","key":"h","limit":3,"window_ms":1000},`, 50) + `{"name":"api","key":"h","limit":3,"window_ms":1000}]}`
	if code, out := httpDo(t, "POST", "http://"+n.HTTPAddr()+"/v1/check", body); code != http.StatusTooManyRequests {
		t.Fatalf("HTTP, 51 checks: %d %.200s, want 429", code, out)
	}
	// A burst of 40 calls of 10 checks from 40 goroutines: each is
	// answered or refused whole, and afterwards nothing is left in flight.
	var (
		wg            sync.WaitGroup
		mu            sync.Mutex
		ok, exhausted int
	)
	for g := range 40 {
		wg.Go(func() {
			req := &sluicev1.CheckRequest{}
			for i := range 10 {
				req.Checks = append(req.Checks, inline("burst", fmt.Sprint(g, ":", i)))
			}
			resp, err := n.client.Check(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && len(resp.Decisions) == 10:
				ok++
			case status.Code(err) == codes.ResourceExhausted:
				exhausted++
			default:
				t.Errorf("burst call: %v", err)
			}
		})
	}
	wg.Wait()
	st := n.Server().Stats()
	if ok+exhausted != 40 || st.InflightRefused != int64(2+exhausted) || n.Server().inflight.n.Load() != 0 {
		t.Fatalf("burst: %d answered, %d refused, stats %d refused, %d still in flight", ok, exhausted, st.InflightRefused, n.Server().inflight.n.Load())
	}
	if _, err := n.client.Check(ctx, &sluicev1.CheckRequest{Checks: big.Checks[:50]}); err != nil {
		t.Fatalf("50 checks after the burst: %v", err)
	}
	if code, out := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", ""); code != 200 || !strings.Contains(out, fmt.Sprintf("sluice_inflight_refused_total %d", 2+exhausted)) {
		t.Fatalf("metrics: %d, no sluice_inflight_refused_total %d", code, 2+exhausted)
	}
}

// h2conn opens a raw HTTP/2 connection to a node's gRPC port and returns
// its framer after the client preface and an empty SETTINGS.
func h2conn(t *testing.T, addr string) (net.Conn, *http2.Framer) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c, fr
}

// The gRPC server announces the stream bound, and disconnects a client
// that floods it with pings (keepalive enforcement): GOAWAY with
// ENHANCE_YOUR_CALM.
func TestGRPCStreamsAndPingFlood(t *testing.T) {
	n := startNodeCfg(t, NodeConfig{Name: "node1", GRPC: GRPCBounds{MaxConcurrentStreams: 7}})
	c, fr := h2conn(t, boundAddr(n.Node))
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // only a broken server waits this long
	var streams uint32
	var goAway *http2.GoAwayFrame
	pings := 0
	for goAway == nil {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d pings, no GOAWAY: %v", pings, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				streams = v
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			// Ping as fast as the server answers: far under the 10 s
			// the server tolerates.
			if err := fr.WritePing(false, [8]byte{1}); err != nil {
				t.Fatal(err)
			}
			pings++
		case *http2.PingFrame:
			if !f.IsAck() {
				break
			}
			if err := fr.WritePing(false, [8]byte{byte(pings)}); err != nil {
				t.Fatalf("the server closed the connection after %d pings without GOAWAY: %v", pings, err)
			}
			pings++
		case *http2.GoAwayFrame:
			goAway = f
		}
	}
	if streams != 7 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want 7", streams)
	}
	if goAway.ErrCode != http2.ErrCodeEnhanceYourCalm || pings > 10 {
		t.Fatalf("GOAWAY %v after %d pings, want ENHANCE_YOUR_CALM within a few", goAway.ErrCode, pings)
	}
	// The node still serves others.
	if d := check(t, n.client, inline("api", "k")); !d.Allowed {
		t.Fatalf("after the ping flood: %v", d)
	}
}

// A client that dribbles its headers (a byte every 500 ms) is cut off at
// the header timeout, and the node stays healthy; headers over the bound
// get 431, a body over 1 MiB 413.
func TestHTTPHeaderDribbleAndSizes(t *testing.T) {
	const headerTimeout = 300 * time.Millisecond
	n := startNodeCfg(t, NodeConfig{Name: "node1", HTTPAddr: "127.0.0.1:0",
		HTTP: HTTPBounds{ReadHeaderTimeout: headerTimeout, MaxHeaderBytes: 4096}})
	c, err := net.Dial("tcp", n.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The full request would take 40 s to dribble; the server must cut it
	// long before.
	req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 50) + "\r\n\r\n"
	closed := make(chan error, 1)
	go func() {
		buf := make([]byte, 512)
		_, err := c.Read(buf) // net/http may write a 408 before closing
		for err == nil {
			_, err = c.Read(buf)
		}
		closed <- err
	}()
	sent := 0
	var readErr error
dribble:
	for ; sent < len(req); sent++ {
		if _, err := c.Write([]byte{req[sent]}); err != nil {
			break
		}
		select {
		case readErr = <-closed:
			break dribble
		case <-time.After(500 * time.Millisecond):
		}
	}
	if readErr == nil || sent >= len(req)-1 {
		t.Fatalf("the dribbling client was not cut off: sent %d of %d bytes (read: %v)", sent, len(req), readErr)
	}
	if sent > 20 {
		t.Errorf("cut off only after %d bytes (%d ms of dribbling) with a %s header timeout", sent, sent*500, headerTimeout)
	}
	if code, out := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/healthz", ""); code != 200 {
		t.Fatalf("healthz after the dribbler: %d %s", code, out)
	}
	// Headers over 4096 bytes (plus net/http's 4 KiB of slack): 431.
	r, _ := http.NewRequest("GET", "http://"+n.HTTPAddr()+"/healthz", nil)
	r.Header.Set("X-Big", strings.Repeat("b", 16<<10))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("16 KiB of headers: %d, want 431", resp.StatusCode)
	}
	big := `{"checks":[{"name":"api","key":"` + strings.Repeat("k", MaxHTTPBodyBytes) + `"}]}`
	if code, _ := httpDo(t, "POST", "http://"+n.HTTPAddr()+"/v1/check", big); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over 1 MiB: %d, want 413", code)
	}
	// The other bounds are set on the server.
	if s := n.http; s.ReadTimeout != DefaultHTTPReadTimeout || s.WriteTimeout != DefaultHTTPWriteTimeout || s.IdleTimeout != DefaultHTTPIdleTimeout || s.ReadHeaderTimeout != headerTimeout {
		t.Fatalf("http.Server timeouts: %v %v %v %v", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
}
