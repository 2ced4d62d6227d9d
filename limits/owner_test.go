package limits

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/region"
)

// on_owner_unavailable: a limit's own policy, inherited by the overrides
// that leave it out and replaced by those that give one; a limit that
// does not say has none (the node's default applies).
func TestOnOwnerUnavailable(t *testing.T) {
	set, err := Parse("limits.yaml", []byte(`
limits:
  login:
    limit: 5
    window: 1m
    on_owner_unavailable: deny
    overrides:
      - key_prefix: "tier:free:"
        limit: 2
      - key_prefix: "internal:"
        on_owner_unavailable: allow
  api:
    limit: 30
    window: 1m
    overrides:
      - key_prefix: "batch:"
        on_owner_unavailable: local
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key string
		want      OwnerUnavailable
	}{
		{"login", "user:1", OwnerUnavailableDeny},
		{"login", "tier:free:bob", OwnerUnavailableDeny}, // inherited
		{"login", "internal:cron", OwnerUnavailableAllow},
		{"api", "user:1", OwnerUnavailableUnset},
		{"api", "batch:7", OwnerUnavailableLocal},
	} {
		l, ok := set.Resolve(tc.name, tc.key)
		if !ok || l.OnOwnerUnavailable != tc.want {
			t.Errorf("Resolve(%q, %q).OnOwnerUnavailable = %q (ok %v), want %q", tc.name, tc.key, l.OnOwnerUnavailable, ok, tc.want)
		}
	}
	if l, _ := set.Resolve("login", "tier:free:bob"); l.Limit != 2 {
		t.Errorf("the override's own limit: %d, want 2", l.Limit)
	}
}

func TestOnOwnerUnavailableRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    on_owner_unavailable: maybe\n",
			`f.yaml:5: limits.api.on_owner_unavailable: must be local, allow or deny, got "maybe"`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    on_owner_unavailable: Deny\n",
			`f.yaml:5: limits.api.on_owner_unavailable: must be local, allow or deny, got "Deny"`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    on_owner_unavailable: \"\"\n",
			`f.yaml:5: limits.api.on_owner_unavailable: must be local, allow or deny, got ""`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    on_owner_unavailable: [deny]\n",
			`f.yaml:5: limits.api.on_owner_unavailable: must be a single value`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    overrides:\n      - key_prefix: a\n        on_owner_unavailable: closed\n",
			`f.yaml:7: limits.api.overrides[0].on_owner_unavailable: must be local, allow or deny, got "closed"`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    on_owner_unavailabel: deny\n",
			`f.yaml:5: limits.api.on_owner_unavailabel: unknown field (want limit, window, algorithm, burst, shadow, on_owner_unavailable, scope or overrides)`},
	} {
		_, err := Parse("f.yaml", []byte(tc.file))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an ErrInvalid containing %q", tc.file, err, tc.want)
		}
	}
}

func TestParseOwnerUnavailable(t *testing.T) {
	for _, s := range []string{"", "local", "allow", "deny"} {
		o, err := ParseOwnerUnavailable(s)
		if err != nil || o.String() != s {
			t.Errorf("ParseOwnerUnavailable(%q) = %v (%q), %v", s, o, o.String(), err)
		}
	}
	if _, err := ParseOwnerUnavailable("open"); err == nil || !strings.Contains(err.Error(), `got "open"`) {
		t.Errorf("ParseOwnerUnavailable(open): %v", err)
	}
}

// scope takes global, regional or exact, on a limit and on an override
// (which otherwise has its limit's), and nothing else.
func TestScope(t *testing.T) {
	set, err := Parse("f.yaml", []byte(`limits:
  api:
    limit: 10
    window: 1m
    scope: exact
    overrides:
      - key_prefix: "eu:"
        scope: regional
      - key_prefix: "x:"
        limit: 3
  web:
    limit: 10
    window: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key string
		want      region.Scope
	}{{"api", "u", region.Exact}, {"api", "eu:1", region.Regional}, {"api", "x:1", region.Exact}, {"web", "u", region.Unspecified}} {
		if l, _ := set.Resolve(tc.name, tc.key); l.Scope != tc.want {
			t.Errorf("%s %s: scope %v, want %v", tc.name, tc.key, l.Scope, tc.want)
		}
	}
	_, err = Parse("f.yaml", []byte("limits:\n  api:\n    limit: 10\n    window: 1m\n    scope: planet\n"))
	if err == nil || !strings.Contains(err.Error(), `f.yaml:5: limits.api.scope: must be global, regional or exact, got "planet"`) {
		t.Errorf("bad scope: %v", err)
	}
}
