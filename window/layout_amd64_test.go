package window

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// The CPUID test for PREFETCHW agrees with what Linux read from CPUID.
func TestHasPrefetchWMatchesLinux(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/cpuinfo")
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip(err)
	}
	var flags []string
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = strings.Fields(v)
			break
		}
	}
	if flags == nil {
		t.Skip("no flags line in /proc/cpuinfo")
	}
	linux := false
	for _, f := range flags {
		linux = linux || f == "3dnowprefetch"
	}
	if hasPrefetchW != linux {
		t.Fatalf("hasPrefetchW = %v, but /proc/cpuinfo shows 3dnowprefetch: %v", hasPrefetchW, linux)
	}
}
