package rls_test

import (
	"os/exec"
	"strings"
	"testing"
)

// rls reaches the cluster only through its Checker: it imports sluice's
// generated types and the file watch its rules reload by, never the
// server, the windows, the ring or memberlist (STYLE.md, "One direction").
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/sluicehq/sluice/rls").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/sluicehq/sluice/rls", dep == "github.com/sluicehq/sluice/rpc/sluicev1",
			dep == "github.com/sluicehq/sluice/internal/filewatch":
		case strings.HasPrefix(dep, "github.com/sluicehq/"):
			t.Errorf("rls depends on %s", dep)
		case strings.HasPrefix(dep, "github.com/hashicorp/"), strings.HasPrefix(dep, "github.com/buraksezer/"):
			t.Errorf("rls depends on %s", dep)
		}
	}
}
