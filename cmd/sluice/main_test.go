package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc"
)

// noEnv is an empty environment.
func noEnv(string) (string, bool) { return "", false }

// startNode runs a real node on 127.0.0.1 with OS-picked ports.
func startNode(t *testing.T, name string) *rpc.Node {
	t.Helper()
	n, err := rpc.StartNode(rpc.NodeConfig{
		Name: name, GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	return n
}

// sluice runs the CLI in-process and returns its exit code and output.
func sluice(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"sluice"}, args...), noEnv, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckJSON(t *testing.T) {
	n := startNode(t, "cli-node")
	code, out, errOut := sluice(t, "check", "--addr", n.GRPCAddr(), "--name", "api", "--key", "user:42",
		"--limit", "3", "--window", "1h", "--algorithm", "token_bucket", "--count", "4", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), out)
	}
	wantKeys := []string{"name", "key", "allowed", "limit", "remaining", "reset_time", "retry_after", "owner", "delay", "degraded", "shadow"}
	for i, l := range lines {
		// Exactly these fields, in this order.
		keys := regexp.MustCompile(`"([a-z_]+)":`).FindAllStringSubmatch(l, -1)
		var got []string
		for _, k := range keys {
			got = append(got, k[1])
		}
		if strings.Join(got, ",") != strings.Join(wantKeys, ",") {
			t.Fatalf("line %d fields %v, want %v", i, got, wantKeys)
		}
		var cl checkLine
		if err := json.Unmarshal([]byte(l), &cl); err != nil {
			t.Fatal(err)
		}
		wantRemaining := int64(max(2-i, 0))
		if cl.Name != "api" || cl.Key != "user:42" || cl.Allowed != (i < 3) || cl.Limit != 3 ||
			cl.Remaining != wantRemaining || cl.Owner != "cli-node" {
			t.Fatalf("line %d: %+v", i, cl)
		}
		nowMs := time.Now().UnixMilli()
		if cl.ResetTime < nowMs || cl.ResetTime > nowMs+3600_001 { // +1: reset_time rounds up
			t.Fatalf("line %d: reset_time %d not within the hour after %d", i, cl.ResetTime, nowMs)
		}
		// A token bucket refills one hit every 20 minutes.
		if i < 3 && cl.RetryAfter != 0 || i == 3 && (cl.RetryAfter <= 0 || cl.RetryAfter > 1200_000) {
			t.Fatalf("line %d: retry_after %d", i, cl.RetryAfter)
		}
	}
}

func TestCheckExitCodes(t *testing.T) {
	n := startNode(t, "cli-node")
	addr := n.GRPCAddr()
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--limit", "0"}, 2, "--limit"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--limit", "-1"}, 2, "--limit"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--window", "0s"}, 2, "--window"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--window", "-5s"}, 2, "--window"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--window", "1500us"}, 2, "--window"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--hits", "-1"}, 2, "--hits"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--burst", "-1"}, 2, "--burst"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--algorithm", "leaky"}, 2, "--algorithm"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", strings.Repeat("k", 1025)}, 2, "--key"},
		{[]string{"check", "--addr", addr, "--name", "api"}, 2, "--key"},
		{[]string{"check", "--addr", addr, "--key", "k"}, 2, "--name"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--count", "0"}, 2, "--count"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--limit", "ten"}, 2, "limit"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"check", "--addr", "127.0.0.1:1", "--timeout", "500ms", "--name", "api", "--key", "k"}, 1, "127.0.0.1:1"},
		{[]string{"members", "--addr", "127.0.0.1:1", "--timeout", "500ms"}, 1, "127.0.0.1:1"},
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "--hits", "11"}, 0, ""}, // over capacity is an answer
		{[]string{"check", "--addr", addr, "--name", "api", "--key", "k", "extra"}, 2, "unexpected argument"},
		{[]string{"bogus"}, 2, "unknown command"},
		{[]string{"members", "--addr", addr, "extra"}, 2, "unexpected argument"},
	}
	for _, c := range cases {
		code, _, errOut := sluice(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("sluice %s: exit %d, stderr %q; want exit %d naming %q", strings.Join(c.args, " "), code, errOut, c.code, c.msg)
		}
	}
}

func TestMembersJSON(t *testing.T) {
	n1 := startNode(t, "m1")
	n2, err := rpc.StartNode(rpc.NodeConfig{
		Name: "m2", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", Region: "eu",
		Join: []string{n1.GossipAddr()}, Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close(context.Background())
	var mj membersJSON
	deadline := time.Now().Add(15 * time.Second)
	for len(mj.Members) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("m1 never saw m2")
		}
		time.Sleep(20 * time.Millisecond)
		code, out, errOut := sluice(t, "members", "--addr", n1.GRPCAddr(), "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		mj = membersJSON{}
		if err := json.Unmarshal([]byte(out), &mj); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	want := []memberJSON{
		{Name: "m1", GRPCAddr: n1.GRPCAddr(), GossipAddr: n1.GossipAddr(), Region: "local", State: "alive"},
		{Name: "m2", GRPCAddr: n2.GRPCAddr(), GossipAddr: n2.GossipAddr(), Region: "eu", State: "alive"},
	}
	sum := 0.0
	for i, m := range mj.Members {
		if m.RingShare <= 0.2 || m.RingShare >= 0.8 {
			t.Errorf("%s ring_share %f, want a fair part of 2 members", m.Name, m.RingShare)
		}
		sum += m.RingShare
		m.RingShare = 0
		if m != want[i] {
			t.Errorf("member %d = %+v, want %+v", i, m, want[i])
		}
	}
	if sum < 0.999 || sum > 1.001 {
		t.Errorf("ring shares add up to %f", sum)
	}
	code, out, _ := sluice(t, "members", "--addr", n1.GRPCAddr())
	if code != 0 || !strings.Contains(out, "m1 (answering)") || !strings.Contains(out, "m2") {
		t.Fatalf("table output (exit %d):\n%s", code, out)
	}
}

// startServe runs `sluice serve` with args and the environment env until
// the returned stop is called, and returns the gRPC address from its start
// line (which must name the node name). stop ends it as SIGTERM does and
// returns its exit code and stderr.
func startServe(t *testing.T, name string, args []string, env map[string]string) (addr string, stop func() (int, string)) {
	t.Helper()
	_, found, stop := startServeLog(t, args, env, regexp.MustCompile(`msg="node started" node=`+regexp.QuoteMeta(name)+` grpc_addr=(\S+)`))
	return found[0][1], stop
}

// startServeLog runs `sluice serve` as startServe does and waits (10 s at
// most) until its log (stderr, returned) has a match of each of lines,
// returned in order.
func startServeLog(t *testing.T, args []string, env map[string]string, lines ...*regexp.Regexp) (*syncbuf.Buffer, [][]string, func() (int, string)) {
	t.Helper()
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"sluice", "serve"}, args...), getenv, &out, &errOut) }()
	stop := func() (int, string) {
		cancel()
		select {
		case code := <-done:
			return code, errOut.String()
		case <-time.After(10 * time.Second):
			t.Fatal("serve did not stop")
			return -1, ""
		}
	}
	found := make([][]string, len(lines))
	deadline := time.Now().Add(10 * time.Second)
	for {
		for i, re := range lines {
			found[i] = re.FindStringSubmatch(errOut.String())
		}
		if !slices.ContainsFunc(found, func(m []string) bool { return m == nil }) {
			return &errOut, found, stop
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before starting:\n%s", code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("serve's log has no line matching each of %v:\n%s", lines, errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serve reads its flags from SLUICE_<FLAG>, answers checks, and exits 0
// after a graceful leave when its context ends (as on SIGTERM).
func TestServeFromEnvAndGracefulStop(t *testing.T) {
	addr, stop := startServe(t, "env-node", nil, map[string]string{
		"SLUICE_NAME":        "env-node",
		"SLUICE_GRPC_ADDR":   "127.0.0.1:0",
		"SLUICE_GOSSIP_ADDR": "127.0.0.1:0",
		"SLUICE_HTTP_ADDR":   "127.0.0.1:0",
		"SLUICE_REGION":      "env-region",
		"SLUICE_PROFILE":     "local",
	})
	code, jsonOut, stderr := sluice(t, "members", "--addr", addr, "--json")
	if code != 0 || !strings.Contains(jsonOut, `"name":"env-node"`) || !strings.Contains(jsonOut, `"region":"env-region"`) {
		t.Fatalf("members: exit %d %s %s", code, jsonOut, stderr)
	}
	if code, _, stderr := sluice(t, "check", "--addr", addr, "--name", "api", "--key", "k"); code != 0 {
		t.Fatalf("check: exit %d %s", code, stderr)
	}
	if code, out, stderr := sluice(t, "healthcheck", "--addr", addr); code != 0 || !strings.Contains(out, "SERVING") {
		t.Fatalf("healthcheck: exit %d %s %s", code, out, stderr)
	}
	code, log := stop()
	if code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, log)
	}
	if !strings.Contains(log, `msg="node stopped"`) {
		t.Fatalf("no graceful stop in the log:\n%s", log)
	}
	if code, _, _ := sluice(t, "healthcheck", "--addr", addr, "--timeout", "1s"); code != 1 {
		t.Fatalf("healthcheck of a stopped node: exit %d, want 1", code)
	}
}

// serve's settings come from the command line, then SLUICE_* variables,
// then the --config file; named limits come from --limits.
func TestServeConfigFileAndNamedLimits(t *testing.T) {
	dir := t.TempDir()
	limitsFile := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limitsFile, []byte("limits:\n  login:\n    limit: 2\n    window: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Join([]string{
		"name: file-node", "region: file-region", "grpc-addr: 127.0.0.1:0", "gossip-addr: 127.0.0.1:0",
		"http-addr: 127.0.0.1:0", "profile: local", "join: []", "limits: " + limitsFile, "",
	}, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, stop := startServe(t, "cli-node", []string{"--config", cfg, "--name", "cli-node"},
		map[string]string{"SLUICE_REGION": "env-region", "SLUICE_NAME": "env-node"})
	defer stop()
	_, jsonOut, _ := sluice(t, "members", "--addr", addr, "--json")
	if !strings.Contains(jsonOut, `"name":"cli-node"`) || !strings.Contains(jsonOut, `"region":"env-region"`) {
		t.Fatalf("members: %s (want the name from the command line, the region from the environment)", jsonOut)
	}
	code, out, stderr := sluice(t, "check", "--addr", addr, "--name", "login", "--key", "u1", "--named", "--count", "3", "--json")
	if code != 0 || strings.Count(out, `"allowed":true`) != 2 || strings.Count(out, `"limit":2`) != 3 {
		t.Fatalf("named check: exit %d\n%s%s", code, out, stderr)
	}
	if code, _, stderr := sluice(t, "check", "--addr", addr, "--name", "nope", "--key", "u1", "--named"); code != 2 || !strings.Contains(stderr, `--name: no limit called "nope" is configured`) {
		t.Fatalf("--named with an unknown name: exit %d %s", code, stderr)
	}
	if code, _, stderr := sluice(t, "check", "--addr", addr, "--name", "login", "--key", "u1", "--named", "--limit", "5"); code != 2 || !strings.Contains(stderr, "--limit") {
		t.Fatalf("--named with --limit: exit %d %s", code, stderr)
	}
}

func TestServeRefusesBadConfigFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ file, msg string }{
		{"grpc-addr: 127.0.0.1:0\ngrpc_adr: x\n", `:2: unknown setting "grpc_adr"`},
		{"max-keys: lots\n", ":1: max-keys:"},
		{"- a\n- b\n", ":1: want a mapping"},
		{"grpc-addr: 127.0.0.1:0\ngrpc-addr: 127.0.0.1:1\n", ":2: grpc-addr is given twice (also on line 1)"},
		{"region: a\n---\nregion: b\n", ":2: a second YAML document"},
		{"limits: " + filepath.Join(dir, "missing.yaml") + "\n", "--limits"},
	} {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := sluice(t, "serve", "--config", path, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "")
		if code != 2 || !strings.Contains(errOut, tc.msg) {
			t.Errorf("config %q: exit %d, stderr %q; want exit 2 naming %q", tc.file, code, errOut, tc.msg)
		}
	}
	if code, _, errOut := sluice(t, "serve", "--config", filepath.Join(dir, "none.yaml")); code != 2 || !strings.Contains(errOut, "--config") {
		t.Errorf("missing config file: exit %d %q", code, errOut)
	}
}

func TestServeRefusesBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"serve", "--profile", "moon"}, "--profile"},
		{[]string{"serve", "--grpc-addr", "0.0.0.0:0", "--gossip-addr", "127.0.0.1:0"}, "advertise_addr"},
		{[]string{"serve", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--forward-timeout", "0s"}, "--forward-timeout"},
		{[]string{"serve", "--name", ""}, "--name"},
		{[]string{"serve", "--on-key-cap", "lru"}, "--on-key-cap"},
		{[]string{"serve", "--name-key-share", "0"}, "--name-key-share"},
		{[]string{"serve", "--max-inflight", "0"}, "--max-inflight"},
		{[]string{"serve", "--max-recv-bytes", "0"}, "--max-recv-bytes"},
		{[]string{"serve", "--http-read-header-timeout", "0s"}, "--http-read-header-timeout"},
		{[]string{"serve", "--max-connection-age", "-1s"}, "--max-connection-age"},
		{[]string{"serve", "--name", "two words"}, "name"},
		{[]string{"serve", "--regions", "us=1,eu=x"}, `--regions: bad region list: regions[1] "eu": weight must be a whole number`},
		{[]string{"serve", "--regions", "us,us"}, `"us" is listed twice`},
		{[]string{"serve", "--regions", "us,eu", "--region", "ap"}, `--region: "ap" is not one of --regions (us, eu)`},
		{[]string{"serve", "--regions", "us,eu"}, `--region: required with --regions: this node's region, one of us, eu`},
		{[]string{"serve", "--config", "testdata/regions-bad.yaml"}, `--regions`},
		{[]string{"serve", "--rls-near-limit-ratio", "1.5"}, `--rls-near-limit-ratio: want a number in (0, 1], got "1.5"`},
		{[]string{"serve", "--grpc-addr", "0.0.0.0:0", "--advertise-addr", "127.0.0.1", "--gossip-addr", "127.0.0.1:0", "--http-addr", ""}, "--insecure"},
	}
	for _, c := range cases {
		// Ports the OS picks unless the case sets them: a refusal that
		// comes after binding must not meet a node running on the
		// defaults (make run).
		for _, f := range []string{"--grpc-addr", "--gossip-addr", "--http-addr"} {
			if !slices.Contains(c.args, f) {
				v := "127.0.0.1:0"
				if f == "--http-addr" {
					v = ""
				}
				c.args = append(c.args, f, v)
			}
		}
		code, _, errOut := sluice(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.msg) {
			t.Errorf("sluice %s: exit %d, stderr %q; want a failure naming %q", strings.Join(c.args, " "), code, errOut, c.msg)
		}
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("grpc-addr"); got != "SLUICE_GRPC_ADDR" {
		t.Fatalf("EnvName = %s", got)
	}
}

// keygen prints a key that serve --gossip-key-file takes; a bad key file
// stops serve, naming the flag and the line.
func TestKeygenAndGossipKeyFile(t *testing.T) {
	code, out, _ := sluice(t, "keygen")
	key := strings.TrimSpace(out)
	if b, err := base64.StdEncoding.DecodeString(key); code != 0 || err != nil || len(b) != 32 {
		t.Fatalf("keygen: exit %d, %q", code, out)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "gossip.keys")
	if err := os.WriteFile(good, []byte("# primary\n"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, stop := startServe(t, "keyed", []string{"--name", "keyed", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0",
		"--http-addr", "", "--profile", "local", "--gossip-key-file", good, "--cluster-label", "test"}, nil)
	if code, _, stderr := sluice(t, "check", "--addr", addr, "--name", "api", "--key", "k"); code != 0 {
		t.Fatalf("check on a keyed node: exit %d %s", code, stderr)
	}
	if code, log := stop(); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, log)
	}
	bad := filepath.Join(dir, "bad.keys")
	if err := os.WriteFile(bad, []byte(key+"\nnot a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := sluice(t, "serve", "--gossip-key-file", bad, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", ""); code != 2 || !strings.Contains(errOut, "--gossip-key-file") || !strings.Contains(errOut, "bad.keys:2") {
		t.Fatalf("a bad key file: exit %d %q", code, errOut)
	}
}

// serve and bench set GOGC=400 only when the environment sets no GOGC.
func TestDefaultGCPercentYieldsToGOGC(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	if gc, set := defaultGCPercent(env(nil)); !set || gc != 400 {
		t.Fatalf("no GOGC: %d, %v; want 400, true", gc, set)
	}
	if gc, set := defaultGCPercent(env(map[string]string{"GOMEMLIMIT": "1GiB"})); !set || gc != 400 {
		t.Fatalf("GOMEMLIMIT alone: %d, %v; want 400, true", gc, set)
	}
	for _, v := range []string{"100", "off"} {
		if _, set := defaultGCPercent(env(map[string]string{"GOGC": v})); set {
			t.Fatalf("GOGC=%s: the default was applied over it", v)
		}
	}
}

// check --scope sends the scope; with regions the answers carry scope,
// region and the global limit's slice, in text and JSON; a bad scope is a
// usage error naming the flag.
func TestCheckScope(t *testing.T) {
	regions, err := region.Parse("us,eu")
	if err != nil {
		t.Fatal(err)
	}
	n, err := rpc.StartNode(rpc.NodeConfig{
		Name: "us-1", Region: "us", Regions: regions, GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second, LeaseBase: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	// Leases off (LeaseBase 1): fixed slices, 2 of 4 in each region.
	code, out, errOut := sluice(t, "check", "--addr", n.GRPCAddr(), "--name", "api", "--key", "k", "--limit", "4", "--count", "3", "--algorithm", "sliding_window")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.Contains(lines[0], "scope=global region=us slice=2") ||
		!strings.Contains(lines[2], "over limit") || !strings.Contains(lines[2], "slice_exhausted") {
		t.Fatalf("global: exit %d, out:\n%s\nstderr %s", code, out, errOut)
	}
	code, out, _ = sluice(t, "check", "--addr", n.GRPCAddr(), "--name", "api", "--key", "k2", "--limit", "4", "--scope", "regional", "--json")
	var cl checkLine
	if err := json.Unmarshal([]byte(out), &cl); err != nil || code != 0 || cl.Scope != "regional" || cl.Region != "us" || cl.Slice != 0 || cl.Remaining != 3 {
		t.Fatalf("regional: exit %d, %+v (%v)", code, cl, err)
	}
	if code, _, errOut := sluice(t, "check", "--addr", n.GRPCAddr(), "--name", "api", "--key", "k", "--scope", "planet"); code != 2 || !strings.Contains(errOut, "--scope") {
		t.Errorf("bad scope: exit %d, %q", code, errOut)
	}
}
