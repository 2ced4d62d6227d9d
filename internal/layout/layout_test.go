// Package layout holds tests of the repository's shape: which package may
// import what (DESIGN.md, "Packages").
package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportDirections fails when window or ring gains network, logging or
// other non-allowed dependencies, cluster depends on anything of ours, or
// client, middleware or proxyrules reach past rpc's generated types.
func TestImportDirections(t *testing.T) {
	// OpenTelemetry's tracing API (no SDK, no exporter), which the client,
	// the middleware and the proxy's rules reach through the client's
	// optional TracerProvider (issue 22); its attributes hash with xxhash.
	otelAPI := []string{"go.opentelemetry.io/otel/attribute", "go.opentelemetry.io/otel/codes", "go.opentelemetry.io/otel/baggage",
		"go.opentelemetry.io/otel/trace", "go.opentelemetry.io/otel/propagation", "go.opentelemetry.io/otel/semconv/",
		"go.opentelemetry.io/otel/internal/", "github.com/cespare/xxhash/v2"}
	allowed := map[string][]string{
		// the package: prefixes of the non-standard imports it may have (transitively)
		"github.com/sluicehq/sluice/window": {"github.com/sluicehq/sluice/window"},
		// region: the region list and slices, pure (xxhash for the keys' seeds)
		"github.com/sluicehq/sluice/region": {"github.com/sluicehq/sluice/region", "github.com/cespare/xxhash/v2"},
		// region/lease: the leases' state machines, pure (standard library only)
		"github.com/sluicehq/sluice/region/lease": {"github.com/sluicehq/sluice/region/lease"},
		"github.com/sluicehq/sluice/ring":         {"github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "github.com/cespare/xxhash/v2"},
		"github.com/sluicehq/sluice/cluster":      {"github.com/sluicehq/sluice/cluster", "github.com/hashicorp/", "github.com/armon/", "github.com/google/btree", "github.com/miekg/dns", "github.com/sean-/seed", "golang.org/x/"},
		// rpc's forward room: gRPC and the generated types, never rpc itself (no room imports rpc)
		"github.com/sluicehq/sluice/rpc/internal/forward": {"github.com/sluicehq/sluice/rpc/internal/forward", "github.com/sluicehq/sluice/rpc/sluicev1", "google.golang.org/", "golang.org/x/", "github.com/planetscale/vtprotobuf/protohelpers"},
		// the SDK: rpc's generated types and gRPC, never the server, memberlist or the windows
		// (vtprotobuf's helpers come with the generated types' fast marshalling code)
		"github.com/sluicehq/sluice/client":     slices.Concat([]string{"github.com/sluicehq/sluice/client", "github.com/sluicehq/sluice/rpc/sluicev1", "github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "github.com/cespare/xxhash/v2", "google.golang.org/", "golang.org/x/", "github.com/planetscale/vtprotobuf/protohelpers"}, otelAPI),
		"github.com/sluicehq/sluice/middleware": slices.Concat([]string{"github.com/sluicehq/sluice/middleware", "github.com/sluicehq/sluice/client", "github.com/sluicehq/sluice/rpc/sluicev1", "github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "google.golang.org/", "golang.org/x/", "github.com/dunglas/httpsfv", "github.com/planetscale/vtprotobuf/protohelpers"}, otelAPI),
		// the scenario runner and its oracle: pure (the windows, the region list, YAML); the
		// command drives real nodes through a Target of its own
		"github.com/sluicehq/sluice/scenario": {"github.com/sluicehq/sluice/scenario", "github.com/sluicehq/sluice/window", "github.com/sluicehq/sluice/region", "github.com/cespare/xxhash/v2", "go.yaml.in/yaml/v3"},
		// the proxy's rules file: the middleware it configures, the limits file it reads (with
		// limits' own window, file watching and YAML), never the server
		// rpc's pure rooms: no gRPC (nor rpc's generated types, which
		// bring it), memberlist or Prometheus; the windows and the ring only
		"github.com/sluicehq/sluice/rpc/internal/custody":  {"github.com/sluicehq/sluice/rpc/internal/custody", "github.com/sluicehq/sluice/window", "github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "github.com/cespare/xxhash/v2"},
		"github.com/sluicehq/sluice/rpc/internal/ringview": {"github.com/sluicehq/sluice/rpc/internal/ringview", "github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "github.com/cespare/xxhash/v2"},
		"github.com/sluicehq/sluice/proxyrules":            slices.Concat([]string{"github.com/sluicehq/sluice/proxyrules", "github.com/sluicehq/sluice/middleware", "github.com/sluicehq/sluice/client", "github.com/sluicehq/sluice/ring", "github.com/buraksezer/consistent", "github.com/sluicehq/sluice/limits", "github.com/sluicehq/sluice/region", "github.com/cespare/xxhash/v2", "github.com/sluicehq/sluice/window", "github.com/sluicehq/sluice/internal/filewatch", "github.com/sluicehq/sluice/rpc/sluicev1", "github.com/fsnotify/fsnotify", "go.yaml.in/yaml/v3", "google.golang.org/", "golang.org/x/", "github.com/dunglas/httpsfv", "github.com/planetscale/vtprotobuf/protohelpers"}, otelAPI),
	}
	for pkg, prefixes := range allowed {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			ok := false
			for _, p := range prefixes {
				ok = ok || strings.HasPrefix(dep, p)
			}
			if !ok {
				t.Errorf("%s depends on %s, which it may not", pkg, dep)
			}
		}
	}
}

// TestRoomsDoNotImportRPC fails when a package under rpc/internal (rpc's
// rooms, e.g. rpc/internal/security) depends on package rpc itself: the
// rooms serve rpc, never the other way round.
func TestRoomsDoNotImportRPC(t *testing.T) {
	const rpc = "github.com/sluicehq/sluice/rpc"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, rpc+"/internal/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if !strings.Contains(string(out), rpc+"/internal/security ") {
		t.Fatalf("go list lists no rpc/internal/security:\n%s", out)
	}
	for _, line := range lines {
		deps := strings.Fields(line)
		for _, dep := range deps[1:] {
			if dep == rpc {
				t.Errorf("%s depends on %s, which it may not", deps[0], rpc)
			}
		}
	}
}
