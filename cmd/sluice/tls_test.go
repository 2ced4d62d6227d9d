package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rpc"
)

func parseCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tls ca create and tls cert create write files that verify against each
// other, with keys 0600, the identity and hosts asked for, and never
// overwrite.
func TestTLSCreate(t *testing.T) {
	dir := t.TempDir()
	caDir, out := filepath.Join(dir, "ca"), filepath.Join(dir, "out")
	if code, _, errOut := sluice(t, "tls", "ca", "create", "--out", caDir); code != 0 {
		t.Fatalf("ca create: %d %s", code, errOut)
	}
	if code, _, errOut := sluice(t, "tls", "ca", "create", "--out", caDir); code != exitUsage || !strings.Contains(errOut, "exists") {
		t.Fatalf("ca create over an existing CA: %d %s, want %d naming the file", code, errOut, exitUsage)
	}
	if code, _, errOut := sluice(t, "tls", "cert", "create", "--ca", caDir, "--peer", "node1", "--host", "127.0.0.1", "--host", "sluice1.internal", "--out", out); code != 0 {
		t.Fatalf("cert create --peer: %d %s", code, errOut)
	}
	if code, _, errOut := sluice(t, "tls", "cert", "create", "--ca", caDir, "--client", "app", "--out", out); code != 0 {
		t.Fatalf("cert create --client: %d %s", code, errOut)
	}
	for _, bad := range [][]string{
		{"--ca", caDir, "--peer", "node1", "--out", out},                  // exists
		{"--ca", caDir, "--peer", "a", "--client", "b", "--out", out},     // both
		{"--ca", caDir, "--out", out},                                     // neither
		{"--ca", filepath.Join(dir, "none"), "--peer", "x", "--out", out}, // no CA
		{"--ca", caDir, "--peer", "bad/name", "--out", out},               // bad name
	} {
		if code, _, errOut := sluice(t, append([]string{"tls", "cert", "create"}, bad...)...); code != exitUsage {
			t.Errorf("cert create %v: %d %s, want %d", bad, code, errOut, exitUsage)
		}
	}
	for _, f := range []string{filepath.Join(caDir, "ca-key.pem"), filepath.Join(out, "node1-key.pem"), filepath.Join(out, "app-key.pem")} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	ca := parseCert(t, filepath.Join(caDir, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	peer := parseCert(t, filepath.Join(out, "node1.pem"))
	if _, err := peer.Verify(x509.VerifyOptions{Roots: pool, DNSName: "sluice1.internal", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("peer certificate does not verify as a server for sluice1.internal: %v", err)
	}
	if err := peer.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("peer certificate: %v", err)
	}
	if k, n, ok := certs.Identity(peer); !ok || k != certs.Peer || n != "node1" {
		t.Errorf("peer identity %s %q %v, want peer node1", k, n, ok)
	}
	client := parseCert(t, filepath.Join(out, "app.pem"))
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify as a client: %v", err)
	}
	if k, n, ok := certs.Identity(client); !ok || k != certs.Client || n != "app" {
		t.Errorf("client identity %s %q %v, want client app", k, n, ok)
	}
	for _, p := range [][2]string{{"node1.pem", "node1-key.pem"}, {"app.pem", "app-key.pem"}} {
		if _, err := tls.LoadX509KeyPair(filepath.Join(out, p[0]), filepath.Join(out, p[1])); err != nil {
			t.Errorf("%s and %s do not match: %v", p[0], p[1], err)
		}
	}
}

// The client commands talk to an mTLS node with --tls-ca, --tls-cert and
// --tls-key; without a client certificate they fail.
func TestClientCommandsOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	caDir, out := filepath.Join(dir, "ca"), filepath.Join(dir, "out")
	for _, args := range [][]string{
		{"tls", "ca", "create", "--out", caDir},
		{"tls", "cert", "create", "--ca", caDir, "--peer", "secure", "--host", "127.0.0.1", "--out", out},
		{"tls", "cert", "create", "--ca", caDir, "--client", "cli", "--out", out},
	} {
		if code, _, errOut := sluice(t, args...); code != 0 {
			t.Fatalf("%v: %d %s", args, code, errOut)
		}
	}
	n, err := rpc.StartNode(rpc.NodeConfig{Name: "secure", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second,
		TLSCert: filepath.Join(out, "secure.pem"), TLSKey: filepath.Join(out, "secure-key.pem"), TLSCA: filepath.Join(caDir, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	auth := []string{"--addr", n.GRPCAddr(), "--tls-ca", filepath.Join(caDir, "ca.pem"),
		"--tls-cert", filepath.Join(out, "cli.pem"), "--tls-key", filepath.Join(out, "cli-key.pem")}
	if code, stdout, errOut := sluice(t, append([]string{"check", "--name", "api", "--key", "k", "--json"}, auth...)...); code != 0 || !strings.Contains(stdout, `"owner":"secure"`) {
		t.Fatalf("check over mTLS: %d %s %s", code, stdout, errOut)
	}
	if code, stdout, errOut := sluice(t, append([]string{"members", "--json"}, auth...)...); code != 0 || !strings.Contains(stdout, `"name":"secure"`) {
		t.Fatalf("members over mTLS: %d %s %s", code, stdout, errOut)
	}
	if code, stdout, errOut := sluice(t, append([]string{"healthcheck"}, auth...)...); code != 0 || !strings.Contains(stdout, "SERVING") {
		t.Fatalf("healthcheck over mTLS: %d %s %s", code, stdout, errOut)
	}
	noCert := []string{"check", "--name", "api", "--key", "k", "--addr", n.GRPCAddr(), "--tls-ca", filepath.Join(caDir, "ca.pem")}
	if code, _, errOut := sluice(t, noCert...); code != exitFailure {
		t.Fatalf("check without a client certificate: %d %s, want %d", code, errOut, exitFailure)
	}
	if code, _, errOut := sluice(t, "check", "--name", "api", "--key", "k", "--addr", n.GRPCAddr()); code != exitFailure || !strings.Contains(errOut, "does the node serve TLS? give --tls-ca") {
		t.Fatalf("plaintext check on a TLS node: %d %s, want %d and a hint to give --tls-ca", code, errOut, exitFailure)
	}
}

// check sends a token from --token-file or SLUICE_TOKEN; without one, or
// with one that does not cover the name, the node refuses (exit 1).
func TestCheckWithToken(t *testing.T) {
	dir := t.TempDir()
	tokens, mine := filepath.Join(dir, "tokens"), filepath.Join(dir, "mine")
	const tok = "cli-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte(tok+" api\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mine, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A token checks configured limits only (no numbers of its own).
	set, err := limits.Parse("limits.yaml", []byte("limits:\n  api: {limit: 10, window: 1m}\n  billing: {limit: 10, window: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := rpc.StartNode(rpc.NodeConfig{Name: "tok", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second, TokenFile: tokens,
		Limits: limits.Static(set)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	runEnv := func(env map[string]string, args ...string) (int, string) {
		var out, errOut strings.Builder
		code := run(context.Background(), append([]string{"sluice", "check", "--addr", n.GRPCAddr(), "--key", "k", "--named"}, args...),
			func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, &errOut)
		return code, errOut.String()
	}
	if code, errOut := runEnv(nil, "--name", "api", "--token-file", mine); code != 0 {
		t.Fatalf("--token-file: %d %s", code, errOut)
	}
	if code, errOut := runEnv(map[string]string{"SLUICE_TOKEN": tok}, "--name", "api"); code != 0 {
		t.Fatalf("SLUICE_TOKEN: %d %s", code, errOut)
	}
	if code, errOut := runEnv(nil, "--name", "api"); code != exitFailure || !strings.Contains(errOut, "Unauthenticated") {
		t.Fatalf("no token: %d %s, want %d Unauthenticated", code, errOut, exitFailure)
	}
	if code, errOut := runEnv(map[string]string{"SLUICE_TOKEN": tok}, "--name", "billing"); code != exitFailure || !strings.Contains(errOut, "PermissionDenied") {
		t.Fatalf("a name outside the token's prefixes: %d %s, want %d PermissionDenied", code, errOut, exitFailure)
	}
	var out, errOut strings.Builder
	code := run(context.Background(), []string{"sluice", "check", "--addr", n.GRPCAddr(), "--key", "k", "--name", "api", "--limit", "1000", "--window", "1s"},
		func(k string) (string, bool) { return map[string]string{"SLUICE_TOKEN": tok}[k], k == "SLUICE_TOKEN" }, &out, &errOut)
	if code != exitFailure || !strings.Contains(errOut.String(), "configured limits only") {
		t.Fatalf("a token check with numbers of its own: %d %s, want %d PermissionDenied", code, errOut.String(), exitFailure)
	}
}
