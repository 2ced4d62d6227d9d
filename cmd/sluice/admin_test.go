package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
)

// The operators' commands against an mTLS node with admin tokens: a
// client certificate is refused (exit 1, the node's PERMISSION_DENIED
// naming what it takes); an admin certificate (tls cert create --admin)
// or a client certificate with --admin-token-file is taken. key get shows
// a key's window, key reset starts it afresh (exit 0, complete), limits
// show lists the named limits and the RLS rules with their check names.
func TestAdminCommandsOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	caDir, out := filepath.Join(dir, "ca"), filepath.Join(dir, "out")
	for _, args := range [][]string{
		{"tls", "ca", "create", "--out", caDir},
		{"tls", "cert", "create", "--ca", caDir, "--peer", "secure", "--host", "127.0.0.1", "--out", out},
		{"tls", "cert", "create", "--ca", caDir, "--client", "cli", "--out", out},
		{"tls", "cert", "create", "--ca", caDir, "--admin", "ops", "--out", out},
	} {
		if code, _, errOut := sluice(t, args...); code != 0 {
			t.Fatalf("%v: %d %s", args, code, errOut)
		}
	}
	if k, n, ok := certs.Identity(parseCert(t, filepath.Join(out, "ops.pem"))); !ok || k != certs.Admin || n != "ops" {
		t.Fatalf("tls cert create --admin ops: identity %s %q %v", k, n, ok)
	}
	if code, _, errOut := sluice(t, "tls", "cert", "create", "--ca", caDir, "--client", "a", "--admin", "b", "--out", out); code != exitUsage || !strings.Contains(errOut, "one of --peer, --client or --admin") {
		t.Fatalf("--client and --admin: %d %s", code, errOut)
	}
	const adminTok = "admin-token-0123456789abcdef"
	adminTokens, adminTokFile := filepath.Join(dir, "admin-tokens"), filepath.Join(dir, "my-admin-token")
	if err := os.WriteFile(adminTokens, []byte(adminTok+" ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(adminTokFile, []byte(adminTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := limits.Open("../../examples/limits.yaml", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := rls.Open("../../examples/rls", rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n, err := rpc.StartNode(rpc.NodeConfig{Name: "secure", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second, Limits: src, RLSSource: rules,
		TLSCert: filepath.Join(out, "secure.pem"), TLSKey: filepath.Join(out, "secure-key.pem"), TLSCA: filepath.Join(caDir, "ca.pem"),
		AdminTokenFile: adminTokens})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	tlsArgs := func(who string) []string {
		return []string{"--addr", n.GRPCAddr(), "--tls-ca", filepath.Join(caDir, "ca.pem"),
			"--tls-cert", filepath.Join(out, who+".pem"), "--tls-key", filepath.Join(out, who+"-key.pem")}
	}
	get := []string{"key", "get", "--name", "auth.signin", "--key", "user:7"}
	if code, _, errOut := sluice(t, append(get, tlsArgs("cli")...)...); code != exitFailure || !strings.Contains(errOut, "PermissionDenied") ||
		!strings.Contains(errOut, "a client certificate (cli) is not an admin's") {
		t.Fatalf("key get with a client certificate: %d %s, want %d and PERMISSION_DENIED", code, errOut, exitFailure)
	}
	for range 2 {
		if code, _, errOut := sluice(t, append([]string{"check", "--name", "auth.signin", "--key", "user:7", "--named"}, tlsArgs("cli")...)...); code != 0 {
			t.Fatalf("check: %d %s", code, errOut)
		}
	}
	code, stdout, errOut := sluice(t, append(get, tlsArgs("ops")...)...)
	if code != 0 || !strings.Contains(stdout, "owner secure, replicas none") || !regexpMatch(stdout, `secure\s+owner\s+window\s+sliding_window\s+15m0s\s+2\s+0\s+5\s+3\s`) {
		t.Fatalf("key get with an admin certificate: %d\n%s%s", code, stdout, errOut)
	}
	reset := []string{"key", "reset", "--name", "auth.signin", "--key", "user:7", "--json"}
	code, stdout, errOut = sluice(t, append(append(reset, tlsArgs("cli")...), "--admin-token-file", adminTokFile)...)
	var resp struct {
		Complete bool `json:"complete"`
		Regions  []struct {
			Nodes []struct {
				Node   string `json:"node"`
				Window struct {
					Count string `json:"count"`
				} `json:"window"`
			} `json:"nodes"`
		} `json:"regions"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &resp) != nil || !resp.Complete || resp.Regions[0].Nodes[0].Window.Count != "2" {
		t.Fatalf("key reset with an admin token: %d %s %s", code, stdout, errOut)
	}
	code, stdout, errOut = sluice(t, append(get, tlsArgs("ops")...)...)
	if code != 0 || !regexpMatch(stdout, `secure\s+owner\s+window\s+sliding_window\s+15m0s\s+0\s+0\s+5\s+5\s`) {
		t.Fatalf("key get after the reset: %d\n%s%s", code, stdout, errOut)
	}
	code, stdout, errOut = sluice(t, append([]string{"limits", "show"}, tlsArgs("ops")...)...)
	if code != 0 || !regexpMatch(stdout, `(?m)^auth\.signin\s+-\s+sliding_window\s+5\s+15m0s`) || !regexpMatch(stdout, `(?m)^\s+tier:pro:\s+token_bucket\s+300\s+1m0s\s+600`) ||
		!strings.Contains(stdout, "edge.remote_address: unit=MINUTE requests_per_unit=10") || !strings.Contains(stdout, `rls "edge" "remote_address"`) {
		t.Fatalf("limits show: %d\n%s%s", code, stdout, errOut)
	}
	if code, _, errOut := sluice(t, "key", "get", "--name", "api", "--addr", n.GRPCAddr()); code != exitUsage || !strings.Contains(errOut, "invalid --key: required") {
		t.Fatalf("key get without --key: %d %s", code, errOut)
	}
}

// On a node on loopback with no credentials at all, the operators'
// commands need none; a key reset there reports every node it reached.
func TestAdminCommandsOnLoopback(t *testing.T) {
	n := startNode(t, "open")
	if code, _, errOut := sluice(t, "check", "--addr", n.GRPCAddr(), "--name", "api", "--key", "k", "--limit", "3"); code != 0 {
		t.Fatalf("check: %d %s", code, errOut)
	}
	code, stdout, errOut := sluice(t, "key", "reset", "--addr", n.GRPCAddr(), "--name", "api", "--key", "k")
	if code != 0 || !regexpMatch(stdout, `open\s+owner\s+window\s+fixed_window\s+1m0s\s+1\s+-\s+-\s+-`) || !strings.Contains(stdout, "reset complete") {
		t.Fatalf("key reset: %d\n%s%s", code, stdout, errOut)
	}
	code, stdout, errOut = sluice(t, "limits", "show", "--addr", n.GRPCAddr())
	if code != 0 || !strings.Contains(stdout, "named limits of open (none): 0") || !strings.Contains(stdout, "no RLS rules") {
		t.Fatalf("limits show: %d\n%s%s", code, stdout, errOut)
	}
}

// validate: good and bad files of both kinds, told apart by their content
// or by --kind; 0 when valid, 2 with the file, line and field when not.
func TestValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badLimits := write("bad-limits.yaml", "limits:\n  api:\n    limit: 10\n    window: fortnight\n")
	badRLS := write("bad-rls.yaml", "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 10\n")
	badDir := filepath.Join(dir, "rules")
	if err := os.Mkdir(badDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badDir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badDir, "b.yaml"), []byte("domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyDir := filepath.Join(dir, "empty")
	peerRoot := filepath.Join(dir, "runtime") // RUNTIME_ROOT=runtime RUNTIME_SUBDIRECTORY=svc
	for _, d := range []string{emptyDir, filepath.Join(peerRoot, "svc", "config")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(peerRoot, "svc", "config", "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout when 0, else in stderr
	}{
		{[]string{"../../examples/limits.yaml"}, 0, "a valid limits file: 3 limits (api, auth.signin, auth.signup)"},
		{[]string{"../../examples/rls/edge.yaml"}, 0, "valid RLS rules:"},
		{[]string{"../../examples/rls"}, 0, "in 1 domains (edge), 1 files"},
		{[]string{"--kind", "limits", write("none.yaml", "limits: {}\n")}, 0, "a valid limits file: 0 limits"},
		{[]string{badLimits}, exitUsage, "bad-limits.yaml:4: limits.api.window: "},
		{[]string{badRLS}, exitUsage, "bad-rls.yaml:5:13: descriptors[0].rate_limit.unit: "},
		{[]string{badDir}, exitUsage, "b.yaml:1:9: domain: duplicate domain \"a\""},
		{[]string{"--rls-merge-domain-config", badDir}, 0, "2 rules in 1 domains (a), 2 files"},
		// No rules in force: 2 unless --allow-empty; rule files that give
		// none, or are not read (the peer's config/), 2 whatever.
		{[]string{emptyDir}, exitUsage, emptyDir + ": no RLS rules: no rule file in it or below it, so a node would answer every Envoy request OK; give --allow-empty"},
		{[]string{"--allow-empty", emptyDir}, 0, emptyDir + ": valid RLS rules: 0 rules in 0 domains, 0 files"},
		{[]string{"--kind", "rls", "--allow-empty", write("norule.yaml", "domain: d\n")}, exitUsage, "norule.yaml: no rules: the file gives no rate_limit"},
		{[]string{"--allow-empty", peerRoot}, exitUsage, peerRoot + ": no rules: 1 rule file below it is not read (" + filepath.Join(peerRoot, "svc", "config", "a.yaml") +
			"; --rls-config reads the *.yaml and *.yml files directly in its directory, not in subdirectories), so every request would be OK; " +
			"envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml: pass --rls-config " + filepath.Join(peerRoot, "svc", "config")},
		{[]string{filepath.Join(peerRoot, "svc", "config")}, 0, "valid RLS rules: 1 rules in 1 domains (a), 1 files"},
		{[]string{write("empty.yaml", "")}, exitUsage, "neither a limits file"},
		{[]string{"--kind", "limits", write("empty2.yaml", "# nothing yet\n")}, exitUsage, "no limits: key"},
		{[]string{"--kind", "rls", "../../examples/limits.yaml"}, exitUsage, "limits.yaml"},
		{[]string{"--kind", "yaml", badLimits}, exitUsage, "invalid --kind"},
		{[]string{filepath.Join(dir, "missing.yaml")}, exitUsage, "no such file"},
		{[]string{}, exitUsage, "validate takes one FILE"},
		{[]string{write("junk.yaml", "limits: [\n")}, exitUsage, "junk.yaml"},
	} {
		code, stdout, errOut := sluice(t, append([]string{"validate"}, tc.args...)...)
		got := stdout
		if tc.code != 0 {
			got = errOut
		}
		if code != tc.code || !strings.Contains(got, tc.want) {
			t.Errorf("validate %v: %d\n%s%s\nwant %d and %q", tc.args, code, stdout, errOut, tc.code, tc.want)
		}
	}
}

// regexpMatch reports whether the regular expression re matches s.
func regexpMatch(s, re string) bool { return regexp.MustCompile(re).MatchString(s) }
