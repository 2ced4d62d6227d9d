package rls_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rls"
)

const (
	reloadA1 = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	reloadA3 = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	reloadB  = "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
)

// A Source's reload swaps the rules in whole for the requests after it; a
// bad file is refused with its error naming the file and line, and the
// rules in force stay; the Service follows the Source and counts both.
func TestSourceReloadSwapsOrRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", reloadA1)
	src, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(nil, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	s.Follow(src)
	codes := func(domain string, n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(call(t, s, domain, 0, desc("k", "v")).OverallCode.String()[:1])
		}
		return b.String()
	}
	if g := codes("a", 2); g != "OO" { // O: OK, then O of OVER_LIMIT
		t.Fatalf("limit 1: %s", g)
	}
	if got := call(t, s, "a", 0, desc("k", "w")).Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 1 {
		t.Fatalf("limit %d, want 1", got)
	}

	// A bad file: refused, the rules in force stay.
	write("a.yaml", reloadA3+"    bogus: 1\n")
	err = src.Reload()
	var ce *rls.ConfigError
	if !errors.As(err, &ce) || ce.File != filepath.Join(dir, "a.yaml") || ce.Line == 0 {
		t.Fatalf("bad reload: %v", err)
	}
	if got := call(t, s, "a", 0, desc("k", "x")).Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 1 {
		t.Fatalf("after a refused reload: limit %d, want 1 still", got)
	}

	// A good one, and a second domain: both in force at once.
	write("a.yaml", reloadA3)
	write("b.yaml", reloadB)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := call(t, s, "a", 0, desc("k", "y")).Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 3 {
		t.Fatalf("after the reload: limit %d, want 3", got)
	}
	if g := codes("b", 3); g != "OOO" || call(t, s, "b", 0, desc("k", "v")).OverallCode.String() != "OVER_LIMIT" {
		t.Fatalf("domain b: %s", g)
	}
	st := s.Stats()
	if st.ConfigLoads != 2 || st.ConfigLoadErrors != 1 || st.Domains != 2 {
		t.Errorf("stats: %+v, want 2 loads, 1 refused, 2 domains", st)
	}
	if d := s.Config().Dump(); !strings.Contains(d, "a.k: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false @ ") ||
		!strings.Contains(d, "b.k: unit=MINUTE requests_per_unit=2") {
		t.Errorf("dump:\n%s", d)
	}
}

// A node may start on an empty rule directory (every request OK), and
// Watch applies the rule files written into it while it runs, with no
// signal.
func TestSourceWatchesAnEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	src, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(nil, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	s.Follow(src)
	for range 5 {
		if r := call(t, s, "b", 0, desc("k", "v")); r.OverallCode != ok || r.Statuses[0].GetCurrentLimit() != nil {
			t.Fatalf("no rules: %v", r)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// The watch starts asynchronously: write until it has seen a write.
	deadline := time.Now().Add(20 * time.Second)
	for len(s.Config().Domains()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the rule file written into the watched directory was never applied")
		}
		if err := os.WriteFile(filepath.Join(dir, "b.yaml"), []byte(reloadB), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // polls the watch; moves no clock
	}
	if g := call(t, s, "b", 0, desc("k", "v")); g.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Fatalf("after the watch: %v", g)
	}
}

// Several files of one domain merge with MergeDomains (MERGE_DOMAIN_CONFIG)
// and are refused without it; a descriptor given by both is refused,
// naming both files.
func TestMergeDomains(t *testing.T) {
	one := rls.File{Name: "one.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")}
	two := rls.File{Name: "two.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")}
	if _, err := rls.Parse(one, two); err == nil || !strings.Contains(err.Error(), `duplicate domain "m" (also in one.yaml`) {
		t.Fatalf("without merging: %v", err)
	}
	cfg, err := rls.LoadOptions{MergeDomains: true}.Parse(one, two)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]uint32{"a": 1, "b": 2} {
		if m, found := cfg.Match("m", d(k, "v")); !found || m.Rule.RequestsPerUnit != want {
			t.Errorf("%s: %v %v", k, m.Rule, found)
		}
	}
	dup := rls.File{Name: "three.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")}
	if _, err := (rls.LoadOptions{MergeDomains: true}).Parse(one, dup); err == nil ||
		!strings.Contains(err.Error(), "three.yaml:3:") || !strings.Contains(err.Error(), "(first at one.yaml:3)") {
		t.Fatalf("a descriptor in two files: %v", err)
	}
	policy := rls.File{Name: "four.yaml", Data: []byte("domain: m\non_owner_unavailable: deny\n")}
	allow := rls.File{Name: "five.yaml", Data: []byte("domain: m\non_owner_unavailable: allow\n")}
	if _, err := (rls.LoadOptions{MergeDomains: true}).Parse(policy, allow); err == nil || !strings.Contains(err.Error(), "five.yaml") {
		t.Fatalf("two policies of one domain: %v", err)
	}
}
