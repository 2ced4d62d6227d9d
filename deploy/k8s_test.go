package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
)

// chartDir is the Helm chart, relative to this package.
const chartDir = "helm/sluice"

// The image the tests and the plain manifests render with: the chart
// has no default (there is no published image).
var imageArgs = []string{"--set", "image.repository=registry.invalid/sluice", "--set", "image.tag=dev"}

// scheme knows the kinds the chart may render; decoding any other kind
// fails.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strictDecoder decodes YAML into the Kubernetes API type of its
// apiVersion and kind, refusing unknown and duplicate fields.
var strictDecoder = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
	kjson.SerializerOptions{Yaml: true, Strict: true})

// manifests are the typed objects of one render (or one file), by name.
type manifests struct {
	namespaces      map[string]*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	services        map[string]*corev1.Service
	statefulSets    map[string]*appsv1.StatefulSet
	pdbs            map[string]*policyv1.PodDisruptionBudget
	networkPolicies map[string]*networkingv1.NetworkPolicy
	// monitoring holds prometheus-operator's objects (ServiceMonitor,
	// PrometheusRule) by kind/name, as YAML: the Kubernetes API types do
	// not have them (monitoring_test.go decodes them strictly).
	monitoring map[string][]byte
}

// decodeManifests decodes every YAML document of data strictly into its
// Kubernetes type (what is the source, for messages). Every object but a
// Namespace must be in namespace ns; no kind and name may repeat.
func decodeManifests(t *testing.T, what string, data []byte, ns string) *manifests {
	t.Helper()
	m := &manifests{
		namespaces: map[string]*corev1.Namespace{}, serviceAccounts: map[string]*corev1.ServiceAccount{},
		configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{},
		statefulSets: map[string]*appsv1.StatefulSet{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{},
		monitoring:      map[string][]byte{},
	}
	r := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	seen := map[string]bool{}
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", what, i, err)
		}
		if j, err := yaml.YAMLToJSON(doc); err != nil {
			t.Fatalf("%s: document %d: %v", what, i, err)
		} else if string(j) == "null" {
			continue // comments only
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: document %d: %v", what, i, err)
		}
		if tm.APIVersion == "monitoring.coreos.com/v1" && (tm.Kind == "ServiceMonitor" || tm.Kind == "PrometheusRule") {
			key := tm.Kind + "/" + tm.Metadata.Name
			if tm.Metadata.Name == "" || m.monitoring[key] != nil {
				t.Fatalf("%s: document %d: %s without a name, or twice", what, i, key)
			}
			if tm.Metadata.Namespace != ns {
				t.Errorf("%s: %s is in namespace %q, want %q", what, key, tm.Metadata.Namespace, ns)
			}
			m.monitoring[key] = doc
			continue
		}
		obj, gvk, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: document %d does not decode strictly into a Kubernetes type: %v\n%s", what, i, err, doc)
		}
		meta, ok := obj.(interface {
			GetName() string
			GetNamespace() string
		})
		if !ok || meta.GetName() == "" {
			t.Fatalf("%s: document %d (%s) has no name", what, i, gvk.Kind)
		}
		name := meta.GetName()
		if key := gvk.Kind + "/" + name; seen[key] {
			t.Fatalf("%s: %s twice", what, key)
		} else {
			seen[key] = true
		}
		if gvk.Kind != "Namespace" && meta.GetNamespace() != ns {
			t.Errorf("%s: %s %s is in namespace %q, want %q", what, gvk.Kind, name, meta.GetNamespace(), ns)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			m.namespaces[name] = o
		case *corev1.ServiceAccount:
			m.serviceAccounts[name] = o
		case *corev1.ConfigMap:
			m.configMaps[name] = o
		case *corev1.Service:
			m.services[name] = o
		case *appsv1.StatefulSet:
			m.statefulSets[name] = o
		case *policyv1.PodDisruptionBudget:
			m.pdbs[name] = o
		case *networkingv1.NetworkPolicy:
			m.networkPolicies[name] = o
		default:
			t.Fatalf("%s: document %d: unexpected kind %s (a Secret or another object the chart must not render)", what, i, gvk)
		}
	}
	return m
}

// helmBinary returns the helm to run: $SLUICE_HELM, else helm on PATH.
// Without one the test is skipped, or fails when SLUICE_HELM_REQUIRED is
// set (make helm-check).
func helmBinary(t *testing.T) string {
	t.Helper()
	name := os.Getenv("SLUICE_HELM")
	if name == "" {
		name = "helm"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("SLUICE_HELM_REQUIRED") != "" {
			t.Fatalf("helm not found (%v): make helm-tools installs it", err)
		}
		t.Skipf("helm not found (%v); make helm-tools installs it, make helm-check runs these tests with it", err)
	}
	return path
}

// render runs helm template on the chart as release "sluice" in namespace
// "sluice" with args; the error holds helm's stderr.
func render(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), append([]string{"template", "sluice", chartDir, "--namespace", "sluice"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, stderr.String())
	}
	return out, nil
}

// mustRender renders with the image and args, and decodes the result.
func mustRender(t *testing.T, args ...string) *manifests {
	t.Helper()
	out, err := render(t, append(slices.Clone(imageArgs), args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return decodeManifests(t, fmt.Sprintf("helm template %v", args), out, "sluice")
}

// want is what a render's secured node must look like.
type want struct {
	fullname    string // the objects' name; default "sluice"
	statefulSet string // the StatefulSet's (its pods' prefix); default fullname
	clientAuth  string // mtls, token or either
	tlsMode     string // issue or provided
	rls         bool   // rule files given: the RLS ConfigMap mounted and passed
	goMemLimit  string // GOMEMLIMIT; "" for none
	replicas    int32
	seeds       int      // this release's pods in SLUICE_JOIN
	remoteSeeds []string // the seeds after them (regions.seeds)
	noState     bool     // state.enabled false: no claim, no --state-dir
	advertise   string   // advertise.mode; default podIP
	regionPeers bool     // regions.peers: gossip and the peer port open to them too
}

// pod is the sluice StatefulSet's pod template with its containers.
type pod struct {
	m    *manifests
	ss   *appsv1.StatefulSet
	spec corev1.PodSpec
	c    corev1.Container // sluice
}

func (p pod) env(name string) (corev1.EnvVar, bool) { return envOf(p.c, name) }

func envOf(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

func (p pod) volume(name string) (corev1.Volume, bool) {
	for _, v := range p.spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

// file returns the volume that path lies in for container c, and path
// relative to the mount.
func (p pod) file(t *testing.T, c corev1.Container, path string) (corev1.Volume, string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if rel, ok := strings.CutPrefix(path, vm.MountPath+"/"); ok {
			v, ok := p.volume(vm.Name)
			if !ok {
				t.Fatalf("container %s mounts a volume %s the pod does not have", c.Name, vm.Name)
			}
			return v, rel
		}
	}
	t.Fatalf("%s is on no volume mounted in container %s (mounts: %v)", path, c.Name, c.VolumeMounts)
	return corev1.Volume{}, ""
}

// secretFile checks that path in c is key of a Secret (projected by its
// items when it has them), and returns the Secret's name.
func (p pod) secretFile(t *testing.T, c corev1.Container, path, key string) string {
	t.Helper()
	v, rel := p.file(t, c, path)
	if v.Secret == nil {
		t.Fatalf("%s is on volume %s, not a Secret", path, v.Name)
	}
	if rel != key {
		t.Errorf("%s: file %s in the Secret's volume, want %s", path, rel, key)
	}
	if len(v.Secret.Items) > 0 && !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Key == key && k.Path == key }) {
		t.Errorf("%s: the volume %s does not project the Secret's key %s (items %v)", path, v.Name, key, v.Secret.Items)
	}
	if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
		t.Errorf("volume %s: defaultMode %v gives others access to a Secret", v.Name, m)
	}
	return v.Secret.SecretName
}

// configFile checks that path in c is a key of a rendered ConfigMap, and
// returns its content.
func (p pod) configFile(t *testing.T, c corev1.Container, path string) string {
	t.Helper()
	v, rel := p.file(t, c, path)
	if v.ConfigMap == nil {
		t.Fatalf("%s is on volume %s, not a ConfigMap", path, v.Name)
	}
	cm := p.m.configMaps[v.ConfigMap.Name]
	if cm == nil {
		t.Fatalf("%s: the ConfigMap %s is not rendered", path, v.ConfigMap.Name)
	}
	data, ok := cm.Data[rel]
	if !ok {
		t.Fatalf("%s: the ConfigMap %s has no key %s (keys %v)", path, cm.Name, rel, keys(cm.Data))
	}
	return data
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// value returns the literal value of env var name, failing the test when
// it is not set or comes from a reference.
func (p pod) value(t *testing.T, name string) string {
	t.Helper()
	e, ok := p.env(name)
	if !ok {
		t.Fatalf("the sluice container does not set %s", name)
	}
	if e.ValueFrom != nil {
		t.Fatalf("%s comes from a reference, want a value", name)
	}
	return e.Value
}

// checkSecured asserts the secured node of w on m: protected mode's
// secure path (no --insecure; TLS files and the gossip key from mounted
// Secrets; client auth), readiness on HTTPS /readyz and liveness on
// HTTPS /healthz, the Services, PodDisruptionBudget, NetworkPolicy,
// GOMEMLIMIT, the limits (and rules) ConfigMaps mounted and passed, the
// security contexts, and a grace period that outlasts the hand-off. It
// returns the pod for more checks.
func checkSecured(t *testing.T, m *manifests, w want) pod {
	t.Helper()
	if w.fullname == "" {
		w.fullname = "sluice"
	}
	if w.statefulSet == "" {
		w.statefulSet = w.fullname
	}
	if w.advertise == "" {
		w.advertise = "podIP"
	}
	ss := m.statefulSets[w.statefulSet]
	if ss == nil || len(m.statefulSets) != 1 {
		t.Fatalf("want one StatefulSet %s, got %v", w.statefulSet, keys(m.statefulSets))
	}
	p := pod{m: m, ss: ss, spec: ss.Spec.Template.Spec}
	for _, c := range p.spec.Containers {
		if c.Name == "sluice" {
			p.c = c
		}
	}
	if len(p.spec.Containers) != 1 || p.c.Name == "" {
		t.Fatalf("want one container sluice, got %d", len(p.spec.Containers))
	}
	podLabels := ss.Spec.Template.Labels
	selects := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 {
			t.Errorf("%s: empty selector", what)
		}
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("%s: selector %s=%s does not match the pods' labels %v", what, k, v, podLabels)
			}
		}
	}
	selects("StatefulSet", ss.Spec.Selector.MatchLabels)
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != w.replicas {
		t.Errorf("replicas %v, want %d", ss.Spec.Replicas, w.replicas)
	}
	if ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: the first nodes must start together to find each other", ss.Spec.PodManagementPolicy)
	}

	// The Services: a headless one that seeds gossip (pods listed before
	// they are ready), the StatefulSet's; a client one.
	headless := m.services[ss.Spec.ServiceName]
	if headless == nil {
		t.Fatalf("the StatefulSet's serviceName %q is not a rendered Service", ss.Spec.ServiceName)
	}
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
		t.Error("the peers' Service must be headless and publish pods before they are ready, or the first nodes never find each other")
	}
	selects("headless Service", headless.Spec.Selector)
	client := m.services[w.fullname]
	if client == nil || client.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Fatalf("no client Service %s", w.fullname)
	}
	selects("client Service", client.Spec.Selector)
	ports := map[string]corev1.ContainerPort{}
	for _, cp := range p.c.Ports {
		ports[cp.Name] = cp
	}
	for _, sp := range client.Spec.Ports {
		if _, ok := ports[sp.TargetPort.String()]; !ok || sp.Port != ports[sp.TargetPort.String()].ContainerPort {
			t.Errorf("client Service port %s targets %s, not a container port of the same number", sp.Name, sp.TargetPort.String())
		}
	}
	for _, name := range []string{"grpc", "http", "gossip-tcp", "gossip-udp"} {
		if _, ok := ports[name]; !ok {
			t.Errorf("the container has no port %s", name)
		}
	}

	// Addresses and names.
	grpcPort, httpPort, gossipPort := ports["grpc"].ContainerPort, ports["http"].ContainerPort, ports["gossip-tcp"].ContainerPort
	for name, port := range map[string]int32{"SLUICE_GRPC_ADDR": grpcPort, "SLUICE_HTTP_ADDR": httpPort, "SLUICE_GOSSIP_ADDR": gossipPort} {
		if v := p.value(t, name); v != fmt.Sprintf("0.0.0.0:%d", port) {
			t.Errorf("%s %q: want 0.0.0.0:%d, the container port", name, v, port)
		}
	}
	if e, _ := p.env("SLUICE_NAME"); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Error("SLUICE_NAME must be the pod's (stable) name")
	}
	if e, _ := p.env("POD_IP"); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Error("POD_IP must be the pod's IP")
	}
	switch w.advertise {
	case "podIP", "hostNetwork":
		if e, _ := p.env("SLUICE_ADVERTISE_ADDR"); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
			t.Error("SLUICE_ADVERTISE_ADDR must be the pod's IP")
		}
		if p.spec.HostNetwork != (w.advertise == "hostNetwork") {
			t.Errorf("hostNetwork %v with advertise.mode %s", p.spec.HostNetwork, w.advertise)
		}
		if p.spec.HostNetwork && p.spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("dnsPolicy %q: a pod on the host's network resolves the seeds' names only with ClusterFirstWithHostNet", p.spec.DNSPolicy)
		}
	case "loadBalancer":
		if _, ok := p.env("SLUICE_ADVERTISE_ADDR"); ok {
			t.Error("SLUICE_ADVERTISE_ADDR set: it would win over the pod's file")
		}
		if c := p.value(t, "SLUICE_CONFIG"); c != "/etc/sluice/advertise/$(SLUICE_NAME).yaml" {
			t.Errorf("SLUICE_CONFIG %q, want the pod's own file", c)
		}
	default:
		t.Fatalf("want.advertise %q", w.advertise)
	}
	seeds := strings.Split(p.value(t, "SLUICE_JOIN"), ",")
	if len(seeds) != w.seeds+len(w.remoteSeeds) {
		t.Errorf("SLUICE_JOIN has %d seeds, want %d and %v: %v", len(seeds), w.seeds, w.remoteSeeds, seeds)
	} else if !slices.Equal(seeds[w.seeds:], w.remoteSeeds) {
		t.Errorf("SLUICE_JOIN's seeds after the release's pods %v, want %v", seeds[w.seeds:], w.remoteSeeds)
	}
	for i, s := range seeds[:min(w.seeds, len(seeds))] {
		if want := fmt.Sprintf("%s-%d.%s.sluice.svc.cluster.local:%d", w.statefulSet, i, headless.Name, gossipPort); s != want {
			t.Errorf("seed %d %q, want %q (the pod's name in the headless Service)", i, s, want)
		}
	}
	if p.value(t, "SLUICE_CLUSTER_LABEL") == "" {
		t.Error("SLUICE_CLUSTER_LABEL is empty")
	}

	// Protected mode's secure path.
	for _, e := range p.c.Env {
		if e.Name == "SLUICE_INSECURE" {
			t.Errorf("SLUICE_INSECURE=%q: the secured default never runs --insecure", e.Value)
		}
	}
	for _, a := range append(slices.Clone(p.c.Command), p.c.Args...) {
		if strings.Contains(a, "insecure") {
			t.Errorf("argument %q", a)
		}
	}
	if !slices.Equal(p.c.Args, []string{"serve"}) {
		t.Errorf("args %v, want [serve]", p.c.Args)
	}
	caSecret := p.secretFile(t, p.c, p.value(t, "SLUICE_TLS_CA"), "ca.pem")
	if caSecret != w.fullname+"-ca" {
		t.Errorf("the CA comes from the Secret %s, want %s-ca", caSecret, w.fullname)
	}
	if gs := p.secretFile(t, p.c, p.value(t, "SLUICE_GOSSIP_KEY_FILE"), "gossip.keys"); gs != w.fullname+"-gossip" {
		t.Errorf("the gossip key comes from the Secret %s, want %s-gossip", gs, w.fullname)
	}
	certPath, keyPath := p.value(t, "SLUICE_TLS_CERT"), p.value(t, "SLUICE_TLS_KEY")
	if !strings.HasSuffix(certPath, "/$(SLUICE_NAME).pem") || keyPath != strings.TrimSuffix(certPath, ".pem")+"-key.pem" {
		t.Errorf("SLUICE_TLS_CERT %q and SLUICE_TLS_KEY %q: want the pod's own pair, <dir>/$(SLUICE_NAME).pem and -key.pem", certPath, keyPath)
	}
	// No volume of the sluice container holds the CA's key.
	for _, vm := range p.c.VolumeMounts {
		if v, _ := p.volume(vm.Name); v.Secret != nil && v.Secret.SecretName == caSecret &&
			(len(v.Secret.Items) == 0 || slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Key == "ca-key.pem" })) {
			t.Errorf("the sluice container mounts the CA Secret %s with its key (volume %s)", caSecret, v.Name)
		}
	}
	switch w.tlsMode {
	case "issue":
		checkIssue(t, p, certPath, headless.Name, w.fullname)
		if !strings.HasPrefix(certPath, "/etc/sluice/tls/$(POD_IP)/") {
			t.Errorf("SLUICE_TLS_CERT %s: want it in the directory of the pod's IP, where the init container writes", certPath)
		}
	case "provided":
		if len(p.spec.InitContainers) != 0 {
			t.Errorf("provided certificates need no init container, got %d", len(p.spec.InitContainers))
		}
		if s := p.secretFile(t, p.c, strings.ReplaceAll(certPath, "$(SLUICE_NAME)", "x"), "x.pem"); s != w.fullname+"-peers-tls" {
			t.Errorf("the node's certificate comes from the Secret %s, want %s-peers-tls", s, w.fullname)
		}
	default:
		t.Fatalf("want.tlsMode %q", w.tlsMode)
	}
	if v := p.value(t, "SLUICE_CLIENT_AUTH"); v != w.clientAuth {
		t.Errorf("SLUICE_CLIENT_AUTH %q, want %q", v, w.clientAuth)
	}
	if w.clientAuth == "mtls" {
		if _, ok := p.env("SLUICE_TOKEN_FILE"); ok {
			t.Error("SLUICE_TOKEN_FILE set with mtls")
		}
	} else if s := p.secretFile(t, p.c, p.value(t, "SLUICE_TOKEN_FILE"), "tokens.txt"); s != w.fullname+"-tokens" {
		t.Errorf("the tokens come from the Secret %s, want %s-tokens", s, w.fullname)
	}

	// Named limits and rules: ConfigMaps, mounted and passed.
	if _, err := limits.Parse("limits.yaml", []byte(p.configFile(t, p.c, p.value(t, "SLUICE_LIMITS")))); err != nil {
		t.Errorf("the limits ConfigMap does not parse: %v", err)
	}
	if e, ok := p.env("SLUICE_RLS_CONFIG"); ok != w.rls {
		t.Errorf("SLUICE_RLS_CONFIG set: %v, want %v", ok, w.rls)
	} else if ok {
		v, rel := p.file(t, p.c, e.Value+"/x.yaml")
		if v.ConfigMap == nil || rel != "x.yaml" || m.configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("SLUICE_RLS_CONFIG %s is not a rendered ConfigMap's directory", e.Value)
		} else if cm := m.configMaps[v.ConfigMap.Name]; len(cm.Data) == 0 {
			t.Errorf("the RLS ConfigMap %s has no rule file", cm.Name)
		}
	}

	checkState(t, p, w)

	// Probes: readiness on /readyz, liveness on /healthz, both HTTPS on
	// the HTTP port (TLS; probes need no certificate there).
	probe := func(what string, pr *corev1.Probe, path string) {
		t.Helper()
		if pr == nil || pr.HTTPGet == nil {
			t.Fatalf("%s is not an HTTP GET", what)
		}
		g := pr.HTTPGet
		if g.Path != path || g.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s: %s %s, want HTTPS %s", what, g.Scheme, g.Path, path)
		}
		if port := g.Port; !(port.Type == intstr.String && ports[port.StrVal].ContainerPort == httpPort) && port.IntValue() != int(httpPort) {
			t.Errorf("%s on port %s, want the HTTP port %d", what, port.String(), httpPort)
		}
	}
	probe("readinessProbe", p.c.ReadinessProbe, "/readyz")
	probe("livenessProbe", p.c.LivenessProbe, "/healthz")

	// Shutdown: the grace period outlasts the hand-off and the leave.
	handoff, err1 := time.ParseDuration(p.value(t, "SLUICE_HANDOFF_TIMEOUT"))
	leave, err2 := time.ParseDuration(p.value(t, "SLUICE_LEAVE_TIMEOUT"))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if g := p.spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < handoff+leave+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: must outlast the hand-off (%s) and the leave (%s), plus 5 s", g, handoff, leave)
	}

	// Memory: GOMEMLIMIT below the container's limit.
	if e, ok := p.env("GOMEMLIMIT"); ok != (w.goMemLimit != "") || e.Value != w.goMemLimit {
		t.Errorf("GOMEMLIMIT %q (set: %v), want %q", e.Value, ok, w.goMemLimit)
	}
	if lim, ok := p.c.Resources.Limits[corev1.ResourceMemory]; !ok || lim.IsZero() {
		t.Error("no memory limit")
	} else if w.goMemLimit != "" {
		gml := resource.MustParse(strings.TrimSuffix(w.goMemLimit, "B"))
		if gml.Cmp(lim) >= 0 {
			t.Errorf("GOMEMLIMIT %s is not below the memory limit %s", w.goMemLimit, lim.String())
		}
	}

	// Security contexts.
	psc := p.spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("the pod must run as a non-root user")
	}
	for _, c := range append(slices.Clone(p.spec.InitContainers), p.spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: want a read-only root FS, no privilege escalation and every capability dropped, got %+v", c.Name, sc)
		}
	}
	if a := p.spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the pods call no Kubernetes API: their service account token must not be mounted")
	}
	if e := p.spec.EnableServiceLinks; e == nil || *e {
		t.Error("enableServiceLinks must be false (no SLUICE_*_SERVICE_HOST variables)")
	}

	// Spread over hosts.
	if len(p.spec.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}
	for _, c := range p.spec.TopologySpreadConstraints {
		if c.LabelSelector == nil {
			t.Errorf("topology spread on %s has no labelSelector", c.TopologyKey)
			continue
		}
		selects("topology spread on "+c.TopologyKey, c.LabelSelector.MatchLabels)
	}

	// One node down at a time.
	pdb := m.pdbs[w.fullname]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("the PodDisruptionBudget allows %v down, want 1", pdb.Spec.MaxUnavailable)
	}
	selects("PodDisruptionBudget", pdb.Spec.Selector.MatchLabels)

	checkNetworkPolicy(t, m, w, podLabels, grpcPort, httpPort, gossipPort)
	return p
}

// checkState asserts --state-dir in a directory of a volume of the
// StatefulSet's volumeClaimTemplates (a claim per pod, which outlives it),
// mounted writable in the sluice container; with w.noState, neither.
func checkState(t *testing.T, p pod, w want) {
	t.Helper()
	e, ok := p.env("SLUICE_STATE_DIR")
	if w.noState {
		if ok || len(p.ss.Spec.VolumeClaimTemplates) != 0 {
			t.Errorf("state.enabled false: SLUICE_STATE_DIR set %v, %d claim templates", ok, len(p.ss.Spec.VolumeClaimTemplates))
		}
		return
	}
	if !ok || e.Value == "" {
		t.Fatal("no SLUICE_STATE_DIR: a whole-cluster stop would lose every count")
	}
	dir := e.Value
	var mount *corev1.VolumeMount
	for i, vm := range p.c.VolumeMounts {
		if strings.HasPrefix(dir, vm.MountPath+"/") {
			mount = &p.c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("SLUICE_STATE_DIR %s is below no mount of the sluice container (a directory of the volume, not its root, which may hold lost+found)", dir)
	}
	if mount.ReadOnly {
		t.Errorf("the state volume %s is mounted read-only", mount.Name)
	}
	if v, ok := p.volume(mount.Name); ok {
		t.Errorf("SLUICE_STATE_DIR %s is on the pod's volume %s (%+v), which goes with the pod: want a claim template", dir, mount.Name, v.VolumeSource)
	}
	i := slices.IndexFunc(p.ss.Spec.VolumeClaimTemplates, func(c corev1.PersistentVolumeClaim) bool { return c.Name == mount.Name })
	if i < 0 {
		t.Fatalf("the state mount %s is no claim template of the StatefulSet", mount.Name)
	}
	c := p.ss.Spec.VolumeClaimTemplates[i]
	if q := c.Spec.Resources.Requests[corev1.ResourceStorage]; q.IsZero() || len(c.Spec.AccessModes) == 0 {
		t.Errorf("claim template %s: storage %s, access modes %v", c.Name, q.String(), c.Spec.AccessModes)
	}
}

// checkIssue asserts the issue mode's init container: it writes the pod's
// certificate (named after the pod, for its DNS names and IP) with the
// CA's key into a memory volume the sluice container reads from, where
// SLUICE_TLS_CERT points.
func checkIssue(t *testing.T, p pod, certPath, headless, fullname string) {
	t.Helper()
	if len(p.spec.InitContainers) != 1 {
		t.Fatalf("want one init container to issue the certificate, got %d", len(p.spec.InitContainers))
	}
	ic := p.spec.InitContainers[0]
	if ic.Image != p.c.Image {
		t.Errorf("the init container runs %s, the node %s: want the same binary", ic.Image, p.c.Image)
	}
	if !slices.Equal(ic.Args[:3], []string{"tls", "cert", "create"}) {
		t.Fatalf("the init container runs %v, want sluice tls cert create", ic.Args)
	}
	flags := map[string][]string{}
	for _, a := range ic.Args[3:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Fatalf("init argument %q: want --flag=value", a)
		}
		flags[k] = append(flags[k], v)
	}
	fieldRef := func(name string) string {
		e, _ := envOf(ic, name)
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
			t.Fatalf("the init container's %s is not a field reference", name)
		}
		return e.ValueFrom.FieldRef.FieldPath
	}
	if !slices.Equal(flags["--peer"], []string{"$(POD_NAME)"}) || fieldRef("POD_NAME") != "metadata.name" {
		t.Errorf("--peer %v: want the pod's name (its member name)", flags["--peer"])
	}
	ipDir := "$(POD_IP)"
	if fieldRef("POD_IP") != "status.podIP" {
		t.Error("POD_IP is not the pod's IP")
	}
	for _, h := range []string{"$(POD_NAME)." + headless + ".sluice.svc.cluster.local", fullname + ".sluice.svc.cluster.local", "$(POD_IP)", "127.0.0.1"} {
		if !slices.Contains(flags["--host"], h) {
			t.Errorf("the certificate does not name %s (--host %v)", h, flags["--host"])
		}
	}
	ca := flags["--ca"]
	if len(ca) != 1 {
		t.Fatalf("--ca %v", ca)
	}
	cav, _ := p.file(t, ic, ca[0]+"/ca.pem")
	if cav.Secret == nil || cav.Secret.SecretName != fullname+"-ca" {
		t.Errorf("--ca %s is not the CA Secret", ca[0])
	}
	for _, k := range []string{"ca.pem", "ca-key.pem"} {
		p.secretFile(t, ic, ca[0]+"/"+k, k)
	}
	out := flags["--out"]
	if len(out) != 1 || !strings.HasSuffix(out[0], "/"+ipDir) {
		t.Fatalf("--out %v: want a directory named after the pod's IP", out)
	}
	outVol, _ := p.file(t, ic, out[0]+"/x")
	if outVol.EmptyDir == nil || outVol.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("--out %s is on volume %s, want a memory-backed emptyDir", out[0], outVol.Name)
	}
	// The node reads what the init container wrote: same volume, same
	// directory once the kubelet has expanded the variables (POD_IP is the
	// pod's IP in both containers).
	certVol, certRel := p.file(t, p.c, certPath)
	_, outRel := p.file(t, ic, out[0]+"/$(SLUICE_NAME).pem")
	if certVol.Name != outVol.Name || certRel != outRel {
		t.Errorf("SLUICE_TLS_CERT %s is not where the init container writes (%s on %s)", certPath, out[0], outVol.Name)
	}
}

// checkNetworkPolicy asserts the NetworkPolicy: gossip and the peer port
// open to the release's pods only; the client ports to the configured
// clients (never to everyone); egress to the pods and DNS.
func checkNetworkPolicy(t *testing.T, m *manifests, w want, podLabels map[string]string, grpc, http, gossip int32) {
	t.Helper()
	np := m.networkPolicies[w.fullname]
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("the NetworkPolicy selects %s=%s, not the pods", k, v)
		}
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policyTypes %v", np.Spec.PolicyTypes)
	}
	isPods := func(peer networkingv1.NetworkPolicyPeer) bool {
		if peer.PodSelector == nil || peer.NamespaceSelector != nil || peer.IPBlock != nil || len(peer.PodSelector.MatchLabels) == 0 {
			return false
		}
		for k, v := range peer.PodSelector.MatchLabels {
			if podLabels[k] != v {
				return false
			}
		}
		return true
	}
	type port struct {
		proto corev1.Protocol
		n     int32
	}
	open := map[port]string{} // port -> "pods" or "clients"
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("an ingress rule with no from admits everyone: %+v", r)
		}
		from := "clients"
		if len(r.From) == 1 && isPods(r.From[0]) {
			from = "pods"
		} else if w.regionPeers && !slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntValue() == int(http) }) {
			from = "pods" // the other regions' nodes: peers, not clients
		}
		if len(r.Ports) == 0 {
			t.Errorf("an ingress rule opens every port: %+v", r)
		}
		for _, p := range r.Ports {
			k := port{*p.Protocol, int32(p.Port.IntValue())}
			if k.n == gossip && from != "pods" {
				t.Errorf("gossip port %d/%s open to %v", k.n, k.proto, r.From)
			}
			if k.n != gossip && k.n != grpc && k.n != http {
				t.Errorf("ingress opens port %d, not sluice's", k.n)
			}
			if open[k] == "" || from == "clients" {
				open[k] = from
			}
		}
	}
	for _, k := range []port{{corev1.ProtocolTCP, gossip}, {corev1.ProtocolUDP, gossip}, {corev1.ProtocolTCP, grpc}} {
		if open[k] == "" {
			t.Errorf("port %d/%s closed to the pods", k.n, k.proto)
		}
	}
	for _, n := range []int32{grpc, http} {
		if open[port{corev1.ProtocolTCP, n}] != "clients" {
			t.Errorf("client port %d not open to the configured clients", n)
		}
	}
	var toPods, dns bool
	for _, r := range np.Spec.Egress {
		if len(r.To) == 1 && isPods(r.To[0]) {
			toPods = true
		}
		for _, p := range r.Ports {
			if p.Port.IntValue() == 53 && len(r.To) == 0 {
				dns = true
			}
		}
	}
	if !toPods || !dns {
		t.Errorf("egress to the pods %v, to DNS %v: want both", toPods, dns)
	}
}

// TestPlainManifests checks deploy/kubernetes: every document decodes
// strictly into its Kubernetes type, the node is the secured default,
// and the ConfigMaps carry examples/limits.yaml and examples/rls/edge.yaml
// as sluice reads them.
func TestPlainManifests(t *testing.T) {
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	var all []byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(append(all, data...), "\n---\n"...)
	}
	m := decodeManifests(t, "deploy/kubernetes", all, "sluice")
	if m.namespaces["sluice"] == nil {
		t.Error("no Namespace sluice")
	}
	p := checkSecured(t, m, want{clientAuth: "mtls", tlsMode: "issue", rls: true, goMemLimit: "921MiB", replicas: 3, seeds: 3})
	if p.c.Image != "registry.invalid/sluice:dev" {
		t.Errorf("image %s: want registry.invalid/sluice:dev, a name that resolves nowhere", p.c.Image)
	}

	want, err := os.ReadFile("../examples/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := p.configFile(t, p.c, p.value(t, "SLUICE_LIMITS"))
	if got != strings.TrimSpace(string(want))+"\n" {
		t.Errorf("the limits ConfigMap is not examples/limits.yaml:\n%s", got)
	}
	set, err := limits.Parse("limits.yaml", []byte(got))
	if err != nil || !slices.Equal(set.Names(), []string{"api", "auth.signin", "auth.signup"}) {
		t.Errorf("limits %v, %v", set.Names(), err)
	}

	dir := t.TempDir()
	cm := m.configMaps["sluice-rls"]
	if cm == nil || len(cm.Data) != 1 {
		t.Fatalf("want the ConfigMap sluice-rls with one rule file")
	}
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rules, err := rls.LoadOptions{}.Load(dir)
	if err != nil || !slices.Equal(rules.Domains(), []string{"edge"}) {
		t.Errorf("the RLS ConfigMap loads as domains %v, %v; want edge", rules.Domains(), err)
	}
}

// TestPlainManifestsAreRendered fails when deploy/kubernetes differs from
// a fresh render of the chart (make k8s-manifests).
func TestPlainManifestsAreRendered(t *testing.T) {
	cmd := exec.Command("sh", "render-manifests.sh")
	cmd.Env = append(os.Environ(), "HELM="+helmBinary(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fresh, err := cmd.Output()
	if err != nil {
		t.Fatalf("render-manifests.sh: %v: %s", err, stderr.String())
	}
	committed, err := os.ReadFile("kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		fl, cl := strings.Split(string(fresh), "\n"), strings.Split(string(committed), "\n")
		i := 0
		for i < len(fl) && i < len(cl) && fl[i] == cl[i] {
			i++
		}
		line := func(l []string) string {
			if i < len(l) {
				return l[i]
			}
			return "(end of file)"
		}
		t.Errorf("deploy/kubernetes/sluice.yaml differs from a fresh render at line %d: %q, fresh %q; run make k8s-manifests (with the helm of make helm-tools)", i+1, line(cl), line(fl))
	}
}

// TestChartDefaults renders the chart with nothing but the image: the
// secured node, no RLS (no rules), no named limits, no Namespace.
func TestChartDefaults(t *testing.T) {
	m := mustRender(t)
	p := checkSecured(t, m, want{clientAuth: "mtls", tlsMode: "issue", goMemLimit: "921MiB", replicas: 3, seeds: 3})
	if got := p.configFile(t, p.c, p.value(t, "SLUICE_LIMITS")); got != "limits: {}\n" {
		t.Errorf("default limits file %q, want limits: {}", got)
	}
	if len(m.configMaps) != 1 || len(m.namespaces) != 0 {
		t.Errorf("ConfigMaps %v, Namespaces %v: want only the limits and no Namespace", keys(m.configMaps), keys(m.namespaces))
	}
	if m.serviceAccounts["sluice"] == nil || p.spec.ServiceAccountName != "sluice" {
		t.Errorf("service account %q", p.spec.ServiceAccountName)
	}
}

// TestChartValues renders the chart with other values and checks what
// each changes.
func TestChartValues(t *testing.T) {
	helmBinary(t)
	base := want{clientAuth: "mtls", tlsMode: "issue", goMemLimit: "921MiB", replicas: 3, seeds: 3}
	for _, tc := range []struct {
		name  string
		args  []string
		want  func(want) want
		check func(*testing.T, *manifests, pod)
	}{
		{name: "tokens", args: []string{"--set", "clientAuth=token"},
			want: func(w want) want { w.clientAuth = "token"; return w }},
		{name: "either, provided certificates", args: []string{"--set", "clientAuth=either", "--set", "tls.mode=provided"},
			want: func(w want) want { w.clientAuth, w.tlsMode = "either", "provided"; return w }},
		{name: "limits and rules as maps",
			args: []string{"--set-json", `limits={"api":{"limit":10,"window":"1m"},"login":{"limit":3,"window":"15m","algorithm":"sliding_window"}}`,
				"--set-json", `rls.rules={"edge":{"domain":"edge","descriptors":[{"key":"remote_address","rate_limit":{"unit":"minute","requests_per_unit":10}}]},"api":{"domain":"api","descriptors":[{"key":"user","rate_limit":{"unit":"second","requests_per_unit":5}}]}}`},
			want: func(w want) want { w.rls = true; return w },
			check: func(t *testing.T, m *manifests, p pod) {
				set, err := limits.Parse("limits.yaml", []byte(p.configFile(t, p.c, p.value(t, "SLUICE_LIMITS"))))
				if err != nil {
					t.Fatal(err)
				}
				if l, ok := set.Resolve("api", "k"); !ok || l.Limit != 10 || l.Window != time.Minute {
					t.Errorf("api: %+v", l)
				}
				dir := t.TempDir()
				for k, v := range m.configMaps["sluice-rls"].Data {
					if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				rules, err := rls.LoadOptions{}.Load(dir)
				if err != nil || !slices.Equal(rules.Domains(), []string{"api", "edge"}) {
					t.Errorf("rules: domains %v, %v", rules.Domains(), err)
				}
			}},
		{name: "memory 2Gi", args: []string{"--set", "resources.limits.memory=2Gi"},
			want: func(w want) want { w.goMemLimit = "1843MiB"; return w }},
		{name: "memory 1500M at 80%", args: []string{"--set", "resources.limits.memory=1500M", "--set", "goMemLimitPercent=80"},
			want: func(w want) want { w.goMemLimit = "1144MiB"; return w }},
		{name: "memory in bytes", args: []string{"--set-json", `resources={"limits":{"memory":536870912}}`},
			want: func(w want) want { w.goMemLimit = "460MiB"; return w }},
		{name: "GOMEMLIMIT given", args: []string{"--set", "goMemLimit=700MiB"},
			want: func(w want) want { w.goMemLimit = "700MiB"; return w }},
		{name: "GOMEMLIMIT off", args: []string{"--set", "goMemLimitPercent=0"},
			want: func(w want) want { w.goMemLimit = ""; return w }},
		{name: "five nodes keep three seeds", args: []string{"--set", "replicas=5"},
			want: func(w want) want { w.replicas = 5; return w }},
		{name: "one node", args: []string{"--set", "replicas=1"},
			want: func(w want) want { w.replicas, w.seeds = 1, 1; return w }},
		{name: "grace and hand-off", args: []string{"--set", "shutdown.handoffTimeoutSeconds=40", "--set", "terminationGracePeriodSeconds=60"},
			want: func(w want) want { return w },
			check: func(t *testing.T, m *manifests, p pod) {
				if v := p.value(t, "SLUICE_HANDOFF_TIMEOUT"); v != "40s" || *p.spec.TerminationGracePeriodSeconds != 60 {
					t.Errorf("SLUICE_HANDOFF_TIMEOUT %s, grace %d", v, *p.spec.TerminationGracePeriodSeconds)
				}
			}},
		{name: "clients from another namespace",
			args: []string{"--set-json", `networkPolicy.clients=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"istio-system"}},"podSelector":{"matchLabels":{"app":"istio-ingressgateway"}}}]`,
				"--set-json", `networkPolicy.metrics=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
			want: func(w want) want { return w },
			check: func(t *testing.T, m *manifests, p pod) {
				in := m.networkPolicies["sluice"].Spec.Ingress
				if len(in) != 3 || in[1].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "istio-system" ||
					len(in[2].Ports) != 1 || in[2].Ports[0].Port.IntValue() != 7080 {
					t.Errorf("ingress %+v", in)
				}
			}},
		{name: "state off", args: []string{"--set", "state.enabled=false"},
			want: func(w want) want { w.noState = true; return w }},
		{name: "state class, size and snapshots", args: []string{"--set", "state.storageClass=fast", "--set", "state.size=5Gi", "--set", "state.interval=10s"},
			want: func(w want) want { return w },
			check: func(t *testing.T, m *manifests, p pod) {
				c := p.ss.Spec.VolumeClaimTemplates[0]
				if sc := c.Spec.StorageClassName; sc == nil || *sc != "fast" || c.Spec.Resources.Requests.Storage().String() != "5Gi" {
					t.Errorf("claim: class %v, size %s", sc, c.Spec.Resources.Requests.Storage())
				}
				if v := p.value(t, "SLUICE_STATE_INTERVAL"); v != "10s" {
					t.Errorf("SLUICE_STATE_INTERVAL %q", v)
				}
			}},
		{name: "state on pre-made volumes", args: []string{"--set", "state.storageClass=-"},
			want: func(w want) want { return w },
			check: func(t *testing.T, m *manifests, p pod) {
				if sc := p.ss.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; sc == nil || *sc != "" {
					t.Errorf("storageClass - gives class %v, want \"\" (no dynamic provisioning)", sc)
				}
				if _, ok := p.env("SLUICE_STATE_INTERVAL"); ok {
					t.Error("SLUICE_STATE_INTERVAL set by default")
				}
			}},
		{name: "host network", args: []string{"--set", "advertise.mode=hostNetwork"},
			want: func(w want) want { w.advertise = "hostNetwork"; return w }},
		{name: "a region on pod IPs, wan",
			args: []string{"--set-json", `regions={"region":"eu","list":"us=2,eu=1","seeds":["sluice-us-0.us.example:7946"],"peers":[{"ipBlock":{"cidr":"10.1.0.0/16"}}]}`,
				"--set", "gossipProfile=wan", "--set", "clusterLabel=sluice-prod"},
			want: func(w want) want {
				w.statefulSet, w.remoteSeeds, w.regionPeers = "sluice-eu", []string{"sluice-us-0.us.example:7946"}, true
				return w
			},
			check: func(t *testing.T, m *manifests, p pod) {
				for name, want := range map[string]string{"SLUICE_REGION": "eu", "SLUICE_REGIONS": "us=2,eu=1", "SLUICE_PROFILE": "wan", "SLUICE_CLUSTER_LABEL": "sluice-prod"} {
					if v := p.value(t, name); v != want {
						t.Errorf("%s %q, want %q", name, v, want)
					}
				}
				if m.services["sluice"] == nil || m.configMaps["sluice-limits"] == nil || m.pdbs["sluice"] == nil {
					t.Errorf("the client Service, ConfigMaps and budget keep the release's name: services %v", keys(m.services))
				}
			}},
		{name: "another release name", args: []string{"--set", "fullnameOverride=rl"},
			want: func(w want) want { w.fullname = "rl"; return w },
			check: func(t *testing.T, m *manifests, p pod) {
				if m.services["rl-peers"] == nil || m.configMaps["rl-limits"] == nil {
					t.Errorf("services %v, config maps %v", keys(m.services), keys(m.configMaps))
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, tc.args...)
			p := checkSecured(t, m, tc.want(base))
			if tc.check != nil {
				tc.check(t, m, p)
			}
		})
	}
}

// TestChartRefuses renders the chart with bad values: each is refused
// with a message naming the value.
func TestChartRefuses(t *testing.T) {
	helmBinary(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "image.repository is required"},
		{[]string{"--set", "image.repository=r/sluice"}, "image.tag (or image.digest) is required"},
		{append(slices.Clone(imageArgs), "--set", "clientAuth=none"), "/clientAuth"},
		{append(slices.Clone(imageArgs), "--set", "insecure=true"), "insecure"},
		{append(slices.Clone(imageArgs), "--set", "tls.mode=off"), "/tls/mode"},
		{append(slices.Clone(imageArgs), "--set", "terminationGracePeriodSeconds=15"), "terminationGracePeriodSeconds: 15 is less than"},
		{append(slices.Clone(imageArgs), "--set", "resources.limits.memory=lots"), `resources.limits.memory: "lots" is not a quantity`},
		{append(slices.Clone(imageArgs), "--set", "resources.limits.cpu=1", "--set", "resources.limits.memory=null"), "resources.limits.memory is required with goMemLimitPercent"},
		{append(slices.Clone(imageArgs), "--set", "keyReplicas=4"), "/keyReplicas"},
		{append(slices.Clone(imageArgs), "--set", "tls.certValidity=90d"), "/tls/certValidity"},
		{append(slices.Clone(imageArgs), "--set", "rls.rules.\\.hidden=x"), "'.hidden' does not match pattern"},
		{append(slices.Clone(imageArgs), "--set", "tls.mode=provided", "--set", "tls.extraHosts={a.example}"), "tls.extraHosts"},
		{append(slices.Clone(imageArgs), "--set", "regions.region=eu"), "regions.list is required"},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"list":"us,eu"}`), "regions.region is required with regions.list"},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"region":"ap","list":"us,eu","seeds":["a:1"],"peers":[{}]}`), `regions.region "ap" is not in regions.list`},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"region":"eu","list":"us,eu","peers":[{}]}`), "regions.seeds is required"},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"region":"eu","list":"us,eu","seeds":["a:1"]}`), "regions.peers is required"},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"region":"eu","list":"us, eu","seeds":["a:1"],"peers":[{}]}`), `clusterLabel is required with regions.region: gossip's cluster label, the same string in every region's release (put it in the values file the regions share, e.g. clusterLabel: sluice-prod); nodes whose labels differ never meet (a release installed before it was required has "sluice/us,eu")`},
		{append(slices.Clone(imageArgs), "--set", "regions.region=EU"), "/regions/region"},
		{append(slices.Clone(imageArgs), "--set-json", `regions={"region":"eu","list":"us,eu=x"}`), "/regions/list"},
		{append(slices.Clone(imageArgs), "--set", "advertise.mode=loadBalancer"), "advertise.loadBalancer.addresses: 0 addresses for 3 replicas"},
		{append(slices.Clone(imageArgs), "--set", "advertise.mode=nodePort"), "/advertise/mode"},
		{append(slices.Clone(imageArgs), "--set", "gossipProfile=slow"), "/gossipProfile"},
		{append(slices.Clone(imageArgs), "--set", "state.size=lots"), "/state/size"},
	} {
		out, err := render(t, tc.args...)
		if err == nil {
			t.Errorf("%v: rendered, want an error naming %s:\n%.300s", tc.args, tc.want, out)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error does not name %q: %v", tc.args, tc.want, err)
		}
	}
}
