package rpc

import (
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/internal/syncbuf"
)

// Protected mode: a node others could reach refuses to start without
// Insecure, naming the setting; loopback needs nothing.
func TestProtectedMode(t *testing.T) {
	for _, tc := range []struct {
		cfg     NodeConfig
		setting string // "" : allowed
	}{
		{NodeConfig{GRPCAddr: "127.0.0.1:7070", GossipAddr: "127.0.0.1:7946", HTTPAddr: "127.0.0.1:7080"}, ""},
		{NodeConfig{GRPCAddr: "[::1]:7070", GossipAddr: "localhost:7946"}, ""},
		{NodeConfig{GRPCAddr: "0.0.0.0:7070", GossipAddr: "127.0.0.1:7946", AdvertiseHost: "127.0.0.1"}, "grpc_addr"},
		{NodeConfig{GRPCAddr: "127.0.0.1:7070", GossipAddr: "127.0.0.1:7946", HTTPAddr: ":7080"}, "http_addr"},
		{NodeConfig{GRPCAddr: "127.0.0.1:7070", GossipAddr: "10.0.0.5:7946"}, "gossip_addr"},
		{NodeConfig{GRPCAddr: "127.0.0.1:7070", GossipAddr: "127.0.0.1:7946", AdvertiseHost: "10.0.0.5"}, "advertise_addr"},
		{NodeConfig{GRPCAddr: "sluice1:7070", GossipAddr: "127.0.0.1:7946"}, "grpc_addr"},
	} {
		err := protectedMode(tc.cfg)
		switch {
		case tc.setting == "" && err != nil:
			t.Errorf("%+v: refused: %v", tc.cfg, err)
		case tc.setting != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.setting+":") || !strings.Contains(err.Error(), "--insecure")):
			t.Errorf("%+v: %v, want a refusal naming %s and --insecure", tc.cfg, err, tc.setting)
		}
		tc.cfg.Insecure = true
		if err := protectedMode(tc.cfg); err != nil {
			t.Errorf("%+v with Insecure: %v", tc.cfg, err)
		}
	}
	// StartNode enforces it before binding anything.
	if _, err := StartNode(NodeConfig{Name: "n", GRPCAddr: "0.0.0.0:0", GossipAddr: "127.0.0.1:0", AdvertiseHost: "127.0.0.1"}); err == nil || !strings.HasPrefix(err.Error(), "grpc_addr:") {
		t.Fatalf("StartNode off loopback without Insecure: %v", err)
	}
}

// With Insecure, a node off loopback starts, warns in its log and sets
// sluice_insecure; a node on loopback does neither.
func TestInsecureNodeStartsAndSaysSo(t *testing.T) {
	var logs syncbuf.Buffer
	n, err := StartNode(NodeConfig{Name: "wide", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", HTTPAddr: "0.0.0.0:0",
		AdvertiseHost: "127.0.0.1", Profile: cluster.Local, Insecure: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Kill()
	_, port, _ := net.SplitHostPort(n.HTTPAddr())
	code, out := httpDo(t, "GET", "http://127.0.0.1:"+port+"/metrics", "")
	if code != 200 || !strings.Contains(out, "\nsluice_insecure 1\n") {
		t.Fatalf("/metrics of an insecure node: %d, no sluice_insecure 1", code)
	}
	eventually(t, "the insecure warning", func() bool {
		return strings.Contains(logs.String(), "INSECURE") && strings.Contains(logs.String(), "setting=http_addr")
	})

	safe := startNodeCfg(t, NodeConfig{Name: "safe", HTTPAddr: "127.0.0.1:0"})
	if _, out := httpDo(t, "GET", "http://"+safe.HTTPAddr()+"/metrics", ""); !strings.Contains(out, "\nsluice_insecure 0\n") {
		t.Fatal("/metrics of a loopback node: no sluice_insecure 0")
	}
}

// Off loopback, a node starts without Insecure once gossip is encrypted
// and clients and peers are authenticated (TLS with mtls or either, or
// tokens over TLS); otherwise the refusal names exactly what is missing.
func TestProtectedModeSecured(t *testing.T) {
	key := [][]byte{make([]byte, 32)}
	wide := NodeConfig{GRPCAddr: "0.0.0.0:7070", GossipAddr: "127.0.0.1:7946", AdvertiseHost: "127.0.0.1"}
	with := func(f func(*NodeConfig)) NodeConfig { c := wide; f(&c); return c }
	tlsOn := func(c *NodeConfig) { c.TLSCert, c.TLSKey, c.TLSCA = "n.pem", "n-key.pem", "ca.pem" }
	const (
		gossip  = "gossip is not encrypted (serve --gossip-key-file)"
		noTLS   = "the gRPC and HTTP ports are not TLS"
		clients = "clients are not authenticated"
	)
	for _, tc := range []struct {
		what    string
		cfg     NodeConfig
		missing []string // empty: starts
	}{
		{"nothing", wide, []string{gossip, noTLS, clients}},
		{"gossip key only", with(func(c *NodeConfig) { c.GossipKeys = key }), []string{noTLS, clients}},
		{"TLS only", with(tlsOn), []string{gossip}},
		{"TLS, no client auth", with(func(c *NodeConfig) { tlsOn(c); c.GossipKeys = key; c.ClientAuth = ClientAuthNone }), []string{clients + " (serve --client-auth"}},
		{"tokens over plaintext", with(func(c *NodeConfig) { c.GossipKeys = key; c.TokenFile = "t" }), []string{noTLS}},
		{"TLS + mtls + gossip key", with(func(c *NodeConfig) { tlsOn(c); c.GossipKeys = key }), nil},
		{"TLS + either + gossip key", with(func(c *NodeConfig) { tlsOn(c); c.GossipKeys = key; c.ClientAuth = ClientAuthEither; c.TokenFile = "t" }), nil},
		{"TLS + token + gossip key", with(func(c *NodeConfig) { tlsOn(c); c.GossipKeys = key; c.ClientAuth = ClientAuthToken; c.TokenFile = "t" }), nil},
	} {
		err := protectedMode(tc.cfg)
		if len(tc.missing) == 0 {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.what, err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), "grpc_addr:") {
			t.Errorf("%s: %v, want a refusal naming grpc_addr", tc.what, err)
			continue
		}
		for _, m := range tc.missing {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not name %q", tc.what, err, m)
			}
		}
		for _, m := range []string{gossip, noTLS, clients} {
			if !slices.ContainsFunc(tc.missing, func(w string) bool { return strings.HasPrefix(w, m) }) && strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q names %q, which is there", tc.what, err, m)
			}
		}
	}

	// A real node on all interfaces with TLS, mtls and a gossip key starts
	// without Insecure and answers a client certificate.
	p := newPKI(t)
	c, k := p.issue(t, certs.Peer, "secured")
	n, err := StartNode(NodeConfig{Name: "secured", GRPCAddr: "0.0.0.0:0", GossipAddr: "127.0.0.1:0", AdvertiseHost: "127.0.0.1",
		Profile: cluster.Local, Logger: testLogger(), GossipKeys: [][]byte{[]byte("0123456789abcdef0123456789abcdef")},
		TLSCert: c, TLSKey: k, TLSCA: p.caFile})
	if err != nil {
		t.Fatalf("secured node off loopback: %v", err)
	}
	defer n.Kill()
	if got := n.Metrics().insecure; gaugeValue(t, got) != 0 {
		t.Fatal("a secured node reports sluice_insecure 1")
	}
	cc, ck := p.issue(t, certs.Client, "app")
	if err := pingCheck(t, n.GRPCAddr(), p.clientTLS(t, cc, ck)); err != nil {
		t.Fatalf("check on the secured node: %v", err)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
