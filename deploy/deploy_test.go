// Package deploy holds the deployment files' tests: the Helm chart
// (deploy/helm/sluice, rendered with helm when it is installed), the plain
// manifests rendered from it (deploy/kubernetes) and the repository's
// docker-compose.yml must parse, strictly into the Kubernetes API types for
// the first two, and keep what running sluice relies on; a pod of the plain
// manifests is run on loopback as the kubelet would run it. (They cannot
// be applied here: no cluster, no registry.)
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// docs decodes every YAML document of path.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, d)
	}
}

// at walks m along path (map keys, or ints for list indexes).
func at(t *testing.T, m any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch p := p.(type) {
		case string:
			mm, ok := m.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not a mapping before %q", path, p)
			}
			m = mm[p]
		case int:
			l, ok := m.([]any)
			if !ok || p >= len(l) {
				t.Fatalf("at %v: no item %d", path, p)
			}
			m = l[p]
		}
	}
	return m
}

func TestComposeFile(t *testing.T) {
	d := docs(t, "../docker-compose.yml")[0]
	services := at(t, d, "services").(map[string]any)
	addrs := map[string]bool{}
	for _, name := range []string{"sluice1", "sluice2", "sluice3"} {
		s := services[name]
		if s == nil {
			t.Fatalf("no service %s", name)
		}
		env := at(t, s, "environment").(map[string]any)
		if env["SLUICE_NAME"] != name {
			t.Errorf("%s: SLUICE_NAME %v", name, env["SLUICE_NAME"])
		}
		ip := at(t, s, "networks", "sluice", "ipv4_address").(string)
		if env["SLUICE_ADVERTISE_ADDR"] != ip || addrs[ip] {
			t.Errorf("%s: advertises %v on %s (each node its own address)", name, env["SLUICE_ADVERTISE_ADDR"], ip)
		}
		addrs[ip] = true
		if join := env["SLUICE_JOIN"].(string); strings.Contains(join, name+":") {
			t.Errorf("%s joins itself: %s", name, join)
		}
	}
	for _, p := range at(t, services["sluice1"], "ports").([]any) {
		if !strings.HasPrefix(p.(string), "127.0.0.1:") {
			t.Errorf("port %v is published beyond loopback", p)
		}
	}
}
