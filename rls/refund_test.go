package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/window"
)

// refundRules are the rules of the refund tests: a team's tokens per hour
// (the token-quota pattern), a per-minute request limit, and a rule that
// refuses every request.
const refundRules = `domain: ai
descriptors:
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 2000}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
`

// hitsDesc is the descriptor (key, value) with hits_addend hits, a refund
// (is_negative_hits) when negative is set.
func hitsDesc(key, value string, hits uint64, negative bool) *ratelimitv3.RateLimitDescriptor {
	d := desc(key, value)
	d.HitsAddend = wrapperspb.UInt64(hits)
	d.IsNegativeHits = negative
	return d
}

// aiCall sends descriptors of domain "ai" to c, failing the test on an
// error.
func aiCall(t *testing.T, c rlsv3.RateLimitServiceClient, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// A descriptor with is_negative_hits gives its hits back at the key's
// owner (here one node, real gRPC): answered OK with the hits remaining
// after it, never below zero, nothing when nothing is counted; it is no
// limit of its request (a refusal by another descriptor leaves it given
// back; given back first, its hits are room for the request's charge);
// a rule of 0 and a descriptor no rule matches are OK; 0 hits peek; with
// the peer's counting (--rls-increment-when-over-limit) it gives back
// from the window too. A refund whose hits were charged in a window that
// has ended is taken from the current one.
func TestRLSRefund(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "ai.yaml", Data: []byte(refundRules)})
	if err != nil {
		t.Fatal(err)
	}
	clock := window.NewManualClock(time.Unix(3600*500_000, 0))
	for _, peer := range []bool{false, true} {
		n := startClusterOpts(t, 1, cfg, rls.Options{IncrementWhenOverLimit: peer, AllowRefunds: true}, clock)[0]
		type want struct {
			code      rlsv3.RateLimitResponse_Code
			remaining uint32
		}
		v := fmt.Sprint("v", peer)
		for i, step := range []struct {
			ds   []*ratelimitv3.RateLimitDescriptor
			want []want
		}{
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 4, true)}, []want{{ok, 10}}}, // nothing counted
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 7, false)}, []want{{ok, 3}}},
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 5, true)}, []want{{ok, 8}}},
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 9, true)}, []want{{ok, 10}}}, // floored at 0
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 10, false)}, []want{{ok, 0}}},
			// The refund first (its status says what remained after it):
			// its 6 hits are room for the charge of 6.
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 6, false), hitsDesc("small", v, 6, true)}, []want{{ok, 0}, {ok, 6}}},
			// Refused by another descriptor: the refund stands.
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 3, true), hitsDesc("blocked", v, 1, false)}, []want{{ok, 3}, {over, 0}}},
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("blocked", v, 1, true), hitsDesc("nothing", v, 5, true)}, []want{{ok, 0}, {ok, 0}}},
			{[]*ratelimitv3.RateLimitDescriptor{hitsDesc("small", v, 0, true)}, []want{{ok, 3}}}, // a peek
		} {
			r := aiCall(t, n.rls, step.ds...)
			for j, w := range step.want {
				if g := r.Statuses[j]; g.Code != w.code || g.LimitRemaining != w.remaining {
					t.Fatalf("peer %v step %d: statuses[%d] %v %d, want %v %d", peer, i, j, g.Code, g.LimitRemaining, w.code, w.remaining)
				}
			}
		}
		if st := n.RLS().Stats(); st.RefundsGiven != 4 || st.RefundsEmpty != 2 || st.RefundsFailed != 0 { // "nothing" matches no rule: no refund
			t.Errorf("peer %v: refunds %d given, %d empty, %d failed; want 4, 2, 0", peer, st.RefundsGiven, st.RefundsEmpty, st.RefundsFailed)
		}
	}

	// Charged 6 in one minute, given back in the next (after 2 more were
	// charged there): taken from the current window, floored.
	n := startClusterOpts(t, 1, cfg, rls.Options{AllowRefunds: true}, clock)[0]
	aiCall(t, n.rls, hitsDesc("small", "late", 6, false))
	clock.Advance(time.Minute)
	aiCall(t, n.rls, hitsDesc("small", "late", 2, false))
	if r := aiCall(t, n.rls, hitsDesc("small", "late", 6, true)); r.Statuses[0].LimitRemaining != 10 {
		t.Fatalf("a late refund: %d remaining, want 10", r.Statuses[0].LimitRemaining)
	}
}

// The token-quota pattern (an AI gateway: charge an estimate of the
// tokens on the request, give back the unused part on the response, as
// Envoy's is_negative_hits does), concurrent, on 1 and on 3 nodes, each
// call to a node picked at random (the refund often to another node than
// the charge): every answer is counted, and the tokens in force at the
// end are exactly those used by the admitted requests, never over the
// limit, the budget ran out on the way, and every refund was given back.
func TestRLSRefundTokenQuota(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "ai.yaml", Data: []byte(refundRules)})
	if err != nil {
		t.Fatal(err)
	}
	const (
		limit    = 2000
		workers  = 8
		requests = 40
	)
	for _, size := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", size), func(t *testing.T) {
			clock := window.NewManualClock(time.Unix(3600*500_000, 0)) // one hour window throughout
			nodes := startClusterOpts(t, size, cfg, rls.Options{AllowRefunds: true}, clock)
			team := fmt.Sprintf("team-%d", size)
			var (
				mu                       sync.Mutex
				used, admitted, refused  int64
				refunds, charged, answer int64
				wg                       sync.WaitGroup
				start                    = make(chan struct{})
			)
			for w := range workers {
				r := rand.New(rand.NewPCG(uint64(size), uint64(w)))
				wg.Go(func() {
					<-start
					for range requests {
						estimate := 1 + r.Uint64N(50)
						resp := aiCall(t, nodes[r.IntN(size)].rls, hitsDesc("team", team, estimate, false))
						if resp.OverallCode != ok {
							mu.Lock()
							refused++
							answer++
							mu.Unlock()
							continue
						}
						u := r.Uint64N(estimate + 1) // the tokens the response used
						if estimate > u {
							back := aiCall(t, nodes[r.IntN(size)].rls, hitsDesc("team", team, estimate-u, true))
							if back.OverallCode != ok || back.Statuses[0].Code != ok {
								t.Errorf("a refund answered %v", back)
							}
						}
						mu.Lock()
						admitted++
						answer++
						charged += int64(estimate)
						used += int64(u)
						if estimate > u {
							refunds++
						}
						mu.Unlock()
					}
				})
			}
			close(start)
			wg.Wait()
			if answer != workers*requests || admitted+refused != answer {
				t.Fatalf("%d answers (%d admitted, %d refused), want %d", answer, admitted, refused, workers*requests)
			}
			if refused == 0 || admitted == 0 {
				t.Fatalf("%d admitted, %d refused: the test wants both (the budget run out)", admitted, refused)
			}
			if used > limit {
				t.Fatalf("%d tokens used by admitted requests, over the limit %d", used, limit)
			}
			// Exactly the used tokens are in force: a peek says limit -
			// used remain, a charge of that many passes, one more does not.
			peek := aiCall(t, nodes[0].rls, hitsDesc("team", team, 0, false))
			if got := int64(peek.Statuses[0].LimitRemaining); got != limit-used {
				t.Fatalf("%d remaining, want %d - %d used = %d (%d charged by %d admitted requests, %d refunds)",
					got, limit, used, limit-used, charged, admitted, refunds)
			}
			if rest := uint64(limit - used); rest > 0 {
				if r := aiCall(t, nodes[size-1].rls, hitsDesc("team", team, rest, false)); r.OverallCode != ok {
					t.Fatalf("the remaining %d tokens: %v", rest, r.OverallCode)
				}
			}
			if r := aiCall(t, nodes[0].rls, hitsDesc("team", team, 1, false)); r.OverallCode != over {
				t.Fatalf("one token past the limit: %v", r.OverallCode)
			}
			var given, empty, failed int64
			for _, n := range nodes {
				st := n.RLS().Stats()
				given, empty, failed = given+st.RefundsGiven, empty+st.RefundsEmpty, failed+st.RefundsFailed
			}
			if given != refunds || empty != 0 || failed != 0 {
				t.Fatalf("refunds: %d given, %d empty, %d failed; want all %d given", given, empty, failed, refunds)
			}
			t.Logf("%d nodes: %d requests admitted (%d tokens charged, %d used, %d refunds), %d refused",
				size, admitted, charged, used, refunds, refused)
		})
	}
}

// A refund that cannot reach its key's owner is answered OK (a refund
// refuses nothing), with nothing remaining, counted in RefundsFailed, and
// the request's own descriptors are decided as usual.
func TestRLSRefundNotDelivered(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "ai.yaml", Data: []byte(refundRules)})
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	ch.failKey = `"gone"`
	s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler), AllowRefunds: true})
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		hitsDesc("small", "gone", 5, true), hitsDesc("small", "here", 4, false)}})
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].Code != ok || r.Statuses[1].LimitRemaining != 6 {
		t.Fatalf("an undelivered refund beside a charge: %v", r)
	}
	if st := s.Stats(); st.RefundsFailed != 1 || st.RefundsGiven != 0 || st.RefundsEmpty != 0 || st.Requests != 1 {
		t.Fatalf("stats: %+v, want 1 refund failed", st)
	}
}

// Refunds off (the node's default; serve --allow-refunds): a descriptor
// with is_negative_hits is answered as before refunds, its hits taken as
// 0: a peek that is one of the request's limits (OVER_LIMIT when the key
// has no hit left), giving nothing back, counted in Stats.RefundsOff
// (sluice_rls_refunds_total{result="off"}); a descriptor of 0 hits or
// that matched no rule is no refund and is not counted.
func TestRLSRefundOff(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "ai.yaml", Data: []byte(refundRules)})
	if err != nil {
		t.Fatal(err)
	}
	clock := window.NewManualClock(time.Unix(3600*500_000, 0))
	for _, peer := range []bool{false, true} {
		n := startClusterOpts(t, 1, cfg, rls.Options{IncrementWhenOverLimit: peer}, clock)[0]
		v := fmt.Sprint("off", peer)
		aiCall(t, n.rls, hitsDesc("small", v, 7, false))
		if r := aiCall(t, n.rls, hitsDesc("small", v, 5, true)); r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[0].LimitRemaining != 3 {
			t.Fatalf("peer %v: a refund with refunds off: %v, want OK with 3 remaining (a peek)", peer, r)
		}
		aiCall(t, n.rls, hitsDesc("small", v, 3, false))
		r := aiCall(t, n.rls, hitsDesc("small", v, 4, true), hitsDesc("nothing", v, 4, true), hitsDesc("small", v, 0, true))
		switch {
		case !peer && (r.OverallCode != over || r.Statuses[0].Code != over):
			t.Fatalf("a refund of a spent key with refunds off: %v, want OVER_LIMIT (a peek, as before refunds)", r)
		case peer && (r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0):
			t.Fatalf("peer counting: a refund of a spent key with refunds off: %v, want OK with 0 left (a peek at the limit)", r)
		}
		if d := aiCall(t, n.rls, hitsDesc("small", v, 0, false)); d.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("peer %v: %d remaining after the refused refunds, want 0 (nothing given back)", peer, d.Statuses[0].LimitRemaining)
		}
		if st := n.RLS().Stats(); st.RefundsOff != 2 || st.RefundsGiven+st.RefundsEmpty+st.RefundsFailed != 0 {
			t.Errorf("peer %v: stats %+v, want 2 refunds off and no other", peer, st)
		}
	}
}
