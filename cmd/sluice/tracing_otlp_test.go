package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// otlpReceiver is a small OTLP/gRPC trace receiver (the collector's
// TraceService): it records the spans of every ExportTraceServiceRequest
// with their resource's service name and instance.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	addr string

	mu    sync.Mutex
	spans []gotSpan
}

// gotSpan is a span the receiver got, and who sent it.
type gotSpan struct {
	service, instance string
	*tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		var service, instance string
		for _, kv := range rs.GetResource().GetAttributes() {
			switch kv.Key {
			case "service.name":
				service = kv.Value.GetStringValue()
			case "service.instance.id":
				instance = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, gotSpan{service: service, instance: instance, Span: s})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// find returns the spans received so far that match.
func (r *otlpReceiver) find(match func(gotSpan) bool) []gotSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []gotSpan
	for _, s := range r.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// startOTLPReceiver serves an otlpReceiver on 127.0.0.1 until the test
// ends, and points this process's OTLP exporters at it (exporting every
// 20 ms).
func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{addr: lis.Addr().String()}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+r.addr)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	return r
}

// servedNode is a `sluice serve` a test started.
type servedNode struct {
	name, grpc, gossip string
	stop               func() (int, string)
}

// startTracedCluster starts three nodes n1..n3 with `sluice serve`, the
// limits file limits (if not empty) and tracing asked for by the
// environment, n2 and n3 joining n1, n1 with extra args, and waits until
// their rings agree. Stop them with stopAll.
func startTracedCluster(t *testing.T, limits string, n1args ...string) []*servedNode {
	t.Helper()
	var extra []string
	if limits != "" {
		extra = []string{"--limits", filepath.Join(writeFiles(t, map[string]string{"limits.yaml": limits}), "limits.yaml")}
	}
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
	var nodes []*servedNode
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("n%d", i)
		args := append([]string{"--name", name, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "",
			"--profile", "local", "--log-level", "info"}, extra...)
		if i == 1 {
			args = append(args, n1args...)
		} else {
			args = append(args, "--join", nodes[0].gossip)
		}
		_, found, stop := startServeLog(t, args, env,
			regexp.MustCompile(`msg="node started" node=`+name+` grpc_addr=(\S+) gossip_addr=(\S+)`))
		nodes = append(nodes, &servedNode{name: name, grpc: found[0][1], gossip: found[0][2], stop: stop})
	}
	t.Cleanup(func() { stopAll(t, nodes) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		fps := map[string]bool{}
		ok := true
		for _, n := range nodes {
			conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := sluicev1.NewRateLimitServiceClient(conn).Members(ctx, &sluicev1.MembersRequest{})
			cancel()
			conn.Close()
			ok = ok && err == nil && len(resp.Members) == 3
			if err == nil {
				fps[resp.RingFingerprint] = true
			}
		}
		if ok && len(fps) == 1 {
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("the three nodes' rings do not agree (%d fingerprints)", len(fps))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopAll stops the nodes not stopped yet, one after the other (three
// leaving at once would hand their keys to each other), as SIGTERM does:
// each flushes its spans to the receiver before it exits.
func stopAll(t *testing.T, nodes []*servedNode) {
	for _, n := range nodes {
		if n.stop == nil {
			continue
		}
		stop := n.stop
		n.stop = nil
		if code, log := stop(); code != 0 {
			t.Errorf("serve exited %d:\n%s", code, log)
		}
	}
}

func spanID(b []byte) string { return hex.EncodeToString(b) }

// attr returns the value of s's attribute key as a string ("" if
// absent; a list's values joined by commas).
func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return anyString(kv.Value)
		}
	}
	return ""
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.Values {
			parts = append(parts, anyString(e))
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}

// The trace of a check follows it from a traced Go client through the
// node it calls to the key's owner, as a real OTLP receiver gets it from
// three nodes started by `sluice serve` (the same tracing set-up): the
// client's span, the entry node's gRPC span a child of it, its forward
// span a child of that, and the owner's span a child of the forward, all
// of one trace. Checks of many traces that the entry node sends in one
// batch: the owner's span of the batch links to each check's forward span.
func TestTracesFollowChecksToTheirOwner(t *testing.T) {
	recv := startOTLPReceiver(t)
	// n1 holds a batch 5 ms behind a call in flight (a batch goes when
	// the call ends), so concurrent checks gather.
	nodes := startTracedCluster(t, "", "--batch-wait", "5ms")
	ctx := context.Background()
	tr, err := setupTracing(ctx, testcluster.Logger(), "test-client", "client")
	if err != nil {
		t.Fatal(err)
	}
	// RouteAny: the checks enter at n1, which forwards them (the path
	// this test follows).
	c, err := client.New(client.Config{Addrs: []string{nodes[0].grpc}, TracerProvider: tr.provider, Logger: testcluster.Logger(), Timeout: 10 * time.Second,
		Route: client.RouteAny})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	check := func(key string) client.Decision {
		d, err := c.Check(ctx, client.Check{Name: "api", Key: key, Limit: &client.Limit{Limit: 100, Window: time.Minute}})
		if err != nil || d.Degraded {
			t.Fatalf("check of %s: %+v %v", key, d, err)
		}
		return d
	}

	// One check that n1 forwards.
	key, owner := "", ""
	for i := 0; owner == "" || owner == "n1"; i++ {
		key = fmt.Sprintf("user:%d", i)
		owner = check(key).Owner
	}

	// Bursts of concurrent checks of keys the owner owns, each in a
	// trace of its own, until the owner has received a batch of several
	// traces (the exporters send every 20 ms).
	var ownerKeys []string
	for i := 0; len(ownerKeys) < 16; i++ {
		if k := fmt.Sprintf("burst:%d", i); check(k).Owner == owner {
			ownerKeys = append(ownerKeys, k)
		}
	}
	linked := func(s gotSpan) bool {
		return s.Name == "sluice.forward.receive" && s.instance == owner && len(s.Links) >= 2
	}
	deadline := time.Now().Add(30 * time.Second)
	bursts := 0
	for ; len(recv.find(linked)) == 0; bursts++ {
		if time.Now().After(deadline) {
			t.Fatal("no batch of several traces reached the owner")
		}
		var wg sync.WaitGroup
		for _, k := range ownerKeys {
			wg.Go(func() { check(k) })
		}
		wg.Wait()
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end) && len(recv.find(linked)) == 0; {
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Flush: the client's exporter and the nodes' (they flush as they
	// stop).
	if err := tr.shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stopAll(t, nodes)
	t.Logf("%d bursts of %d checks until a batch of several traces; %d such batches; the nodes stopped in %s",
		bursts, len(ownerKeys), len(recv.find(linked)), time.Since(start).Round(time.Millisecond))

	// The chain of the first forwarded check.
	clientSpans := recv.find(func(s gotSpan) bool { return s.Name == client.SpanCheck && s.service == "test-client" })
	var top *gotSpan
	for _, s := range clientSpans {
		entry := recv.find(func(e gotSpan) bool {
			return e.instance == "n1" && e.Name == "sluice.v1.RateLimitService/Check" && bytes.Equal(e.ParentSpanId, s.SpanId)
		})
		if len(entry) == 1 && len(recv.find(func(f gotSpan) bool {
			return f.instance == "n1" && f.Name == "sluice.forward" && bytes.Equal(f.TraceId, s.TraceId) && attr(f.Span, "sluice.peer") == owner
		})) > 0 {
			top = &s
			break
		}
	}
	if top == nil {
		t.Fatalf("no client span whose call n1 forwarded to %s (%d client spans)", owner, len(clientSpans))
	}
	if top.Kind != tracepb.Span_SPAN_KIND_CLIENT || attr(top.Span, "sluice.limit_names") != "api" || attr(top.Span, "sluice.check_count") != "1" {
		t.Errorf("the client's span: kind %v, attributes %v", top.Kind, top.Attributes)
	}
	entry := recv.find(func(e gotSpan) bool {
		return e.instance == "n1" && e.Name == "sluice.v1.RateLimitService/Check" && bytes.Equal(e.ParentSpanId, top.SpanId)
	})[0]
	fw := recv.find(func(f gotSpan) bool {
		return f.instance == "n1" && f.Name == "sluice.forward" && bytes.Equal(f.ParentSpanId, entry.SpanId)
	})
	if len(fw) != 1 || !bytes.Equal(fw[0].TraceId, top.TraceId) || fw[0].Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Fatalf("n1's forward spans under its Check span: %v, want one client span in the client's trace", fw)
	}
	if attr(fw[0].Span, "sluice.peer") != owner || attr(fw[0].Span, "sluice.check_count") != "1" || attr(fw[0].Span, "sluice.batched") != "true" {
		t.Errorf("n1's forward span's attributes: %v", fw[0].Attributes)
	}
	at := recv.find(func(o gotSpan) bool {
		return o.Name == "sluice.forward.receive" && bytes.Equal(o.ParentSpanId, fw[0].SpanId)
	})
	if len(at) != 1 || at[0].instance != owner || !bytes.Equal(at[0].TraceId, top.TraceId) || at[0].Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Fatalf("spans whose parent is n1's forward %s: %v, want the owner %s's span in trace %s", spanID(fw[0].SpanId), at, owner, spanID(top.TraceId))
	}
	if attr(at[0].Span, "sluice.sender") != "n1" || attr(at[0].Span, "sluice.check_count") != "1" {
		t.Errorf("the owner's span's attributes: %v", at[0].Attributes)
	}

	// A batch of several traces: the owner's span links to each check's
	// forward span at n1, and is in a trace of its own.
	for _, b := range recv.find(linked) {
		if len(b.ParentSpanId) != 0 {
			t.Errorf("a batch span of %d links has a parent", len(b.Links))
		}
		if got := attr(b.Span, "sluice.trace_count"); got != fmt.Sprint(len(b.Links)) {
			t.Errorf("a batch span of %d links says sluice.trace_count %s", len(b.Links), got)
		}
		for _, l := range b.Links {
			f := recv.find(func(f gotSpan) bool {
				return f.instance == "n1" && f.Name == "sluice.forward" && bytes.Equal(f.SpanId, l.SpanId) && bytes.Equal(f.TraceId, l.TraceId)
			})
			if len(f) != 1 {
				t.Fatalf("a batch span links to %s/%s, which is no forward span of n1", spanID(l.TraceId), spanID(l.SpanId))
			}
			if bytes.Equal(l.TraceId, b.TraceId) {
				t.Errorf("a batch span is in the trace of a check it links to")
			}
			if len(recv.find(func(s gotSpan) bool { return s.Name == client.SpanCheck && bytes.Equal(s.TraceId, l.TraceId) })) != 1 {
				t.Errorf("the trace %s a batch span links to has no client span", spanID(l.TraceId))
			}
		}
	}

	// No span carries a key.
	for _, s := range recv.find(func(gotSpan) bool { return true }) {
		for _, kv := range s.Attributes {
			if v := attr(s.Span, kv.Key); strings.Contains(v, "user:") || strings.Contains(v, "burst:") {
				t.Errorf("%s's span %s: attribute %s = %q", s.instance, s.Name, kv.Key, v)
			}
		}
	}
}

// The proxy's trace: a request that comes with a W3C traceparent gets the
// proxy's check span as a child, and the node's span is a child of that.
func TestProxyTracesItsChecks(t *testing.T) {
	recv := startOTLPReceiver(t)
	nodes := startTracedCluster(t, proxyLimits)
	dir := writeFiles(t, map[string]string{"limits.yaml": proxyLimits, "proxy.yaml": proxyRules})
	up := upstream(t)
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
	for k, v := range testSecrets {
		env[k] = v
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.grpc)
	}
	base := startProxy(t, []string{"--upstream", up.URL, "--cluster", strings.Join(addrs, ","), "--rules", filepath.Join(dir, "proxy.yaml")}, env)
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00f067aa0ba902b7"
	)
	resp, body := send(t, "GET", base+"/api/items", "203.0.113.9", "", "traceparent", "00-"+traceID+"-"+parent+"-01")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("proxied request: %d %s", resp.StatusCode, body)
	}
	var cs []gotSpan
	deadline := time.Now().Add(20 * time.Second)
	for {
		cs = recv.find(func(s gotSpan) bool { return s.Name == client.SpanCheck && spanID(s.TraceId) == traceID })
		if len(cs) > 0 && len(recv.find(func(s gotSpan) bool {
			return s.Name == "sluice.v1.RateLimitService/Check" && len(cs) > 0 && bytes.Equal(s.ParentSpanId, cs[0].SpanId)
		})) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no proxy span and node span in trace %s (%d proxy spans)", traceID, len(cs))
		}
		time.Sleep(10 * time.Millisecond)
	}
	p := cs[0]
	if len(cs) != 1 || p.service != "sluice-proxy" || spanID(p.ParentSpanId) != parent || attr(p.Span, "sluice.limit_names") != "api" {
		t.Fatalf("the proxy's span: %d spans, service %q, parent %s, attributes %v", len(cs), p.service, spanID(p.ParentSpanId), p.Attributes)
	}
	for _, s := range recv.find(func(s gotSpan) bool { return spanID(s.TraceId) == traceID }) {
		for _, kv := range s.Attributes {
			if v := attr(s.Span, kv.Key); strings.Contains(v, "203.0.113.9") {
				t.Errorf("%s/%s's span %s: attribute %s = %q holds the client's IP", s.service, s.instance, s.Name, kv.Key, v)
			}
		}
	}
}
