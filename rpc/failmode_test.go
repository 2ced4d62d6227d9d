package rpc

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

const failModeLimits = `
limits:
  login:
    limit: 5
    window: 1m
    on_owner_unavailable: deny
    overrides:
      - key_prefix: "internal:"
        on_owner_unavailable: allow
  api:
    limit: 30
    window: 1m
`

const (
	policyUnspecified = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED
	policyLocal       = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL
	policyAllow       = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW
	policyDeny        = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
)

// A check under a configured name that leaves on_owner_unavailable
// unspecified is forwarded with the limit's policy (its key's override's),
// whether it carries numbers or not; a policy of the check's own wins only
// when it is stricter (deny over local over allow: the operator's policy
// is never weakened by a caller, issue 38); a name without a policy, or
// without a configured limit, keeps the check's (unspecified: local); a
// peer's check keeps the policy its sender resolved. The client's message
// is never changed.
func TestParseCheckTakesTheLimitsPolicy(t *testing.T) {
	set := mustParseLimits(t, failModeLimits).Current()
	inline := func(name, key string, p sluicev1.OwnerUnavailablePolicy) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: name, Key: key, Limit: 2, WindowMs: 1000, OnOwnerUnavailable: p}
	}
	withPolicy := func(c *sluicev1.RateLimitCheck, p sluicev1.OwnerUnavailablePolicy) *sluicev1.RateLimitCheck {
		c.OnOwnerUnavailable = p
		return c
	}
	for _, tc := range []struct {
		what     string
		check    *sluicev1.RateLimitCheck
		fromPeer bool
		want     sluicev1.OwnerUnavailablePolicy
	}{
		{"named, the limit says deny", named("login", "user:1"), false, policyDeny},
		{"inline numbers under the name", inline("login", "user:1", policyUnspecified), false, policyDeny},
		{"the override says allow", named("login", "internal:cron"), false, policyAllow},
		{"a weaker policy of the check's own loses (local under deny)", withPolicy(named("login", "user:1"), policyLocal), false, policyDeny},
		{"a weaker policy of the check's own loses, inline (allow under deny)", inline("login", "user:1", policyAllow), false, policyDeny},
		{"a stricter policy of the check's own wins (deny under allow)", withPolicy(named("login", "internal:cron"), policyDeny), false, policyDeny},
		{"a stricter policy of the check's own wins (local under allow)", withPolicy(named("login", "internal:cron"), policyLocal), false, policyLocal},
		{"the same policy", withPolicy(named("login", "user:1"), policyDeny), false, policyDeny},
		{"a limit without a policy: the check's", withPolicy(named("api", "user:1"), policyAllow), false, policyAllow},
		{"a limit without a policy", named("api", "user:1"), false, policyUnspecified},
		{"no such limit", inline("other", "user:1", policyUnspecified), false, policyUnspecified},
		{"from a peer: the sender's (none)", withNamed(named("login", "user:1")), true, policyUnspecified},
		{"from a peer: the sender's (allow)", withPolicy(withNamed(named("login", "user:1")), policyAllow), true, policyAllow},
	} {
		sent := proto.CloneOf(tc.check)
		r, fe := parseCheck(tc.check, set, tc.fromPeer)
		if fe != nil {
			t.Fatalf("%s: %v", tc.what, fe)
		}
		if got := r.pb.GetOnOwnerUnavailable(); got != tc.want {
			t.Errorf("%s: forwarded with %s, want %s", tc.what, got, tc.want)
		}
		if !proto.Equal(tc.check, sent) {
			t.Errorf("%s: the client's message changed: %v, was %v", tc.what, tc.check, sent)
		}
	}
	// The numbers are still the limit's (named) or the check's (inline).
	r, _ := parseCheck(named("login", "user:1"), set, false)
	if r.check.Limit != 5 || !r.named {
		t.Errorf("named check: limit %d named %v, want 5 and named", r.check.Limit, r.named)
	}
	r, _ = parseCheck(inline("login", "user:1", policyUnspecified), set, false)
	if r.check.Limit != 2 || r.pb.Named {
		t.Errorf("inline check: limit %d, marked named %v; want 2, not marked", r.check.Limit, r.pb.Named)
	}
}

func withNamed(c *sluicev1.RateLimitCheck) *sluicev1.RateLimitCheck {
	c.Limit, c.WindowMs, c.Named = 5, 60_000, true
	return c
}

// End to end: with the key's owner dead, the node the client called
// answers a check of a limit configured deny (named or inline) denied and
// degraded, and so one whose own policy says allow (a caller cannot turn
// the operator's deny into fail-open, issue 38); under the override that
// says allow, a check's own deny is denied.
func TestNamedLimitPolicyWhenTheOwnerIsDown(t *testing.T) {
	clock := windowClock()
	nodes := startInproc(t, NodeConfig{Name: "node1", Clock: clock, Limits: mustParseLimits(t, failModeLimits)},
		NodeConfig{Name: "node2", Clock: clock, Limits: mustParseLimits(t, failModeLimits)})
	a, b := nodes[0], nodes[1]
	k := keyOwnedBy(t, a, "login", "node2")
	if d := check(t, a.client, named("login", k)); !d.Allowed || d.Degraded || d.Owner != "node2" {
		t.Fatalf("before the kill: %+v", d)
	}
	b.Kill()
	// node1 may see node2 die meanwhile and take the key over: its answer
	// is then its own (not degraded), so only degraded answers are
	// checked against the policy, and at least the first must be one.
	degraded := 0
	for _, tc := range []struct {
		what    string
		check   *sluicev1.RateLimitCheck
		allowed bool
	}{
		{"named, deny", named("login", k), false},
		{"inline under the name, deny", &sluicev1.RateLimitCheck{Name: "login", Key: k, Limit: 5, WindowMs: 60_000}, false},
		{"the check's own allow under deny", &sluicev1.RateLimitCheck{Name: "login", Key: k, OnOwnerUnavailable: policyAllow}, false},
		{"the check's own allow, inline, under deny", &sluicev1.RateLimitCheck{Name: "login", Key: k, Limit: 5, WindowMs: 60_000, OnOwnerUnavailable: policyAllow}, false},
	} {
		d := check(t, a.client, tc.check)
		if !d.Degraded {
			t.Logf("%s: answered by node1 as the owner (it saw node2 die): %+v", tc.what, d)
			continue
		}
		degraded++
		if d.Allowed != tc.allowed || d.Owner != "node1" {
			t.Errorf("%s: %+v, want allowed=%v by node1, degraded", tc.what, d, tc.allowed)
		}
	}
	if degraded == 0 {
		t.Fatal("no degraded answer right after the owner died")
	}
}
