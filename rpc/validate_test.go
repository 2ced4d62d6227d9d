package rpc

import (
	"context"
	"math"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// C12 and the bad-input list: every bad check is refused with
// INVALID_ARGUMENT naming the field, nothing is counted, and the node keeps
// serving.
func TestBadInputIsRefusedByField(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	n := startInprocNode(t, "solo", clock)
	good := func() *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "api", Key: "user:1", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}
	}
	with := func(f func(*sluicev1.RateLimitCheck)) []*sluicev1.RateLimitCheck {
		c := good()
		f(c)
		return []*sluicev1.RateLimitCheck{c}
	}
	many := make([]*sluicev1.RateLimitCheck, MaxBatch+1)
	for i := range many {
		many[i] = good()
	}
	cases := []struct {
		name   string
		checks []*sluicev1.RateLimitCheck
		field  string
	}{
		{"limit 0", with(func(c *sluicev1.RateLimitCheck) { c.Limit = 0 }), "checks[0].limit"},
		{"limit -1", with(func(c *sluicev1.RateLimitCheck) { c.Limit = -1 }), "checks[0].limit"},
		{"limit over 2^53", with(func(c *sluicev1.RateLimitCheck) { c.Limit = 1<<53 + 1 }), "checks[0].limit"},
		{"window 0", with(func(c *sluicev1.RateLimitCheck) { c.WindowMs = 0 }), "checks[0].window_ms"},
		{"window -5s", with(func(c *sluicev1.RateLimitCheck) { c.WindowMs = -5000 }), "checks[0].window_ms"},
		{"window wrapping to positive ns", with(func(c *sluicev1.RateLimitCheck) { c.WindowMs = -18446744073709 }), "checks[0].window_ms"},
		{"window min int64", with(func(c *sluicev1.RateLimitCheck) { c.WindowMs = math.MinInt64 }), "checks[0].window_ms"},
		{"window over 366 days", with(func(c *sluicev1.RateLimitCheck) { c.WindowMs = math.MaxInt64 }), "checks[0].window_ms"},
		{"hits -1", with(func(c *sluicev1.RateLimitCheck) { c.Hits = proto.Int64(-1) }), "checks[0].hits"}, // refunds are off (serve --allow-refunds)
		{"hits min int64", with(func(c *sluicev1.RateLimitCheck) { c.Hits = proto.Int64(math.MinInt64) }), "checks[0].hits"},
		{"burst -1", with(func(c *sluicev1.RateLimitCheck) { c.Burst = -1 }), "checks[0].burst"},
		{"unknown algorithm", with(func(c *sluicev1.RateLimitCheck) { c.Algorithm = 9 }), "checks[0].algorithm"},
		{"negative algorithm", with(func(c *sluicev1.RateLimitCheck) { c.Algorithm = -1 }), "checks[0].algorithm"},
		{"empty key", with(func(c *sluicev1.RateLimitCheck) { c.Key = "" }), "checks[0].key"},
		{"empty name", with(func(c *sluicev1.RateLimitCheck) { c.Name = "" }), "checks[0].name"},
		{"key over 512 bytes", with(func(c *sluicev1.RateLimitCheck) { c.Key = strings.Repeat("k", MaxKeyBytes+1) }), "checks[0].key"},
		{"name over 256 B", with(func(c *sluicev1.RateLimitCheck) { c.Name = strings.Repeat("n", MaxNameBytes+1) }), "checks[0].name"},
		{"nil check", []*sluicev1.RateLimitCheck{good(), nil}, "checks[1].name"},
		{"empty batch", nil, "checks"},
		{"batch over 1000", many, "checks"},
		{"bad second check", []*sluicev1.RateLimitCheck{good(), with(func(c *sluicev1.RateLimitCheck) { c.Limit = 0 })[0]}, "checks[1].limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: c.checks})
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), c.field+": ") {
				t.Fatalf("got %v, want InvalidArgument starting %q", err, c.field+": ")
			}
			var br *errdetails.BadRequest
			for _, d := range st.Details() {
				if b, ok := d.(*errdetails.BadRequest); ok {
					br = b
				}
			}
			if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != c.field {
				t.Fatalf("details %v, want a BadRequest for %s", st.Details(), c.field)
			}
		})
	}
	// Nothing of the refused batches was counted, and the node still serves:
	// the first good hit sees the full budget.
	d := check(t, n.client, good())
	if !d.Allowed || d.Remaining != 9 || d.Limit != 10 || d.ResetTime <= 0 || d.RetryAfter != 0 {
		t.Fatalf("after bad input: %v, want allowed with remaining 9", d)
	}
	// The peer API validates too.
	_, err := n.peer(t).Forward(context.Background(), &sluicev1.ForwardRequest{Checks: with(func(c *sluicev1.RateLimitCheck) { c.Limit = 0 })})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Forward with limit 0: %v, want InvalidArgument", err)
	}
}

// Hits above the capacity are over limit with retry_after -1, not an error,
// and nothing in any answer is negative except that -1.
func TestCapacityExceeded(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	n := startInprocNode(t, "solo", clock)
	for _, alg := range algorithms {
		d := check(t, n.client, &sluicev1.RateLimitCheck{Name: "api", Key: "k", Hits: proto.Int64(11), Limit: 10, WindowMs: 60000, Algorithm: alg})
		if d.Allowed || d.RetryAfter != -1 || d.Remaining != 10 || d.Limit != 10 || d.ResetTime != windowStart.UnixMilli() || d.Delay != 0 {
			t.Errorf("%s: %v, want denied, retry_after -1, remaining 10, reset_time now", alg, d)
		}
	}
}

// On the peer stream a refused request gets a response naming the field,
// and the stream goes on serving the next request in order.
func TestForwardStreamRefusesAndGoesOn(t *testing.T) {
	n := startInprocNode(t, "solo", window.NewManualClock(windowStart))
	st, err := n.peer(t).ForwardStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bad := &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "api", Key: "k", Hits: proto.Int64(1), Limit: 0, WindowMs: 1000}}}
	good := &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "api", Key: "k", Hits: proto.Int64(1), Limit: 2, WindowMs: 1000}}}
	for _, req := range []*sluicev1.ForwardRequest{bad, good, good, good} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for i := 0; i < 4; i++ {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case resp.Error != "":
			got = append(got, "E:"+strings.SplitN(resp.Error, ":", 2)[0])
		case len(resp.Decisions) == 1 && resp.Decisions[0].Allowed:
			got = append(got, "A")
		default:
			got = append(got, "D")
		}
	}
	if strings.Join(got, " ") != "E:checks[0].limit A A D" {
		t.Fatalf("responses %v, want the refusal then A A D", got)
	}
	_ = st.CloseSend()
}

// A check that leaves hits unset consumes one hit (a peek needs an
// explicit 0), so a client that forgets the field is still limited.
func TestHitsDefaultToOne(t *testing.T) {
	n := startInprocNode(t, "solo", window.NewManualClock(windowStart))
	c := &sluicev1.RateLimitCheck{Name: "api", Key: "forgetful", Limit: 2, WindowMs: 60000}
	for i, want := range []bool{true, true, false} {
		if d := check(t, n.client, c); d.Allowed != want || d.Remaining != int64(max(1-i, 0)) {
			t.Fatalf("check %d without hits: %v, want allowed=%v remaining=%d", i+1, d, want, max(1-i, 0))
		}
	}
	peek := &sluicev1.RateLimitCheck{Name: "api", Key: "peeker", Limit: 2, WindowMs: 60000, Hits: proto.Int64(0)}
	for i := 0; i < 3; i++ {
		if d := check(t, n.client, peek); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("peek %d: %v, want allowed with remaining 2", i+1, d)
		}
	}
}
