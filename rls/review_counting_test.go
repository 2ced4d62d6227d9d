package rls_test

import (
	"context"
	"log/slog"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rls"
)

// reviewRule10 is one rule of limit 10 a minute on key k, any value.
const reviewRule10 = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

// reviewService is a Service on rules, deciding on an in-memory store
// (storeChecker), with opts (its Clock and Logger filled in).
func reviewService(t *testing.T, rules string, opts rls.Options) (*rls.Service, *storeChecker) {
	t.Helper()
	cfg, err := rls.Parse(rls.File{Name: "r.yaml", Data: []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	opts.Clock, opts.Logger = ch.clock, slog.New(slog.DiscardHandler)
	return rls.NewService(cfg, ch, opts), ch
}

// reviewHits is a descriptor k=v of its own hits_addend.
func reviewHits(v string, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d := desc("k", v)
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

func reviewCodes(resp *rlsv3.RateLimitResponse) string {
	var b []byte
	for _, s := range resp.GetStatuses() {
		b = append(b, s.GetCode().String()[0]) // O: OK, O of OVER_LIMIT told apart below
		if s.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			b[len(b)-1] = 'X'
		}
	}
	return string(b)
}

// Finding (IncrementWhenOverLimit, deterministic, one request): the
// peer counts a request's descriptors one after the other, refused hits
// included (fixed_cache_impl.go: one INCRBY per descriptor in a
// pipeline, each status from the count after its own INCRBY). A request
// carrying the same descriptor twice, 20 hits then 1, on a count of 5 of
// 10, is therefore OVER_LIMIT twice at the peer (25 then 26). decideEach
// sends both in one call to a window of 11: the 20 are refused (not
// counted), the 1 then fits (6 <= 10) and is answered OK; the second
// "fill" call then asks for the refused hits' share (6) on a count of
// 6, which is refused too, so the count stays 6 where the peer's is 26,
// and the next four 1-hit requests are OK where the peer refuses them.
// Right: the refused hits are counted before the next descriptor of the
// same check is decided (e.g. the first call fills: a refused check
// takes the window to L+1, the way a peer count past L does), so the
// second descriptor and the following requests are OVER_LIMIT.
func TestReviewIncrementWhenOverLimitSameDescriptorTwice(t *testing.T) {
	s, _ := reviewService(t, reviewRule10, rls.Options{IncrementWhenOverLimit: true})
	if r := call(t, s, "r", 0, reviewHits("v", 5)); r.OverallCode != ok {
		t.Fatalf("5 of 10: %v", r)
	}
	r := call(t, s, "r", 0, reviewHits("v", 20), reviewHits("v", 1))
	if got := reviewCodes(r); got != "XX" {
		t.Errorf("20 then 1 hit of one descriptor on a count of 5 of 10: statuses %s, want XX (the peer: 25 and 26 are both over 10)", got)
	}
	// The peer's count is 26: every later hit of the window is refused.
	var later string
	for range 5 {
		later += reviewCodes(call(t, s, "r", 0, reviewHits("v", 1)))
	}
	if later != "XXXXX" {
		t.Errorf("1-hit requests after it: %s, want XXXXX (the count is past the limit)", later)
	}
}

// Finding (IncrementWhenOverLimit, a race between two requests): a
// refused request's hits are counted by a second "fill" call for
// min(hits, remaining) — the remaining seen by the first call. The doc
// comment says another request that comes in between "fills the window
// first: the second call is then refused and the count is at L+1
// anyway"; but a request of 1 hit in between does not fill the window,
// it only makes the fill (asked all at once) too big to fit, so the
// refused request's hits are never counted. Here: count 5 of 10, a
// request of 20 hits is refused (the peer's count: 25), one request of
// 1 hit comes between the two calls (OK: the peer may order it first),
// the fill of 6 is refused, the count stays 6, and four more 1-hit
// requests are OK where the peer refuses every one (its count is 26).
// The number of 1-hit OKs stays <= the limit (10), so this is
// under-counting against the peer, not over-admission past the limit.
// Right: the fill takes what is left when it runs (e.g. fill to L+1 by
// asking again with the new remaining, or as a check that saturates).
func TestReviewIncrementWhenOverLimitFillRace(t *testing.T) {
	s, ch := reviewService(t, reviewRule10, rls.Options{IncrementWhenOverLimit: true})
	if r := call(t, s, "r", 0, reviewHits("v", 5)); r.OverallCode != ok {
		t.Fatalf("5 of 10: %v", r)
	}
	var between *rlsv3.RateLimitResponse
	ch.afterCall = func(n int) {
		ch.afterCall = nil // once: after the big request's first call
		between = call(t, s, "r", 0, reviewHits("v", 1))
	}
	if r := call(t, s, "r", 0, reviewHits("v", 20)); r.OverallCode != over {
		t.Fatalf("20 hits on 5 of 10: %v, want OVER_LIMIT", r)
	}
	if between == nil || between.OverallCode != ok {
		t.Fatalf("the request in between: %v (OK: 6 <= 10 when ordered before the 20)", between)
	}
	var later string
	for range 5 {
		later += reviewCodes(call(t, s, "r", 0, reviewHits("v", 1)))
	}
	if later != "XXXXX" {
		t.Errorf("1-hit requests after a refused request of 20 hits: %s, want XXXXX (the peer's count is 26 > 10; the refused hits were not counted)", later)
	}
}

// Holds (pinned): with IncrementWhenOverLimit, whatever the order of
// requests of 1 or more hits and peeks, the 1-hit requests answered OK
// in one window never pass the limit, a peek is OK exactly while the
// count (the peer's, refused hits included) is at most the limit, and a
// charge is OK exactly when it fits.
func TestReviewIncrementWhenOverLimitSequential(t *testing.T) {
	s, _ := reviewService(t, reviewRule10, rls.Options{IncrementWhenOverLimit: true})
	count := uint64(0) // the peer's count
	oks := 0
	for i, hits := range []uint64{0, 1, 3, 0, 4, 0, 1, 0, 1, 0, 2, 0, 1, 0, 1, 0, 5, 0, 1} {
		r := call(t, s, "r", 0, reviewHits("v", hits))
		count += hits
		wantOK := count <= 10
		if gotOK := r.OverallCode == ok; gotOK != wantOK {
			t.Fatalf("request %d (%d hits, count %d of 10): %s, want OK %v", i, hits, count, r.OverallCode, wantOK)
		}
		if wantOK && hits > 0 && r.Statuses[0].LimitRemaining != uint32(10-count) {
			t.Errorf("request %d: remaining %d, want %d", i, r.Statuses[0].LimitRemaining, 10-count)
		}
		if hits == 1 && r.OverallCode == ok {
			oks++
		}
	}
	if oks > 10 {
		t.Errorf("%d 1-hit OKs, limit 10", oks)
	}
}

// Holds (pinned): a requests_per_unit 0 rule with IncrementWhenOverLimit
// (a window of 1): a hit is always over, a peek is OK as the peer's
// (count 0 <= limit 0) until a hit was counted.
func TestReviewIncrementWhenOverLimitZeroRule(t *testing.T) {
	s, _ := reviewService(t, "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 0}\n", rls.Options{IncrementWhenOverLimit: true})
	for i, c := range []struct {
		hits uint64
		want rlsv3.RateLimitResponse_Code
	}{{0, ok}, {1, over}, {0, over}, {1, over}, {2, over}} {
		if r := call(t, s, "r", 0, reviewHits("z", c.hits)); r.OverallCode != c.want {
			t.Errorf("request %d (%d hits): %s, want %s", i, c.hits, r.OverallCode, c.want)
		}
	}
}

// Holds (pinned): a request of 1001 descriptors is refused naming the
// field, and a hits_addend of 2^64-1 is a refusal, not a wrap.
func TestReviewServiceBadRequests(t *testing.T) {
	s, _ := reviewService(t, reviewRule10, rls.Options{})
	many := make([]*ratelimitv3.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "v")
	}
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "r", Descriptors: many}); err == nil ||
		err.Error() != "rpc error: code = InvalidArgument desc = descriptors: at most 1000, got 1001" {
		t.Errorf("1001 descriptors: %v", err)
	}
	r := call(t, s, "r", 0, reviewHits("huge", 1<<64-1))
	if r.OverallCode != over {
		t.Errorf("hits_addend 2^64-1: %v, want OVER_LIMIT", r)
	}
	if r := call(t, s, "r", 0, reviewHits("huge", 10)); r.OverallCode != ok {
		t.Errorf("after a refused huge hits_addend, 10 of 10: %v, want OK (nothing was counted)", r)
	}
}

// Finding (high with IncrementWhenOverLimit: a fail-open domain fails
// closed): a node answers a check whose owner it cannot reach, under
// on_owner_unavailable: allow, with Decision{Allowed: true, Degraded:
// true} and no remaining (rpc/standin.go, the ALLOW case). decideEach
// reads "allowed with none left" as the peer's count passing the limit
// and answers OVER_LIMIT, so during an owner's outage every request of
// a domain that says allow is refused (and its hits counted as over in
// the rule statistics). Without IncrementWhenOverLimit the same answer
// is OK (TestServiceDomainPolicy). Right: a degraded allowed decision
// is OK (its remaining unknown), as in decide; likewise a degraded
// answer is not "filled".
func TestReviewIncrementWhenOverLimitOwnerUnavailableAllow(t *testing.T) {
	rules := "domain: r\non_owner_unavailable: allow\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	for _, each := range []bool{false, true} {
		s, ch := reviewService(t, rules, rls.Options{IncrementWhenOverLimit: each})
		ch.degradedKey = `"down"`
		r := call(t, s, "r", 0, desc("k", "up"), desc("k", "down"))
		if r.OverallCode != ok || r.Statuses[1].Code != ok {
			t.Errorf("IncrementWhenOverLimit %v: the owner of k=down unreachable, policy allow: overall %s, its status %s; want OK (the domain's policy)", each, r.OverallCode, r.Statuses[1].Code)
		}
		if st := s.RuleStats(); len(st) != 1 || st[0].OverLimit != 0 {
			t.Errorf("IncrementWhenOverLimit %v: rule statistics %+v, want no hit over the limit", each, st)
		}
	}
}
