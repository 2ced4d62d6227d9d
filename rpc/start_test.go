package rpc

import (
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// freeAddr returns a loopback host:port that nothing listens on (now).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// A StartNode that fails closes what it opened before the failure: the
// gRPC and HTTP ports can be bound again at once, and the Server's
// goroutines stop (TestMain's leak check).
func TestStartNodeErrorClosesWhatItOpened(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		what   string
		cfg    func(c *NodeConfig)
		prefix string // of the error
	}{
		{"name_key_share out of range", func(c *NodeConfig) { c.NameKeyShare = 101 }, "name_key_share:"},
		{"HTTP port taken", func(c *NodeConfig) { c.HTTPAddr = busy.Addr().String() }, "http_addr:"},
		{"ring config invalid", func(c *NodeConfig) { c.Ring = ring.Config{PartitionCount: -1} }, "rpc: "},
		{"gossip config invalid", func(c *NodeConfig) { c.Profile = cluster.Profile("bogus") }, "cluster: "},
	} {
		cfg := NodeConfig{Name: "n", GRPCAddr: freeAddr(t), GossipAddr: "127.0.0.1:0", HTTPAddr: freeAddr(t),
			Profile: cluster.Local, Logger: testLogger()}
		tc.cfg(&cfg)
		n, err := StartNode(cfg)
		if err == nil {
			n.Kill()
			t.Fatalf("%s: StartNode succeeded", tc.what)
		}
		if !strings.HasPrefix(err.Error(), tc.prefix) {
			t.Errorf("%s: %v, want an error beginning %q", tc.what, err, tc.prefix)
		}
		for _, addr := range []string{cfg.GRPCAddr, cfg.HTTPAddr} {
			if addr == busy.Addr().String() {
				continue
			}
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Errorf("%s: %s still bound after the failed start: %v", tc.what, addr, err)
				continue
			}
			l.Close()
		}
	}
}
