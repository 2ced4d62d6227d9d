package rls

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// ServiceName is the full gRPC name of the service [Service] implements.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// MaxDescriptors is the most descriptors one request may carry (a sluice
// Check batch holds at most 1000 checks).
const MaxDescriptors = 1000

// Checker decides sluice checks: a node's *rpc.Server, which routes each
// check to its owner. Check answers one decision per check, in order, or
// an error for the whole batch. It must be safe for concurrent use.
type Checker interface {
	Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error)
}

// Clock tells the time; nil in [Options] means the system clock.
type Clock interface {
	Now() time.Time
}

// Options configures a [Service]. The zero value is ready to use.
type Options struct {
	// Clock gives the time from which duration_until_reset is computed
	// (the end of the current fixed window). Default the system clock.
	Clock Clock
	// Logger receives warnings (e.g. a partial charge). Default
	// slog.Default().
	Logger *slog.Logger
}

// Stats counts what a [Service] answered since it started.
type Stats struct {
	// Requests is the number of ShouldRateLimit calls answered.
	Requests int64
	// OverLimit is the number answered OVER_LIMIT.
	OverLimit int64
	// PartialCharges counts requests refused while at least one of their
	// descriptors stayed charged: answered allowed, not refunded, in the
	// call whose other check refused the request. A request's limited
	// descriptors go in one call that the nodes decide all or nothing, so
	// this is 0 unless a node answers a check degraded (its owner
	// unreachable, policy local: such a check is not given back) or does
	// not give back what a refused request consumed (nodes before sluice's
	// all-or-nothing requests).
	PartialCharges int64
}

// Service implements Envoy's RLS v3 RateLimitService on a [Config] and a
// [Checker]. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg     *Config
	checker Checker
	clock   Clock
	log     *slog.Logger

	requests, overLimit, partial atomic.Int64
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// NewService returns a Service answering from cfg (nil: no domains, every
// request OK) and deciding through checker (nil: every limited descriptor
// is UNAVAILABLE).
func NewService(cfg *Config, checker Checker, opts Options) *Service {
	if cfg == nil {
		cfg = &Config{}
	}
	if opts.Clock == nil {
		opts.Clock = systemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Service{cfg: cfg, checker: checker, clock: opts.Clock, log: opts.Logger}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Register registers s on a gRPC server as ServiceName.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

// Stats returns the counters so far.
func (s *Service) Stats() Stats {
	return Stats{Requests: s.requests.Load(), OverLimit: s.overLimit.Load(), PartialCharges: s.partial.Load()}
}

// kind is what a descriptor turned into.
type kind int

const (
	kindNone      kind = iota // no rule: OK, no limit
	kindUnlimited             // unlimited rule: OK, limit_remaining MaxUint32
	kindZero                  // requests_per_unit 0: always over limit, never sent
	kindCheck                 // a sluice check
)

// item is the plan for one descriptor.
type item struct {
	kind   kind
	rule   *Rule
	name   string
	key    string
	hits   int64
	window time.Duration
	policy sluicev1.OwnerUnavailablePolicy // the domain's on_owner_unavailable
	scope  sluicev1.Scope                  // the domain's scope
}

// ShouldRateLimit answers one status per descriptor, in request order,
// and OVER_LIMIT overall if any descriptor is over its limit. Descriptors
// of an unknown domain or that match no rule are OK with no limit.
// hits_addend 0 (or unset) means 1; a descriptor's own hits_addend wins
// over the request's. The request is charged to all its limited
// descriptors or to none: they go to the cluster in one call, which the
// nodes decide all or nothing (see the package doc). Each check carries
// the domain's on_owner_unavailable: a descriptor whose owner cannot be
// reached is answered by it (deny: OVER_LIMIT). Errors:
// INVALID_ARGUMENT naming the field for an empty domain, no descriptors,
// more than MaxDescriptors or a limit override of unknown unit;
// UNAVAILABLE when a descriptor could not be decided at all (Envoy then
// applies its failure_mode_deny setting).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain: must not be empty")
	}
	descs := req.GetDescriptors()
	switch {
	case len(descs) == 0:
		return nil, status.Error(codes.InvalidArgument, "descriptors: must not be empty")
	case len(descs) > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: at most %d, got %d", MaxDescriptors, len(descs))
	}
	plan, err := s.plan(req)
	if err != nil {
		return nil, err
	}
	statuses, err := s.decide(ctx, plan)
	if err != nil {
		return nil, err
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}
	for _, st := range statuses {
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	s.requests.Add(1)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		s.overLimit.Add(1)
	}
	return resp, nil
}

// plan matches every descriptor of req and applies replaces.
func (s *Service) plan(req *rlsv3.RateLimitRequest) ([]item, error) {
	descs := req.GetDescriptors()
	reqHits := int64(req.GetHitsAddend())
	if reqHits == 0 {
		reqHits = 1
	}
	_, knownDomain := s.cfg.domains[req.GetDomain()]
	policy := s.cfg.OnOwnerUnavailable(req.GetDomain())
	scope := s.cfg.Scope(req.GetDomain())
	plan := make([]item, len(descs))
	replacing := map[string]bool{}
	for i, d := range descs {
		hits := reqHits
		if h := d.GetHitsAddend(); h != nil {
			hits = int64(min(h.GetValue(), math.MaxUint32))
		}
		if d.GetIsNegativeHits() {
			hits = 0 // sluice cannot refund hits: this descriptor only peeks
		}
		if o := d.GetLimit(); o != nil {
			if !knownDomain {
				continue // as envoyproxy/ratelimit: an unknown domain is OK
			}
			it, err := overrideItem(req.GetDomain(), i, d, hits)
			if err != nil {
				return nil, err
			}
			it.policy, it.scope = policy, scope
			plan[i] = it
			continue
		}
		entries := make([]Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		m, ok := s.cfg.Match(req.GetDomain(), entries)
		if !ok {
			continue
		}
		for _, r := range m.Rule.Replaces {
			replacing[r] = true
		}
		switch {
		case m.Rule.Unlimited:
			plan[i] = item{kind: kindUnlimited, rule: m.Rule}
		case m.Rule.RequestsPerUnit == 0:
			plan[i] = item{kind: kindZero, rule: m.Rule, window: m.Rule.Window}
		default:
			plan[i] = item{kind: kindCheck, rule: m.Rule, name: m.Name, key: m.Key, hits: hits, window: m.Rule.Window, policy: policy, scope: scope}
		}
	}
	for i, it := range plan {
		if (it.kind == kindCheck || it.kind == kindZero) && it.rule.Name != "" && replacing[it.rule.Name] {
			plan[i] = item{kind: kindNone}
		}
	}
	return plan, nil
}

// overrideItem plans descriptor i, which carries its own limit (Envoy's
// rate limit override): counted under the domain and all its entries.
func overrideItem(domain string, i int, d *ratelimitv3.RateLimitDescriptor, hits int64) (item, error) {
	o := d.GetLimit()
	unit := Unit(o.GetUnit())
	w, ok := unitDurations[unit]
	if !ok {
		return item{}, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit.unit: unknown unit %s", i, o.GetUnit())
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = m.GetValue()
	}
	if time.Duration(mult) > maxWindow/w {
		return item{}, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit.unit_multiplier: %d x %s is longer than 366 days", i, mult, o.GetUnit())
	}
	w *= time.Duration(mult)
	r := &Rule{Domain: domain, RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unit, UnitMultiplier: mult, Window: w}
	// The window is part of the key, so that overrides of other units
	// never share (and reset) a count.
	var key strings.Builder
	key.WriteString(strconv.FormatInt(w.Milliseconds(), 10) + "ms")
	for _, e := range d.GetEntries() {
		key.WriteString(" " + strconv.Quote(e.GetKey()) + "=" + strconv.Quote(e.GetValue()))
	}
	k := key.String()
	if len(k) > maxKeyBytes {
		k = hashed(k)
	}
	name := "rls " + strconv.Quote(domain) + " override"
	if len(name) > maxNameBytes {
		name = "rls" + hashed(name)
	}
	if r.RequestsPerUnit == 0 {
		return item{kind: kindZero, rule: r, window: w}, nil
	}
	return item{kind: kindCheck, rule: r, name: name, key: k, hits: hits, window: w}, nil
}

// decide runs the plan's checks, all or none, and builds the statuses.
//
// The enforcing descriptors (not shadow_mode) go in one call that
// consumes: the nodes decide a request's checks all or nothing (when one
// is denied, the others that were allowed are given back and answered
// refunded), so no descriptor is charged for a refused request, with no
// peek before the charge for a concurrent request to race. Shadow
// descriptors never refuse the request, and a denial among other checks
// would un-count them, so each goes in a call of its own after the
// enforcing call has admitted the request (all at once), and is only
// peeked at when the request is refused. A rule of requests_per_unit 0
// refuses the request before anything is counted: the other descriptors
// are then peeked at, in one call.
func (s *Service) decide(ctx context.Context, plan []item) ([]*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	now := s.clock.Now()
	out := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(plan))
	var enforce, shadow []int
	blocked := false // a rule of requests_per_unit 0 refuses the request
	for i, it := range plan {
		switch it.kind {
		case kindNone:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		case kindUnlimited:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case kindZero:
			out[i] = limitStatus(it, false, 0, now)
			blocked = blocked || !it.rule.ShadowMode
		case kindCheck:
			if it.rule.ShadowMode {
				shadow = append(shadow, i)
			} else {
				enforce = append(enforce, i)
			}
		}
	}
	if blocked {
		return out, s.peek(ctx, plan, append(enforce, shadow...), now, out)
	}
	refused := false
	if len(enforce) > 0 {
		ds, err := s.check(ctx, plan, enforce, false)
		if err != nil {
			return nil, err
		}
		// Descriptors that became the same check (the same rule and
		// values, sent twice) pass or fail together: the request needed
		// room for all their hits.
		denied := map[string]bool{}
		for j, i := range enforce {
			if !ds[j].GetAllowed() && !ds[j].GetRefunded() {
				denied[checkKey(plan[i])] = true
				refused = true
			}
		}
		charged := false
		for j, i := range enforce {
			d := ds[j]
			charged = charged || d.GetAllowed()
			out[i] = limitStatus(plan[i], (d.GetAllowed() || d.GetRefunded()) && !denied[checkKey(plan[i])], d.GetRemaining(), now)
		}
		if refused && charged {
			s.partial.Add(1)
			s.log.Warn("rls: a refused request left descriptors charged (a node did not give them back, e.g. answered degraded)")
		}
	}
	if len(shadow) == 0 {
		return out, nil
	}
	if refused {
		return out, s.peek(ctx, plan, shadow, now, out)
	}
	var (
		wg    sync.WaitGroup
		errs  = make([]error, len(shadow))
		shown = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(shadow))
	)
	for j, i := range shadow {
		wg.Go(func() {
			ds, err := s.check(ctx, plan, []int{i}, false)
			if err != nil {
				errs[j] = err
				return
			}
			shown[j] = limitStatus(plan[i], ds[0].GetAllowed(), ds[0].GetRemaining(), now)
		})
	}
	wg.Wait()
	for j, i := range shadow {
		if errs[j] != nil {
			return nil, errs[j]
		}
		out[i] = shown[j]
	}
	return out, nil
}

// checkKey identifies the sluice check of a planned descriptor.
func checkKey(it item) string { return it.name + "\x00" + it.key }

// peek fills out[i], i in idx, from one peek of those checks (nothing
// counted): a descriptor passes when the room left holds the hits of all
// the descriptors that are its same check.
func (s *Service) peek(ctx context.Context, plan []item, idx []int, now time.Time, out []*rlsv3.RateLimitResponse_DescriptorStatus) error {
	if len(idx) == 0 {
		return nil
	}
	ds, err := s.check(ctx, plan, idx, true)
	if err != nil {
		return err
	}
	need := make(map[string]int64, len(idx))
	for _, i := range idx {
		need[checkKey(plan[i])] += plan[i].hits
	}
	for j, i := range idx {
		out[i] = limitStatus(plan[i], passes(ds[j], need[checkKey(plan[i])]), ds[j].GetRemaining(), now)
	}
	return nil
}

// passes reports whether a peek's decision leaves room for hits (a fixed
// window's remaining is exactly limit - count); 0 hits pass as a peek
// does, when one more hit would.
func passes(d *sluicev1.Decision, hits int64) bool {
	return d.GetError() == "" && d.GetRemaining() >= max(hits, 1)
}

// check sends the checks plan[i], i in idx, in one batch (peek: hits 0;
// else all or nothing), each with its domain's on_owner_unavailable and
// scope, and
// returns their decisions in order, or UNAVAILABLE naming the first
// descriptor that could not be decided.
func (s *Service) check(ctx context.Context, plan []item, idx []int, peek bool) ([]*sluicev1.Decision, error) {
	// The descriptors are one request's limits: a consuming batch asks
	// the nodes for all or nothing (a peek consumes nothing to give back).
	req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, len(idx)), AllOrNothing: !peek && len(idx) > 1}
	for j, i := range idx {
		it := plan[i]
		hits := it.hits
		if peek {
			hits = 0
		}
		req.Checks[j] = &sluicev1.RateLimitCheck{
			Name: it.name, Key: it.key, Hits: proto.Int64(hits),
			Limit: int64(it.rule.RequestsPerUnit), WindowMs: it.window.Milliseconds(),
			Algorithm:          sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW,
			OnOwnerUnavailable: it.policy,
			Scope:              it.scope,
		}
	}
	if s.checker == nil {
		return nil, status.Error(codes.Unavailable, "rls: no checker to decide the descriptors")
	}
	resp, err := s.checker.Check(ctx, req)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	ds := resp.GetDecisions()
	if len(ds) != len(idx) {
		return nil, status.Errorf(codes.Internal, "%d decisions for %d checks", len(ds), len(idx))
	}
	for j, d := range ds {
		if d.GetError() != "" {
			return nil, status.Errorf(codes.Unavailable, "descriptors[%d]: %s", idx[j], d.GetError())
		}
	}
	return ds, nil
}

// limitStatus is the status of a limited descriptor: allowed or over
// limit (OK anyway in shadow mode), with the rule, the hits remaining (0
// when over limit) and the time to the end of the current window.
func limitStatus(it item, allowed bool, remaining int64, now time.Time) *rlsv3.RateLimitResponse_DescriptorStatus {
	r := it.rule
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OK,
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
			Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit,
		},
		DurationUntilReset: durationpb.New(untilReset(now, it.window)),
	}
	if r.UnitMultiplier > 1 {
		st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(r.UnitMultiplier)
	}
	if allowed {
		st.LimitRemaining = uint32(min(max(remaining, 0), math.MaxUint32))
	} else if !r.ShadowMode {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return st
}

// untilReset returns the time from now to the end of the fixed window of
// length w (aligned to the Unix epoch) that holds now, rounded up to
// whole seconds for windows of a second or more (the peer's
// unit - now % unit, in seconds).
func untilReset(now time.Time, w time.Duration) time.Duration {
	if w <= 0 {
		return 0
	}
	into := now.UnixNano() % int64(w)
	if into < 0 { // before 1970
		into += int64(w)
	}
	// Whole seconds, rounded up, as envoyproxy/ratelimit's
	// unit - now % unit: Envoy's X-RateLimit-Reset takes the seconds, so
	// half a second into a per-second window reads 1, not 0.
	left := w - time.Duration(into)
	if w >= time.Second {
		left = min((left+time.Second-1)/time.Second*time.Second, w)
	}
	return left
}

// String returns the plan kind's name, for logs and tests.
func (k kind) String() string {
	switch k {
	case kindNone:
		return "none"
	case kindUnlimited:
		return "unlimited"
	case kindZero:
		return "zero"
	case kindCheck:
		return "check"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}
