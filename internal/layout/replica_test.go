package layout

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReplicaImports fails when rpc/internal/replica reaches the node it
// serves (package rpc), gossip (memberlist, cluster) or Prometheus: it
// sees the node only through the interfaces it declares. rpc's generated
// types (and through them gRPC) are its Replicator's to send with.
func TestReplicaImports(t *testing.T) {
	const pkg = "github.com/sluicehq/sluice/rpc/internal/replica"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pkg, err, out)
	}
	ours := []string{pkg, "github.com/sluicehq/sluice/window", "github.com/sluicehq/sluice/ring", "github.com/sluicehq/sluice/rpc/sluicev1"}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, "github.com/hashicorp/"), strings.HasPrefix(dep, "github.com/prometheus/"):
			t.Errorf("%s depends on %s, which it may not", pkg, dep)
		case strings.HasPrefix(dep, "github.com/sluicehq/sluice/"):
			ok := false
			for _, p := range ours {
				ok = ok || dep == p
			}
			if !ok {
				t.Errorf("%s depends on %s, which it may not (of this module: window, ring and rpc's generated types only)", pkg, dep)
			}
		}
	}
}
