package proxyrules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// proxyLimits is the nodes' limits file of cmd/sluice's proxy tests.
const proxyLimits = `
limits:
  api:
    limit: 3
    window: 1h
    overrides:
      - key_prefix: "user:"
        limit: 5
  login:
    limit: 2
    window: 1h
  signin:
    limit: 1
    window: 1h
`

var testSecrets = map[string]string{"T_IP_SECRET": "proxy-test-secret-0123456789"}

// Bad rules files are refused with their line and field (cmd/sluice's
// TestProxyRefusesBadFlags: bad flags name the flag).
func TestProxyRefusesBadRules(t *testing.T) {
	env := func(k string) (string, bool) { v, ok := testSecrets[k]; return v, ok }
	for _, tc := range []struct{ file, want string }{
		{"rules:\n  - match: /\n    limit: api\n    key: ip\n", "proxy.yaml:4: rules[0].key: ip needs client_ip.secret_env"},
		{"client_ip:\n  secret_env: NOPE\nrules: []\n", "proxy.yaml:2: client_ip.secret_env: environment variable NOPE is not set"},
		{"client_ip:\n  secret_env: T_IP_SECRET\n  trusted_proxies: [10.0.0.0/8, nope]\nrules: []\n", "proxy.yaml:3: client_ip.trusted_proxies[1]: want a CIDR prefix"},
		{"rules:\n  - match: /\n    limit: api\n    key: route\n  - match: here\n    limit: api\n    key: route\n", "proxy.yaml:5: rules[1].match:"},
		{"rules:\n  - match: /\n    key: route\n", "proxy.yaml:2: rules[0].limit: required"},
		{"rules:\n  - match: /\n    limit: api\n    key: route+bogus\n", `proxy.yaml:4: rules[0].key: unknown key source "bogus"`},
		{"rules:\n  - match: /\n    limit: api\n    key: route\n    over_limit: maybe\n", "proxy.yaml:5: rules[0].over_limit: want deny or forward"},
		{"timeout: soon\nrules: []\n", "proxy.yaml:1: timeout:"},
		{"failure: sometimes\n", "proxy.yaml:1: failure: want open or closed"},
		{"rules:\n  - match: /\n    limit: api\n    key: route\n    limt: 3\n", "proxy.yaml:5: field limt is not a setting of the rules file"},
		{"rules:\n  - match: /\n    limit: api\n    checks:\n      - limit: api\n        key: route\n", "proxy.yaml:2: rules[0]: give limit, key, over_limit and window, or checks, not both"},
		{"rules:\n  - match: /\n    checks:\n      - limit: api\n        key: route\n      - limit: api\n        key: nope\n", `proxy.yaml:7: rules[0].checks[1].key: unknown key source "nope"`},
		{"limits_file: limits.yaml\nrules:\n  - match: /\n    limit: nope\n    key: route\n", `proxy.yaml:4: rules[0].limit: no limit called "nope"`},
		{"", "proxy.yaml:1: rules: at least one rule is required"},
		{"rules: [\n", "proxy.yaml:1: did not find expected node content"},
		{"exempt: [OPTIONS, \"get it\"]\nrules:\n  - match: /\n    limit: api\n    key: route\n", `proxy.yaml:1: exempt[1]: "get it" is no HTTP method`},
		{"rules:\n  - match: P@ST /x\n    limit: api\n    key: route\n", `proxy.yaml:2: rules[0].match: "P@ST /x": "P@ST" is no HTTP method`},
		{"rules:\n  - match: /\n    limit: api\n    key: route\n    failure: shut\n", `proxy.yaml:5: rules[0].failure: want open or closed, got "shut"`},
		{"rules:\n  - match: /\n    checks:\n      - {limit: api, key: route}\n      - {limit: login, key: route, over_limit: forward}\n",
			`proxy.yaml:5: rules[0].checks[1].over_limit: forward needs a rule of its own (one check)`},
		{"rules:\n  - match: /\n    checks:\n      - {limit: api, key: route, failure: closed}\n", "proxy.yaml:4: field failure is not a setting of the rules file"},
	} {
		dir := writeFiles(t, map[string]string{"proxy.yaml": tc.file, "limits.yaml": proxyLimits})
		_, err := Load(filepath.Join(dir, "proxy.yaml"), env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("file %q:\n got %v\nwant %s", tc.file, err, tc.want)
		}
	}
}

// The example rules file loads.
func TestExampleRulesFileLoads(t *testing.T) {
	rs, err := Load("../examples/proxy.yaml", func(k string) (string, bool) {
		return "example-secret-0123456789", k == "IP_KEY_SECRET"
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Rules) != 2 || rs.Rules[0].Checks[0].Window != time.Hour || rs.Rules[1].Checks[0].Window != time.Minute || rs.Timeout != 500*time.Millisecond {
		t.Fatalf("examples/proxy.yaml: %+v", rs)
	}
}
