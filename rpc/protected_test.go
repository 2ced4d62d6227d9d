package rpc

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/cluster"
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
	var logs lockedLog
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

// lockedLog is a log sink safe for concurrent writes.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
