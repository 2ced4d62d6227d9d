// Package deploy holds the deployment files' tests: deploy/kubernetes and
// the repository's docker-compose.yml must parse and keep what running
// sluice relies on. (They cannot be applied here: no cluster, no registry.)
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

func TestKubernetesManifests(t *testing.T) {
	byKind := map[string]map[string]any{}
	for _, d := range docs(t, "kubernetes/sluice.yaml") {
		for _, f := range []string{"apiVersion", "kind", "metadata"} {
			if d[f] == nil {
				t.Fatalf("a document has no %s: %v", f, d)
			}
		}
		kind := d["kind"].(string)
		if kind == "Service" && at(t, d, "spec", "clusterIP") == "None" {
			kind = "HeadlessService"
		}
		byKind[kind] = d
	}
	for _, k := range []string{"HeadlessService", "Service", "StatefulSet", "PodDisruptionBudget"} {
		if byKind[k] == nil {
			t.Fatalf("no %s", k)
		}
	}
	if at(t, byKind["HeadlessService"], "spec", "publishNotReadyAddresses") != true {
		t.Error("the gossip Service must publish pods before they are ready, or the first nodes never find each other")
	}
	ss := byKind["StatefulSet"]
	if at(t, ss, "spec", "serviceName") != at(t, byKind["HeadlessService"], "metadata", "name") {
		t.Error("the StatefulSet's serviceName is not the headless Service")
	}
	pod := at(t, ss, "spec", "template", "spec")
	if g := at(t, pod, "terminationGracePeriodSeconds").(int); g <= 15 {
		t.Errorf("terminationGracePeriodSeconds %d: must outlast the leave (5 s) and the hand-off (10 s)", g)
	}
	c := at(t, pod, "containers", 0)
	// Readiness is gRPC health (SERVING once joined and settled);
	// liveness must not be, or a node still joining would be restarted.
	if at(t, c, "readinessProbe", "grpc", "port") != 7070 {
		t.Error("readinessProbe is not a gRPC health probe on 7070")
	}
	if at(t, c, "livenessProbe", "grpc") != nil {
		t.Error("livenessProbe is gRPC health, which is readiness: a node still joining would be killed")
	}
	if at(t, c, "livenessProbe", "httpGet", "path") != "/healthz" {
		t.Error("livenessProbe is not GET /healthz")
	}
	ports := map[any]any{}
	for _, p := range at(t, c, "ports").([]any) {
		ports[at(t, p, "name")] = at(t, p, "containerPort")
	}
	if port := at(t, c, "livenessProbe", "httpGet", "port"); port != 7080 && ports[port] != 7080 {
		t.Errorf("livenessProbe on port %v, want the HTTP port 7080", port)
	}
	env := map[string]any{}
	for _, e := range at(t, c, "env").([]any) {
		env[at(t, e, "name").(string)] = e
	}
	if v := at(t, env["SLUICE_HTTP_ADDR"], "value"); v != "0.0.0.0:7080" {
		t.Errorf("SLUICE_HTTP_ADDR %v: the liveness probe needs HTTP on 0.0.0.0:7080", v)
	}
	for _, name := range []string{"SLUICE_NAME", "SLUICE_ADVERTISE_ADDR", "SLUICE_JOIN", "SLUICE_GRPC_ADDR", "SLUICE_GOSSIP_ADDR"} {
		if env[name] == nil {
			t.Errorf("the container does not set %s", name)
		}
	}
	if at(t, env["SLUICE_NAME"], "valueFrom", "fieldRef", "fieldPath") != "metadata.name" {
		t.Error("SLUICE_NAME must be the pod's (stable) name")
	}
	if at(t, byKind["PodDisruptionBudget"], "spec", "maxUnavailable") != 1 {
		t.Error("the PodDisruptionBudget must allow one node down at a time")
	}
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
