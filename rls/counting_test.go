package rls_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rls"
)

// countRule is one rule of a random rule file: key kN, any value.
type countRule struct {
	limit         uint32
	quota, shadow bool
}

// countDesc is one descriptor of a random request: rule index (-1: a key
// no rule matches), value, hits (0: a peek).
type countDesc struct {
	rule  int
	value string
	hits  uint32
}

// randomRules returns 4 rules of limits 0..5, some quota, some shadow,
// and their rule file.
func randomRules(r *rand.Rand) ([]countRule, string) {
	rules := make([]countRule, 4)
	var b strings.Builder
	b.WriteString("domain: c\ndescriptors:\n")
	for i := range rules {
		rules[i] = countRule{limit: uint32(r.IntN(6)), quota: r.IntN(3) == 0, shadow: r.IntN(6) == 0}
		fmt.Fprintf(&b, "  - key: k%d\n    quota_mode: %v\n    shadow_mode: %v\n    rate_limit: {unit: minute, requests_per_unit: %d}\n",
			i, rules[i].quota, rules[i].shadow, rules[i].limit)
	}
	return rules, b.String()
}

// randomRequest returns 1 to 4 descriptors of distinct keys.
func randomRequest(r *rand.Rand) []countDesc {
	n := 1 + r.IntN(4)
	var out []countDesc
	for _, k := range r.Perm(5)[:n] {
		out = append(out, countDesc{rule: k - 1, value: []string{"x", "y"}[r.IntN(2)], hits: uint32(r.IntN(4))})
	}
	return out
}

func (d countDesc) proto() *ratelimitv3.RateLimitDescriptor {
	key := "unknown"
	if d.rule >= 0 {
		key = fmt.Sprintf("k%d", d.rule)
	}
	out := desc(key, d.value)
	out.HitsAddend = wrapperspb.UInt64(uint64(d.hits))
	return out
}

// wantStatus is a model's answer for one descriptor.
type wantStatus struct {
	code      rlsv3.RateLimitResponse_Code
	remaining uint32
}

// peerModel answers as envoyproxy/ratelimit counts by default
// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset; base_limiter.go and
// fixed_cache_impl.go): every descriptor's hits are added to its count,
// refused or not; a descriptor is over when its count after them is above
// the limit, else OK with limit - count remaining; a shadow_mode rule's
// over is answered OK; the request is over when a descriptor that is not
// a quota descriptor is over, or all its quota descriptors are
// (service/ratelimit.go).
type peerModel struct {
	rules     []countRule
	quotaMode bool
	counts    map[string]uint64
}

func (m *peerModel) answer(ds []countDesc) ([]wantStatus, rlsv3.RateLimitResponse_Code) {
	out := make([]wantStatus, len(ds))
	quotas, overQuotas, overRate := 0, 0, false
	for i, d := range ds {
		isQuota := m.quotaMode
		if d.rule < 0 {
			out[i] = wantStatus{code: ok}
		} else {
			r := m.rules[d.rule]
			isQuota = isQuota || r.quota
			k := fmt.Sprintf("k%d=%s", d.rule, d.value)
			m.counts[k] += uint64(d.hits)
			after := m.counts[k]
			switch {
			case after <= uint64(r.limit):
				out[i] = wantStatus{ok, r.limit - uint32(after)}
			case r.shadow:
				out[i] = wantStatus{ok, 0}
			default:
				out[i] = wantStatus{over, 0}
			}
		}
		if isQuota {
			quotas++
			if out[i].code == over {
				overQuotas++
			}
		} else if out[i].code == over {
			overRate = true
		}
	}
	if overRate || (quotas > 0 && overQuotas == quotas) {
		return out, over
	}
	return out, ok
}

// sluiceModel answers as sluice's default counting: a descriptor fits
// when its hits fit in what is left (a peek: when one more hit would);
// the request is refused when a descriptor that is neither a quota nor a
// shadow descriptor does not fit, or no quota descriptor fits; an admitted
// request charges every descriptor that fits (shadow ones included), a
// refused one charges nothing. Remaining is what is left after the
// charge, or before it when nothing was charged; 0 for one that does not
// fit.
type sluiceModel struct {
	rules     []countRule
	quotaMode bool
	counts    map[string]uint64
}

func (m *sluiceModel) answer(ds []countDesc) ([]wantStatus, rlsv3.RateLimitResponse_Code) {
	out := make([]wantStatus, len(ds))
	fits := make([]bool, len(ds))
	quotas, fitQuotas, refused := 0, 0, false
	for i, d := range ds {
		isQuota := m.quotaMode
		fits[i] = true
		if d.rule >= 0 {
			r := m.rules[d.rule]
			isQuota = isQuota || r.quota
			c := m.counts[fmt.Sprintf("k%d=%s", d.rule, d.value)]
			// A shadow descriptor never refuses.
			fits[i] = r.shadow || c+uint64(max(d.hits, 1)) <= uint64(r.limit)
		}
		if isQuota {
			quotas++
			if fits[i] {
				fitQuotas++
			}
		} else if !fits[i] {
			refused = true
		}
	}
	if quotas > 0 && fitQuotas == 0 {
		refused = true
	}
	for i, d := range ds {
		if d.rule < 0 {
			out[i] = wantStatus{code: ok}
			continue
		}
		r := m.rules[d.rule]
		k := fmt.Sprintf("k%d=%s", d.rule, d.value)
		c := m.counts[k]
		fit := c+uint64(max(d.hits, 1)) <= uint64(r.limit)
		switch {
		case !fit && r.shadow:
			out[i] = wantStatus{ok, 0}
		case !fit:
			out[i] = wantStatus{over, 0}
		case refused:
			out[i] = wantStatus{ok, r.limit - uint32(c)}
		default:
			m.counts[k] = c + uint64(d.hits)
			out[i] = wantStatus{ok, r.limit - uint32(c) - d.hits}
		}
	}
	if refused {
		return out, over
	}
	return out, ok
}

// Against a model of each way of counting, on random rule files (limits 0
// to 5, quota and shadow rules, QUOTA_MODE on some seeds) and random
// requests of peeks and charges, every status and overall code agrees:
// sluice's default counting, and the peer's behind
// IncrementWhenOverLimit, kept exactly by windows of limit + 1.
func TestCountingAgreesWithItsModel(t *testing.T) {
	for _, peer := range []bool{false, true} {
		t.Run(fmt.Sprintf("increment_when_over_limit=%v", peer), func(t *testing.T) {
			for seed := range uint64(300) {
				r := rand.New(rand.NewPCG(seed, 21))
				rules, file := randomRules(r)
				quotaMode := seed%5 == 4
				cfg, err := rls.Parse(rls.File{Name: "c.yaml", Data: []byte(file)})
				if err != nil {
					t.Fatal(err)
				}
				ch := newStoreChecker()
				s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler),
					IncrementWhenOverLimit: peer, QuotaMode: quotaMode})
				var model interface {
					answer([]countDesc) ([]wantStatus, rlsv3.RateLimitResponse_Code)
				}
				if peer {
					model = &peerModel{rules: rules, quotaMode: quotaMode, counts: map[string]uint64{}}
				} else {
					model = &sluiceModel{rules: rules, quotaMode: quotaMode, counts: map[string]uint64{}}
				}
				for step := range 40 {
					ds := randomRequest(r)
					pds := make([]*ratelimitv3.RateLimitDescriptor, len(ds))
					for i, d := range ds {
						pds[i] = d.proto()
					}
					resp := call(t, s, "c", 0, pds...)
					want, wantCode := model.answer(ds)
					for i := range ds {
						if g := resp.Statuses[i]; g.Code != want[i].code || g.LimitRemaining != want[i].remaining {
							t.Fatalf("seed %d step %d (rules %+v, quota mode %v): request %+v: descriptor %d: %s remaining %d, want %s remaining %d",
								seed, step, rules, quotaMode, ds, i, g.Code, g.LimitRemaining, want[i].code, want[i].remaining)
						}
					}
					if resp.OverallCode != wantCode {
						t.Fatalf("seed %d step %d (rules %+v, quota mode %v): request %+v: overall %s, want %s",
							seed, step, rules, quotaMode, ds, resp.OverallCode, wantCode)
					}
				}
			}
		})
	}
}
