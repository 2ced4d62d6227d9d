package deploy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// varRef is a $(NAME) reference in a container's args or env values.
var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(NAME) in s with env's value, as the kubelet does: a
// name env does not have stays as written, and $$ is a literal $.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// podEnv is c's environment as the kubelet gives it to a pod of the given
// name and IP: field references resolved, $(NAME) expanded from the
// variables before it.
func podEnv(t *testing.T, c corev1.Container, name, ip string) (map[string]string, []string) {
	t.Helper()
	env := map[string]string{}
	var order []string
	for _, e := range c.Env {
		v := expand(e.Value, env)
		if e.ValueFrom != nil {
			switch f := e.ValueFrom.FieldRef; {
			case f != nil && f.FieldPath == "metadata.name":
				v = name
			case f != nil && f.FieldPath == "status.podIP":
				v = ip
			default:
				t.Fatalf("container %s: %s comes from %+v, which this test cannot resolve", c.Name, e.Name, e.ValueFrom)
			}
		}
		env[e.Name] = v
		order = append(order, e.Name)
	}
	return env, order
}

// sluiceBinary builds cmd/sluice into a temporary directory.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// run runs the sluice binary with args and env (nothing else of this
// process's environment), and returns its output.
func run(t *testing.T, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPodStarts runs the plain manifests' pod on loopback as the kubelet
// would: the Secrets made as docs/kubernetes.md says (sluice tls ca
// create, sluice keygen), every volume laid out under a temporary root at
// its mount path, the init container's arguments and the node's
// environment expanded from the pod's name and IP, then the init
// container (it must issue a certificate the node accepts as its own),
// then the node (every SLUICE_ variable passed as its flag, so that a
// misspelt one fails). The node must start without --insecure, answer
// the readiness probe over HTTPS, check a named limit of the limits
// ConfigMap for a client certificate and refuse a caller without one,
// load the rules ConfigMap, and stop within the grace period on SIGTERM,
// writing its keys to the state claim's directory (it is the whole
// cluster); started again on that directory, it has the count it had.
// Only the addresses differ from a pod: 127.0.0.1 with OS-picked ports,
// and no seeds to join (a cluster of one).
func TestPodStarts(t *testing.T) {
	data, err := os.ReadFile("kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := decodeManifests(t, "deploy/kubernetes", data, "sluice")
	p := checkSecured(t, m, want{clientAuth: "mtls", tlsMode: "issue", rls: true, goMemLimit: "921MiB", replicas: 3, seeds: 3})
	bin := sluiceBinary(t)
	const podName, podIP = "sluice-0", "127.0.0.1"

	// The Secrets, made with sluice's own commands.
	secrets := t.TempDir()
	if out, err := run(t, bin, nil, "tls", "ca", "create", "--out", filepath.Join(secrets, "sluice-ca")); err != nil {
		t.Fatalf("tls ca create: %v\n%s", err, out)
	}
	key, err := run(t, bin, nil, "keygen")
	if err != nil {
		t.Fatalf("keygen: %v\n%s", err, key)
	}
	if err := os.MkdirAll(filepath.Join(secrets, "sluice-gossip"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "sluice-gossip", "gossip.keys"), []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, bin, nil, "tls", "cert", "create", "--ca", filepath.Join(secrets, "sluice-ca"), "--client", "app", "--out", filepath.Join(secrets, "app")); err != nil {
		t.Fatalf("tls cert create --client: %v\n%s", err, out)
	}

	// The volumes, each at its mount path under root.
	root := t.TempDir()
	mapped := func(path string) bool {
		return strings.HasPrefix(path, "/etc/sluice/") || strings.HasPrefix(path, "/var/lib/sluice/") || path == "/var/lib/sluice"
	}
	local := func(path string) string {
		if !mapped(path) {
			t.Fatalf("%s: the test maps only /etc/sluice/ and /var/lib/sluice to its root", path)
		}
		return filepath.Join(root, path)
	}
	emptyDirs := map[string]string{}
	for _, c := range append(slices.Clone(p.spec.InitContainers), p.spec.Containers...) {
		for _, vm := range c.VolumeMounts {
			dir := local(vm.MountPath)
			v, isVolume := p.volume(vm.Name)
			switch {
			case !isVolume && slices.ContainsFunc(p.ss.Spec.VolumeClaimTemplates, func(c corev1.PersistentVolumeClaim) bool { return c.Name == vm.Name }):
				// The pod's claim: a directory that outlives the process.
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			case v.EmptyDir != nil:
				if first, ok := emptyDirs[v.Name]; ok {
					if first != dir {
						t.Fatalf("emptyDir %s mounted at %s and %s: the test shares one directory", v.Name, first, dir)
					}
					continue
				}
				emptyDirs[v.Name] = dir
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			case v.Secret != nil:
				items := v.Secret.Items
				if len(items) == 0 {
					t.Fatalf("Secret volume %s without items", v.Name)
				}
				for _, it := range items {
					b, err := os.ReadFile(filepath.Join(secrets, v.Secret.SecretName, it.Key))
					if err != nil {
						t.Fatalf("volume %s: the Secret %s's key %s, as docs/kubernetes.md makes it: %v", v.Name, v.Secret.SecretName, it.Key, err)
					}
					writeFile(t, filepath.Join(dir, it.Path), b)
				}
			case v.ConfigMap != nil:
				cm := m.configMaps[v.ConfigMap.Name]
				for k, d := range cm.Data {
					writeFile(t, filepath.Join(dir, k), []byte(d))
				}
			default:
				t.Fatalf("volume %s: a kind this test does not lay out", v.Name)
			}
		}
	}

	// The init container issues the node's certificate.
	ic := p.spec.InitContainers[0]
	ienv, _ := podEnv(t, ic, podName, podIP)
	var args []string
	for _, a := range ic.Args {
		args = append(args, strings.ReplaceAll(expand(a, ienv), "/etc/sluice/", filepath.Join(root, "etc/sluice")+"/"))
	}
	if out, err := run(t, bin, nil, args...); err != nil {
		t.Fatalf("the init container (sluice %s) failed: %v\n%s", strings.Join(args, " "), err, out)
	}

	// The node: its environment as flags, loopback addresses, no seeds.
	env, order := podEnv(t, p.c, podName, podIP)
	if j := env["SLUICE_JOIN"]; !strings.HasPrefix(j, "sluice-0.sluice-peers.sluice.svc.cluster.local:7946,") {
		t.Errorf("SLUICE_JOIN %q", j)
	}
	flags := []string{"serve"}
	var procEnv []string
	for _, name := range order {
		v := env[name]
		flag, isFlag := strings.CutPrefix(name, "SLUICE_")
		if !isFlag {
			procEnv = append(procEnv, name+"="+v) // GOMEMLIMIT
			continue
		}
		flag = strings.ReplaceAll(strings.ToLower(flag), "_", "-")
		switch flag {
		case "grpc-addr", "http-addr", "gossip-addr":
			v = "127.0.0.1:0"
		case "join":
			continue
		}
		if mapped(v) {
			v = local(v)
		}
		flags = append(flags, "--"+flag+"="+v)
	}
	checkNodeCertificate(t, local(env["SLUICE_TLS_CERT"]), podName)

	n := startNode(t, bin, flags, procEnv)
	addrs, nodeLog := n.addrs, n.log
	httpAddr, grpcAddr := addrs["http_addr"].(string), addrs["grpc_addr"].(string)

	// The readiness probe, as the kubelet sends it: HTTPS, no certificate.
	caFile := local(env["SLUICE_TLS_CA"])
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(caFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA %s: %v", caFile, err)
	}
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(c *http.Client, path string) (int, string) {
		resp, err := c.Get("https://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for code, body := get(probe, p.c.ReadinessProbe.HTTPGet.Path); code != http.StatusOK; code, body = get(probe, p.c.ReadinessProbe.HTTPGet.Path) {
		if time.Now().After(deadline) {
			t.Fatalf("readiness %s: %d %s\n%s", p.c.ReadinessProbe.HTTPGet.Path, code, body, nodeLog())
		}
		time.Sleep(50 * time.Millisecond) // polling a real process, with a deadline
	}
	if code, body := get(probe, p.c.LivenessProbe.HTTPGet.Path); code != http.StatusOK {
		t.Errorf("liveness %s: %d %s", p.c.LivenessProbe.HTTPGet.Path, code, body)
	}

	// A client with a certificate from the CA checks a named limit of the
	// ConfigMap (examples/limits.yaml: api, 30 a minute).
	clientTLS := []string{"--tls-ca", caFile, "--tls-cert", filepath.Join(secrets, "app", "app.pem"), "--tls-key", filepath.Join(secrets, "app", "app-key.pem")}
	out, err := run(t, bin, nil, append([]string{"check", "--addr", grpcAddr, "--name", "api", "--key", "user:42", "--named", "--json"}, clientTLS...)...)
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	var d struct {
		Allowed bool  `json:"allowed"`
		Limit   int64 `json:"limit"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || !d.Allowed || d.Limit != 30 {
		t.Errorf("check of the named limit api: %s (%v); want allowed, limit 30", out, err)
	}
	if out, err := run(t, bin, nil, "check", "--addr", grpcAddr, "--tls-ca", caFile, "--name", "api", "--key", "user:42", "--named"); err == nil {
		t.Errorf("a caller without a client certificate was answered (mtls): %s", out)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(secrets, "app", "app.pem"), filepath.Join(secrets, "app", "app-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	scraper := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	if code, body := get(scraper, "/metrics"); code != http.StatusOK || !strings.Contains(body, "\nsluice_limits_configured 3\n") || !strings.Contains(body, "\nsluice_insecure 0\n") {
		t.Errorf("/metrics: %d, want sluice_limits_configured 3 and sluice_insecure 0", code)
	}
	if !regexp.MustCompile(`"msg":"rls rules loaded".*"domains":"edge"`).MatchString(nodeLog()) {
		t.Errorf("the node did not load the rules ConfigMap (domain edge):\n%s", nodeLog())
	}

	// Spend most of user:42's burst (60; 1 spent above) before the stop.
	if out, err := run(t, bin, nil, append([]string{"check", "--addr", grpcAddr, "--name", "api", "--key", "user:42", "--named", "--hits", "50", "--json"}, clientTLS...)...); err != nil || !strings.Contains(out, `"allowed":true`) {
		t.Fatalf("check of 50 hits: %v\n%s", err, out)
	}

	// SIGTERM: not ready, hand-off, leave, exit within the grace period.
	// The node is the whole cluster: no member can take its keys, so it
	// writes them to the claim's directory (--state-dir).
	grace := time.Duration(*p.spec.TerminationGracePeriodSeconds) * time.Second
	n.stop(t, grace)
	if !strings.Contains(nodeLog(), `"msg":"node stopped"`) {
		t.Errorf("no graceful stop in the log:\n%s", nodeLog())
	}
	if !strings.Contains(nodeLog(), "keys saved for a restart") {
		t.Fatalf("the node did not save its keys to the state volume at its stop:\n%s", nodeLog())
	}

	// The pod again (a whole-cluster restart): the same claim, a new
	// process; user:42 keeps what it spent (a fresh bucket would have 59
	// left after this check; the restored one about 9 plus its refill, 30
	// a minute).
	n = startNode(t, bin, flags, procEnv)
	out, err = run(t, bin, nil, append([]string{"check", "--addr", n.addrs["grpc_addr"].(string), "--name", "api", "--key", "user:42", "--named", "--json"}, clientTLS...)...)
	if err != nil {
		t.Fatalf("check after the restart: %v\n%s", err, out)
	}
	var after struct {
		Allowed   bool  `json:"allowed"`
		Remaining int64 `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(out), &after); err != nil || after.Remaining >= 30 {
		t.Errorf("after a restart on the same state volume: %s (%v); want the count kept (remaining about 9, not 59)\n%s", out, err, n.log())
	}
	n.stop(t, grace)
}

// node is a sluice serve process of the pod test.
type node struct {
	cmd   *exec.Cmd
	addrs map[string]any // the "node started" log line: grpc_addr, http_addr, ...
	log   func() string
	done  chan struct{} // closed when its log ends
}

// startNode starts sluice with flags and env, and waits for its "node
// started" line (30 s at most).
func startNode(t *testing.T, bin string, flags, env []string) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, flags...)
	cmd.Env = env
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan map[string]any, 1)
	var logMu sync.Mutex
	var logText strings.Builder
	n := &node{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(n.done)
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			logMu.Lock()
			logText.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "node started" {
				started <- line
			}
		}
	}()
	n.log = func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logText.String()
	}
	select {
	case n.addrs = <-started:
	case <-time.After(30 * time.Second):
		t.Fatalf("the node did not start within 30 s (sluice %s):\n%s", strings.Join(flags, " "), n.log())
	}
	return n
}

// stop sends SIGTERM and waits for a clean exit within grace.
func (n *node) stop(t *testing.T, grace time.Duration) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { <-n.done; exited <- n.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the node exited with %v after SIGTERM:\n%s", err, n.log())
		}
	case <-time.After(grace):
		t.Fatalf("the node did not exit within the grace period %s:\n%s", grace, n.log())
	}
}

// checkNodeCertificate asserts that the init container's certificate is
// the peer certificate of the pod: URI SAN spiffe://sluice/peer/NAME,
// the pod's DNS name in the headless Service, the client Service's name
// and 127.0.0.1.
func checkNodeCertificate(t *testing.T, file, name string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the node's certificate: %v", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://sluice/peer/"+name {
		t.Errorf("URI SANs %v, want spiffe://sluice/peer/%s", c.URIs, name)
	}
	for _, dns := range []string{name + ".sluice-peers.sluice.svc.cluster.local", "sluice.sluice.svc.cluster.local", "sluice"} {
		if !slices.Contains(c.DNSNames, dns) {
			t.Errorf("the certificate does not name %s: %v", dns, c.DNSNames)
		}
	}
	if ips := fmt.Sprint(c.IPAddresses); !strings.Contains(ips, "127.0.0.1") {
		t.Errorf("IP SANs %s, want 127.0.0.1 (the pod's IP here)", ips)
	}
}

// writeFile writes b to path, creating its directory.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
