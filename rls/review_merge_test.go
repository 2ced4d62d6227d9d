package rls_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

func reviewFile(name, body string) rls.File { return rls.File{Name: name, Data: []byte(body)} }

var reviewMerge = rls.LoadOptions{MergeDomains: true}

// Finding (low): with MergeDomains, the error for a domain's second
// on_owner_unavailable (or scope) names the domain's first file, even
// when that file sets none: one.yaml sets nothing, two.yaml deny,
// three.yaml allow; the error says allow "differs from the value of
// domain "m" in one.yaml", where the value is two.yaml's. Right: name
// the file that set the value it differs from (two.yaml).
func TestReviewMergeConflictNamesTheFileThatSetIt(t *testing.T) {
	for _, key := range []struct{ name, a, b string }{{"on_owner_unavailable", "deny", "allow"}, {"scope", "regional", "exact"}} {
		one := reviewFile("one.yaml", "domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
		two := reviewFile("two.yaml", "domain: m\n"+key.name+": "+key.a+"\n")
		three := reviewFile("three.yaml", "domain: m\n"+key.name+": "+key.b+"\n")
		_, err := reviewMerge.Parse(one, two, three)
		if err == nil || !strings.HasPrefix(err.Error(), "three.yaml:2:") {
			t.Fatalf("%s: %v, want an error at three.yaml:2", key.name, err)
		}
		if !strings.Contains(err.Error(), "two.yaml") {
			t.Errorf("%s: %q names %s, want two.yaml (the file whose value it differs from)", key.name, err, "one.yaml")
		}
	}
}

// Holds (pinned): a domain in three files merges, each file's rules
// matching; the same file given twice is a duplicate descriptor naming
// its line (merged) or a duplicate domain (not merged); a parent
// descriptor given by two files is a duplicate as at the peer; a
// policy or scope set by one file only applies to the whole domain, and
// the same value in two files is no conflict.
func TestReviewMergeDomains(t *testing.T) {
	files := []rls.File{
		reviewFile("a.yaml", "domain: m\nscope: regional\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"),
		reviewFile("b.yaml", "domain: m\non_owner_unavailable: deny\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"),
		reviewFile("c.yaml", "domain: m\nscope: regional\non_owner_unavailable: deny\ndescriptors:\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"),
	}
	cfg, err := reviewMerge.Parse(files...)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]uint32{"a": 1, "b": 2, "c": 3} {
		if m, found := cfg.Match("m", d(k, "v")); !found || m.Rule.RequestsPerUnit != want {
			t.Errorf("%s: %v %v, want a rule of %d", k, m.Rule, found, want)
		}
	}
	if cfg.OnOwnerUnavailable("m") != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY || cfg.Scope("m") != sluicev1.Scope_SCOPE_REGIONAL {
		t.Errorf("merged policy %s scope %s, want deny and regional", cfg.OnOwnerUnavailable("m"), cfg.Scope("m"))
	}
	if got := len(cfg.Files()); got != 3 || len(cfg.Domains()) != 1 || len(cfg.Rules()) != 3 {
		t.Errorf("files %v domains %v rules %d", cfg.Files(), cfg.Domains(), len(cfg.Rules()))
	}

	var ce *rls.ConfigError
	if _, err := reviewMerge.Parse(files[0], files[0]); !errors.As(err, &ce) || !strings.Contains(err.Error(), "a.yaml:4:") ||
		!strings.Contains(err.Error(), "duplicate descriptor composite key 'm.a' (first at line 4)") {
		t.Errorf("the same file twice, merged: %v", err)
	}
	if _, err := rls.Parse(files[0], files[0]); !errors.As(err, &ce) || !strings.Contains(err.Error(), `duplicate domain "m" (also in a.yaml`) {
		t.Errorf("the same file twice, not merged: %v", err)
	}
	p1 := reviewFile("p1.yaml", "domain: m\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: minute, requests_per_unit: 1}\n")
	p2 := reviewFile("p2.yaml", "domain: m\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: c\n        rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if _, err := reviewMerge.Parse(p1, p2); !errors.As(err, &ce) || !strings.Contains(err.Error(), "p2.yaml:3:") || !strings.Contains(err.Error(), "(first at p1.yaml:3)") {
		t.Errorf("a parent descriptor in two files: %v", err)
	}

	// A directory holding a file and a symbolic link to it: merged, a
	// duplicate descriptor naming both names.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), files[0].Data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.yaml", filepath.Join(dir, "b.yaml")); err != nil {
		t.Skip(err)
	}
	if _, err := reviewMerge.Load(dir); !errors.As(err, &ce) || !strings.Contains(err.Error(), "b.yaml:4:") || !strings.Contains(err.Error(), "a.yaml:4") {
		t.Errorf("a file and a link to it, merged: %v", err)
	}
}
