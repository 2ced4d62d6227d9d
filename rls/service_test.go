package rls_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// t0 is 20 s into a minute and an hour (weeks are aligned to the epoch).
var t0 = time.Unix(3600*500_000+20, 0)

// storeChecker decides checks on one in-memory window store, as an owner
// does, and a request of several checks marked all_or_nothing all or
// nothing, as a node does:
// when one is denied (or fails), the others that were allowed are given
// back and answered refunded. afterCall runs after each Check call (to
// interleave another request), failKey makes checks of that key fail as
// an unreachable owner, degradedKey makes them answered allowed and
// degraded (never given back, as a node's local policy answers them), or
// per their on_owner_unavailable when it is allow or deny.
type storeChecker struct {
	store       *window.Store
	clock       *window.ManualClock
	mu          sync.Mutex
	calls       []*sluicev1.CheckRequest
	afterCall   func(call int)
	failKey     string
	degradedKey string
}

func newStoreChecker() *storeChecker {
	c := window.NewManualClock(t0)
	return &storeChecker{store: window.NewStore(window.StoreConfig{Clock: c}), clock: c}
}

func (s *storeChecker) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	s.mu.Lock()
	s.calls = append(s.calls, req)
	n := len(s.calls)
	failKey, degradedKey := s.failKey, s.degradedKey
	out := &sluicev1.CheckResponse{}
	before := map[string]*window.State{} // each key's state before the request; nil: none
	denied := false
	now := s.clock.Now()
	for _, c := range req.Checks {
		switch {
		case c.Key == failKey:
			out.Decisions = append(out.Decisions, &sluicev1.Decision{Error: "owner node9: no connection to it"})
			denied = true
			continue
		case c.Key == degradedKey:
			allowed := c.OnOwnerUnavailable != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
			out.Decisions = append(out.Decisions, &sluicev1.Decision{Allowed: allowed, Limit: c.Limit, Degraded: true})
			denied = denied || !allowed
			continue
		}
		key := c.Name + "\x00" + c.Key
		if _, seen := before[key]; !seen {
			before[key] = nil
			if st, ok := s.store.Get(key); ok {
				before[key] = &st
			}
		}
		d, err := s.store.Apply(key, window.Check{Algorithm: window.FixedWindow, Limit: c.Limit,
			Window: time.Duration(c.WindowMs) * time.Millisecond, Hits: c.GetHits()}, now)
		if err != nil {
			s.mu.Unlock()
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		out.Decisions = append(out.Decisions, &sluicev1.Decision{Allowed: d.Allowed, Limit: c.Limit, Remaining: d.Remaining})
		denied = denied || !d.Allowed
	}
	if denied && req.AllOrNothing && len(req.Checks) > 1 {
		for key, st := range before {
			s.store.Take(key)
			if st != nil {
				s.store.MergeState(key, *st, now)
			}
		}
		for i, d := range out.Decisions {
			if d.Allowed && !d.Degraded {
				d.Allowed, d.Refunded = false, true
				d.Remaining = min(d.Remaining+req.Checks[i].GetHits(), d.Limit)
			}
		}
	}
	s.mu.Unlock()
	if s.afterCall != nil {
		s.afterCall(n)
	}
	return out, nil
}

const serviceRules = `
domain: shop
descriptors:
  - key: path
    value: /checkout
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: health
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: beta}
  - key: week
    rate_limit: {unit: day, unit_multiplier: 7, requests_per_unit: 100}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`

func newService(t *testing.T) (*rls.Service, *storeChecker) {
	t.Helper()
	cfg, err := rls.Parse(rls.File{Name: "shop.yaml", Data: []byte(serviceRules)})
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	return rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)}), ch
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	out := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func call(t *testing.T, s *rls.Service, domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

// st is the part of a status the tests compare.
type st struct {
	code      rlsv3.RateLimitResponse_Code
	rpu       uint32 // 0: no current_limit
	remaining uint32
	reset     time.Duration
}

func got(s *rlsv3.RateLimitResponse_DescriptorStatus) st {
	return st{s.Code, s.GetCurrentLimit().GetRequestsPerUnit(), s.LimitRemaining, s.GetDurationUntilReset().AsDuration()}
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestServiceStatusesInOrder(t *testing.T) {
	const week = 7 * 24 * time.Hour
	s, _ := newService(t)
	resp := call(t, s, "shop", 0,
		desc("nothing", "here"), desc("path", "/checkout"), desc("health", "x"), desc("user", "42"), desc("banned", "1"), desc("week", "w"))
	// The banned descriptor (requests_per_unit 0) refuses the request, so
	// none of the others is charged: their remaining is the whole limit.
	want := []st{
		{ok, 0, 0, 0},
		{ok, 2, 2, 40 * time.Second},
		{ok, 0, math.MaxUint32, 0},
		{ok, 3, 3, 40 * time.Second},
		{over, 0, 0, time.Second}, // current_limit.requests_per_unit 0
		{ok, 100, 100, week - time.Duration(t0.UnixNano()%int64(week))},
	}
	for i, w := range want {
		if g := got(resp.Statuses[i]); g != w {
			t.Errorf("statuses[%d] = %+v, want %+v", i, g, w)
		}
	}
	if resp.OverallCode != over {
		t.Errorf("overall = %s, want OVER_LIMIT (banned)", resp.OverallCode)
	}
	if m := resp.Statuses[5].CurrentLimit.GetUnitMultiplier().GetValue(); m != 7 {
		t.Errorf("unit_multiplier = %d, want 7", m)
	}
	if u := resp.Statuses[1].CurrentLimit.Unit; u != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("unit = %s, want MINUTE", u)
	}
	if g := got(call(t, s, "shop", 0, desc("user", "42")).Statuses[0]); g.remaining != 2 {
		t.Errorf("user 42 after a banned request: remaining %d, want 2 (its first hit)", g.remaining)
	}
	if g := got(call(t, s, "shop", 0, desc("path", "/checkout"), desc("week", "w")).Statuses[1]); g.remaining != 99 {
		t.Errorf("week after a banned request: remaining %d, want 99 (its first hit)", g.remaining)
	}
	// Unknown domain: OK, one empty status per descriptor.
	resp = call(t, s, "elsewhere", 0, desc("path", "/checkout"), desc("user", "1"))
	if resp.OverallCode != ok || got(resp.Statuses[0]) != (st{ok, 0, 0, 0}) || got(resp.Statuses[1]) != (st{ok, 0, 0, 0}) {
		t.Errorf("unknown domain: %v", resp)
	}
}

// Exactly requests_per_unit admitted per value per unit, then OVER_LIMIT
// until the next window.
func TestServiceAdmitsExactlyTheLimit(t *testing.T) {
	s, ch := newService(t)
	for i := range 5 {
		r := call(t, s, "shop", 0, desc("user", "a"))
		want := st{ok, 3, uint32(2 - i), 40 * time.Second}
		if i >= 3 {
			want = st{over, 3, 0, 40 * time.Second}
		}
		if g := got(r.Statuses[0]); g != want || (r.OverallCode == over) != (i >= 3) {
			t.Fatalf("call %d: %+v overall %s, want %+v", i, g, r.OverallCode, want)
		}
	}
	if g := got(call(t, s, "shop", 0, desc("user", "b")).Statuses[0]); g != (st{ok, 3, 2, 40 * time.Second}) {
		t.Errorf("another value: %+v, want its own 3", g)
	}
	ch.clock.Advance(40 * time.Second)
	if g := got(call(t, s, "shop", 0, desc("user", "a")).Statuses[0]); g != (st{ok, 3, 2, time.Minute}) {
		t.Errorf("next minute: %+v", g)
	}
	if st := s.Stats(); st.Requests != 7 || st.OverLimit != 2 || st.PartialCharges != 0 {
		t.Errorf("stats = %+v", st)
	}
}

// A request over one limit charges none of its descriptors.
func TestServiceAllOrNone(t *testing.T) {
	s, _ := newService(t)
	call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "u"))
	call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "u"))
	// path is exhausted (2); user has 1 left and must keep it.
	r := call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "u"))
	if r.OverallCode != over || got(r.Statuses[0]) != (st{over, 2, 0, 40 * time.Second}) || got(r.Statuses[1]) != (st{ok, 3, 1, 40 * time.Second}) {
		t.Fatalf("third: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	if g := got(call(t, s, "shop", 0, desc("user", "u")).Statuses[0]); g != (st{ok, 3, 0, 40 * time.Second}) {
		t.Errorf("user after a refused request: %+v, want its third hit allowed (remaining 0)", g)
	}
	// hits_addend 3 on a limit of 3 with 2 used elsewhere: refused whole.
	r = call(t, s, "shop", 3, desc("user", "v"), desc("week", "v"))
	if r.OverallCode != ok || got(r.Statuses[0]).remaining != 0 || got(r.Statuses[1]).remaining != 97 {
		t.Fatalf("hits 3: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	r = call(t, s, "shop", 3, desc("user", "v"), desc("week", "v"))
	if r.OverallCode != over || got(r.Statuses[0]).code != over || got(r.Statuses[1]) != (st{ok, 100, 97, got(r.Statuses[1]).reset}) {
		t.Fatalf("hits 3 again: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
}

// The same descriptor twice in one request needs room for both hits.
func TestServiceSameDescriptorTwice(t *testing.T) {
	s, _ := newService(t)
	call(t, s, "shop", 0, desc("user", "twice"))
	r := call(t, s, "shop", 0, desc("user", "twice"), desc("user", "twice"))
	if r.OverallCode != ok || got(r.Statuses[0]).remaining != 1 || got(r.Statuses[1]).remaining != 0 {
		t.Fatalf("2 of 2 left: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	call(t, s, "shop", 0, desc("user", "thrice"), desc("user", "thrice"))
	r = call(t, s, "shop", 0, desc("user", "thrice"), desc("user", "thrice"))
	if r.OverallCode != over || got(r.Statuses[0]).code != over || got(r.Statuses[1]).code != over {
		t.Fatalf("1 left, 2 asked: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	if st := s.Stats(); st.PartialCharges != 0 {
		t.Errorf("PartialCharges = %d, want 0", st.PartialCharges)
	}
	if g := got(call(t, s, "shop", 0, desc("user", "thrice")).Statuses[0]); g != (st{ok, 3, 0, 40 * time.Second}) {
		t.Errorf("the last hit: %+v", g)
	}
}

func TestServiceHitsAddend(t *testing.T) {
	s, _ := newService(t)
	// Request-level 0 means 1; 2 counts 2; a descriptor's own wins.
	if g := got(call(t, s, "shop", 0, desc("week", "h")).Statuses[0]); g.remaining != 99 {
		t.Errorf("hits_addend 0: remaining %d, want 99", g.remaining)
	}
	if g := got(call(t, s, "shop", 2, desc("week", "h")).Statuses[0]); g.remaining != 97 {
		t.Errorf("hits_addend 2: remaining %d, want 97", g.remaining)
	}
	d := desc("week", "h")
	d.HitsAddend = wrapperspb.UInt64(10)
	if g := got(call(t, s, "shop", 2, d).Statuses[0]); g.remaining != 87 {
		t.Errorf("descriptor hits_addend 10: remaining %d, want 87", g.remaining)
	}
	// A descriptor's hits_addend 0 peeks.
	p := desc("user", "peek")
	p.HitsAddend = wrapperspb.UInt64(0)
	if g := got(call(t, s, "shop", 5, p).Statuses[0]); g != (st{ok, 3, 3, 40 * time.Second}) {
		t.Errorf("peek of a fresh key: %+v", g)
	}
	call(t, s, "shop", 3, desc("user", "peek"))
	if r := call(t, s, "shop", 0, p, desc("week", "peek")); r.OverallCode != over || got(r.Statuses[1]).remaining != 100 {
		t.Errorf("peek of a full key with another descriptor: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	// More hits than the limit: over limit, nothing counted.
	if r := call(t, s, "shop", 4, desc("user", "h")); r.OverallCode != over {
		t.Errorf("4 hits on a limit of 3: %s", r.OverallCode)
	}
	if g := got(call(t, s, "shop", 0, desc("user", "h")).Statuses[0]); g.remaining != 2 {
		t.Errorf("after refused 4 hits: remaining %d, want 2", g.remaining)
	}
}

// Example 7 of envoyproxy/ratelimit: with both descriptors in one request,
// the replacing rule applies and the replaced one is neither applied nor
// counted.
func TestServiceReplaces(t *testing.T) {
	s, ch := newService(t)
	for i := range 7 {
		r := call(t, s, "shop", 0, desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
		if g := got(r.Statuses[0]); g != (st{ok, 0, 0, 0}) {
			t.Fatalf("call %d: replaced status %+v, want OK with no limit", i, g)
		}
		if g := got(r.Statuses[1]); g.code != ok || g.rpu != 10 || g.remaining != uint32(9-i) {
			t.Fatalf("call %d: replacing status %+v, want 10/s remaining %d", i, g, 9-i)
		}
	}
	for _, c := range ch.calls {
		for _, chk := range c.Checks {
			if chk.Limit == 5 {
				t.Fatalf("the replaced 5/s rule was checked: %v", chk)
			}
		}
	}
	// Alone, the replaced rule applies with its own, untouched count.
	if g := got(call(t, s, "shop", 0, desc("key_1", "value_1", "user", "bkthomps")).Statuses[0]); g != (st{ok, 5, 4, time.Second}) {
		t.Errorf("alone: %+v, want 5/s remaining 4", g)
	}
}

// shadow_mode: counted, reported, never OVER_LIMIT, and it does not block
// the request's other descriptors.
func TestServiceShadowMode(t *testing.T) {
	s, _ := newService(t)
	r := call(t, s, "shop", 0, desc("beta", "x"))
	if g := got(r.Statuses[0]); g.code != ok || g.rpu != 1 || g.remaining != 0 {
		t.Fatalf("first: %+v", g)
	}
	for i := range 3 {
		r := call(t, s, "shop", 0, desc("beta", "x"), desc("user", "s"))
		if r.OverallCode != ok || got(r.Statuses[0]).code != ok || got(r.Statuses[1]) != (st{ok, 3, uint32(2 - i), 40 * time.Second}) {
			t.Fatalf("call %d over a shadow limit: %s %+v %+v", i, r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
		}
	}
}

// A request's limited descriptors go in one call that consumes (no peek
// first), so a concurrent request can only come before or after it: the
// request that comes after the last hit is refused whole, and nothing is
// partially charged.
func TestServiceOneConsumingCall(t *testing.T) {
	s, ch := newService(t)
	call(t, s, "shop", 0, desc("path", "/checkout"))
	ch.afterCall = func(n int) {
		if n == 2 { // right after the next request's call
			ch.afterCall = nil
			call(t, s, "shop", 0, desc("path", "/checkout"))
		}
	}
	r := call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "p"))
	if r.OverallCode != ok || got(r.Statuses[0]) != (st{ok, 2, 0, 40 * time.Second}) || got(r.Statuses[1]) != (st{ok, 3, 2, 40 * time.Second}) {
		t.Fatalf("first: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	ch.mu.Lock()
	first := ch.calls[1]
	ch.mu.Unlock()
	if len(first.Checks) != 2 || first.Checks[0].GetHits() != 1 || first.Checks[1].GetHits() != 1 || !first.AllOrNothing {
		t.Fatalf("the request's call: %v, want its 2 checks, each consuming 1, all or nothing", first)
	}
	// The interleaved request came after the last /checkout hit.
	r = call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "p"))
	if r.OverallCode != over || got(r.Statuses[0]).code != over || got(r.Statuses[1]) != (st{ok, 3, 2, 40 * time.Second}) {
		t.Fatalf("refused: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	if st := s.Stats(); st.PartialCharges != 0 {
		t.Errorf("PartialCharges = %d, want 0", st.PartialCharges)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i, c := range ch.calls {
		for _, chk := range c.Checks {
			if chk.GetHits() == 0 {
				t.Errorf("call %d peeked: %v", i, c)
			}
		}
	}
}

// A descriptor answered degraded (its owner unreachable, decided by the
// node's local policy) is not given back when the request is refused:
// the request counts as partially charged.
func TestServicePartialChargeIsCounted(t *testing.T) {
	s, ch := newService(t)
	call(t, s, "shop", 0, desc("path", "/checkout"))
	call(t, s, "shop", 0, desc("path", "/checkout"))
	ch.degradedKey = `"d"`
	r := call(t, s, "shop", 0, desc("path", "/checkout"), desc("user", "d"))
	if r.OverallCode != over || got(r.Statuses[0]).code != over || got(r.Statuses[1]).code != ok {
		t.Fatalf("refused: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	if st := s.Stats(); st.PartialCharges != 1 {
		t.Errorf("PartialCharges = %d, want 1", st.PartialCharges)
	}
}

func TestServiceLimitOverride(t *testing.T) {
	s, _ := newService(t)
	d := desc("anything", "v")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND}
	if g := got(call(t, s, "shop", 0, d).Statuses[0]); g != (st{ok, 1, 0, time.Second}) {
		t.Errorf("override first: %+v", g)
	}
	if r := call(t, s, "shop", 0, d); r.OverallCode != over {
		t.Errorf("override second: %s", r.OverallCode)
	}
	// Another unit: another count.
	d.Limit.Unit = typev3.RateLimitUnit_MINUTE
	if g := got(call(t, s, "shop", 0, d).Statuses[0]); g != (st{ok, 1, 0, 40 * time.Second}) {
		t.Errorf("override per minute: %+v", g)
	}
	if r := call(t, s, "unknown", 0, d); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
		t.Errorf("override in an unknown domain: %v", r)
	}
}

func TestServiceErrors(t *testing.T) {
	s, ch := newService(t)
	cases := []struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "1")}}, codes.InvalidArgument, "domain: must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "shop"}, codes.InvalidArgument, "descriptors: must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: make([]*ratelimitv3.RateLimitDescriptor, 1001)}, codes.InvalidArgument, "descriptors: at most 1000, got 1001"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 99}}}},
			codes.InvalidArgument, "descriptors[0].limit.unit: unknown unit 99"},
		{&rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
			RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}}}},
			codes.InvalidArgument, "descriptors[0].limit.unit_multiplier: 4294967295 x YEAR is longer than 366 days"},
	}
	for _, c := range cases {
		_, err := s.ShouldRateLimit(context.Background(), c.req)
		if st, _ := status.FromError(err); st.Code() != c.code || st.Message() != c.msg {
			t.Errorf("got %v, want %s %q", err, c.code, c.msg)
		}
	}
	// nil descriptors and entries never panic: they match nothing.
	r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{nil, {Entries: []*ratelimitv3.RateLimitDescriptor_Entry{nil}}}})
	if err != nil || r.OverallCode != ok || len(r.Statuses) != 2 {
		t.Errorf("nil descriptors: %v %v", r, err)
	}
	// An owner that cannot be reached: UNAVAILABLE naming the descriptor.
	ch.failKey = `"down"`
	_, err = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "ok"), desc("user", "down")}})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "descriptors[1]: owner node9: no connection to it" {
		t.Errorf("unreachable owner: %v", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("unexpected")
	}
}

// duration_until_reset is whole seconds, rounded up, as
// envoyproxy/ratelimit's unit - now % unit: Envoy's X-RateLimit-Reset
// reads its seconds, so a per-second limit half a second in says 1 (to
// the nanosecond it said 0.5 s, read as 0), and a minute limit 12.3 s in
// says 48 (it said 47.7 s, read as 47, one less than the peer's).
func TestDurationUntilResetIsWholeSeconds(t *testing.T) {
	for _, c := range []struct {
		name   string
		unit   time.Duration
		into   time.Duration
		d      *ratelimitv3.RateLimitDescriptor
		wantIn time.Duration
	}{
		{"a minute, at its start", time.Minute, 0, desc("path", "/checkout"), time.Minute},
		{"a minute, 12.3 s in", time.Minute, 12300 * time.Millisecond, desc("path", "/checkout"), 48 * time.Second},
		{"a minute, 59.9 s in", time.Minute, 59900 * time.Millisecond, desc("path", "/checkout"), time.Second},
		{"a second, half in", time.Second, 500 * time.Millisecond, desc("key_1", "value_1", "user", "bkthomps"), time.Second},
		{"a second, at its start", time.Second, 0, desc("key_1", "value_1", "user", "bkthomps"), time.Second},
	} {
		s, ch := newService(t)
		// Move the clock to c.into past the start of a window of c.unit.
		into := time.Duration(ch.clock.Now().UnixNano() % int64(c.unit))
		ch.clock.Advance(c.unit - into + c.into)
		r := call(t, s, "shop", 1, c.d)
		if got := got(r.Statuses[0]).reset; got != c.wantIn {
			t.Errorf("%s: duration_until_reset %s, want %s", c.name, got, c.wantIn)
		}
	}
}
