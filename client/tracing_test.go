package client_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// startHeaderFake is startFake whose server records the traceparent of
// every call ("" when absent).
func startHeaderFake(t *testing.T) (*fakeNode, func() []string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []string
	)
	f := &fakeNode{addr: lis.Addr().String()}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, strings.Join(md.Get("traceparent"), ","))
		mu.Unlock()
		return h(ctx, req)
	}))
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }
}

// A traced client makes one span per call, a child of the caller's, with
// the limits' names and counts (never a key or an address), an event per
// failed attempt, and sends its trace context to the node; an untraced
// one sends none.
func TestClientTracesEachCall(t *testing.T) {
	f, seen := startHeaderFake(t)
	dead := deadAddr(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	c := newClient(t, client.Config{Addrs: []string{dead, f.addr}, TracerProvider: tp})
	ctx, root := tp.Tracer("test").Start(context.Background(), "request")
	// The first call starts at the fake; the second at the dead address,
	// then the fake.
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "user:secret-42"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CheckAll(ctx, []client.Check{{Name: "api", Key: "user:secret-42"}, {Name: "login", Key: "ip:10.9.8.7"}}); err != nil {
		t.Fatal(err)
	}
	root.End()
	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == client.SpanCheck {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d %s spans, want 2", len(spans), client.SpanCheck)
	}
	want := []map[string]string{
		{"sluice.limit_names": `["api"]`, "sluice.check_count": "1", "sluice.failure_mode": "open", "sluice.all_or_nothing": "false",
			"sluice.attempts": "1", "sluice.allowed_count": "1", "sluice.denied_count": "0", "sluice.degraded": "false"},
		{"sluice.limit_names": `["api","login"]`, "sluice.check_count": "2", "sluice.all_or_nothing": "true",
			"sluice.attempts": "2", "sluice.allowed_count": "2", "sluice.degraded": "false"},
	}
	headers := seen()
	if len(headers) != 2 {
		t.Fatalf("the node got %d calls, want 2", len(headers))
	}
	for i, s := range spans {
		if s.Parent().SpanID() != root.SpanContext().SpanID() || s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("span %d: parent %v, want the caller's %v", i, s.Parent(), root.SpanContext())
		}
		got := map[string]string{}
		all := s.Attributes()
		for _, e := range s.Events() {
			all = append(all, e.Attributes...)
		}
		for _, kv := range all {
			got[string(kv.Key)] = kv.Value.Emit()
			for _, secret := range []string{"secret", "10.9.8.7", "127.0.0.1", dead, f.addr} {
				if strings.Contains(kv.Value.Emit(), secret) {
					t.Errorf("span %d: attribute %s = %q holds %q", i, kv.Key, kv.Value.Emit(), secret)
				}
			}
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("span %d: %s = %q, want %q (all: %v)", i, k, got[k], v, got)
			}
		}
		tp := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())
		if headers[i] != tp {
			t.Errorf("call %d: the node got traceparent %q, want %q (the client's span)", i, headers[i], tp)
		}
	}
	if ev := spans[1].Events(); len(ev) != 1 || ev[0].Name != "attempt failed" || !hasInt(ev[0].Attributes, "rpc.grpc.status_code", 14) {
		t.Errorf("the second call's events: %+v, want one failed attempt, code 14 (Unavailable)", ev)
	}
	if len(spans[0].Events()) != 0 {
		t.Errorf("the first call's events: %+v, want none", spans[0].Events())
	}

	// Untraced: nothing sent, even under a caller's span.
	plain := newClient(t, client.Config{Addrs: []string{f.addr}})
	if _, err := plain.Check(ctx, client.Check{Name: "api", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if h := seen(); h[len(h)-1] != "" {
		t.Fatalf("an untraced client sent traceparent %q", h[len(h)-1])
	}
}

func hasInt(kvs []attribute.KeyValue, key string, v int64) bool {
	for _, kv := range kvs {
		if string(kv.Key) == key && kv.Value.AsInt64() == v {
			return true
		}
	}
	return false
}
