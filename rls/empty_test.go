package rls_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rls"
)

// peerRoot is envoyproxy/ratelimit's own integration runtime, unchanged:
// RUNTIME_ROOT=peerRoot, RUNTIME_SUBDIRECTORY=ratelimit; the peer reads
// the 3 files of ratelimit/config (11 rules), not ratelimit/reload.yaml.
const peerRoot = "testdata/envoyproxy-ratelimit/test/integration/runtime/current"

// loadErr loads path and returns its *ConfigError's message, failing the
// test when the load passes or fails otherwise.
func loadErr(t *testing.T, path string) string {
	t.Helper()
	cfg, err := rls.Load(path)
	var ce *rls.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Load(%s): %v rules, error %v; want a *ConfigError", path, len(cfg.Rules()), err)
	}
	if ce.File != path {
		t.Errorf("Load(%s): the error names %q, want the path", path, ce.File)
	}
	return err.Error()
}

// wantAll fails the test unless msg holds every part.
func wantAll(t *testing.T, what, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("%s: %q\nlacks %q", what, msg, p)
		}
	}
}

// The peer's runtime root, given as --rls-config, loads no rule: refused,
// naming the files below that are not read and the config/ directory to
// pass; the peer's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY (which holds a rule
// file of its own beside config/, which the peer does not read) is
// refused too, naming the same directory; that directory loads the
// peer's 11 rules.
func TestLoadPeerRuntimeLayout(t *testing.T) {
	cfgDir := filepath.Join(peerRoot, "ratelimit", "config")
	msg := loadErr(t, peerRoot)
	wantAll(t, "the runtime root", msg,
		peerRoot+": no rules: 4 rule files below it are not read",
		filepath.Join(cfgDir, "another.yaml"), filepath.Join(cfgDir, "basic.yaml"), filepath.Join(cfgDir, "share_threshold.yaml"),
		filepath.Join(peerRoot, "ratelimit", "reload.yaml"),
		"envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml: pass --rls-config "+cfgDir)

	sub := filepath.Join(peerRoot, "ratelimit")
	msg = loadErr(t, sub)
	wantAll(t, "root/subdirectory", msg,
		sub+": its config/ directory holds 3 rule files that are not read ("+filepath.Join(cfgDir, "another.yaml")+", ",
		"pass --rls-config "+cfgDir+" (or move config/ out of "+sub+")")

	cfg, err := rls.Load(cfgDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(cfg.Rules()); got != 11 || strings.Join(cfg.Domains(), ",") != "another,basic,share-threshold-test" {
		t.Fatalf("%s: %d rules of %v, want the peer's 11 of [another basic share-threshold-test]", cfgDir, got, cfg.Domains())
	}
}

// The same below a symbolic link (a runtime root's "current" often is
// one), with two subdirectories (two services' rules): both config/
// directories are named, and Open refuses to start on it.
func TestLoadPeerLayoutBehindSymlink(t *testing.T) {
	root := t.TempDir()
	for _, svc := range []string{"a", "b"} {
		d := filepath.Join(root, "v1", svc, "config")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, svc+".yaml"), []byte(reloadA1), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	cur := filepath.Join(root, "current")
	msg := loadErr(t, cur)
	wantAll(t, "two services", msg, "no rules: 2 rule files below it are not read",
		filepath.Join(cur, "a", "config", "a.yaml"), filepath.Join(cur, "b", "config", "b.yaml"),
		"pass the config/ directory of the peer's RUNTIME_SUBDIRECTORY as --rls-config: "+
			filepath.Join(cur, "a", "config")+" or "+filepath.Join(cur, "b", "config"))
	if src, err := rls.Open(cur, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); err == nil || src != nil {
		t.Fatalf("Open: %v %v, want refused", src, err)
	}
}

// Rule files that give no rule (a domain with no rate_limit) are refused,
// naming them, in a directory and alone; an empty directory, or one whose
// only YAML is in a dot directory (a ConfigMap volume's internals), loads
// with no rules; a file below that is not in a config/ directory is named
// with its own directory to pass.
func TestLoadNoRules(t *testing.T) {
	write := func(path, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const noRule = "domain: d\ndescriptors:\n  - key: k\n"

	dir := t.TempDir()
	write(filepath.Join(dir, "a.yaml"), noRule)
	write(filepath.Join(dir, "b.yml"), "domain: e\n")
	wantAll(t, "two files, no rule", loadErr(t, dir),
		dir+": no rules: its 2 rule files give no rate_limit ("+filepath.Join(dir, "a.yaml")+", "+filepath.Join(dir, "b.yml")+")")
	wantAll(t, "one file, no rule", loadErr(t, filepath.Join(dir, "a.yaml")),
		filepath.Join(dir, "a.yaml")+": no rules: the file gives no rate_limit")

	empty := t.TempDir()
	write(filepath.Join(empty, "..2026_01_01", "r.yaml"), reloadA1)
	write(filepath.Join(empty, "notes.txt"), "not a rule file")
	if cfg, err := rls.Load(empty); err != nil || len(cfg.Rules()) != 0 || len(cfg.Files()) != 0 {
		t.Fatalf("an empty directory: %v %v, want no rules and no error", cfg, err)
	}

	nested := t.TempDir()
	write(filepath.Join(nested, "rules", "r.yaml"), reloadA1)
	wantAll(t, "a rules/ subdirectory", loadErr(t, nested),
		"no rules: 1 rule file below it is not read ("+filepath.Join(nested, "rules", "r.yaml"),
		"pass --rls-config "+filepath.Join(nested, "rules")+" to read them")
}

// A reload that would load no rule while rule files exist below is
// refused: the rules in force stay, counted as a refused load, and the
// Service still says how many rules are in force.
func TestReloadToNoRulesIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(reloadA1), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(nil, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	s.Follow(src)
	if st := s.Stats(); st.Rules != 1 || st.Domains != 1 {
		t.Fatalf("stats: %+v, want 1 rule in 1 domain", st)
	}
	// The file moves into config/, as the peer's layout has it.
	if err := os.Mkdir(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "a.yaml"), filepath.Join(dir, "config", "a.yaml")); err != nil {
		t.Fatal(err)
	}
	err = src.Reload()
	if err == nil || !strings.Contains(err.Error(), "pass --rls-config "+filepath.Join(dir, "config")) {
		t.Fatalf("reload: %v, want refused naming %s", err, filepath.Join(dir, "config"))
	}
	if g := call(t, s, "a", 0, desc("k", "v")).Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); g != 1 {
		t.Fatalf("after the refused reload: limit %d, want 1 still", g)
	}
	if st := s.Stats(); st.Rules != 1 || st.ConfigLoads != 1 || st.ConfigLoadErrors != 1 {
		t.Fatalf("stats: %+v, want 1 rule in force, 1 load, 1 refused", st)
	}
}
