package rls_test

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// on_owner_unavailable, sluice's own key at the domain level: local,
// allow or deny; anything else is refused with its line; a file without
// it (every envoyproxy/ratelimit file) leaves the policy unspecified.
func TestDomainOnOwnerUnavailable(t *testing.T) {
	cfg, err := rls.Parse(
		rls.File{Name: "a.yaml", Data: []byte("domain: a\non_owner_unavailable: deny\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
		rls.File{Name: "b.yaml", Data: []byte("domain: b\non_owner_unavailable: allow\n")},
		rls.File{Name: "c.yaml", Data: []byte("domain: c\non_owner_unavailable: local\n")},
		rls.File{Name: "d.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	for domain, want := range map[string]sluicev1.OwnerUnavailablePolicy{
		"a": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY,
		"b": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW,
		"c": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL,
		"d": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED,
		"e": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED, // unknown domain
	} {
		if got := cfg.OnOwnerUnavailable(domain); got != want {
			t.Errorf("domain %s: %s, want %s", domain, got, want)
		}
	}
	var none *rls.Config
	if got := none.OnOwnerUnavailable("a"); got != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED {
		t.Errorf("nil Config: %s", got)
	}
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\non_owner_unavailable: closed\n", `bad.yaml:2:23: on_owner_unavailable: want local, allow or deny, got "closed"`},
		{"domain: d\non_owner_unavailable: \"\"\n", `bad.yaml:2:23: on_owner_unavailable: want local, allow or deny, got ""`},
		{"domain: d\ndescriptors:\n  - key: k\n    on_owner_unavailable: deny\n", `unknown field "on_owner_unavailable"`}, // the domain's only
	} {
		_, err := rls.Parse(rls.File{Name: "bad.yaml", Data: []byte(c.yaml)})
		var ce *rls.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a ConfigError containing %q", c.yaml, err, c.want)
		}
	}
	// The shipped envoyproxy/ratelimit-format files still load, without
	// a policy.
	if _, err := os.Stat("../examples/rls"); err == nil {
		cfg, err := rls.Load("../examples/rls")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range cfg.Domains() {
			if p := cfg.OnOwnerUnavailable(d); p != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED {
				t.Errorf("examples/rls domain %s: %s", d, p)
			}
		}
	}
}

// Every check of a domain carries its on_owner_unavailable; a descriptor
// the node answers by deny (its owner unreachable) is OVER_LIMIT and
// refuses the request, which then charges none of its other descriptors;
// by allow, it is OK.
func TestServiceDomainPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		want    sluicev1.OwnerUnavailablePolicy
		overall string
	}{
		{"deny", sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY, "OVER_LIMIT"},
		{"allow", sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW, "OK"},
	} {
		cfg, err := rls.Parse(rls.File{Name: "shop.yaml", Data: []byte(strings.Replace(serviceRules, "domain: shop\n", "domain: shop\non_owner_unavailable: "+tc.policy+"\n", 1))})
		if err != nil {
			t.Fatal(err)
		}
		ch := newStoreChecker()
		s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
		ch.degradedKey = `"down"`
		r := call(t, s, "shop", 0, desc("user", "up"), desc("user", "down"))
		if r.OverallCode.String() != tc.overall {
			t.Errorf("%s: overall %s, want %s", tc.policy, r.OverallCode, tc.overall)
		}
		wantUp := st{ok, 3, 2, 40 * time.Second}
		if tc.policy == "deny" {
			wantUp = st{ok, 3, 3, 40 * time.Second} // refunded: the request counted nowhere
			if g := got(r.Statuses[1]); g.code != over {
				t.Errorf("deny: the unreachable descriptor %+v, want OVER_LIMIT", g)
			}
		}
		if g := got(r.Statuses[0]); g != wantUp {
			t.Errorf("%s: the other descriptor %+v, want %+v", tc.policy, g, wantUp)
		}
		ch.mu.Lock()
		for _, c := range ch.calls {
			for _, chk := range c.Checks {
				if chk.OnOwnerUnavailable != tc.want {
					t.Errorf("%s: check %s sent with %s", tc.policy, chk.Key, chk.OnOwnerUnavailable)
				}
			}
		}
		ch.mu.Unlock()
	}
	// Without the key: nothing is sent (the node's default, local).
	s, ch := newService(t)
	call(t, s, "shop", 0, desc("user", "x"))
	if p := ch.calls[0].Checks[0].OnOwnerUnavailable; p != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED {
		t.Errorf("no policy in the file: sent %s", p)
	}
}

// Shadow descriptors are counted each in a call of their own once the
// request is admitted (a would-be denial of one never un-counts another,
// nor the enforcing ones), and only peeked at when it is refused.
func TestServiceShadowCallsApart(t *testing.T) {
	const rules = `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: gamma
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
`
	cfg, err := rls.Parse(rls.File{Name: "shop.yaml", Data: []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	// beta is over from the second request on; gamma keeps counting.
	for i := range 3 {
		r := call(t, s, "shop", 0, desc("user", "u"), desc("beta", "b"), desc("gamma", "g"))
		want := []st{{ok, 3, uint32(2 - i), 40 * time.Second}, {ok, 1, 0, time.Hour - 20*time.Second}, {ok, 5, uint32(4 - i), time.Hour - 20*time.Second}}
		for j, w := range want {
			if g := got(r.Statuses[j]); g != w {
				t.Errorf("request %d: statuses[%d] = %+v, want %+v", i+1, j, g, w)
			}
		}
		if r.OverallCode != ok {
			t.Errorf("request %d: %s", i+1, r.OverallCode)
		}
	}
	ch.mu.Lock()
	for i, c := range ch.calls {
		if len(c.Checks) != 1 {
			t.Errorf("call %d has %d checks, want 1 (user; beta and gamma each apart)", i, len(c.Checks))
		}
	}
	ch.calls = nil
	ch.mu.Unlock()
	// user is spent: the request is refused, and gamma only peeked at.
	r := call(t, s, "shop", 0, desc("user", "u"), desc("gamma", "g"))
	if r.OverallCode != over || got(r.Statuses[1]) != (st{ok, 5, 2, time.Hour - 20*time.Second}) {
		t.Fatalf("refused: %s %+v %+v", r.OverallCode, got(r.Statuses[0]), got(r.Statuses[1]))
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.calls) != 2 || ch.calls[1].Checks[0].GetHits() != 0 {
		t.Fatalf("calls %v, want user's, then a peek at gamma", ch.calls)
	}
}

// scope, sluice's own key at the domain level: global, regional or exact;
// every check of the domain carries it; anything else is refused with its
// line; a file without it leaves the scope unspecified.
func TestDomainScope(t *testing.T) {
	cfg, err := rls.Parse(
		rls.File{Name: "a.yaml", Data: []byte(strings.Replace(serviceRules, "domain: shop\n", "domain: shop\nscope: exact\n", 1))},
		rls.File{Name: "b.yaml", Data: []byte("domain: b\nscope: regional\n")},
		rls.File{Name: "c.yaml", Data: []byte("domain: c\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	for domain, want := range map[string]sluicev1.Scope{
		"shop": sluicev1.Scope_SCOPE_EXACT, "b": sluicev1.Scope_SCOPE_REGIONAL,
		"c": sluicev1.Scope_SCOPE_UNSPECIFIED, "zz": sluicev1.Scope_SCOPE_UNSPECIFIED,
	} {
		if got := cfg.Scope(domain); got != want {
			t.Errorf("domain %s: %s, want %s", domain, got, want)
		}
	}
	ch := newStoreChecker()
	s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	call(t, s, "shop", 0, desc("user", "u1"))
	ch.mu.Lock()
	if len(ch.calls) != 1 || ch.calls[0].Checks[0].Scope != sluicev1.Scope_SCOPE_EXACT {
		t.Errorf("the domain's check was sent with %v", ch.calls)
	}
	ch.mu.Unlock()
	_, err = rls.Parse(rls.File{Name: "bad.yaml", Data: []byte("domain: d\nscope: planet\n")})
	if err == nil || !strings.Contains(err.Error(), `bad.yaml:2:8: scope: want global, regional or exact, got "planet"`) {
		t.Errorf("bad scope: %v", err)
	}
}

// A request whose only denied descriptors are quota descriptors, with
// another quota descriptor left, is asked again without them; a check
// answered degraded in the first call stays charged there (the node does
// not give it back), so it is not sent again: charged once, not twice.
func TestServiceQuotaRetryChargesADegradedCheckOnce(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "q.yaml", Data: []byte(`
domain: q
descriptors:
  - key: service
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	call(t, s, "q", 0, desc("service", "one")) // service one spent
	ch.degradedKey = `"down"`
	ch.calls = nil
	r := call(t, s, "q", 0, desc("service", "one"), desc("service", "two"), desc("user", "down"), desc("user", "up"))
	if r.OverallCode != ok {
		t.Fatalf("overall %s, want OK: a quota descriptor is left", r.OverallCode)
	}
	want := []st{{over, 1, 0, 40 * time.Second}, {ok, 1, 0, 40 * time.Second}, {ok, 5, 0, 40 * time.Second}, {ok, 5, 4, 40 * time.Second}}
	for i, w := range want {
		if g := got(r.Statuses[i]); g != w {
			t.Errorf("descriptor %d: %+v, want %+v", i, g, w)
		}
	}
	sent := map[string]int{}
	for _, c := range ch.calls {
		for _, chk := range c.Checks {
			sent[chk.Key] += int(chk.GetHits())
		}
	}
	if sent[`"down"`] != 1 || len(ch.calls) != 2 {
		t.Errorf("the degraded check was sent with %d hits in %d calls, want 1 hit (the first of 2 calls)", sent[`"down"`], len(ch.calls))
	}
	if s.Stats().PartialCharges != 0 {
		t.Errorf("partial charges %d: the request was admitted", s.Stats().PartialCharges)
	}
}
