// Package buildinfo says which build of sluice a binary is: its version,
// the commit it was built from and the Go toolchain. Each comes from what
// the build stamped with -ldflags -X (make build and make docker stamp
// git describe and the commit), else from what the Go toolchain recorded
// in the binary (runtime/debug.ReadBuildInfo: the module version for
// `go install ...@v1.2.3` or a pseudo-version, the VCS revision, time and
// modified flag for a build in a checkout).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/module"
)

// Unknown is the Version of a build that nothing says the version of (a
// `go build` or `go run` outside make, without VCS stamping).
const Unknown = "devel"

// MaxVersionBytes is the longest Version; it is gossiped in the node's
// metadata.
const MaxVersionBytes = 64

// Info describes one build. It is a plain value, safe to copy.
type Info struct {
	// Version is the release ("v0.3.0"), git describe of the commit built
	// ("v0.3.0-4-g2401e1f", "2401e1f-dirty" before the first tag), the
	// Go module version (a pseudo-version such as
	// "v0.0.0-20261203073254-ac2685f4f996"), or Unknown. It holds at most
	// MaxVersionBytes bytes of [A-Za-z0-9._+-]: any other byte of what
	// was stamped becomes '-'.
	Version string
	// Revision is the commit built (a full or abbreviated hash), "" when
	// unknown.
	Revision string
	// Time is the commit's time, the zero Time when unknown.
	Time time.Time
	// Modified is true when the build's tree had uncommitted changes (the
	// VCS said so, or the version ends in -dirty or +dirty).
	Modified bool
	// GoVersion is the toolchain that built the binary, e.g. "go1.26.8".
	GoVersion string
}

// Read returns this binary's Info. version and revision are what the
// build stamped with -ldflags -X ("" each when nothing was).
func Read(version, revision string) Info {
	bi, _ := debug.ReadBuildInfo()
	return From(version, revision, bi)
}

// From returns the Info of a build that stamped version and revision
// ("" each: not stamped) and whose toolchain recorded bi (nil: nothing).
// A stamped field wins over bi's; a module version of "(devel)" says
// nothing.
func From(version, revision string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Revision == "" {
					info.Revision = s.Value
				}
			case "vcs.time":
				info.Time, _ = time.Parse(time.RFC3339, s.Value)
			case "vcs.modified":
				info.Modified, _ = strconv.ParseBool(s.Value)
			}
		}
		if v := bi.Main.Version; info.Version == "" && v != "" && v != "(devel)" {
			info.Version = v
			if info.Revision == "" && module.IsPseudoVersion(v) {
				info.Revision, _ = module.PseudoVersionRev(v)
			}
		}
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	info.Version = token(info.Version)
	if strings.HasSuffix(info.Version, "-dirty") || strings.HasSuffix(info.Version, "+dirty") {
		info.Modified = true
	}
	return info
}

// token returns v with every byte outside [A-Za-z0-9._+-] replaced by
// '-', cut to MaxVersionBytes.
func token(v string) string {
	b := []byte(v)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == '+') {
			b[i] = '-'
		}
	}
	if len(b) > MaxVersionBytes {
		b = b[:MaxVersionBytes]
	}
	return string(b)
}

// String returns the lines `sluice --version` prints, e.g.
//
//	sluice v0.3.0
//	revision 2401e1f0c0ffee... (2026-12-03T07:32:54Z, modified)
//	go1.26.8 linux/amd64
//
// ("revision unknown" when it is).
func (i Info) String() string {
	rev := "unknown"
	if i.Revision != "" {
		rev = i.Revision
		var notes []string
		if !i.Time.IsZero() {
			notes = append(notes, i.Time.UTC().Format(time.RFC3339))
		}
		if i.Modified {
			notes = append(notes, "modified")
		}
		if len(notes) > 0 {
			rev += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return fmt.Sprintf("sluice %s\nrevision %s\n%s %s/%s\n", i.Version, rev, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}
