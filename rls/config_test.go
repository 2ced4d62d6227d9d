package rls_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rls"
)

// Bad rule files are refused with the file, the line and the field.
func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		line       int
		want       string // the error after "file:line[:col]: "
	}{
		{"empty domain", "descriptors:\n  - key: a\n", 0, "domain: required (a config file cannot have an empty domain)"},
		{"empty file", "", 0, "domain: required (a config file cannot have an empty domain)"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: a\n    valu: b\n", 4, `unknown field "valu"`},
		{"unknown rate_limit key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 5\n", 6, `unknown field "request_per_unit"`},
		{"bad count", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n", 6, "cannot unmarshal string into Go struct field"},
		{"negative count", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, "overflow"},
		{"syntax", "domain: d\ndescriptors:\n  - key: a\n  rate_limit: [\n", 4, ""},
		{"empty key", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: x\n", 5, "descriptors[0].descriptors[0].key: required (a descriptor has an empty key)"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 5\n", 5, `descriptors[0].rate_limit.unit: invalid rate limit unit "minutes" (want second, minute, hour, day, week, month or year)`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n", 0, `descriptors[0].rate_limit.unit: invalid rate limit unit ""`},
		{"unit when unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", 6, "descriptors[0].rate_limit.unit: should not specify a rate limit unit when unlimited"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: x\n  - key: a\n    value: b\n", 6, "descriptors[2]: duplicate descriptor composite key 'd.a_b' (first at line 3)"},
		{"duplicate key only", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", 4, "descriptors[1]: duplicate descriptor composite key 'd.a' (first at line 3)"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n", 8, "descriptors[0].rate_limit.replaces[0].name: should not be empty"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: me\n", 9, `descriptors[0].rate_limit.replaces[0].name: should not be the rule's own name "me"`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", 5, `descriptors[0].share_threshold: only allowed with a wildcard value (one holding '*'), got value "b"`},
		{"zero multiplier", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      unit_multiplier: 0\n      requests_per_unit: 1\n", 6, "descriptors[0].rate_limit.unit_multiplier: must be >= 1, got 0"},
		{"window too long", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: year\n      unit_multiplier: 2\n      requests_per_unit: 1\n", 6, "descriptors[0].rate_limit.unit_multiplier: the window (2 x year) is longer than sluice's longest, 366 days"},
		{"window overflows", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: year\n      unit_multiplier: 4294967295\n      requests_per_unit: 1\n", 6, "descriptors[0].rate_limit.unit_multiplier: the window (4294967295 x year) is longer"},
		{"list of strings", "domain: d\ndescriptors:\n  - a\n", 3, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := rls.Parse(rls.File{Name: "rules/bad.yaml", Data: []byte(c.yaml)})
			var ce *rls.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v (%T), want a *rls.ConfigError", err, err)
			}
			if ce.File != "rules/bad.yaml" || ce.Line != c.line {
				t.Errorf("at %s:%d, want rules/bad.yaml:%d (%v)", ce.File, ce.Line, c.line, err)
			}
			if !strings.HasPrefix(err.Error(), "rules/bad.yaml:") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
	// A domain in two files.
	_, err := rls.Parse(rls.File{Name: "a.yaml", Data: []byte("domain: d\n")}, rls.File{Name: "b.yaml", Data: []byte("\ndomain: d\n")})
	if err == nil || err.Error() != `b.yaml:2:9: domain: duplicate domain "d" (also in a.yaml; set --rls-merge-domain-config to merge a domain's files)` {
		t.Errorf("duplicate domain: %v", err)
	}
}

// Values written as YAML numbers or booleans are strings, as with
// envoyproxy/ratelimit's loader; the metrics-only keys load.
func TestConfigScalarsAndMetricsKeys(t *testing.T) {
	cfg, err := rls.Parse(rls.File{Name: "s.yaml", Data: []byte(`
domain: s
descriptors:
  - key: port
    value: 443
    detailed_metric: true
    value_to_metric: true
    metadata: {team: web}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: flag
    value: true
    rate_limit: {unit: second, requests_per_unit: 2}
`)})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := cfg.Match("s", d("port", "443")); !ok || m.Rule.RequestsPerUnit != 1 {
		t.Errorf("port 443: %v %v", m, ok)
	}
	if m, ok := cfg.Match("s", d("flag", "true")); !ok || m.Rule.RequestsPerUnit != 2 {
		t.Errorf("flag true: %v %v", m, ok)
	}
	// Anchors and aliases.
	cfg, err = rls.Parse(rls.File{Name: "a.yaml", Data: []byte(`
domain: a
descriptors:
  - key: one
    rate_limit: &perMinute
      unit: minute
      requests_per_unit: 7
  - key: two
    rate_limit: *perMinute
`)})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := cfg.Match("a", d("two", "x")); !ok || m.Rule.RequestsPerUnit != 7 || m.Rule.Window != time.Minute {
		t.Errorf("alias: %+v %v", m.Rule, ok)
	}
}

func TestLoadFileAndDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.yml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("notes.txt", "not yaml")
	write(".hidden.yaml", "broken: [")
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := rls.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Domains(), ","); got != "a,b" {
		t.Errorf("domains = %s, want a,b", got)
	}
	if fs := cfg.Files(); len(fs) != 2 || filepath.Base(fs[0]) != "a.yaml" || filepath.Base(fs[1]) != "b.yml" {
		t.Errorf("files = %v", fs)
	}
	one, err := rls.Load(filepath.Join(dir, "b.yml"))
	if err != nil || strings.Join(one.Domains(), ",") != "b" {
		t.Errorf("one file: %v %v", one.Domains(), err)
	}
	write("c.yaml", "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if _, err := rls.Load(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "c.yaml")+":4:") {
		t.Errorf("bad file in dir: %v", err)
	}
	if _, err := rls.Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml: stat: no such file or directory") {
		t.Errorf("missing: %v", err)
	}
	empty := t.TempDir()
	// An empty directory loads no domains (every request OK), as in
	// envoyproxy/ratelimit: rules can be added while the node runs.
	if cfg, err := rls.Load(empty); err != nil || len(cfg.Domains()) != 0 || len(cfg.Files()) != 0 {
		t.Errorf("empty dir: %v %v", cfg.Domains(), err)
	}
	// The repository's example rules load.
	if _, err := rls.Load("../examples/rls"); err != nil {
		t.Errorf("examples/rls: %v", err)
	}
}

// Booleans as YAML 1.1 (and so envoyproxy/ratelimit) writes them.
func TestConfigYAML11Booleans(t *testing.T) {
	for _, c := range []struct {
		v      string
		shadow bool
	}{{"true", true}, {"yes", true}, {"Yes", true}, {"ON", true}, {"y", true}, {"false", false}, {"no", false}, {"Off", false}} {
		cfg, err := rls.Parse(rls.File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    shadow_mode: " + c.v + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n")})
		if err != nil {
			t.Fatalf("%s: %v", c.v, err)
		}
		if m, _ := cfg.Match("b", d("k", "x")); m.Rule.ShadowMode != c.shadow {
			t.Errorf("shadow_mode: %s gave %v", c.v, m.Rule.ShadowMode)
		}
	}
	_, err := rls.Parse(rls.File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n")})
	if err == nil || !strings.Contains(err.Error(), `want true or false, got "maybe"`) || !strings.HasPrefix(err.Error(), "b.yaml:4:") {
		t.Errorf("shadow_mode: maybe: %v", err)
	}
	cfg, err := rls.Parse(rls.File{Name: "u.yaml", Data: []byte("domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: yes}\n")})
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := cfg.Match("u", d("k", "x")); !m.Rule.Unlimited {
		t.Error("unlimited: yes is not unlimited")
	}
}

// A rule file holds one document: a second one (after ---) is refused,
// not ignored.
func TestConfigRefusesASecondDocument(t *testing.T) {
	_, err := rls.Parse(rls.File{Name: "two.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: b\n")})
	if err == nil || !strings.Contains(err.Error(), "second YAML document") {
		t.Fatalf("Parse of two documents: %v", err)
	}
}
