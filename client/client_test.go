package client_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// fakeNode is a gRPC server answering every check allowed and recording
// the checks it got.
type fakeNode struct {
	sluicev1.UnimplementedRateLimitServiceServer
	mu     sync.Mutex
	checks []*sluicev1.RateLimitCheck
	addr   string
}

func (f *fakeNode) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &sluicev1.CheckResponse{}
	for _, c := range req.Checks {
		f.checks = append(f.checks, proto.Clone(c).(*sluicev1.RateLimitCheck))
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Limit: 7, Remaining: 6, ResetTime: 60_000, Owner: f.addr})
	}
	return resp, nil
}

func (f *fakeNode) got() []*sluicev1.RateLimitCheck {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*sluicev1.RateLimitCheck(nil), f.checks...)
}

func startFake(t *testing.T) *fakeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{addr: lis.Addr().String()}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

func newClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testcluster.Logger()
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A named check sends no numbers; an inline one sends its own; hits 0 is
// sent only for a peek.
func TestCheckWireForm(t *testing.T) {
	f := startFake(t)
	c := newClient(t, client.Config{Addrs: []string{f.addr}})
	ctx := context.Background()
	d, err := c.Check(ctx, client.Check{Name: "api", Key: "user:1"})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Limit != 7 || d.Remaining != 6 || !d.ResetTime.Equal(time.UnixMilli(60_000)) || d.Degraded || d.Owner != f.addr {
		t.Fatalf("decision %+v", d)
	}
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "user:1", Hits: 3,
		Limit: &client.Limit{Limit: 30, Window: time.Minute, Burst: 60, Algorithm: client.TokenBucket}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "user:1", Peek: true}); err != nil {
		t.Fatal(err)
	}
	got := f.got()
	want := []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "user:1"},
		{Name: "api", Key: "user:1", Hits: proto.Int64(3), Limit: 30, WindowMs: 60_000, Burst: 60, Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET},
		{Name: "api", Key: "user:1", Hits: proto.Int64(0)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d checks, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("check %d sent as %v, want %v", i, got[i], want[i])
		}
	}
}

// Bad input is refused before any call, naming the field.
func TestCheckRefusesBadInput(t *testing.T) {
	f := startFake(t)
	c := newClient(t, client.Config{Addrs: []string{f.addr}})
	for _, tc := range []struct {
		check client.Check
		field string
	}{
		{client.Check{Key: "k"}, "name:"},
		{client.Check{Name: "n"}, "key:"},
		{client.Check{Name: "n", Key: "k", Hits: -1}, "hits:"},
		{client.Check{Name: "n", Key: "user:\xff\xfe"}, "key: must be valid UTF-8"},
		{client.Check{Name: "n\xff", Key: "k"}, "name: must be valid UTF-8"},
		{client.Check{Name: "n", Key: "k", Limit: &client.Limit{Window: time.Second}}, "limit.limit:"},
		{client.Check{Name: "n", Key: "k", Limit: &client.Limit{Limit: 1, Window: 1500 * time.Microsecond}}, "limit.window:"},
		{client.Check{Name: "n", Key: "k", Limit: &client.Limit{Limit: 1, Window: time.Second, Burst: -1}}, "limit.burst:"},
		{client.Check{Name: "n", Key: "k", Limit: &client.Limit{Limit: 1, Window: time.Second, Algorithm: "gcra"}}, "limit.algorithm:"},
	} {
		_, err := c.Check(context.Background(), tc.check)
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: err %v, want ErrInvalid naming %s", tc.check, err, tc.field)
		}
	}
	if n := len(f.got()); n != 0 {
		t.Fatalf("%d bad checks were sent", n)
	}
	for _, cfg := range []client.Config{{}, {Addrs: []string{""}}, {Addrs: []string{"x:1"}, Timeout: -1}} {
		if _, err := client.New(cfg); err == nil || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("New(%+v): %v, want an error naming the field", cfg, err)
		}
	}
}

// Calls spread over the nodes in turn; a dead node costs no failed check,
// is tried once, then skipped for SkipFor, and tried again after it.
func TestSpreadsAndSkipsDeadNodes(t *testing.T) {
	a, b := startFake(t), startFake(t)
	dead := testnet.DeadAddr(t)
	var mu sync.Mutex
	attempts := map[string]int{}
	count := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		attempts[cc.Target()]++
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	now := time.Unix(1000, 0)
	c := newClient(t, client.Config{Addrs: []string{a.addr, dead, b.addr}, FailureMode: client.FailClosed,
		SkipFor: 2 * time.Second, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), count}})
	for i := range 60 {
		d, err := c.Check(context.Background(), client.Check{Name: "api", Key: "k"})
		if err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
	}
	na, nb := len(a.got()), len(b.got())
	if na+nb != 60 || na < 20 || nb < 20 {
		t.Fatalf("checks per live node: %d and %d, want 60 spread over both", na, nb)
	}
	mu.Lock()
	if attempts[dead] != 1 {
		t.Errorf("the dead node was tried %d times in 60 checks, want once (then skipped)", attempts[dead])
	}
	now = now.Add(3 * time.Second) // past SkipFor: worth another try
	mu.Unlock()
	for range 3 {
		if _, err := c.Check(context.Background(), client.Check{Name: "api", Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts[dead] != 2 {
		t.Errorf("after SkipFor the dead node was tried %d times in all, want 2", attempts[dead])
	}
}

// No node answers: fail open allows, marks the answer degraded and logs
// the event without the key; fail closed refuses with ErrUnavailable.
// Neither waits past the timeout, even on a node that never answers.
func TestFailureModes(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	addrs := []string{testnet.DeadAddr(t), testnet.SilentAddr(t)}
	const timeout = 300 * time.Millisecond

	open := newClient(t, client.Config{Addrs: addrs, Timeout: timeout, Logger: logger})
	for range 2 { // once starting at each node
		start := time.Now()
		d, err := open.Check(context.Background(), client.Check{Name: "auth.login", Key: "secret-key-203.0.113.9"})
		if took := time.Since(start); took > timeout+time.Second {
			t.Errorf("fail open took %s, timeout %s", took, timeout)
		}
		if err != nil || !d.Allowed || !d.Degraded || !errors.Is(d.Cause, client.ErrUnavailable) || d.Limit != 0 {
			t.Fatalf("fail open: %+v, %v; want allowed and degraded", d, err)
		}
	}
	closed := newClient(t, client.Config{Addrs: addrs, Timeout: timeout, FailureMode: client.FailClosed, Logger: logger})
	start := time.Now()
	d, err := closed.Check(context.Background(), client.Check{Name: "auth.login", Key: "secret-key-203.0.113.9"})
	if took := time.Since(start); took > timeout+time.Second {
		t.Errorf("fail closed took %s, timeout %s", took, timeout)
	}
	if !errors.Is(err, client.ErrUnavailable) || d.Allowed || !d.Degraded {
		t.Fatalf("fail closed: %+v, %v; want ErrUnavailable", d, err)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "event=rate_limit.unavailable") || !strings.Contains(out, "name=auth.login") {
		t.Errorf("log lacks the event and name:\n%s", out)
	}
	if strings.Contains(out, "secret-key") || strings.Contains(out, "203.0.113.9") {
		t.Errorf("log holds the key:\n%s", out)
	}

	// A caller that cancels gets its own error, not a failure mode.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := open.Check(ctx, client.Check{Name: "n", Key: "k"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Against a real cluster: exact counts through any node, named limits
// resolved by the nodes, and killing one node mid-run costs no failed
// check (the client moves in-flight and later checks to the live nodes).
func TestClusterSpreadAndKill(t *testing.T) {
	nodes := testcluster.Start(t, 3, testcluster.Options{Limits: "limits:\n  api:\n    limit: 5\n    window: 1h\n"})
	var perNode sync.Map // target -> *atomic.Int64
	count := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		v, _ := perNode.LoadOrStore(cc.Target(), new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	c := newClient(t, client.Config{
		Addrs:       testcluster.Addrs(nodes),
		Timeout:     20 * time.Second, // a loaded machine is no outage
		FailureMode: client.FailClosed,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), count},
		Route:       client.RouteAny, // this test is about the spread over the addresses
	})
	ctx := context.Background()

	// A named limit: the nodes' numbers, exactly 5 allowed.
	allowed := 0
	for i := range 8 {
		d, err := c.Check(ctx, client.Check{Name: "api", Key: "user:42"})
		if err != nil || d.Limit != 5 {
			t.Fatalf("named check %d: %+v, %v", i, d, err)
		}
		if d.Allowed {
			allowed++
			if d.Remaining != int64(4-i) {
				t.Fatalf("check %d: remaining %d, want %d", i, d.Remaining, 4-i)
			}
		} else if d.RetryAfter <= 0 {
			t.Fatalf("denied check %d: retry after %s", i, d.RetryAfter)
		}
	}
	if allowed != 5 {
		t.Fatalf("%d allowed, want 5", allowed)
	}

	// Keys owned by the nodes that stay, so that a lost owner (its counts
	// die with it: README, "Not yet") is not mistaken for a failed call.
	var keys []string
	for _, owner := range []string{"node1", "node2"} {
		for i := range 4 {
			keys = append(keys, testcluster.KeyOwnedBy(t, nodes[0], "load", "k"+string(rune('a'+i))+":", owner))
		}
	}
	inline := &client.Limit{Limit: 1 << 40, Window: time.Hour}
	var (
		wg       sync.WaitGroup
		ok, fail atomic.Int64
		killed   = make(chan struct{})
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 { // bounded
				d, err := c.Check(ctx, client.Check{Name: "load", Key: keys[g], Limit: inline})
				if err != nil || !d.Allowed || d.Degraded {
					fail.Add(1)
					t.Logf("goroutine %d check %d: %+v, %v", g, i, d, err)
				} else {
					ok.Add(1)
				}
				if g == 0 && i == 100 {
					nodes[2].Kill()
					close(killed)
				}
			}
		})
	}
	wg.Wait()
	<-killed
	if fail.Load() != 0 || ok.Load() != 8*400 {
		t.Fatalf("%d checks failed, %d succeeded; want none failed", fail.Load(), ok.Load())
	}
	for _, n := range nodes {
		v, _ := perNode.Load(n.GRPCAddr())
		if v == nil || v.(*atomic.Int64).Load() < 100 {
			t.Errorf("node %s got %v calls, want at least 100 (load spread over all)", n.Name(), v)
		}
	}
}
