package rls

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// ServiceName is the full gRPC name of the service [Service] implements.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// HealthName is the service name gRPC health answers for as
// envoyproxy/ratelimit's does ("ratelimit"), next to ServiceName.
const HealthName = "ratelimit"

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

// HeaderNames are the names of the response headers a [Service] asks
// Envoy to add (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER); an empty name takes its
// default.
type HeaderNames struct {
	// Limit carries the requests_per_unit of the descriptor closest to
	// its limit. Default "RateLimit-Limit".
	Limit string
	// Remaining carries its hits remaining. Default "RateLimit-Remaining".
	Remaining string
	// Reset carries the whole seconds until its window resets. Default
	// "RateLimit-Reset".
	Reset string
}

// Default header names, as envoyproxy/ratelimit's (draft-ietf-httpapi-
// ratelimit-headers).
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// DefaultNearLimitRatio is the share of a rule's limit past which hits
// count as near the limit in [RuleStats] (envoyproxy/ratelimit's
// NEAR_LIMIT_RATIO default).
const DefaultNearLimitRatio = 0.8

// Options configures a [Service]. The zero value answers as sluice does
// by default; each other setting is named after the envoyproxy/ratelimit
// setting it gives (see docs/envoy.md's migration table).
type Options struct {
	// Clock gives the time from which duration_until_reset is computed
	// (the end of the current fixed window). Default the system clock.
	Clock Clock
	// Logger receives warnings (e.g. a partial charge). Default
	// slog.Default().
	Logger *slog.Logger
	// ShadowMode answers every request OK, counted as usual: its
	// descriptors' statuses still say OVER_LIMIT, and Stats.ShadowOK
	// counts the requests it let through (SHADOW_MODE).
	ShadowMode bool
	// QuotaMode makes every limited descriptor a quota descriptor, as a
	// rule's quota_mode does for its own (QUOTA_MODE): a request is then
	// refused only when all its quota descriptors are over their limits.
	QuotaMode bool
	// DynamicMetadata returns the response's dynamic_metadata: the
	// domain, the request's descriptors and hits_addend, and the merged
	// metadata of the rules the request passed
	// (RESPONSE_DYNAMIC_METADATA).
	DynamicMetadata bool
	// Headers, when not nil, asks Envoy to add the RateLimit-* headers of
	// the descriptor closest to its limit to the response
	// (LIMIT_RESPONSE_HEADERS_ENABLED).
	Headers *HeaderNames
	// IncrementWhenOverLimit counts as envoyproxy/ratelimit does by
	// default (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset): each
	// descriptor is counted on its own, refused hits included, so a
	// request refused by one descriptor still spends the others, a count
	// may pass its limit, and a peek (hits_addend 0) is OK while the count
	// is at most the limit (the token-quota pattern: peek on the request
	// path, charge on the response path). Off (sluice's default): a
	// request is charged all or nothing, refused hits count nothing, and a
	// peek is OK only while one more hit would pass.
	IncrementWhenOverLimit bool
	// NearLimitRatio is the share of a limit past which [RuleStats] count
	// hits as near the limit (NEAR_LIMIT_RATIO); 0 means
	// DefaultNearLimitRatio.
	NearLimitRatio float64
	// AllowRefunds makes a descriptor with is_negative_hits a refund (see
	// [Service.ShouldRateLimit]); the checker must take checks of
	// negative hits (serve --allow-refunds, which sets it). Off (the
	// default), such a descriptor is answered as before refunds: its
	// hits are taken as 0, so it only peeks, and it is counted in
	// Stats.RefundsOff.
	AllowRefunds bool
}

// Stats counts what a [Service] answered since it started.
type Stats struct {
	// Requests is the number of ShouldRateLimit calls answered.
	Requests int64
	// OverLimit is the number answered OVER_LIMIT.
	OverLimit int64
	// ShadowOK is the number answered OK only because of Options.ShadowMode.
	ShadowOK int64
	// PartialCharges counts requests refused while at least one of their
	// descriptors stayed charged: answered allowed, not refunded, in the
	// call whose other check refused the request. A request's limited
	// descriptors go in one call that the nodes decide all or nothing, so
	// this is 0 unless a node answers a check degraded (its owner
	// unreachable, policy local: such a check is not given back) or does
	// not give back what a refused request consumed (nodes before sluice's
	// all-or-nothing requests). With Options.IncrementWhenOverLimit a
	// refused request spends its other descriptors by design, and is not
	// counted here.
	PartialCharges int64
	// ConfigLoads and ConfigLoadErrors count the rule loads of the
	// [Source] the Service follows: applied, and refused (the rules in
	// force stay). Both 0 without a Source.
	ConfigLoads, ConfigLoadErrors int64
	// Domains is the number of domains of the rules in force.
	Domains int
	// Rules is the number of rules (rate_limit blocks, unlimited ones
	// included) in force; 0 means every request is OK.
	Rules int
	// RefundsGiven, RefundsEmpty and RefundsFailed count the refund
	// descriptors (is_negative_hits) answered: given back (in part when
	// the count held fewer hits), giving nothing back (nothing counted
	// in the window in force, or a rule of requests_per_unit 0), and
	// not delivered (the key's owner unreachable: the hits stay counted;
	// logged at warning). A refund is never counted in [RuleStats].
	RefundsGiven, RefundsEmpty, RefundsFailed int64
	// RefundsOff counts the descriptors with is_negative_hits that would
	// have been refunds but only peeked, because Options.AllowRefunds is
	// off.
	RefundsOff int64
}

// RuleStat is what one rule counted, in hits, as envoyproxy/ratelimit's
// per-rule statistics (ratelimit.service.rate_limit.<key>.*). Its series
// are one per rule, never one per descriptor value.
type RuleStat struct {
	// Domain is the rule's domain.
	Domain string
	// Rule is the rule's full key, e.g. "rl.foo_bar" ("<domain>.(override)"
	// for the limits that requests carry themselves).
	Rule string
	// TotalHits is every hit asked of the rule (total_hits).
	TotalHits int64
	// OverLimit is the hits beyond the limit (over_limit).
	OverLimit int64
	// NearLimit is the hits within the limit but past NearLimitRatio of it
	// (near_limit).
	NearLimit int64
	// WithinLimit is the hits within the limit (within_limit).
	WithinLimit int64
	// ShadowMode is the hits beyond the limit of a shadow_mode rule, let
	// through (shadow_mode).
	ShadowMode int64
}

// ruleCounters are one rule's RuleStat counters.
type ruleCounters struct {
	domain, rule                         string
	total, over, near, within, shadowHit atomic.Int64
}

// Service implements Envoy's RLS v3 RateLimitService on a [Config] and a
// [Checker]. It is safe for concurrent use; its rules can be replaced
// while it answers ([Service.SetConfig], [Service.Follow]).
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg     atomic.Pointer[Config]
	src     atomic.Pointer[Source]
	checker Checker
	clock   Clock
	log     *slog.Logger
	opts    Options
	headers HeaderNames

	requests, overLimit, partial, shadowOK    atomic.Int64
	refundsGiven, refundsEmpty, refundsFailed atomic.Int64
	refundsOff                                atomic.Int64
	rules                                     sync.Map // domain + "\x00" + full key -> *ruleCounters
	byRule                                    sync.Map // *Rule -> *ruleCounters
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
	if opts.NearLimitRatio <= 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	s := &Service{checker: checker, clock: opts.Clock, log: opts.Logger, opts: opts}
	if h := opts.Headers; h != nil {
		s.headers = HeaderNames{Limit: cmp.Or(h.Limit, DefaultLimitHeader),
			Remaining: cmp.Or(h.Remaining, DefaultRemainingHeader), Reset: cmp.Or(h.Reset, DefaultResetHeader)}
	}
	s.cfg.Store(cfg)
	return s
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Register registers s on a gRPC server as ServiceName.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

// Config returns the rules in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// SetConfig puts cfg (nil: no domains) in force for the requests that
// start after it returns; a request already answering keeps the rules it
// started with. Counts carry over: a rule that keeps its domain, path and
// numbers keeps counting the same keys.
func (s *Service) SetConfig(cfg *Config) {
	if cfg == nil {
		cfg = &Config{}
	}
	s.cfg.Store(cfg)
	s.byRule.Clear() // the old rules' pointers; their counters stay in s.rules
}

// Follow puts src's rules in force now and after each of its reloads, and
// reports its load counts in [Service.Stats].
func (s *Service) Follow(src *Source) {
	s.src.Store(src)
	src.onLoad(s.SetConfig)
}

// Stats returns the counters so far.
func (s *Service) Stats() Stats {
	st := Stats{Requests: s.requests.Load(), OverLimit: s.overLimit.Load(), PartialCharges: s.partial.Load(),
		ShadowOK: s.shadowOK.Load(), Domains: len(s.Config().domains), Rules: len(s.Config().rules),
		RefundsGiven: s.refundsGiven.Load(), RefundsEmpty: s.refundsEmpty.Load(), RefundsFailed: s.refundsFailed.Load(),
		RefundsOff: s.refundsOff.Load()}
	if src := s.src.Load(); src != nil {
		st.ConfigLoads, st.ConfigLoadErrors = src.loads.Load(), src.failures.Load()
	}
	return st
}

// RuleStats returns what each rule counted so far, sorted by domain and
// rule; a rule that no request has matched yet is not listed.
func (s *Service) RuleStats() []RuleStat {
	var out []RuleStat
	s.rules.Range(func(_, v any) bool {
		c := v.(*ruleCounters)
		out = append(out, RuleStat{Domain: c.domain, Rule: c.rule, TotalHits: c.total.Load(), OverLimit: c.over.Load(),
			NearLimit: c.near.Load(), WithinLimit: c.within.Load(), ShadowMode: c.shadowHit.Load()})
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Rule < out[j].Rule
	})
	return out
}

// counters returns r's counters, made on first use. They are found by
// the rule's pointer (no allocation on a request's path), and made once
// per domain and full key, so a rule reloaded keeps counting in the same
// series.
func (s *Service) counters(r *Rule) *ruleCounters {
	if c, ok := s.byRule.Load(r); ok {
		return c.(*ruleCounters)
	}
	full := r.FullKey
	if full == "" {
		full = r.Domain + ".(override)"
	}
	c, _ := s.rules.LoadOrStore(r.Domain+"\x00"+full, &ruleCounters{domain: r.Domain, rule: full})
	if r.FullKey != "" { // an override's Rule is made per request: not kept
		s.byRule.Store(r, c)
	}
	return c.(*ruleCounters)
}

// count adds one descriptor's hits to its rule's statistics, as
// envoyproxy/ratelimit's base limiter does: before is the rule's count
// for the key before the hits, after = before + hits (whether or not they
// were counted), limit its requests_per_unit.
func (s *Service) count(r *Rule, hits, before, limit int64, shadow bool) {
	c := s.counters(r)
	after := before + hits
	c.total.Add(hits)
	// In float32, as the peer computes it (the two differ for some
	// ratios and limits, e.g. 0.7 of 90: 62 in float64, 63 in float32).
	near := int64(math.Floor(float64(float32(limit) * float32(s.opts.NearLimitRatio))))
	if after > limit {
		over := hits
		if before < limit {
			over = after - limit
			c.near.Add(limit - max(near, before))
		}
		c.over.Add(over)
		if shadow {
			c.shadowHit.Add(over)
		}
		return
	}
	c.within.Add(hits)
	if after > near {
		if before >= near {
			c.near.Add(hits)
		} else {
			c.near.Add(after - near)
		}
	}
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
	quota  bool                            // a quota descriptor
	// refund marks a descriptor with is_negative_hits (and hits > 0): its
	// hits are given back, not consumed (see giveBack).
	refund bool
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
//
// A descriptor with is_negative_hits (Envoy 1.38 on; its hits_addend, or
// the request's, taken as negative) is a refund: its hits are given back
// at the key's owner before the request's other descriptors are decided,
// exactly and never below zero, from the rule's window in force when the
// refund reaches the owner (see giveBack). It is answered OK with the
// rule's limit and the hits remaining after it, and is no limit of the
// request: it never refuses it, nor is undone when another descriptor
// does. Its limit_remaining is what remained right after it, before the
// request's own charges. One with 0 hits only peeks, as before. Refunds
// are the operator's to allow (Options.AllowRefunds, serve
// --allow-refunds): without them such a descriptor is answered as before
// refunds, a peek (0 hits) that is one of the request's limits, and is
// counted in Stats.RefundsOff.
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
	cfg := s.cfg.Load()
	plan, err := s.plan(cfg, req)
	if err != nil {
		return nil, err
	}
	// Refunds first, in a call of their own: they are no limit of the
	// request (never refuse it, never undone with it), and what they give
	// back is room for the request's own hits.
	given := s.giveBack(ctx, plan)
	limits := plan
	if given != nil {
		limits = slices.Clone(plan)
		for i := range given {
			limits[i] = item{kind: kindNone}
		}
	}
	var statuses []*rlsv3.RateLimitResponse_DescriptorStatus
	if s.opts.IncrementWhenOverLimit {
		statuses, err = s.decideEach(ctx, limits)
	} else {
		statuses, err = s.decide(ctx, limits)
	}
	if err != nil {
		return nil, err
	}
	for i, st := range given {
		statuses[i] = st
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}
	if refuses(limits, statuses) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.opts.Headers != nil {
		resp.ResponseHeadersToAdd = s.limitHeaders(plan, statuses)
	}
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, plan, statuses)
	}
	s.requests.Add(1)
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.opts.ShadowMode:
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		s.shadowOK.Add(1)
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		s.overLimit.Add(1)
	}
	return resp, nil
}

// refuses reports whether a request whose descriptors got statuses is
// refused: a descriptor that is not a quota descriptor is over its limit,
// or it has quota descriptors and all of them are (as
// envoyproxy/ratelimit). A shadow_mode descriptor's status is never
// OVER_LIMIT.
func refuses(plan []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) bool {
	quotas, overQuotas := 0, 0
	for i, st := range statuses {
		over := st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		switch {
		case plan[i].quota:
			quotas++
			if over {
				overQuotas++
			}
		case over:
			return true
		}
	}
	return quotas > 0 && overQuotas == quotas
}

// limitHeaders returns the RateLimit-* headers of the descriptor closest
// to its limit, chosen as envoyproxy/ratelimit does: the one with the
// fewest hits remaining, or the last one over its limit that is not a
// quota descriptor; none when no descriptor has a limit.
func (s *Service) limitHeaders(plan []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range statuses {
		if plan[i].kind == kindUnlimited || st.GetCurrentLimit() == nil {
			continue
		}
		if st.GetLimitRemaining() < least {
			pick, least = st, st.GetLimitRemaining()
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !plan[i].quota {
			pick, least = st, 0
		}
	}
	if pick == nil {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(pick.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(pick.GetLimitRemaining()), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(pick.GetDurationUntilReset().GetSeconds(), 10)},
	}
}

// dynamicMetadata returns the response's dynamic_metadata as
// envoyproxy/ratelimit builds it: {"domain", "descriptors": [{"entries":
// ["key=value", ...], "limit" (an override, as text), "hitsAddend"}],
// "hitsAddend" (when the request sets it), "metadata": the rule metadata
// of the descriptors that passed, merged (the first value of a key wins;
// two structs merge)}.
func dynamicMetadata(req *rlsv3.RateLimitRequest, plan []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, st := range statuses {
		if plan[i].kind == kindUnlimited || st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		if r := plan[i].rule; r != nil && r.Metadata != nil {
			mergeMetadata(passed, r.Metadata)
		}
	}
	if len(passed.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dst's: a key dst lacks is added (a
// copy), two structs under one key merge, any other value of a key dst
// has stays.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.CloneOf(v)
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeMetadata(hs, vs)
		}
	}
}

// plan matches every descriptor of req and applies replaces.
func (s *Service) plan(cfg *Config, req *rlsv3.RateLimitRequest) ([]item, error) {
	descs := req.GetDescriptors()
	reqHits := int64(req.GetHitsAddend())
	if reqHits == 0 {
		reqHits = 1
	}
	_, knownDomain := cfg.domains[req.GetDomain()]
	policy := cfg.OnOwnerUnavailable(req.GetDomain())
	scope := cfg.Scope(req.GetDomain())
	plan := make([]item, len(descs))
	offRefund := make([]bool, len(descs)) // a refund taken as a peek: refunds off
	replacing := map[string]bool{}
	for i, d := range descs {
		hits := reqHits
		if h := d.GetHitsAddend(); h != nil {
			hits = int64(min(h.GetValue(), math.MaxUint32))
		}
		if d.GetIsNegativeHits() && !s.opts.AllowRefunds && hits > 0 {
			// Refunds are off: as before refunds, the descriptor only
			// peeks (counted in Stats.RefundsOff below).
			hits, offRefund[i] = 0, true
		}
		if o := d.GetLimit(); o != nil {
			if !knownDomain {
				continue // as envoyproxy/ratelimit: an unknown domain is OK
			}
			it, err := overrideItem(req.GetDomain(), i, d, hits)
			if err != nil {
				return nil, err
			}
			it.policy, it.scope, it.quota = policy, scope, s.opts.QuotaMode
			plan[i] = it
			continue
		}
		entries := make([]Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		m, ok := cfg.Match(req.GetDomain(), entries)
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
			plan[i] = item{kind: kindZero, rule: m.Rule, name: m.Name, key: m.Key, hits: hits, window: m.Rule.Window, policy: policy, scope: scope}
		default:
			plan[i] = item{kind: kindCheck, rule: m.Rule, name: m.Name, key: m.Key, hits: hits, window: m.Rule.Window, policy: policy, scope: scope}
		}
	}
	for i, it := range plan {
		if (it.kind == kindCheck || it.kind == kindZero) && it.rule.Name != "" && replacing[it.rule.Name] {
			plan[i] = item{kind: kindNone}
		}
		if offRefund[i] && (plan[i].kind == kindCheck || plan[i].kind == kindZero) {
			s.refundsOff.Add(1)
		}
		if descs[i].GetIsNegativeHits() && plan[i].hits > 0 && (plan[i].kind == kindCheck || plan[i].kind == kindZero) {
			// A refund (Envoy's is_negative_hits): given back, never a
			// limit of the request (0 hits stays a peek, as before).
			plan[i].refund = true
			continue
		}
		// As envoyproxy/ratelimit: with QUOTA_MODE even a descriptor
		// that matched no rule is a quota descriptor (one that passes).
		if plan[i].kind != kindUnlimited {
			plan[i].quota = s.opts.QuotaMode || (plan[i].rule != nil && plan[i].rule.QuotaMode)
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
		return item{kind: kindZero, rule: r, name: name, key: k, hits: hits, window: w}, nil
	}
	return item{kind: kindCheck, rule: r, name: name, key: k, hits: hits, window: w}, nil
}

// decide runs the plan's checks, all or none, and builds the statuses.
//
// The enforcing descriptors (not shadow_mode) go in one call that
// consumes: the nodes decide a request's checks all or nothing (when one
// is denied, the others that were allowed are given back and answered
// refunded), so no descriptor is charged for a refused request, with no
// peek before the charge for a concurrent request to race. A quota
// descriptor over its limit refuses the request only when all the
// request's quota descriptors are: when only quota descriptors were
// denied and some other quota descriptor is not over, the call is made
// again without the denied ones (which stay OVER_LIMIT and uncharged).
// Shadow descriptors never refuse the request, and a denial among other
// checks would un-count them, so each goes in a call of its own after the
// enforcing call has admitted the request (all at once), and is only
// peeked at when it is refused. A rule of requests_per_unit 0 that is not
// a quota descriptor refuses the request before anything is counted: the
// other descriptors are then peeked at, in one call.
func (s *Service) decide(ctx context.Context, plan []item) ([]*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	now := s.clock.Now()
	out := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(plan))
	var enforce, shadow []int
	blocked := false // a rule of requests_per_unit 0 refuses the request
	quotas, overQuotas := 0, 0
	for i, it := range plan {
		if it.quota {
			quotas++
		}
		switch it.kind {
		case kindNone:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		case kindUnlimited:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case kindZero:
			out[i] = limitStatus(it, false, 0, now)
			s.count(it.rule, it.hits, 0, 0, it.rule.ShadowMode)
			switch {
			case it.rule.ShadowMode:
			case it.quota:
				overQuotas++
			default:
				blocked = true
			}
		case kindCheck:
			if it.rule.ShadowMode {
				shadow = append(shadow, i)
			} else {
				enforce = append(enforce, i)
			}
		}
	}
	if !blocked && quotas > 0 && overQuotas == quotas {
		blocked = true // every quota descriptor is a rule of 0
	}
	if blocked {
		return out, s.peek(ctx, plan, append(enforce, shadow...), now, out)
	}
	refused := false
	keptCharged := false // a check answered degraded stayed charged in a call made again
	for len(enforce) > 0 {
		ds, err := s.check(ctx, plan, enforce, false)
		if err != nil {
			return nil, err
		}
		// Descriptors that became the same check (the same rule and
		// values, sent twice) pass or fail together: the request needed
		// room for all their hits.
		denied := map[string]bool{}
		deniedRate := false
		var deniedQuota map[int]bool // made on the first quota denial
		for j, i := range enforce {
			if !ds[j].GetAllowed() && !ds[j].GetRefunded() {
				denied[checkKey(plan[i])] = true
			}
		}
		for _, i := range enforce {
			if denied[checkKey(plan[i])] {
				if plan[i].quota {
					if deniedQuota == nil {
						deniedQuota = map[int]bool{}
					}
					deniedQuota[i] = true
				} else {
					deniedRate = true
				}
			}
		}
		charged := false
		for j, i := range enforce {
			d := ds[j]
			charged = charged || d.GetAllowed()
			out[i] = limitStatus(plan[i], (d.GetAllowed() || d.GetRefunded()) && !denied[checkKey(plan[i])], d.GetRemaining(), now)
		}
		if !deniedRate && len(deniedQuota) > 0 && overQuotas+len(deniedQuota) < quotas {
			// Only quota descriptors were denied, and not all of them:
			// the request passes without them. The nodes gave back what
			// the call consumed, but for the checks answered degraded,
			// which stay charged (and keep their status); ask again for
			// the rest.
			done := maps.Clone(deniedQuota)
			for j, i := range enforce {
				if ds[j].GetAllowed() && ds[j].GetDegraded() {
					done[i], keptCharged = true, true
				}
			}
			s.countDecided(plan, enforce, ds, done)
			overQuotas += len(deniedQuota)
			enforce = slices.DeleteFunc(enforce, func(i int) bool { return done[i] })
			continue
		}
		refused = deniedRate || len(deniedQuota) > 0
		if refused && (charged || keptCharged) {
			s.partial.Add(1)
			s.log.Warn("rls: a refused request left descriptors charged (a node did not give them back, e.g. answered degraded)")
		}
		s.countDecided(plan, enforce, ds, nil)
		break
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
			s.countDecided(plan, []int{i}, ds, nil)
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

// countDecided adds the decisions ds of the checks plan[i], i in idx, to
// their rules' statistics; only the descriptors in only (all when nil).
// A fixed window's remaining is its limit less its count: after the hits
// when allowed, before them when denied or refunded.
func (s *Service) countDecided(plan []item, idx []int, ds []*sluicev1.Decision, only map[int]bool) {
	for j, i := range idx {
		if only != nil && !only[i] {
			continue
		}
		it, d := plan[i], ds[j]
		limit := int64(it.rule.RequestsPerUnit)
		before := limit - d.GetRemaining()
		if d.GetAllowed() {
			before -= it.hits
		}
		s.count(it.rule, it.hits, max(before, 0), limit, it.rule.ShadowMode)
	}
}

// decideEach decides the plan as envoyproxy/ratelimit counts by default
// (Options.IncrementWhenOverLimit): every limited descriptor is counted on
// its own, refused hits included, in one call that is not all or nothing.
//
// A count c of limit L that may pass L is kept exactly by a sluice fixed
// window of limit L+1 that holds min(c, L+1): a hit of h passes when
// c+h <= L, and the peer's count after it is above L exactly when the
// window's is L+1. So each check asks for L+1: allowed with 1 or more
// remaining is the peer's OK (remaining one less), allowed with none left
// is the peer's OVER_LIMIT (counted), and a denied check is OVER_LIMIT
// whose hits are then counted by a call that fills the window to L+1
// (see fill; a peek is OK while 1 or more remain, i.e. c <= L). A
// descriptor the request carries twice is decided after the first, as the
// peer's increments follow one another. A check answered degraded (its
// owner unreachable) stands as the node answered it, as in sluice's own
// counting: on_owner_unavailable allow is OK, never filled.
func (s *Service) decideEach(ctx context.Context, plan []item) ([]*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	now := s.clock.Now()
	out := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(plan))
	var idx []int
	for i, it := range plan {
		switch it.kind {
		case kindNone:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		case kindUnlimited:
			out[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case kindZero, kindCheck:
			idx = append(idx, i)
		}
	}
	// The k-th descriptor of one check goes in the k-th call, so that a
	// descriptor sent twice is counted after the first, refused hits
	// included, as the peer's increments follow one another.
	var rounds [][]int
	nth := map[string]int{}
	for _, i := range idx {
		k := checkKey(plan[i])
		r := nth[k]
		nth[k]++
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	for _, round := range rounds {
		ds, err := s.checkWith(ctx, plan, round, false, 1)
		if err != nil {
			return nil, err
		}
		room := map[int]int64{}
		var fill []int
		for j, i := range round {
			it, d := plan[i], ds[j]
			limit := int64(it.rule.RequestsPerUnit)
			if d.GetDegraded() {
				// The owner could not be reached: the node answered by the
				// domain's on_owner_unavailable (allow: allowed with
				// nothing remaining), not from the count, so the answer
				// stands as sluice's counting takes it, and nothing is
				// filled.
				out[i] = limitStatus(it, d.GetAllowed(), max(d.GetRemaining()-1, 0), now)
				before := int64(0)
				if !d.GetAllowed() {
					before = limit
				}
				s.count(it.rule, it.hits, before, limit, it.rule.ShadowMode)
				continue
			}
			ok := d.GetAllowed() && d.GetRemaining() >= 1
			out[i] = limitStatus(it, ok, d.GetRemaining()-1, now)
			before := limit + 1 - d.GetRemaining()
			if d.GetAllowed() {
				before -= it.hits
			}
			s.count(it.rule, it.hits, max(before, 0), limit, it.rule.ShadowMode)
			if !d.GetAllowed() && d.GetRemaining() > 0 && it.hits > 0 {
				fill, room[i] = append(fill, i), d.GetRemaining()
			}
		}
		s.fill(ctx, plan, fill, room)
	}
	return out, nil
}

// maxFills bounds the calls fill makes for one round.
const maxFills = 8

// fill counts the refused hits of the checks plan[i], i in idx, as far as
// their windows of limit L+1 hold them (see decideEach): each is charged
// the room it had left, room[i]. A request in between may take some of
// that room first: the charge is then refused, and asked again with the
// room the refusal reports, until it passes, the window is full, or
// maxFills calls were made (each refusal means the room shrank, so this
// ends). An error leaves the refusals standing, short of their count.
func (s *Service) fill(ctx context.Context, plan []item, idx []int, room map[int]int64) {
	for try := 0; len(idx) > 0 && try < maxFills; try++ {
		filled := slices.Clone(plan)
		for _, i := range idx {
			filled[i].hits = room[i]
		}
		ds, err := s.checkWith(ctx, filled, idx, false, 1)
		if err != nil {
			s.log.Debug("rls: refused hits not counted", "error", err)
			return
		}
		var again []int
		for j, i := range idx {
			if d := ds[j]; !d.GetAllowed() && !d.GetDegraded() && d.GetRemaining() > 0 {
				room[i] = d.GetRemaining()
				again = append(again, i)
			}
		}
		idx = again
	}
}

// giveBack gives back the hits of the plan's refunds (is_negative_hits)
// and returns their statuses by index (nil when the plan has none).
//
// The refunds go in one call of their own, not all or nothing (each is
// given back on its own, whatever the others): a check of negative hits,
// with the rule's numbers, which the key's owner applies as
// window.Store.Refund does. Envoy does not say when the hits were
// charged, so the owner takes them from the key as it is when the refund
// reaches it: from the fixed window in force, floored at zero. A refund
// whose charge was counted in a window that has ended is thus taken from
// the current window (the ended window's count no longer matters): the
// new window may then admit up to those hits more than its limit. Under
// Options.IncrementWhenOverLimit the windows hold min(count, limit+1)
// (see decideEach), so a refund is taken from that: after a count went
// past limit+1 it gives back more room than the peer's counter would.
//
// Every refund is answered OK (a refund refuses nothing): with the
// rule's limit and the hits remaining after it when it reached the owner,
// else with nothing remaining, and the hits stay counted. A rule of
// requests_per_unit 0 counted nothing: nothing is sent.
func (s *Service) giveBack(ctx context.Context, plan []item) map[int]*rlsv3.RateLimitResponse_DescriptorStatus {
	var idx []int
	for i, it := range plan {
		if it.refund {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	now := s.clock.Now()
	out := make(map[int]*rlsv3.RateLimitResponse_DescriptorStatus, len(idx))
	var send []int
	for _, i := range idx {
		if plan[i].kind == kindZero {
			out[i] = limitStatus(plan[i], true, 0, now)
			s.refundsEmpty.Add(1)
			continue
		}
		send = append(send, i)
	}
	if len(send) == 0 {
		return out
	}
	extra := int64(0)
	if s.opts.IncrementWhenOverLimit {
		extra = 1 // the windows of decideEach
	}
	req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, len(send))}
	for j, i := range send {
		req.Checks[j] = s.sluiceCheck(plan[i], -plan[i].hits, extra)
	}
	var ds []*sluicev1.Decision
	var err error
	if s.checker == nil {
		err = status.Error(codes.Unavailable, "rls: no checker to give the refunds back")
	} else {
		var resp *sluicev1.CheckResponse
		if resp, err = s.checker.Check(ctx, req); err == nil {
			if ds = resp.GetDecisions(); len(ds) != len(send) {
				err = status.Errorf(codes.Internal, "%d decisions for %d refunds", len(ds), len(send))
			}
		}
	}
	for j, i := range send {
		var d *sluicev1.Decision
		if err == nil {
			d = ds[j]
		}
		if d == nil || d.GetError() != "" {
			why := ""
			if d != nil {
				why = d.GetError()
			} else {
				why = err.Error()
			}
			s.refundsFailed.Add(1)
			s.log.Warn("rls: a refund (is_negative_hits) was not given back; its hits stay counted", "rule", plan[i].rule.FullKey, "hits", plan[i].hits, "error", why)
			out[i] = limitStatus(plan[i], true, 0, now)
			continue
		}
		if d.GetRefunded() {
			s.refundsGiven.Add(1)
		} else {
			s.refundsEmpty.Add(1)
		}
		out[i] = limitStatus(plan[i], true, d.GetRemaining()-extra, now)
	}
	return out
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
		// The statistics count the hits asked, as the peer's do, though a
		// refused request counted none of them.
		limit := int64(plan[i].rule.RequestsPerUnit)
		s.count(plan[i].rule, plan[i].hits, max(limit-ds[j].GetRemaining(), 0), limit, plan[i].rule.ShadowMode)
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
	return s.checkWith(ctx, plan, idx, peek, 0)
}

// checkWith is check with each limit raised by extra (1 for
// decideEach's windows, which are then not all or nothing).
func (s *Service) checkWith(ctx context.Context, plan []item, idx []int, peek bool, extra int64) ([]*sluicev1.Decision, error) {
	// The descriptors are one request's limits: a consuming batch asks
	// the nodes for all or nothing (a peek consumes nothing to give back).
	req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, len(idx)), AllOrNothing: !peek && extra == 0 && len(idx) > 1}
	for j, i := range idx {
		hits := plan[i].hits
		if peek {
			hits = 0
		}
		req.Checks[j] = s.sluiceCheck(plan[i], hits, extra)
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

// sluiceCheck is the sluice check of the planned descriptor it, for hits
// (0: a peek; negative: a refund of -hits), its limit raised by extra:
// its rule's window, fixed, with the domain's on_owner_unavailable and
// scope.
func (s *Service) sluiceCheck(it item, hits, extra int64) *sluicev1.RateLimitCheck {
	return &sluicev1.RateLimitCheck{
		Name: it.name, Key: it.key, Hits: proto.Int64(hits),
		Limit: int64(it.rule.RequestsPerUnit) + extra, WindowMs: it.window.Milliseconds(),
		Algorithm:          sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW,
		OnOwnerUnavailable: it.policy,
		Scope:              it.scope,
	}
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
