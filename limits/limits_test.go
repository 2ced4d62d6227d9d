package limits

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/window"
)

func TestParseAndResolve(t *testing.T) {
	set, err := Load("testdata/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Names(), ","); got != "api,auth.signup" {
		t.Fatalf("names = %s", got)
	}
	for _, tc := range []struct {
		name, key string
		want      Limit
		ok        bool
	}{
		{"api", "user:1", Limit{Algorithm: window.TokenBucket, Limit: 30, Window: time.Minute, Burst: 60}, true},
		{"api", "tier:pro:acme", Limit{Algorithm: window.TokenBucket, Limit: 300, Window: time.Minute, Burst: 600}, true},
		// The longest prefix wins, whatever the file's order.
		// An override that sets its limit and no burst: its burst is its limit.
		{"api", "tier:free:bob", Limit{Algorithm: window.TokenBucket, Limit: 100, Window: time.Minute}, true},
		{"auth.signup", "1.2.3.4", Limit{Algorithm: window.FixedWindow, Limit: 5, Window: time.Hour, Shadow: true}, true},
		{"nope", "k", Limit{}, false},
	} {
		got, ok := set.Resolve(tc.name, tc.key)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Resolve(%q, %q) = %+v, %v; want %+v, %v", tc.name, tc.key, got, ok, tc.want, tc.ok)
		}
	}
	var none *Set
	if _, ok := none.Resolve("api", "k"); ok || none.Has("api") {
		t.Error("a nil Set resolved a limit")
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"limits:\n  api:\n    limit: 0\n    window: 1m\n", "f.yaml:3: limits.api.limit: must be > 0, got 0"},
		{"limits:\n  api:\n    limit: 10\n    window: soon\n", `f.yaml:4: limits.api.window: not a duration (want e.g. 500ms, 1m, 1h): "soon"`},
		{"limits:\n  api:\n    limit: 10\n    window: -1m\n", "f.yaml:3: limits.api.window: must be > 0, got -1m0s"},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    limt: 3\n", "f.yaml:5: limits.api.limt: unknown field"},
		{"limits:\n  api:\n    window: 1m\n", "f.yaml:3: limits.api: limit is required"},
		{"limits:\n  api:\n    limit: 10\n", "f.yaml:3: limits.api: window is required"},
		{"limits:\n  api:\n    limit: ten\n    window: 1m\n", `f.yaml:3: limits.api.limit: must be a whole number, got "ten"`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    algorithm: gcra\n", `f.yaml:5: limits.api.algorithm: unknown algorithm "gcra"`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n  api:\n    limit: 5\n    window: 1m\n", `f.yaml:5: limits.api: given twice (also on line 2)`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    overrides:\n      - limit: 5\n", "f.yaml:6: limits.api.overrides[0].key_prefix: required"},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    overrides:\n      - key_prefix: a\n        limit: 5\n      - key_prefix: a\n        limit: 6\n", `f.yaml:8: limits.api.overrides[1].key_prefix: "a" is already overridden on line 6`},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    overrides:\n      - key_prefix: a\n        burst: -1\n", "f.yaml:6: limits.api.overrides[0].burst: must be >= 0, got -1"},
		{"limits:\n  api:\n    limit: 10\n    window: 1500us\n", "f.yaml:3: limits.api.window: must be a whole number of milliseconds, got 1.5ms"},
		{"limits:\n  api:\n    limit: 10\n    limit: 1000\n    window: 1m\n", "f.yaml:4: limits.api.limit: given twice (also on line 3)"},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n    burst: 20\n", "f.yaml:3: limits.api.burst: applies to token_bucket and leaky_bucket only, not fixed_window"},
		{"limits:\n  api:\n    limit: 10\n    window: 1m\n---\nlimits: {}\n", "f.yaml:5: a second YAML document"},
		{"limits:\n  " + strings.Repeat("n", 257) + ":\n    limit: 1\n    window: 1m\n", "a limit's name must be at most 256 bytes, got 257"},
		{"limits: [1, 2]\n", "f.yaml:1: limits: must be a mapping"},
		{"limit:\n  api: {}\n", "f.yaml:1: limit: unknown field (want limits)"},
		{"limits:\n  api: [\n", "f.yaml: yaml: line 2"},
	} {
		_, err := Parse("f.yaml", []byte(tc.file))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an ErrInvalid containing %q", tc.file, err, tc.want)
		}
	}
	for _, empty := range []string{"", "# nothing yet\n", "limits: {}\n"} {
		set, err := Parse("f.yaml", []byte(empty))
		if err != nil || len(set.Names()) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want an empty set", empty, set.Names(), err)
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // as editors and ConfigMaps do
		t.Fatal(err)
	}
}

func TestReloadKeepsTheRunningSetOnABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, "limits:\n  api:\n    limit: 10\n    window: 1m\n")
	src, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, "limits:\n  api:\n    limit: 0\n    window: 1m\n")
	if err := src.Reload(); err == nil || !strings.Contains(err.Error(), ":3: limits.api.limit") {
		t.Fatalf("Reload of a bad file = %v", err)
	}
	if l, _ := src.Current().Resolve("api", "k"); l.Limit != 10 {
		t.Fatalf("after a refused reload the limit is %d, want 10", l.Limit)
	}
	writeFile(t, path, "limits:\n  api:\n    limit: 20\n    window: 1m\n")
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if l, _ := src.Current().Resolve("api", "k"); l.Limit != 20 {
		t.Fatalf("after a reload the limit is %d, want 20", l.Limit)
	}
	if st := src.Stats(); st.Reloads != 2 || st.Failures != 1 || st.Limits != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.yaml"), quiet()); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
}

func TestWatchReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, "limits:\n  api:\n    limit: 10\n    window: 1m\n")
	src, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Watch(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The watch may not be in place yet: rewrite until it is seen.
	deadline := time.Now().Add(10 * time.Second)
	for {
		writeFile(t, path, "limits:\n  api:\n    limit: 42\n    window: 1m\n")
		time.Sleep(150 * time.Millisecond)
		if l, _ := src.Current().Resolve("api", "k"); l.Limit == 42 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change was not picked up within 10 s")
		}
	}
}

// A file without a limits: key (empty, or caught half-written) does not
// drop the limits in force; `limits: {}` does.
func TestReloadRefusesAnEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, "limits:\n  api:\n    limit: 10\n    window: 1m\n")
	src, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	for _, empty := range []string{"", "# being written\n"} {
		writeFile(t, path, empty)
		if err := src.Reload(); err == nil || !strings.Contains(err.Error(), "no limits: key") {
			t.Fatalf("reload of %q: %v", empty, err)
		}
		if !src.Current().Has("api") {
			t.Fatalf("reload of %q dropped the limits", empty)
		}
	}
	writeFile(t, path, "limits: {}\n")
	if err := src.Reload(); err != nil || src.Current().Has("api") {
		t.Fatalf("limits: {}: %v, api still there: %v", err, src.Current().Has("api"))
	}
}
