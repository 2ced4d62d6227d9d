package rls_test

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/rls"
)

// The examples of envoyproxy/ratelimit's README ("Examples" 1-9) and its
// test/config/basic_config.yaml and wildcard.yaml, with the limits the
// README says each descriptor gets.
var examples = map[string]string{
	"example1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2.yaml": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4a.yaml": `
domain: example4a
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`,
	"example4b.yaml": `
domain: example4b
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
	"example5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"basic_config.yaml": `
# Basic configuration for testing.
domain: test-domain
descriptors:
  # Top level key/value with no default rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30

  # Top level key/value with no limit, effectively whitelisted.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 1

  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
`,
	"wildcard.yaml": `
domain: wildcard
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 22
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 23
  - key: path
    value: /api/*
    descriptors:
      - key: user
        value: admin*
        rate_limit:
          unit: second
          requests_per_unit: 24
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: 25
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 26
`,
}

func loadExamples(t *testing.T) *rls.Config {
	t.Helper()
	var files []rls.File
	for _, name := range []string{"example1.yaml", "example2.yaml", "example3.yaml", "example4a.yaml", "example4b.yaml",
		"example5.yaml", "example6.yaml", "example7.yaml", "example8.yaml", "example9.yaml", "basic_config.yaml", "wildcard.yaml"} {
		files = append(files, rls.File{Name: name, Data: []byte(examples[name])})
	}
	cfg, err := rls.Parse(files...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// d builds a descriptor from key, value pairs.
func d(kv ...string) []rls.Entry {
	var es []rls.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, rls.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

const (
	sec  = rlsv3.RateLimitResponse_RateLimit_SECOND
	min_ = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour = rlsv3.RateLimitResponse_RateLimit_HOUR
	day  = rlsv3.RateLimitResponse_RateLimit_DAY
)

func TestMatchDocumentedExamples(t *testing.T) {
	cfg := loadExamples(t)
	cases := []struct {
		name      string
		domain    string
		entries   []rls.Entry
		want      bool
		rpu       uint32
		unit      rls.Unit
		fullKey   string
		unlimited bool
		shadow    bool
	}{
		// Example 1: two values of one key, each its own limit.
		{"ex1 users", "mongo_cps", d("database", "users"), true, 500, sec, "mongo_cps.database_users", false, false},
		{"ex1 default", "mongo_cps", d("database", "default"), true, 500, sec, "mongo_cps.database_default", false, false},
		{"ex1 other value", "mongo_cps", d("database", "orders"), false, 0, 0, "", false, false},
		// Example 2: nested descriptors; a key without value matches any.
		{"ex2 marketing to number", "messaging", d("message_type", "marketing", "to_number", "2061111111"), true, 5, day, "messaging.message_type_marketing.to_number", false, false},
		{"ex2 any number", "messaging", d("to_number", "2061111111"), true, 100, day, "messaging.to_number", false, false},
		{"ex2 placeholder has no limit", "messaging", d("message_type", "marketing"), false, 0, 0, "", false, false},
		{"ex2 other message type", "messaging", d("message_type", "transactional", "to_number", "2061111111"), false, 0, 0, "", false, false},
		// Example 3: key/value is tried before key alone.
		{"ex3 any IP", "edge_proxy_per_ip", d("remote_address", "50.0.0.1"), true, 10, sec, "edge_proxy_per_ip.remote_address", false, false},
		{"ex3 blacklisted IP", "edge_proxy_per_ip", d("remote_address", "50.0.0.5"), true, 0, sec, "edge_proxy_per_ip.remote_address_50.0.0.5", false, false},
		// Example 4: a rule applies only at the descriptor's own depth.
		{"ex4 deeper request", "example4a", d("key", "value", "subkey", "subvalue"), false, 0, 0, "", false, false},
		{"ex4 same depth", "example4b", d("key", "value", "subkey", "subvalue"), true, 300, sec, "example4b.key_value.subkey", false, false},
		{"ex4 shallower request", "example4b", d("key", "value"), false, 0, 0, "", false, false},
		// Example 5: unlimited.
		{"ex5 ldap", "internal", d("ldap", "x"), true, 0, 0, "internal.ldap", true, false},
		{"ex5 azure", "internal", d("azure", "x"), true, 100, min_, "internal.azure", false, false},
		// Example 6: shadow mode for user-a only.
		{"ex6 user-a", "example6", d("service", "auth-service", "user", "user-a"), true, 10, sec, "example6.service.user_user-a", false, true},
		{"ex6 user-b", "example6", d("service", "auth-service", "user", "user-b"), true, 20, sec, "example6.service.user_user-b", false, false},
		// Example 7: each descriptor matches its own rule (replaces is
		// applied across the descriptors of a request: see the service test).
		{"ex7 key_1", "example7", d("key_1", "value_1", "user", "bkthomps"), true, 5, sec, "example7.key_1_value_1.user_bkthomps", false, false},
		{"ex7 key_2", "example7", d("key_2", "value_2", "user", "bkthomps"), true, 10, sec, "example7.key_2_value_2.user_bkthomps", false, false},
		// Example 8: detailed_metric changes metrics only.
		{"ex8 unspecified", "example8", d("key1", "unspecified_value"), true, 10, min_, "example8.key1", false, false},
		{"ex8 value1", "example8", d("key1", "value1"), true, 20, min_, "example8.key1_value1", false, false},
		// Example 9: wildcard value.
		{"ex9 value_1", "example9", d("key1", "value_1"), true, 20, min_, "example9.key1_value*", false, false},
		{"ex9 value_2", "example9", d("key1", "value_2"), true, 20, min_, "example9.key1_value*", false, false},
		{"ex9 no prefix", "example9", d("key1", "other"), false, 0, 0, "", false, false},
		// basic_config.yaml of envoyproxy/ratelimit's tests.
		{"basic default subkey", "test-domain", d("key1", "value1", "subkey1", "something"), true, 5, sec, "test-domain.key1_value1.subkey1", false, false},
		{"basic specific subkey", "test-domain", d("key1", "value1", "subkey1", "subvalue1"), true, 10, sec, "test-domain.key1_value1.subkey1_subvalue1", false, false},
		{"basic key1 alone", "test-domain", d("key1", "value1"), false, 0, 0, "", false, false},
		{"basic key2 default", "test-domain", d("key2", "something"), true, 20, min_, "test-domain.key2", false, false},
		{"basic key2 value2", "test-domain", d("key2", "value2"), true, 30, min_, "test-domain.key2_value2", false, false},
		{"basic key2 whitelisted", "test-domain", d("key2", "value3"), false, 0, 0, "", false, false},
		{"basic key3", "test-domain", d("key3", "foo"), true, 1, hour, "test-domain.key3", false, false},
		{"basic key5 outer", "test-domain", d("key5", "value5"), true, 15, day, "test-domain.key5_value5", false, false},
		{"basic key5 inner", "test-domain", d("key5", "value5", "subkey5", "subvalue5"), true, 25, day, "test-domain.key5_value5.subkey5_subvalue5", false, false},
		{"basic key5 other inner", "test-domain", d("key5", "value5", "subkey5", "other"), false, 0, 0, "", false, false},
		{"unknown domain", "nope", d("key2", "value2"), false, 0, 0, "", false, false},
		{"no entries", "test-domain", nil, false, 0, 0, "", false, false},
		{"unknown key", "test-domain", d("nokey", "x"), false, 0, 0, "", false, false},
		// wildcard.yaml: trailing and middle '*'.
		{"wild foo1", "wildcard", d("wild", "foo1"), true, 20, min_, "wildcard.wild_foo*", false, false},
		{"wild foo itself", "wildcard", d("wild", "foo"), true, 20, min_, "wildcard.wild_foo*", false, false},
		{"wild bar", "wildcard", d("wild", "bar"), false, 0, 0, "", false, false},
		{"noWild exact", "wildcard", d("noWild", "foo"), true, 21, min_, "wildcard.noWild_foo", false, false},
		{"noWild is no prefix", "wildcard", d("noWild", "foo1"), false, 0, 0, "", false, false},
		{"noVal any", "wildcard", d("noVal", "foo1"), true, 22, min_, "wildcard.noVal", false, false},
		{"midWild", "wildcard", d("midWild", "barxyzb"), true, 23, min_, "wildcard.midWild_bar*b", false, false},
		{"midWild wrong end", "wildcard", d("midWild", "barxyz"), false, 0, 0, "", false, false},
		{"nested wildcard wins over key only", "wildcard", d("path", "/api/v1", "user", "admin-7"), true, 24, sec, "wildcard.path_/api/*.user_admin*", false, false},
		{"nested key only", "wildcard", d("path", "/api/v1", "user", "bob"), true, 25, sec, "wildcard.path_/api/*.user", false, false},
		{"nested wildcard miss", "wildcard", d("path", "/web/v1", "user", "bob"), false, 0, 0, "", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, ok := cfg.Match(c.domain, c.entries)
			if ok != c.want {
				t.Fatalf("Match(%s, %v) matched = %v, want %v", c.domain, c.entries, ok, c.want)
			}
			if !ok {
				return
			}
			r := m.Rule
			if r.RequestsPerUnit != c.rpu || r.Unit != c.unit || r.FullKey != c.fullKey || r.Unlimited != c.unlimited || r.ShadowMode != c.shadow {
				t.Fatalf("rule = {rpu %d unit %s full_key %q unlimited %v shadow %v}, want {%d %s %q %v %v}",
					r.RequestsPerUnit, r.Unit, r.FullKey, r.Unlimited, r.ShadowMode, c.rpu, c.unit, c.fullKey, c.unlimited, c.shadow)
			}
			if m.Name == "" || m.Key == "" || len(m.Name) > 256 || len(m.Key) > 1024 {
				t.Fatalf("check name %q key %q: empty or too long", m.Name, m.Key)
			}
		})
	}
}

// A key without value (and a wildcard) makes every value its own limit,
// each rule has its own check name, and share_threshold makes every value
// of a wildcard share one count.
func TestMatchCheckNamesAndKeys(t *testing.T) {
	cfg := loadExamples(t)
	get := func(domain string, es []rls.Entry) rls.Match {
		t.Helper()
		m, ok := cfg.Match(domain, es)
		if !ok {
			t.Fatalf("no match for %s %v", domain, es)
		}
		return m
	}
	a := get("messaging", d("to_number", "2061111111"))
	b := get("messaging", d("to_number", "2062222222"))
	if a.Name != b.Name || a.Key == b.Key {
		t.Errorf("two numbers: names %q %q (want equal), keys %q %q (want different)", a.Name, b.Name, a.Key, b.Key)
	}
	if want := `rls "messaging" "to_number"`; a.Name != want {
		t.Errorf("name = %q, want %q", a.Name, want)
	}
	if want := `"2061111111"`; a.Key != want {
		t.Errorf("key = %q, want %q", a.Key, want)
	}
	m := get("messaging", d("message_type", "marketing", "to_number", "2061111111"))
	if m.Name == a.Name {
		t.Errorf("nested rule shares the name %q of the top-level rule", m.Name)
	}
	if want := `rls "messaging" "message_type"="marketing" "to_number"`; m.Name != want {
		t.Errorf("nested name = %q, want %q", m.Name, want)
	}
	if want := `"marketing" "2061111111"`; m.Key != want {
		t.Errorf("nested key = %q, want %q", m.Key, want)
	}
	w1, w2 := get("example9", d("key1", "value_1")), get("example9", d("key1", "value_2"))
	if w1.Name != w2.Name || w1.Key == w2.Key {
		t.Errorf("wildcard values: names %q %q, keys %q %q: want one name, two keys", w1.Name, w2.Name, w1.Key, w2.Key)
	}
	s1, s2 := get("wildcard", d("files", "files/a.txt")), get("wildcard", d("files", "files/b.txt"))
	if s1.Name != s2.Name || s1.Key != s2.Key {
		t.Errorf("share_threshold: names %q %q, keys %q %q: want one name and one key", s1.Name, s2.Name, s1.Key, s2.Key)
	}
	// Values that would collide if joined by a separator do not.
	c1 := get("test-domain", d("key1", "value1", "subkey1", "x y"))
	c2 := get("test-domain", d("key1", "value1", "subkey1", `x" "y`))
	if c1.Key == c2.Key {
		t.Errorf("keys collide: %q", c1.Key)
	}
	// A very long value is hashed into a key sluice accepts.
	long := get("messaging", d("to_number", strings.Repeat("9", 5000)))
	if len(long.Key) > 1024 || long.Key == a.Key {
		t.Errorf("long key %d bytes %q", len(long.Key), long.Key[:min(len(long.Key), 40)])
	}
}

// A rule whose path is longer than a sluice name gets a hashed name of
// its own.
func TestMatchLongNames(t *testing.T) {
	long := strings.Repeat("d", 300)
	y := "domain: " + long + "\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	cfg, err := rls.Parse(rls.File{Name: "long.yaml", Data: []byte(y)})
	if err != nil {
		t.Fatal(err)
	}
	a, okA := cfg.Match(long, d("a", "x"))
	b, okB := cfg.Match(long, d("b", "x"))
	if !okA || !okB || len(a.Name) > 256 || len(b.Name) > 256 || a.Name == b.Name || !strings.HasPrefix(a.Name, "rls#") {
		t.Errorf("names %q %q", a.Name, b.Name)
	}
}

func TestGlob(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"foo*", "foo", true}, {"foo*", "foobar", true}, {"foo*", "fo", false}, {"foo*", "xfoo", false},
		{"*", "", true}, {"*", "anything", true}, {"bar*b", "barb", true}, {"bar*b", "bar-b", true},
		{"bar*b", "bar-bx", false}, {"svc*ep*rpc", "svc1ep2rpc", true}, {"svc*ep*rpc", "svcrpc", false},
		{"a*a*a", "aaaa", true}, {"a*a*a", "aa", false}, {"*x", "yyyx", true},
	}
	for _, c := range cases {
		y := strings.Replace("domain: g\ndescriptors:\n  - key: k\n    value: \"PATTERN\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "PATTERN", c.pattern, 1)
		cfg, err := rls.Parse(rls.File{Name: "g.yaml", Data: []byte(y)})
		if err != nil {
			t.Fatal(err)
		}
		if _, got := cfg.Match("g", d("k", c.s)); got != c.want {
			t.Errorf("%q matches %q = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}
