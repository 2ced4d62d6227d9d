package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func settings(kv ...string) []debug.BuildSetting {
	var out []debug.BuildSetting
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// Where each field comes from, for each way sluice is built.
func TestFrom(t *testing.T) {
	commit := "ac2685f4f9965042e3098a30ce754374ba85cda0"
	at := time.Date(2026, 12, 3, 7, 32, 54, 0, time.UTC)
	checkout := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203073254-ac2685f4f996+dirty"},
		Settings: settings("vcs", "git", "vcs.revision", commit, "vcs.time", "2026-12-03T07:32:54Z", "vcs.modified", "true")}
	tests := []struct {
		name              string
		version, revision string // stamped
		bi                *debug.BuildInfo
		want              Info
	}{
		{"make build: git describe and the commit stamped", "v0.3.0-4-g2401e1f", commit, &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Version: "v0.3.0-4-g2401e1f", Revision: commit, GoVersion: "go1.26.8"}},
		{"make build before the first tag, uncommitted changes", "2401e1f-dirty", "", nil,
			Info{Version: "2401e1f-dirty", Modified: true, GoVersion: runtime.Version()}},
		{"go install ...@v0.3.0", "", "", &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Version: "v0.3.0"}},
			Info{Version: "v0.3.0", GoVersion: "go1.26.7"}},
		{"go install ...@latest before the first tag: a pseudo-version", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261203073254-ac2685f4f996"}},
			Info{Version: "v0.0.0-20261203073254-ac2685f4f996", Revision: "ac2685f4f996", GoVersion: "go1.26.8"}},
		{"go build in a checkout (VCS stamping)", "", "", checkout,
			Info{Version: "v0.0.0-20261203073254-ac2685f4f996+dirty", Revision: commit, Time: at, Modified: true, GoVersion: "go1.26.8"}},
		{"stamped wins over the toolchain's", "v1.0.0", "abc", checkout,
			Info{Version: "v1.0.0", Revision: "abc", Time: at, Modified: true, GoVersion: "go1.26.8"}},
		{"go build without VCS stamping", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Version: Unknown, GoVersion: "go1.26.8"}},
		{"a tag with a slash and spaces, made fit to gossip", "release/v1 rc", "", nil,
			Info{Version: "release-v1-rc", GoVersion: runtime.Version()}},
		{"too long, cut", strings.Repeat("v", 70), "", nil,
			Info{Version: strings.Repeat("v", MaxVersionBytes), GoVersion: runtime.Version()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := From(tt.version, tt.revision, tt.bi); got != tt.want {
				t.Fatalf("From = %+v\nwant   %+v", got, tt.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	i := Info{Version: "v0.3.0", Revision: "ac2685f4f996", Time: time.Date(2026, 12, 3, 7, 32, 54, 0, time.UTC), Modified: true, GoVersion: "go1.26.8"}
	want := "sluice v0.3.0\nrevision ac2685f4f996 (2026-12-03T07:32:54Z, modified)\ngo1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if got := i.String(); got != want {
		t.Fatalf("String:\n%s\nwant\n%s", got, want)
	}
	if got := (Info{Version: Unknown, GoVersion: "go1.26.8"}).String(); !strings.Contains(got, "sluice devel\nrevision unknown\n") {
		t.Fatalf("String of an unknown build:\n%s", got)
	}
}

// The test binary itself: Read fills the Go version at least.
func TestRead(t *testing.T) {
	got := Read("", "")
	if got.GoVersion != runtime.Version() || got.Version == "" {
		t.Fatalf("Read = %+v, want a version and the Go version %s", got, runtime.Version())
	}
}
