package middleware_test

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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// degradedNode is a gRPC node that answers every check allowed and
// degraded (as a node whose policy allowed it, the key's owner being
// unreachable), and records the checks it got.
type degradedNode struct {
	sluicev1.UnimplementedRateLimitServiceServer
	mu     sync.Mutex
	checks []*sluicev1.RateLimitCheck
}

func (f *degradedNode) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &sluicev1.CheckResponse{}
	for _, c := range req.Checks {
		f.checks = append(f.checks, proto.CloneOf(c))
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Limit: 10, Owner: "entry", Degraded: true})
	}
	return resp, nil
}

func (f *degradedNode) policies() []sluicev1.OwnerUnavailablePolicy {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sluicev1.OwnerUnavailablePolicy
	for _, c := range f.checks {
		out = append(out, c.OnOwnerUnavailable)
	}
	return out
}

func startDegraded(t *testing.T) (*degradedNode, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &degradedNode{}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f, lis.Addr().String()
}

// The client's failure mode reaches the node and the answer: failing
// closed, the checks ask for deny and a degraded allowed answer is 503
// (HTTP) and UNAVAILABLE (gRPC); failing open, no policy is sent and the
// request passes.
func TestFailClosedDegradedAnswerIs503(t *testing.T) {
	f, addr := startDegraded(t)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	for _, tc := range []struct {
		mode   client.FailureMode
		code   int
		policy sluicev1.OwnerUnavailablePolicy
	}{
		{client.FailClosed, 503, sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY},
		{client.FailOpen, 200, sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED},
	} {
		c, err := client.New(client.Config{Addrs: []string{addr}, FailureMode: tc.mode, Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m, err := middleware.New(middleware.Config{Checker: c, Name: "api", Key: middleware.Const("k"), Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		if resp := do(m.Handler(ok), "GET", "192.0.2.1:1"); resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.mode, resp.StatusCode, tc.code)
		}
		g, err := middleware.NewGroup(middleware.GroupConfig{Checker: c, Limits: []*middleware.Middleware{m, m}})
		if err != nil {
			t.Fatal(err)
		}
		if resp := do(g.Handler(ok), "GET", "192.0.2.1:1"); resp.StatusCode != tc.code {
			t.Errorf("%s, a group: %d, want %d", tc.mode, resp.StatusCode, tc.code)
		}
		p := f.policies()
		if len(p) == 0 || p[len(p)-1] != tc.policy {
			t.Errorf("%s: sent %v, want %s", tc.mode, p, tc.policy)
		}
		intercept, err := middleware.UnaryServerInterceptor(middleware.GRPCConfig{Checker: c, Name: "api", Logger: testcluster.Logger(),
			Key: func(context.Context, string) (string, error) { return "k", nil }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.Y/Z"}, func(context.Context, any) (any, error) { return "ok", nil })
		if want := map[client.FailureMode]codes.Code{client.FailClosed: codes.Unavailable, client.FailOpen: codes.OK}[tc.mode]; status.Code(err) != want {
			t.Errorf("%s, gRPC: %v, want %s", tc.mode, err, want)
		}
	}
}

// closedChecker fails closed but, unlike client.Client, returns a
// degraded decision without an error.
type closedChecker struct{}

func (closedChecker) Check(context.Context, client.Check) (client.Decision, error) {
	return client.Decision{Allowed: true, Degraded: true}, nil
}
func (closedChecker) FailureMode() client.FailureMode { return client.FailClosed }

// A Checker that says it fails closed never lets a degraded decision
// through.
func TestFailClosedCheckerGuard(t *testing.T) {
	m, err := middleware.New(middleware.Config{Checker: closedChecker{}, Name: "api", Key: middleware.Const("k"), Logger: testcluster.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the request went through") }))
	if resp := do(h, "GET", "192.0.2.1:1"); resp.StatusCode != 503 {
		t.Fatalf("%d, want 503", resp.StatusCode)
	}
}

// scriptedBatch answers CheckAll with decisions, and records the calls.
type scriptedBatch struct {
	mu    sync.Mutex
	calls [][]client.Check
	ds    []client.Decision
	err   error
}

func (s *scriptedBatch) CheckAll(_ context.Context, cs []client.Check) ([]client.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, cs)
	return s.ds, s.err
}

func (s *scriptedBatch) Check(context.Context, client.Check) (client.Decision, error) {
	panic("a Group must not call Check")
}

func mustNew(t *testing.T, cfg middleware.Config) *middleware.Middleware {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testcluster.Logger()
	}
	m, err := middleware.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A Group keys every limit, sends one call, and answers by the first
// denial that is not a refund, with that limit's headers and body; a key
// error answers before anything is sent; exempt limits are left out.
func TestGroupAnswersByTheFirstDenial(t *testing.T) {
	reset := t0.Add(time.Minute)
	b := &scriptedBatch{}
	now := func() time.Time { return t0 }
	a := mustNew(t, middleware.Config{Checker: b, Name: "api", Key: middleware.Const("k1"), Window: time.Minute, Now: now})
	login := mustNew(t, middleware.Config{Checker: b, Name: "login", Key: middleware.UserFromHeader("X-User"), Window: time.Minute, Now: now,
		ExemptMethods: []string{"PUT"}})
	g, err := middleware.NewGroup(middleware.GroupConfig{Checker: b, Limits: []*middleware.Middleware{a, login}})
	if err != nil {
		t.Fatal(err)
	}
	var seen []client.Decision
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.DecisionFrom(r.Context())
		seen = append(seen, d)
	}))

	// login denies; api's allowed hit was refunded: 429 naming login.
	b.ds = []client.Decision{
		{Limit: 30, Remaining: 12, ResetTime: reset, Refunded: true},
		{Limit: 5, Remaining: 0, ResetTime: reset, RetryAfter: 20 * time.Second},
	}
	resp := do(h, "POST", "192.0.2.1:1", "X-User", "u1")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 429 || resp.Header.Get("X-RateLimit-Limit") != "5" || resp.Header.Get("Retry-After") != "20" ||
		string(body) != `{"error":"rate_limited","limit":"login","retry_after":20}`+"\n" {
		t.Fatalf("login denied: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if len(b.calls) != 1 || len(b.calls[0]) != 2 || b.calls[0][0] != (client.Check{Name: "api", Key: "k1"}) || b.calls[0][1] != (client.Check{Name: "login", Key: "user:u1"}) {
		t.Fatalf("calls %+v, want one with api/k1 and login/user:u1", b.calls)
	}
	// Both allowed: the request goes on with the last limit's headers.
	b.ds = []client.Decision{{Allowed: true, Limit: 30, Remaining: 11, ResetTime: reset}, {Allowed: true, Limit: 5, Remaining: 3, ResetTime: reset}}
	resp = do(h, "POST", "192.0.2.1:1", "X-User", "u1")
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"login";r=3;t=60` || len(seen) != 1 || seen[0].Remaining != 3 {
		t.Fatalf("both allowed: %d %v, handler saw %+v", resp.StatusCode, resp.Header, seen)
	}
	// api denies first: it answers, whatever login says.
	b.ds = []client.Decision{{Limit: 30, ResetTime: reset, RetryAfter: time.Second}, {Limit: 5, ResetTime: reset, RetryAfter: 9 * time.Second}}
	if resp := do(h, "POST", "192.0.2.1:1", "X-User", "u1"); resp.StatusCode != 429 || resp.Header.Get("X-RateLimit-Limit") != "30" {
		t.Fatalf("api denied: %d %v", resp.StatusCode, resp.Header)
	}
	// No user: login's key error answers 400, and nothing is sent.
	calls := len(b.calls)
	if resp := do(h, "POST", "192.0.2.1:1"); resp.StatusCode != 400 || len(b.calls) != calls {
		t.Fatalf("no key: %d, %d calls (was %d)", resp.StatusCode, len(b.calls), calls)
	}
	// login exempts PUT: api alone is checked.
	b.ds = []client.Decision{{Allowed: true, Limit: 30, Remaining: 10, ResetTime: reset}}
	if resp := do(h, "PUT", "192.0.2.1:1"); resp.StatusCode != 200 || len(b.calls[len(b.calls)-1]) != 1 {
		t.Fatalf("exempt: %d, last call %+v", resp.StatusCode, b.calls[len(b.calls)-1])
	}
	// The call fails (closed): 503 by the first limit's OnError.
	b.ds, b.err = nil, fmt.Errorf("%w: no answer", client.ErrUnavailable)
	if resp := do(h, "POST", "192.0.2.1:1", "X-User", "u1"); resp.StatusCode != 503 {
		t.Fatalf("unavailable: %d", resp.StatusCode)
	}

	pass := mustNew(t, middleware.Config{Checker: b, Name: "pass", Key: middleware.Const("k"), PassOverLimit: true})
	for _, tc := range []struct {
		cfg  middleware.GroupConfig
		want string
	}{
		{middleware.GroupConfig{Limits: []*middleware.Middleware{a}}, "GroupConfig.Checker: required"},
		{middleware.GroupConfig{Checker: b}, "GroupConfig.Limits: at least one"},
		{middleware.GroupConfig{Checker: b, Limits: []*middleware.Middleware{a, nil}}, "GroupConfig.Limits[1]: nil"},
		{middleware.GroupConfig{Checker: b, Limits: []*middleware.Middleware{a, pass}}, `GroupConfig.Limits[1]: PassOverLimit in a group of 2`},
	} {
		if _, err := middleware.NewGroup(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewGroup: %v, want %q", err, tc.want)
		}
	}
	if _, err := middleware.NewGroup(middleware.GroupConfig{Checker: b, Limits: []*middleware.Middleware{pass}}); err != nil {
		t.Errorf("PassOverLimit alone: %v", err)
	}
}

// Against a real node: a group's request that one limit denies counts
// against none of the others.
func TestGroupCountsAllOrNothing(t *testing.T) {
	e := newEnv(t)
	a := mustNew(t, middleware.Config{Checker: e.client, Name: "g-api", Limit: fixed(5, time.Minute), Key: middleware.Const("k"), Now: e.clock.Now})
	login := mustNew(t, middleware.Config{Checker: e.client, Name: "g-login", Limit: fixed(1, time.Minute), Key: middleware.Const("k"), Now: e.clock.Now})
	g, err := middleware.NewGroup(middleware.GroupConfig{Checker: e.client, Limits: []*middleware.Middleware{a, login}})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for i, want := range []struct {
		code  int
		limit string
	}{{200, "1"}, {429, "1"}, {429, "1"}} {
		if resp := do(h, "POST", "192.0.2.1:1"); resp.StatusCode != want.code || resp.Header.Get("X-RateLimit-Limit") != want.limit {
			t.Fatalf("request %d: %d limit %q, want %d naming g-login", i+1, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), want.code)
		}
	}
	// g-api counted the first request only: 4 left.
	d, err := e.client.Check(context.Background(), client.Check{Name: "g-api", Key: "k", Peek: true, Limit: fixed(5, time.Minute)})
	if err != nil || d.Remaining != 4 {
		t.Fatalf("g-api after two refused requests: %+v, %v; want remaining 4", d, err)
	}
}
