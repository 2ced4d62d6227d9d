//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// The nodes' settings that the accounting depends on: passed to the
// containers through e2e/docker-compose.yml, so this is their one place.
const (
	// forwardTimeout is the nodes' --forward-timeout (their default). A
	// check is answered within twice that (one for the owner, one for its
	// stand-in holder), three times when the ring changed meanwhile and
	// the forward was retried once (the README's promise): answerBound,
	// with answerMargin for the client's side (docker's port proxy on a
	// busy machine). The ledgers also count the answers that took longer
	// than twice the forward timeout (plus the margin), and the slowest.
	forwardTimeout = 2 * time.Second
	answerMargin   = time.Second
	answerBound    = 3*forwardTimeout + answerMargin
	// replicationInterval is the nodes' --replication-interval (their
	// default): a crash loses at most the hits an owner admitted in its
	// last interval plus one send (bounded by the forward timeout).
	replicationInterval = 100 * time.Millisecond
	// ringTimeout bounds every wait for the nodes' rings to agree: after a
	// start, a graceful leave, a crash (gossip declares the node dead) or
	// a partition's heal. Generous: the machine is small and busy.
	ringTimeout = 90 * time.Second
	// partitionFor is how long the partition scenario keeps its victim
	// cut off: longer than memberlist's GossipToTheDeadTime (30 s on a
	// LAN), after which only sluice's reconnect loop (every 5 s) heals it.
	partitionFor = 35 * time.Second
)

// pki is the folder of the running test's development PKI (made by
// newCluster with sluice tls): ca/ca.pem, NAME/NAME.pem and NAME-key.pem
// for every node, and client/e2e.pem with its key. Tests run one at a
// time, so one folder at a time is in use.
var pki string

// clientDialOption is how the suite's gRPC clients reach the nodes: TLS
// against the test's CA, presenting its client certificate (the nodes run
// --client-auth mtls).
func clientDialOption(t *testing.T) grpc.DialOption {
	t.Helper()
	o, err := client.TLS(filepath.Join(pki, "ca", "ca.pem"), filepath.Join(pki, "client", "e2e.pem"), filepath.Join(pki, "client", "e2e-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// cliSecurityArgs is what the suite gives the sluice CLI (check, members,
// bench) for the same.
func cliSecurityArgs() []string {
	return []string{"--tls-ca", filepath.Join(pki, "ca", "ca.pem"),
		"--tls-cert", filepath.Join(pki, "client", "e2e.pem"), "--tls-key", filepath.Join(pki, "client", "e2e-key.pem")}
}

// makePKI writes a development CA into dir, a peer certificate for every
// node (naming its service name, its address on the network and
// 127.0.0.1, where its ports are published and its health check dials)
// and a client certificate, all with sluice's own commands. The keys are
// made readable by the containers' user (65532) through the bind mount:
// development only.
func makePKI(t *testing.T, dir string) {
	t.Helper()
	ips := map[string]string{}
	for i, name := range allNodes {
		ips[name] = fmt.Sprintf("%s.%d", netPrefix, 11+i)
	}
	makePKIFor(t, dir, allNodes, ips)
}

// makePKIFor is makePKI for the nodes names, each at its address in ips.
func makePKIFor(t *testing.T, dir string, names []string, ips map[string]string) {
	t.Helper()
	if out, err := run(30*time.Second, nil, sluiceBin, "tls", "ca", "create", "--out", filepath.Join(dir, "ca")); err != nil {
		t.Fatalf("sluice tls ca create: %v\n%s", err, out)
	}
	for _, name := range names {
		ip := ips[name]
		if out, err := run(30*time.Second, nil, sluiceBin, "tls", "cert", "create", "--ca", filepath.Join(dir, "ca"),
			"--peer", name, "--host", name, "--host", ip, "--host", "127.0.0.1", "--out", filepath.Join(dir, name)); err != nil {
			t.Fatalf("sluice tls cert create --peer %s: %v\n%s", name, err, out)
		}
	}
	if out, err := run(30*time.Second, nil, sluiceBin, "tls", "cert", "create", "--ca", filepath.Join(dir, "ca"),
		"--client", "e2e", "--out", filepath.Join(dir, "client")); err != nil {
		t.Fatalf("sluice tls cert create --client: %v\n%s", err, out)
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(path, 0o755)
		}
		return os.Chmod(path, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// envOr returns the environment variable key, or def when it is empty.
func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

var (
	// image is the sluice image under test (make e2e builds it).
	image = envOr("SLUICE_E2E_IMAGE", "sluice:e2e")
	// netPrefix is the first three octets of the suite's /24 subnet; it
	// must not overlap docker-compose.yml's 172.28.7.0/24.
	netPrefix = envOr("SLUICE_E2E_NET", "172.28.97")
	// sluiceBin is the CLI the suite runs on this host (make e2e builds it).
	sluiceBin = envOr("SLUICE_E2E_BIN", "../bin/sluice")
)

// allNodes are the compose services: sluice1..3 start with every cluster,
// sluice4..5 (profile "scale") only when a test starts them.
var allNodes = []string{"sluice1", "sluice2", "sluice3", "sluice4", "sluice5"}

// node is one compose service as the suite reaches it.
type node struct {
	name      string
	ip        string // on the compose network, advertised by the node
	grpcPort  int    // published on 127.0.0.1
	httpPort  int    // published on 127.0.0.1
	conn      *grpc.ClientConn
	rateLimit sluicev1.RateLimitServiceClient
}

// grpcAddr is where the test process reaches the node's gRPC.
func (n *node) grpcAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.grpcPort)) }

// cluster is one compose project of the suite: its own project name, so
// it never meets a developer's make cluster-up, and its own ports.
type cluster struct {
	t       *testing.T
	project string
	files   []string // the compose files: docker-compose.yml unless set
	env     []string
	nodes   map[string]*node
	ids     map[string]string // container ids by service
}

// run runs a command with a bound of its own, returning its combined output.
func run(timeout time.Duration, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), err
}

// requireDocker skips the test when no Docker engine answers, and fails
// it when the image under test is missing.
func requireDocker(t *testing.T) {
	t.Helper()
	if _, err := run(30*time.Second, nil, "docker", "info"); err != nil {
		t.Skipf("e2e skipped: no Docker engine answers (%v)", err)
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skipf("e2e skipped: no docker-compose (%v)", err)
	}
	if _, err := run(30*time.Second, nil, "docker", "image", "inspect", image); err != nil {
		t.Fatalf("image %s not found: build it with make e2e (or make docker IMAGE=%s): %v", image, image, err)
	}
	if _, err := os.Stat(sluiceBin); err != nil {
		t.Fatalf("%s not found: build it with make build: %v", sluiceBin, err)
	}
}

// freePorts returns n distinct ports that were free on 127.0.0.1.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// newCluster starts sluice1..3 under the compose project sluicee2e<scenario>,
// with a fresh gossip key, and waits until they are healthy and agree on
// the ring. Cleanup logs the containers' last lines when the test failed,
// then removes the containers and the network (down -v), whatever happened.
func newCluster(t *testing.T, scenario string) *cluster {
	t.Helper()
	requireDocker(t)
	secrets := newSecrets(t)
	makePKI(t, secrets)
	pki = secrets
	c := &cluster{t: t, project: envOr("SLUICE_E2E_PROJECT_PREFIX", "sluicee2e") + scenario, nodes: map[string]*node{}, ids: map[string]string{}}
	c.prepare(secrets, allNodes, func(i int, _ string) string { return fmt.Sprintf("%s.%d", netPrefix, 11+i) }, clientDialOption(t))
	c.start("sluice1", "sluice2", "sluice3")
	return c
}

// newSecrets returns a fresh directory the containers' user (65532) can
// read through a bind mount, holding a new gossip key (gossip.keys).
func newSecrets(t *testing.T) string {
	t.Helper()
	secrets := t.TempDir()
	if err := os.Chmod(secrets, 0o755); err != nil {
		t.Fatal(err)
	}
	key, err := run(30*time.Second, nil, sluiceBin, "keygen")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "gossip.keys"), key, 0o644); err != nil {
		t.Fatal(err)
	}
	return secrets
}

// prepare gives c the services names (at the addresses ipOf gives them),
// free host ports for each one's gRPC and HTTP, the compose environment
// (plus extraEnv) and a client connection per node over dial; it removes
// what a run that crashed before its cleanup may have left of the
// project, and registers the cleanup: on failure the artifacts and the
// containers' last log lines, then the connections closed and down -v.
func (c *cluster) prepare(secrets string, names []string, ipOf func(i int, name string) string, dial grpc.DialOption, extraEnv ...string) {
	t := c.t
	t.Helper()
	ports := freePorts(t, 2*len(names))
	c.env = append(append(os.Environ(),
		"SLUICE_E2E_IMAGE="+image,
		"SLUICE_E2E_NET="+netPrefix,
		"SLUICE_E2E_SECRETS="+secrets,
		"SLUICE_E2E_FORWARD_TIMEOUT="+forwardTimeout.String(),
		"SLUICE_E2E_REPLICATION_INTERVAL="+replicationInterval.String()), extraEnv...)
	for i, name := range names {
		n := &node{name: name, ip: ipOf(i, name), grpcPort: ports[2*i], httpPort: ports[2*i+1]}
		c.env = append(c.env, fmt.Sprintf("SLUICE_E2E_GRPC_%s=%d", name, n.grpcPort), fmt.Sprintf("SLUICE_E2E_HTTP_%s=%d", name, n.httpPort))
		conn, err := grpc.NewClient(n.grpcAddr(), dial)
		if err != nil {
			t.Fatal(err)
		}
		n.conn, n.rateLimit = conn, sluicev1.NewRateLimitServiceClient(conn)
		c.nodes[name] = n
	}
	// A run that crashed before its cleanup may have left this project.
	c.compose(2*time.Minute, "down", "-v", "--remove-orphans", "--timeout", "5")
	t.Cleanup(func() {
		if t.Failed() {
			c.saveArtifacts()
			out, _ := c.compose(time.Minute, "logs", "--no-color", "--tail", "40")
			t.Logf("containers' last log lines:\n%s", out)
		}
		for _, n := range c.nodes {
			n.conn.Close()
		}
		if out, err := c.compose(3*time.Minute, "down", "-v", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
}

// artifacts is where a failed test leaves its containers' whole logs, with
// a goroutine dump of every node still running (SIGQUIT: Go prints every
// goroutine's stack and exits), for a hang or a lost count to be read
// after the containers are gone. Unset: nothing is saved.
var artifacts = os.Getenv("SLUICE_E2E_ARTIFACTS")

// saveArtifacts writes, when artifacts is set, a goroutine dump of every
// running node and every container's whole log there, one file per
// container named after the test and the service.
func (c *cluster) saveArtifacts() {
	if artifacts == "" {
		return
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		c.t.Logf("artifacts: %v", err)
		return
	}
	out, err := c.compose(time.Minute, "ps", "-q")
	if err != nil {
		c.t.Logf("artifacts: %v", err)
		return
	}
	ids := strings.Fields(string(out))
	for _, id := range ids {
		if st, err := run(30*time.Second, nil, "docker", "inspect", "--format", "{{.State.Running}}", id); err == nil && strings.TrimSpace(string(st)) == "true" {
			run(30*time.Second, nil, "docker", "kill", "--signal", "QUIT", id)
		}
	}
	time.Sleep(3 * time.Second) // the dumps reach the logs
	prefix := strings.NewReplacer("/", "_", "=", "").Replace(c.t.Name()) + "-" + time.Now().UTC().Format("150405")
	for _, id := range ids {
		name, _ := run(30*time.Second, nil, "docker", "inspect", "--format", `{{index .Config.Labels "com.docker.compose.service"}}`, id)
		logs, _ := run(2*time.Minute, nil, "docker", "logs", id)
		path := filepath.Join(artifacts, prefix+"-"+strings.TrimSpace(string(name))+".log")
		if err := os.WriteFile(path, logs, 0o644); err != nil {
			c.t.Logf("artifacts: %v", err)
			continue
		}
		c.t.Logf("artifacts: %s (%d bytes; the goroutine dump at its end if the node was running)", path, len(logs))
	}
}

// compose runs docker-compose on the suite's file under the cluster's
// project (profile scale on, so that down also removes sluice4..5).
func (c *cluster) compose(timeout time.Duration, args ...string) ([]byte, error) {
	files := c.files
	if len(files) == 0 {
		files = []string{"docker-compose.yml"}
	}
	var fa []string
	for _, f := range files {
		fa = append(fa, "-f", f)
	}
	return run(timeout, c.env, "docker-compose", append(append(append([]string{"-p", c.project}, fa...), "--profile", "scale"), args...)...)
}

// docker runs a docker command and fails the test if it fails.
func (c *cluster) docker(args ...string) {
	c.t.Helper()
	if _, err := run(2*time.Minute, nil, "docker", args...); err != nil {
		c.t.Fatal(err)
	}
}

// id returns the container id of a service.
func (c *cluster) id(name string) string {
	c.t.Helper()
	if id, ok := c.ids[name]; ok {
		return id
	}
	out, err := c.compose(time.Minute, "ps", "-q", name)
	id := strings.TrimSpace(string(out))
	if err != nil || id == "" {
		c.t.Fatalf("no container for %s: %v", name, err)
	}
	c.ids[name] = id
	return id
}

// start creates and starts services (compose up, never recreating the
// running ones), then waits until they are healthy.
func (c *cluster) start(names ...string) {
	c.t.Helper()
	if out, err := c.compose(5*time.Minute, append([]string{"up", "-d", "--no-deps", "--no-recreate"}, names...)...); err != nil {
		c.t.Fatalf("compose up: %v\n%s", err, out)
	}
	c.waitHealthy(names...)
}

// restart starts a stopped container again and waits until it is healthy.
func (c *cluster) restart(name string) {
	c.t.Helper()
	c.docker("start", c.id(name))
	c.waitHealthy(name)
}

// stop sends SIGTERM to a node and waits until it has exited (its
// hand-off and leave done), at most 30 s before docker kills it.
func (c *cluster) stop(name string) {
	c.t.Helper()
	c.docker("stop", "--time", "30", c.id(name))
}

// kill sends SIGKILL to a node: no hand-off, no leave message.
func (c *cluster) kill(name string) {
	c.t.Helper()
	c.docker("kill", c.id(name))
}

// network is the compose network's name.
func (c *cluster) network() string { return c.project + "_sluice" }

// disconnect cuts a node off the network (and so from the others and from
// the test's clients: its published ports go with the network).
func (c *cluster) disconnect(name string) {
	c.t.Helper()
	c.docker("network", "disconnect", c.network(), c.id(name))
}

// reconnect puts a node back on the network at its address.
func (c *cluster) reconnect(name string) {
	c.t.Helper()
	c.docker("network", "connect", "--ip", c.nodes[name].ip, c.network(), c.id(name))
}

// waitHealthy waits until Docker reports the containers healthy (the
// image's HEALTHCHECK: sluice healthcheck, every 5 s).
func (c *cluster) waitHealthy(names ...string) {
	c.t.Helper()
	deadline := time.Now().Add(ringTimeout)
	for _, name := range names {
		for {
			out, err := run(30*time.Second, nil, "docker", "inspect", "--format", "{{.State.Health.Status}}", c.id(name))
			if err == nil && strings.TrimSpace(string(out)) == "healthy" {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s not healthy within %s: %s %v", name, ringTimeout, bytes.TrimSpace(out), err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// members asks one node for the cluster as it sees it.
func (c *cluster) members(name string) (*sluicev1.MembersResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return c.nodes[name].rateLimit.Members(ctx, &sluicev1.MembersRequest{})
}

// ringAgrees reports whether every node of names sees exactly names, all
// alive, and all have one ring fingerprint.
func (c *cluster) ringAgrees(names []string) bool {
	want := slices.Sorted(slices.Values(names))
	fp := ""
	for _, name := range names {
		resp, err := c.members(name)
		if err != nil {
			return false
		}
		var got []string
		for _, m := range resp.Members {
			if m.State != "alive" {
				return false
			}
			got = append(got, m.Name)
		}
		if !slices.Equal(got, want) {
			return false
		}
		if fp == "" {
			fp = resp.RingFingerprint
		} else if resp.RingFingerprint != fp {
			return false
		}
	}
	return true
}

// waitRing waits until names agree on a ring of exactly themselves and
// returns how long that took; it fails the test after ringTimeout.
func (c *cluster) waitRing(names ...string) time.Duration {
	c.t.Helper()
	took, ok := c.tryWaitRing(names...)
	if !ok {
		c.t.Fatalf("%v did not agree on a ring of themselves within %s", names, ringTimeout)
	}
	return took
}

// tryWaitRing is waitRing that reports, and logs what each node sees,
// when the nodes did not agree within ringTimeout.
func (c *cluster) tryWaitRing(names ...string) (time.Duration, bool) {
	c.t.Helper()
	start := time.Now()
	for !c.ringAgrees(names) {
		if time.Since(start) > ringTimeout {
			for _, name := range names {
				resp, err := c.members(name)
				var seen []string
				for _, m := range resp.GetMembers() {
					seen = append(seen, m.Name+"/"+m.State)
				}
				c.t.Logf("%s sees %v, ring %s (%v)", name, seen, resp.GetRingFingerprint(), err)
			}
			return time.Since(start), false
		}
		time.Sleep(250 * time.Millisecond)
	}
	return time.Since(start), true
}

// cli runs the sluice CLI on this host with the cluster's client flags.
func cli(args ...string) ([]byte, error) {
	return run(time.Minute, nil, sluiceBin, append(args, cliSecurityArgs()...)...)
}

// cliDecision is one line of sluice check --json.
type cliDecision struct {
	Allowed   bool   `json:"allowed"`
	Remaining int64  `json:"remaining"`
	ResetTime int64  `json:"reset_time"`
	Owner     string `json:"owner"`
	Degraded  bool   `json:"degraded"`
}

// benchResult is what the suite reads of sluice bench --json.
type benchResult struct {
	RPCs    int64 `json:"rpcs"`
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
	err     error
}

// bench runs sluice bench (workload spread, light: the machine is small)
// against nodes for d in the background; wait returns its summary.
func (c *cluster) bench(d time.Duration, names ...string) (wait func() benchResult) {
	var addrs []string
	for _, name := range names {
		addrs = append(addrs, c.nodes[name].grpcAddr())
	}
	done := make(chan benchResult, 1)
	go func() {
		out, err := run(d+2*time.Minute, nil, sluiceBin, append([]string{"bench", "--addrs", strings.Join(addrs, ","),
			"--workload", "spread", "--keys", "10000", "--concurrency", "4", "--warmup", "0s",
			"--duration", d.String(), "--timeout", "10s", "--json"}, cliSecurityArgs()...)...)
		var r benchResult
		if err == nil {
			// The summary is the last line (stdout, after the progress
			// lines on stderr).
			lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
			err = json.Unmarshal(lines[len(lines)-1], &r)
		}
		r.err = err
		done <- r
	}()
	return func() benchResult { return <-done }
}

// metrics reads a node's /metrics (over HTTPS, with the suite's client
// certificate) and returns its sluice_ series summed over their labels,
// by name.
func (c *cluster) metrics(name string) (map[string]float64, error) {
	cfg, err := client.TLSConfig(filepath.Join(pki, "ca", "ca.pem"), filepath.Join(pki, "client", "e2e.pem"), filepath.Join(pki, "client", "e2e-key.pem"))
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[name].httpPort)) + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics of %s: %s", name, resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sluice_") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		series := line[:sp]
		if i := strings.IndexByte(series, '{'); i >= 0 {
			series = series[:i]
		}
		m[series] += v
	}
	return m, sc.Err()
}

// accountingSeries are the counters the suite reports around a ring
// change: what can hand a client extra budget, or cost it some.
var accountingSeries = []string{
	"sluice_degraded_checks_total", "sluice_reforwarded_checks_total", "sluice_not_owner_applied_total",
	"sluice_view_mismatch_total", "sluice_keys_moved_without_state_total", "sluice_keys_owner_lost_total",
	"sluice_replica_takeovers_total", "sluice_replica_returned_total", "sluice_pulls_total",
	"sluice_handoff_timeouts_total", "sluice_handoff_errors_total", "sluice_handoff_refused_total",
}

// accounting returns the accountingSeries of m, and every other series
// whose name says stand-in or expired (metrics the nodes may add), that
// moved between before and m.
func accounting(before, m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if !slices.Contains(accountingSeries, k) && !strings.Contains(k, "stand_in") && !strings.Contains(k, "standin") && !strings.Contains(k, "expired") {
			continue
		}
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// formatSeries formats a map of series as "name=value ..." in name order,
// the sluice_ prefix and _total suffix left out.
func formatSeries(m map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%g", strings.TrimSuffix(strings.TrimPrefix(k, "sluice_"), "_total"), m[k])
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// envInt reads a positive count from the environment variable key, or
// returns def when it is unset.
func envInt(t *testing.T, key string, def int) int {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a count >= 1", key, v)
	}
	return n
}
