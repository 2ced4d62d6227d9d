package rpc

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// refundCheck returns rc with hits -n: a refund of n hits.
func refundCheck(rc *sluicev1.RateLimitCheck, n int64) *sluicev1.RateLimitCheck {
	r := proto.CloneOf(rc)
	r.Hits = proto.Int64(-n)
	return r
}

// A client's refund (negative hits) gives the hits back at the key's
// owner, exactly, never below zero, for every algorithm: answered
// allowed, refunded when it gave something back, with the hits remaining
// after it; a key with nothing counted gives nothing back; hits counted
// in a window that has ended are taken from the current one (Envoy sends
// no time); the most negative int64 is refused naming the field.
func TestClientRefund(t *testing.T) {
	clock := windowClock()
	n := startInproc(t, NodeConfig{Name: "node1", Clock: clock, AllowRefunds: true})[0]
	c := n.client
	type step struct {
		hits              int64 // < 0: a refund
		allowed, refunded bool
		remaining         int64
	}
	for _, tc := range []struct {
		alg   sluicev1.Algorithm
		steps []step
	}{
		{sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, []step{
			{-1, true, false, 10}, // nothing counted yet
			{7, true, false, 3}, {-5, true, true, 8}, {-5, true, true, 10}, {-1, true, false, 10},
			{10, true, false, 0}, {1, false, false, 0}, {-4, true, true, 4}, {4, true, false, 0},
		}},
		{sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW, []step{
			{4, true, false, 6}, {-4, true, true, 10}, {10, true, false, 0}, {-3, true, true, 3}, {4, false, false, 3},
		}},
		{sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, []step{
			{8, true, false, 2}, {-8, true, true, 10}, {10, true, false, 0}, {-20, true, true, 10},
		}},
		{sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET, []step{
			{6, true, false, 4}, {-2, true, true, 6}, {6, true, false, 0}, {-10, true, true, 10},
		}},
	} {
		rc := &sluicev1.RateLimitCheck{Name: "refund", Key: "k-" + tc.alg.String(), Limit: 10, WindowMs: time.Hour.Milliseconds(), Algorithm: tc.alg}
		for i, s := range tc.steps {
			r := proto.CloneOf(rc)
			r.Hits = proto.Int64(s.hits)
			d := check(t, c, r)
			if d.Allowed != s.allowed || d.Refunded != s.refunded || d.Remaining != s.remaining {
				t.Fatalf("%s step %d (hits %d): allowed %v refunded %v remaining %d, want %v %v %d",
					tc.alg, i, s.hits, d.Allowed, d.Refunded, d.Remaining, s.allowed, s.refunded, s.remaining)
			}
		}
	}

	// Charged in one window, refunded in the next: taken from the
	// current window's count, floored at zero.
	rc := &sluicev1.RateLimitCheck{Name: "refund", Key: "late", Limit: 10, WindowMs: time.Minute.Milliseconds(), Hits: proto.Int64(6)}
	check(t, c, rc)
	clock.Advance(time.Minute)
	two := proto.CloneOf(rc)
	two.Hits = proto.Int64(2)
	if d := check(t, c, two); d.Remaining != 8 {
		t.Fatalf("the next window: remaining %d, want 8", d.Remaining)
	}
	if d := check(t, c, refundCheck(rc, 6)); !d.Refunded || d.Remaining != 10 {
		t.Fatalf("a late refund: refunded %v remaining %d, want true 10", d.Refunded, d.Remaining)
	}

	bad := proto.CloneOf(rc)
	bad.Hits = proto.Int64(math.MinInt64)
	_, err := c.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{bad}})
	if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "checks[0].hits: ") {
		t.Fatalf("hits min int64: %v, want INVALID_ARGUMENT naming checks[0].hits", err)
	}
	if got := n.srv.Stats().Refunds; got != 10 {
		t.Errorf("Stats.Refunds %d, want the 10 refunds that gave something back", got)
	}
}

// In an all-or-nothing request a refund is not one of the request's
// limits: it stands when another check is denied (the charged one is
// undone, the refund is not), and one that gives nothing back denies
// nothing.
func TestClientRefundAllOrNothing(t *testing.T) {
	n := startInproc(t, NodeConfig{Name: "node1", Clock: windowClock(), AllowRefunds: true})[0]
	c := n.client
	a := &sluicev1.RateLimitCheck{Name: "aon", Key: "a", Limit: 10, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(5)}
	b := &sluicev1.RateLimitCheck{Name: "aon", Key: "b", Limit: 1, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(2)}
	ok := &sluicev1.RateLimitCheck{Name: "aon", Key: "c", Limit: 10, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(1)}
	check(t, c, a)
	resp, err := c.Check(context.Background(), &sluicev1.CheckRequest{AllOrNothing: true,
		Checks: []*sluicev1.RateLimitCheck{refundCheck(a, 3), ok, b}})
	if err != nil {
		t.Fatal(err)
	}
	ds := resp.Decisions
	if !ds[0].Allowed || !ds[0].Refunded || ds[0].Remaining != 8 || ds[1].Allowed || !ds[1].Refunded || ds[2].Allowed {
		t.Fatalf("refund, charge, denied: %v", ds)
	}
	if d := peek(t, c, a); d.Remaining != 8 {
		t.Fatalf("a after the request: remaining %d, want 8 (the refund stands)", d.Remaining)
	}
	if d := peek(t, c, ok); d.Remaining != 10 {
		t.Fatalf("c after the request: remaining %d, want 10 (undone)", d.Remaining)
	}
	fresh := proto.CloneOf(a)
	fresh.Key = "never-charged"
	resp, err = c.Check(context.Background(), &sluicev1.CheckRequest{AllOrNothing: true,
		Checks: []*sluicev1.RateLimitCheck{refundCheck(fresh, 3), ok}})
	if err != nil || resp.Decisions[0].Refunded || !resp.Decisions[0].Allowed || !resp.Decisions[1].Allowed || resp.Decisions[1].Remaining != 9 {
		t.Fatalf("a refund of nothing beside a charge: %v %v; want the charge allowed", resp.GetDecisions(), err)
	}
}

// On three nodes a refund sent to any node is applied at the key's owner
// (counted there), and a refund whose owner cannot be reached is
// answered with an error, never applied by a stand-in.
func TestClientRefundCluster(t *testing.T) {
	nodes := startRefundCluster(t, true, true, true)
	key := keyOwnedBy(t, nodes[0], "cl", "node3")
	rc := &sluicev1.RateLimitCheck{Name: "cl", Key: key, Limit: 10, WindowMs: time.Hour.Milliseconds(), Hits: proto.Int64(9)}
	check(t, nodes[0].client, rc)
	if d := check(t, nodes[1].client, refundCheck(rc, 4)); !d.Refunded || d.Remaining != 5 || d.Owner != "node3" {
		t.Fatalf("refund through node2: %v, want refunded by node3 with 5 remaining", d)
	}
	if d := peek(t, nodes[0].client, rc); d.Remaining != 5 {
		t.Fatalf("peek through node1: remaining %d, want 5", d.Remaining)
	}
	if r3, r1 := nodes[2].srv.Stats().Refunds, nodes[0].srv.Stats().Refunds+nodes[1].srv.Stats().Refunds; r3 != 1 || r1 != 0 {
		t.Fatalf("refunds counted: node3 %d, others %d; want 1 at the owner only", r3, r1)
	}
	nodes[2].Kill()
	resp, err := nodes[0].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{refundCheck(rc, 4)}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Error == "" || d.Refunded || d.Allowed {
		t.Fatalf("a refund whose owner is down: %v, want an error", d)
	}
}
