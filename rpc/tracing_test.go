package rpc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// recorded returns a tracer provider whose spans rec records, shut down
// when the test ends.
func recorded(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// spansNamed returns rec's ended spans called name.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// attrs returns s's attributes by key, as their values' strings.
func attrs(kvs []attribute.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}

// wantAttrs fails the test unless got has each of want's keys with its
// value.
func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[string]string) {
	t.Helper()
	m := attrs(got)
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s: attribute %s = %q, want %q (all: %v)", what, k, m[k], v, m)
		}
	}
}

// sameSpan reports whether a and b are the same span (trace and span id).
func sameSpan(a, b trace.SpanContext) bool {
	return a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

// A check forwarded to its owner: the entry node's span of the forward
// is a child of the caller's span, and the owner's span of the request is
// a child of it, in the same trace, with the attributes of docs/tracing.md.
// A node that does not trace sends no trace context: its owner makes no
// span of its requests.
func TestForwardedCheckSpanIsAChildOfTheEntrysSpan(t *testing.T) {
	clock := windowClock()
	var cfgs []NodeConfig
	var recs []*tracetest.SpanRecorder
	for i := range 3 {
		tp, rec := recorded(t)
		cfg := NodeConfig{Name: fmt.Sprintf("node%d", i+1), Clock: clock, TracerProvider: tp}
		if i == 2 {
			cfg.TracerProvider = nil // node3 does not trace
		}
		cfgs, recs = append(cfgs, cfg), append(recs, rec)
	}
	nodes := startInproc(t, cfgs...)
	callerTP, callerRec := recorded(t)
	ctx, root := callerTP.Tracer("test").Start(context.Background(), "caller")
	key := keyOwnedBy(t, nodes[0], "api", "node2")
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: key, Limit: 10, WindowMs: 60000}
	resp, err := nodes[0].srv.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
	root.End()
	if err != nil || !resp.Decisions[0].Allowed || resp.Decisions[0].Owner != "node2" {
		t.Fatalf("check: %v %v", resp, err)
	}
	fw := spansNamed(recs[0], spanForward)
	if len(fw) != 1 {
		t.Fatalf("node1 ended %d %s spans, want 1", len(fw), spanForward)
	}
	if !sameSpan(fw[0].Parent(), root.SpanContext()) || fw[0].SpanKind() != trace.SpanKindClient {
		t.Errorf("node1's forward: parent %v kind %v, want the caller's span %v, client", fw[0].Parent(), fw[0].SpanKind(), root.SpanContext())
	}
	wantAttrs(t, "node1's forward", fw[0].Attributes(), map[string]string{
		"sluice.node": "node1", "sluice.peer": "node2", "sluice.check_count": "1", "sluice.batched": "true",
		"sluice.allowed_count": "1", "sluice.denied_count": "0", "sluice.error_count": "0"})
	rv := spansNamed(recs[1], spanReceive)
	if len(rv) != 1 {
		t.Fatalf("node2 ended %d %s spans, want 1", len(rv), spanReceive)
	}
	if !sameSpan(rv[0].Parent(), fw[0].SpanContext()) || rv[0].SpanContext().TraceID() != root.SpanContext().TraceID() ||
		!rv[0].Parent().IsRemote() || len(rv[0].Links()) != 0 || rv[0].SpanKind() != trace.SpanKindServer {
		t.Errorf("node2's span: parent %v (remote %v), trace %v, links %v, kind %v; want a server span, child of node1's forward %v",
			rv[0].Parent(), rv[0].Parent().IsRemote(), rv[0].SpanContext().TraceID(), rv[0].Links(), rv[0].SpanKind(), fw[0].SpanContext())
	}
	wantAttrs(t, "node2's span", rv[0].Attributes(), map[string]string{
		"sluice.node": "node2", "sluice.sender": "node1", "sluice.check_count": "1", "sluice.trace_count": "1",
		"sluice.allowed_count": "1"})
	for _, s := range append(recs[0].Ended(), append(recs[1].Ended(), callerRec.Ended()...)...) {
		for _, kv := range s.Attributes() {
			if kv.Value.Emit() == key {
				t.Errorf("span %s has the key in %s", s.Name(), kv.Key)
			}
		}
	}

	// From node3, which does not trace, to node2: nothing carried, no span.
	recs[1].Reset()
	key3 := keyOwnedBy(t, nodes[2], "api", "node2")
	ctx3, root3 := callerTP.Tracer("test").Start(context.Background(), "caller")
	_, err = nodes[2].srv.Check(ctx3, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "api", Key: key3, Limit: 10, WindowMs: 60000}}})
	root3.End()
	if err != nil {
		t.Fatal(err)
	}
	if got := recs[1].Ended(); len(got) != 0 {
		t.Fatalf("node2 made %d spans of an untraced forward: %s", len(got), got[0].Name())
	}
}

// sentBatches is a stream interceptor for a node's peer connections that
// tells of every ForwardRequest of more than one check sent on the peer
// stream.
func sentBatches(ch chan<- *sluicev1.ForwardRequest) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return watchedStream{ClientStream: cs, ch: ch}, nil
	})
}

type watchedStream struct {
	grpc.ClientStream
	ch chan<- *sluicev1.ForwardRequest
}

func (w watchedStream) SendMsg(m any) error {
	err := w.ClientStream.SendMsg(m)
	if req, ok := m.(*sluicev1.ForwardRequest); ok && len(req.Checks) > 1 && err == nil {
		w.ch <- req
	}
	return err
}

// Checks of three traces in one batch: the owner's span of the batch is a
// new root that links to each check's forward span at the entry node,
// each link counting the checks it covered.
func TestForwardedBatchOfManyTracesLinksEach(t *testing.T) {
	clock := windowClock()
	tp1, rec1 := recorded(t)
	tp2, rec2 := recorded(t)
	sent := make(chan *sluicev1.ForwardRequest, 1)
	// A batch goes as soon as it holds 3 checks; fewer wait a minute
	// behind a call in flight.
	cfg1 := NodeConfig{Name: "node1", Clock: clock, TracerProvider: tp1, Batch: BatchConfig{MaxSize: 3, MaxWait: time.Minute},
		DialOptions: []grpc.DialOption{sentBatches(sent)}}
	var (
		blockOnce sync.Once
		blocked   = make(chan struct{})
		release   = make(chan struct{})
		first     []byte // the store key of the check that holds the owner's stream
	)
	hookDecideOwned(t, func(s *Server, storeKey []byte) {
		if s.name == "node2" && string(storeKey) == string(first) {
			blockOnce.Do(func() { close(blocked); <-release })
		}
	})
	nodes := startInproc(t, cfg1, NodeConfig{Name: "node2", Clock: clock, TracerProvider: tp2})
	callerTP, _ := recorded(t)
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		if k := fmt.Sprintf("user:%d", i); nodes[0].srv.Owner("api", k) == "node2" {
			keys = append(keys, k)
		}
	}
	first = ring.Key(nil, "api", keys[0])
	roots := make([]trace.Span, 4)
	errs := make(chan error, 4)
	check := func(i int) {
		ctx, root := callerTP.Tracer("test").Start(context.Background(), fmt.Sprint("caller", i))
		roots[i] = root
		go func() {
			defer root.End()
			_, err := nodes[0].srv.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
				{Name: "api", Key: keys[i], Limit: 10, WindowMs: 60000}}})
			errs <- err
		}()
	}
	check(0) // goes alone, at once; the owner holds it
	<-blocked
	for i := 1; i < 4; i++ {
		check(i) // they queue behind it, and go as one batch of 3
	}
	batch := <-sent
	close(release)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(batch.Checks) != 3 || len(batch.Traces) != 3 {
		t.Fatalf("the batch: %d checks, %d trace runs; want 3 and 3", len(batch.Checks), len(batch.Traces))
	}
	forwards := map[trace.TraceID]sdktrace.ReadOnlySpan{}
	for _, s := range spansNamed(rec1, spanForward) {
		forwards[s.SpanContext().TraceID()] = s
	}
	var batchSpan sdktrace.ReadOnlySpan
	for _, s := range spansNamed(rec2, spanReceive) {
		if attrs(s.Attributes())["sluice.check_count"] == "3" {
			batchSpan = s
		}
	}
	if batchSpan == nil {
		t.Fatalf("node2 has no span of the batch of 3")
	}
	if batchSpan.Parent().IsValid() {
		t.Errorf("the batch's span has parent %v, want none (a root)", batchSpan.Parent())
	}
	wantAttrs(t, "the batch's span", batchSpan.Attributes(), map[string]string{
		"sluice.sender": "node1", "sluice.check_count": "3", "sluice.trace_count": "3", "sluice.allowed_count": "3"})
	var linked []trace.SpanContext
	for _, l := range batchSpan.Links() {
		linked = append(linked, l.SpanContext)
		wantAttrs(t, "a link", l.Attributes, map[string]string{"sluice.check_count": "1"})
	}
	for i := 1; i < 4; i++ {
		fw, ok := forwards[roots[i].SpanContext().TraceID()]
		if !ok {
			t.Fatalf("node1 has no forward span in the trace of check %d", i)
		}
		if !sameSpan(fw.Parent(), roots[i].SpanContext()) {
			t.Errorf("check %d's forward: parent %v, want the caller's %v", i, fw.Parent(), roots[i].SpanContext())
		}
		if !slices.ContainsFunc(linked, func(sc trace.SpanContext) bool { return sameSpan(sc, fw.SpanContext()) }) {
			t.Errorf("the batch's span does not link to check %d's forward %v (links %v)", i, fw.SpanContext(), linked)
		}
		if batchSpan.SpanContext().TraceID() == roots[i].SpanContext().TraceID() {
			t.Errorf("the batch's span is in check %d's trace", i)
		}
	}
	if len(linked) != 3 {
		t.Errorf("the batch's span has %d links, want 3", len(linked))
	}
}

// wire returns the trace context of sc covering checks checks.
func wire(sc trace.SpanContext, checks uint32) *sluicev1.TraceContext {
	w := wireTrace(sc)
	w.Checks = checks
	return w
}

// spanContext makes a span context of trace tb and span sb, sampled or
// not.
func spanContext(tb, sb byte, sampled bool) trace.SpanContext {
	var cfg trace.SpanContextConfig
	for i := range cfg.TraceID {
		cfg.TraceID[i] = tb
	}
	for i := range cfg.SpanID {
		cfg.SpanID[i] = sb
	}
	if sampled {
		cfg.TraceFlags = trace.FlagsSampled
	}
	return trace.NewSpanContext(cfg)
}

// The receiver's span of a request, case by case (receiveSpan's doc).
func TestReceiveSpanParentAndLinks(t *testing.T) {
	tp, rec := recorded(t)
	s, err := NewServer(ServerConfig{Name: "owner", Store: window.NewStore(window.StoreConfig{Clock: windowClock()}),
		Logger: testLogger(), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a1, a2 := spanContext(1, 1, true), spanContext(1, 2, true)
	b, c := spanContext(2, 3, true), spanContext(3, 4, false)
	un1, un2 := spanContext(4, 5, false), spanContext(5, 6, false)
	streamCtx, stream := tp.Tracer("test").Start(context.Background(), "the stream's span")
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		unary  bool
		runs   []*sluicev1.TraceContext
		span   bool              // a span is made (recorded)
		parent trace.SpanContext // invalid: a root
		links  []trace.SpanContext
	}{
		{name: "one run", ctx: streamCtx, runs: []*sluicev1.TraceContext{wire(a1, 2)}, span: true, parent: a1},
		{name: "one trace, two spans, an untraced run between", ctx: streamCtx,
			runs: []*sluicev1.TraceContext{wire(a1, 1), {Checks: 3}, wire(a2, 1), wire(a1, 1)}, span: true, parent: a1, links: []trace.SpanContext{a2}},
		{name: "three traces", ctx: streamCtx, runs: []*sluicev1.TraceContext{wire(a1, 1), wire(b, 1), wire(c, 1)},
			span: true, links: []trace.SpanContext{a1, b, c}},
		{name: "two traces, neither sampled", ctx: streamCtx, runs: []*sluicev1.TraceContext{wire(un1, 1), wire(un2, 1)}},
		{name: "nothing carried", ctx: streamCtx, runs: nil},
		{name: "malformed runs are ignored", ctx: streamCtx,
			runs: []*sluicev1.TraceContext{{Checks: 1, TraceId: []byte{1, 2}, SpanId: make([]byte, 8)}, {Checks: 1, TraceId: make([]byte, 16), SpanId: make([]byte, 8)}}},
		{name: "unary: gRPC's span is the parent, another trace linked", ctx: streamCtx, unary: true,
			runs: []*sluicev1.TraceContext{wire(a1, 1), wire(b, 1)}, span: true, parent: stream.SpanContext(), links: []trace.SpanContext{a1, b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.Reset()
			req := &sluicev1.ForwardRequest{Sender: "entry", Checks: make([]*sluicev1.RateLimitCheck, 4), Traces: tc.runs}
			ctx, span := s.receiveSpan(tc.ctx, req, tc.unary)
			if span != nil {
				span.End()
			}
			got := rec.Ended()
			if !tc.span {
				if len(got) != 0 {
					t.Fatalf("a span was recorded: parent %v links %v", got[0].Parent(), got[0].Links())
				}
				if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && sc.IsSampled() {
					t.Fatalf("the request's context has a sampled span %v", sc)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("%d spans recorded, want 1", len(got))
			}
			if p := got[0].Parent(); !sameSpan(p, tc.parent) && (p.IsValid() || tc.parent.IsValid()) {
				t.Errorf("parent %v, want %v", p, tc.parent)
			}
			var links []trace.SpanContext
			for _, l := range got[0].Links() {
				links = append(links, l.SpanContext)
			}
			if !slices.EqualFunc(links, tc.links, sameSpan) {
				t.Errorf("links %v, want %v", links, tc.links)
			}
			if !sameSpan(trace.SpanContextFromContext(ctx), got[0].SpanContext()) {
				t.Errorf("the returned context is not the span's")
			}
		})
	}
}

// With tracing off a forward's request carries no trace context, even
// from a caller whose context has a span.
func TestForwardCarriesNoTraceWhenOff(t *testing.T) {
	sent := make(chan *sluicev1.ForwardRequest, 10)
	clock := windowClock()
	nodes := startInproc(t, NodeConfig{Name: "node1", Clock: clock, DialOptions: []grpc.DialOption{sentBatches(sent)}},
		NodeConfig{Name: "node2", Clock: clock})
	callerTP, _ := recorded(t)
	ctx, root := callerTP.Tracer("test").Start(context.Background(), "caller")
	defer root.End()
	var cs []*sluicev1.RateLimitCheck
	for i := 0; len(cs) < 2; i++ {
		if k := fmt.Sprintf("user:%d", i); nodes[0].srv.Owner("api", k) == "node2" {
			cs = append(cs, &sluicev1.RateLimitCheck{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000})
		}
	}
	if _, err := nodes[0].srv.Check(ctx, &sluicev1.CheckRequest{Checks: cs}); err != nil {
		t.Fatal(err)
	}
	if req := <-sent; len(req.Traces) != 0 {
		t.Fatalf("an untraced node's request carries %d trace runs", len(req.Traces))
	}
}

// A check sent to a traced node's HTTP face with a W3C traceparent: the
// node's forward span is a child of the caller's span.
func TestHTTPCheckJoinsTheCallersTrace(t *testing.T) {
	clock := windowClock()
	tp1, rec1 := recorded(t)
	tp2, _ := recorded(t)
	n1 := startNodeWith(t, "node1", clock, NodeConfig{ForwardTimeout: 2 * time.Second, HTTPAddr: "127.0.0.1:0", TracerProvider: tp1})
	n2 := startNodeWith(t, "node2", clock, NodeConfig{ForwardTimeout: 2 * time.Second, TracerProvider: tp2}, n1.GossipAddr())
	waitRingAgrees(t, []*testNode{n1, n2})
	key := keyOwnedBy(t, n1, "api", "node2")
	req, err := http.NewRequest("POST", "http://"+n1.HTTPAddr()+"/v1/check",
		strings.NewReader(`{"checks":[{"name":"api","key":"`+key+`","limit":10,"window_ms":60000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"owner":"node2"`) {
		t.Fatalf("POST /v1/check: %d %s", resp.StatusCode, body)
	}
	fw := spansNamed(rec1, spanForward)
	if len(fw) != 1 || fw[0].Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		fw[0].Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("node1's forward spans: %d, parent %v; want one, a child of the request's traceparent", len(fw), fw)
	}
}
