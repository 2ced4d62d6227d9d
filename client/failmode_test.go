package client_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// scriptedNode is a gRPC node that answers each check by answer (by the
// check's key) and records every request it got.
type scriptedNode struct {
	sluicev1.UnimplementedRateLimitServiceServer
	addr   string
	answer func(c *sluicev1.RateLimitCheck) *sluicev1.Decision
	mu     sync.Mutex
	reqs   []*sluicev1.CheckRequest
}

func (f *scriptedNode) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, proto.CloneOf(req))
	f.mu.Unlock()
	resp := &sluicev1.CheckResponse{}
	for _, c := range req.Checks {
		resp.Decisions = append(resp.Decisions, f.answer(c))
	}
	return resp, nil
}

func (f *scriptedNode) requests() []*sluicev1.CheckRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*sluicev1.CheckRequest(nil), f.reqs...)
}

// lastPolicies returns the on_owner_unavailable of each check of the last
// request.
func (f *scriptedNode) lastPolicies(t *testing.T) []sluicev1.OwnerUnavailablePolicy {
	t.Helper()
	reqs := f.requests()
	if len(reqs) == 0 {
		t.Fatal("no request reached the node")
	}
	var out []sluicev1.OwnerUnavailablePolicy
	for _, c := range reqs[len(reqs)-1].Checks {
		out = append(out, c.OnOwnerUnavailable)
	}
	return out
}

// startScripted starts a scriptedNode; by default every key is answered
// allowed by its owner, "degraded-allow" allowed and degraded (as a node
// whose policy allowed it with the owner unreachable), "degraded-deny"
// denied and degraded, "over" denied, and "refunded" refunded.
func startScripted(t *testing.T) *scriptedNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &scriptedNode{addr: lis.Addr().String(), answer: func(c *sluicev1.RateLimitCheck) *sluicev1.Decision {
		switch {
		case strings.HasPrefix(c.Key, "degraded-allow"):
			return &sluicev1.Decision{Allowed: true, Limit: 10, Owner: "entry", Degraded: true}
		case strings.HasPrefix(c.Key, "degraded-deny"):
			return &sluicev1.Decision{Limit: 10, Owner: "entry", Degraded: true}
		case strings.HasPrefix(c.Key, "over"):
			return &sluicev1.Decision{Limit: 10, RetryAfter: 5000, Owner: "owner"}
		case strings.HasPrefix(c.Key, "refunded"):
			return &sluicev1.Decision{Limit: 10, Remaining: 4, Owner: "owner", Refunded: true}
		case strings.HasPrefix(c.Key, "unreachable"):
			return &sluicev1.Decision{Owner: "node9", Error: "no connection to it"}
		}
		return &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetTime: 60_000, Owner: "owner"}
	}}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

const (
	polUnspecified = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED
	polLocal       = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL
	polAllow       = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW
	polDeny        = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
)

// Under FailClosed every check carries OWNER_UNAVAILABLE_DENY unless it
// sets a policy of its own, and an answer the node marked degraded,
// allowed or not, is the fail-closed error (logged, without the key),
// never an allowed decision.
func TestFailClosedSendsDenyAndRefusesDegradedAnswers(t *testing.T) {
	f := startScripted(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	c := newClient(t, client.Config{Addrs: []string{f.addr}, FailureMode: client.FailClosed, Logger: logger})
	ctx := context.Background()

	d, err := c.Check(ctx, client.Check{Name: "api", Key: "user:1"})
	if err != nil || !d.Allowed || d.Degraded || d.Remaining != 9 {
		t.Fatalf("a normal answer: %+v, %v", d, err)
	}
	if reqs := f.requests(); reqs[0].AllOrNothing {
		t.Errorf("Check sent all_or_nothing")
	}
	if p := f.lastPolicies(t); len(p) != 1 || p[0] != polDeny {
		t.Fatalf("sent on_owner_unavailable %v, want [DENY]", p)
	}
	for _, key := range []string{"degraded-allow:203.0.113.9", "degraded-deny:203.0.113.9"} {
		d, err := c.Check(ctx, client.Check{Name: "auth.login", Key: key})
		if !errors.Is(err, client.ErrUnavailable) || d.Allowed || !d.Degraded || !errors.Is(d.Cause, client.ErrUnavailable) {
			t.Fatalf("%s under FailClosed: %+v, %v; want not allowed, degraded, ErrUnavailable", key, d, err)
		}
		if !strings.Contains(err.Error(), "node entry answered degraded") {
			t.Errorf("%s: error %q does not name the answering node", key, err)
		}
	}
	// A policy of the check's own is sent as it is; the degraded answer
	// is still an error.
	for _, tc := range []struct {
		p    client.OwnerUnavailable
		want sluicev1.OwnerUnavailablePolicy
	}{{client.OwnerUnavailableLocal, polLocal}, {client.OwnerUnavailableAllow, polAllow}, {client.OwnerUnavailableDeny, polDeny}} {
		d, err := c.Check(ctx, client.Check{Name: "auth.login", Key: "degraded-allow:x", OnOwnerUnavailable: tc.p})
		if !errors.Is(err, client.ErrUnavailable) || d.Allowed {
			t.Fatalf("policy %d: %+v, %v; want ErrUnavailable", tc.p, d, err)
		}
		if p := f.lastPolicies(t); p[0] != tc.want {
			t.Errorf("policy %d sent as %v, want %v", tc.p, p[0], tc.want)
		}
	}
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "k", OnOwnerUnavailable: 9}); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "on_owner_unavailable: unknown policy 9") {
		t.Fatalf("an unknown policy: %v", err)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "event=rate_limit.unavailable") || !strings.Contains(out, "name=auth.login") || !strings.Contains(out, "code=degraded") {
		t.Errorf("log lacks the event, name or code:\n%s", out)
	}
	if strings.Contains(out, "203.0.113.9") {
		t.Errorf("log holds the key:\n%s", out)
	}
}

// Under FailOpen nothing changes: no policy is sent (the node applies the
// named limit's, else local) unless the check sets one, and a degraded
// answer is returned as the node gave it.
func TestFailOpenKeepsTheNodesPolicy(t *testing.T) {
	f := startScripted(t)
	c := newClient(t, client.Config{Addrs: []string{f.addr}})
	ctx := context.Background()
	d, err := c.Check(ctx, client.Check{Name: "api", Key: "degraded-allow:1"})
	if err != nil || !d.Allowed || !d.Degraded || d.Cause != nil || d.Owner != "entry" {
		t.Fatalf("degraded allowed under FailOpen: %+v, %v", d, err)
	}
	if p := f.lastPolicies(t); p[0] != polUnspecified {
		t.Fatalf("sent %v, want UNSPECIFIED", p[0])
	}
	d, err = c.Check(ctx, client.Check{Name: "api", Key: "degraded-deny:1", OnOwnerUnavailable: client.OwnerUnavailableDeny})
	if err != nil || d.Allowed || !d.Degraded {
		t.Fatalf("degraded denied under FailOpen: %+v, %v", d, err)
	}
	if p := f.lastPolicies(t); p[0] != polDeny {
		t.Fatalf("sent %v, want DENY", p[0])
	}
}

// CheckAll sends all its checks in one call and answers in order, with
// refunds marked; bad input names the check; under FailClosed one
// degraded or unreachable check fails the whole call, under FailOpen only
// an unreachable one is answered by the failure mode.
func TestCheckAllIsOneCall(t *testing.T) {
	f := startScripted(t)
	open := newClient(t, client.Config{Addrs: []string{f.addr}})
	ctx := context.Background()
	ds, err := open.CheckAll(ctx, []client.Check{
		{Name: "api", Key: "user:1"},
		{Name: "login", Key: "refunded:1", Hits: 2},
		{Name: "login", Key: "over:1"},
		{Name: "api", Key: "unreachable:1"},
	})
	if err != nil || len(ds) != 4 {
		t.Fatalf("CheckAll: %v, %v", ds, err)
	}
	if reqs := f.requests(); len(reqs) != 1 || len(reqs[0].Checks) != 4 || reqs[0].Checks[1].GetHits() != 2 || reqs[0].Checks[2].Key != "over:1" || !reqs[0].AllOrNothing {
		t.Fatalf("requests: %v, want one with the 4 checks in order, all or nothing", reqs)
	}
	switch {
	case !ds[0].Allowed || ds[0].Remaining != 9:
		t.Errorf("decisions[0] = %+v, want allowed", ds[0])
	case ds[1].Allowed || !ds[1].Refunded || ds[1].Remaining != 4:
		t.Errorf("decisions[1] = %+v, want refunded, remaining 4", ds[1])
	case ds[2].Allowed || ds[2].Refunded || ds[2].RetryAfter != 5*time.Second:
		t.Errorf("decisions[2] = %+v, want denied, retry after 5s", ds[2])
	case !ds[3].Allowed || !ds[3].Degraded || !errors.Is(ds[3].Cause, client.ErrUnavailable):
		t.Errorf("decisions[3] = %+v, want allowed by the failure mode", ds[3])
	}

	closed, err := open.WithFailureMode(client.FailClosed)
	if err != nil || closed.FailureMode() != client.FailClosed || open.FailureMode() != client.FailOpen {
		t.Fatalf("WithFailureMode: %v", err)
	}
	for _, bad := range []string{"degraded-allow:2", "unreachable:2"} {
		ds, err = closed.CheckAll(ctx, []client.Check{{Name: "api", Key: "user:2"}, {Name: "api", Key: bad}})
		if !errors.Is(err, client.ErrUnavailable) || len(ds) != 2 || ds[0].Allowed || ds[1].Allowed || !ds[0].Degraded {
			t.Fatalf("FailClosed with %s: %+v, %v; want every decision not allowed and ErrUnavailable", bad, ds, err)
		}
		if p := f.lastPolicies(t); p[0] != polDeny || p[1] != polDeny {
			t.Fatalf("FailClosed sent %v, want DENY for both", p)
		}
	}

	for _, tc := range []struct {
		checks []client.Check
		want   string
	}{
		{nil, "checks: at least one check is required"},
		{make([]client.Check, client.MaxChecks+1), "checks: at most 1000 per call, got 1001"},
		{[]client.Check{{Name: "a", Key: "k"}, {Name: "a"}}, "checks[1].key: must not be empty"},
		{[]client.Check{{Name: "a", Key: "k", Limit: &client.Limit{Window: time.Second}}}, "checks[0].limit.limit: must be > 0, got 0"},
	} {
		n := len(f.requests())
		if _, err := open.CheckAll(ctx, tc.checks); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckAll(%d checks): %v, want ErrInvalid naming %q", len(tc.checks), err, tc.want)
		}
		if len(f.requests()) != n {
			t.Errorf("a bad CheckAll was sent")
		}
	}
	if _, err := open.WithFailureMode(7); err == nil || !strings.Contains(err.Error(), "unknown mode 7") {
		t.Errorf("WithFailureMode(7): %v", err)
	}
	// Clients of one New share their connections, and Close.
	open.Close()
	if _, err := closed.Check(ctx, client.Check{Name: "api", Key: "k"}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("after Close of the first: %v, want ErrClosed", err)
	}
}

// Against real nodes, the key's owner dead: failing open, the node the
// client called answers from its copy (local: allowed, degraded);
// failing closed, the client asks for deny and answers ErrUnavailable,
// never allowed.
func TestFailClosedWithTheOwnerDown(t *testing.T) {
	nodes := testcluster.Start(t, 2, testcluster.Options{})
	key := testcluster.KeyOwnedBy(t, nodes[0], "dead-owner", "user:", "node2")
	entry := []string{nodes[0].GRPCAddr()}
	open := newClient(t, client.Config{Addrs: entry, Timeout: 20 * time.Second})
	closed := newClient(t, client.Config{Addrs: entry, Timeout: 20 * time.Second, FailureMode: client.FailClosed})
	check := client.Check{Name: "dead-owner", Key: key, Limit: &client.Limit{Limit: 10, Window: time.Hour}}
	if d, err := closed.Check(context.Background(), check); err != nil || !d.Allowed || d.Degraded || d.Owner != "node2" {
		t.Fatalf("before the kill: %+v, %v", d, err)
	}
	nodes[1].Kill()
	// node1 may see node2 die meanwhile and take the key over: its own
	// answers are then not degraded. The first checks come well before.
	d, err := closed.Check(context.Background(), check)
	switch {
	case errors.Is(err, client.ErrUnavailable) && !d.Allowed && d.Degraded:
	case err == nil && !d.Degraded && d.Owner == "node1":
		t.Logf("node1 took the key over before the check: %+v", d)
	default:
		t.Fatalf("fail closed, the owner dead: %+v, %v; want not allowed and ErrUnavailable", d, err)
	}
	d, err = open.Check(context.Background(), check)
	if err != nil || !d.Allowed {
		t.Fatalf("fail open, the owner dead: %+v, %v; want allowed", d, err)
	}
}
