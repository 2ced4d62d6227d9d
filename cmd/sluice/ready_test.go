package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc"

	"github.com/sluicehq/sluice/internal/poll"
	"github.com/sluicehq/sluice/internal/testnet"
)

// serve --join with a seed that does not answer: sluice healthcheck exits
// 1 saying NOT_SERVING, and sluice check is refused (UNAVAILABLE: not
// joined yet) and exits 1. Once a seed answers at that address the node
// joins: healthcheck exits 0 saying SERVING, the check is answered, and
// serve still stops gracefully (exit 0).
func TestServeWithUnreachableSeedIsNotReady(t *testing.T) {
	seedAddr := testnet.DeadAddr(t) // nothing listens there yet
	addr, stop := startServe(t, "joiner", nil, map[string]string{
		"SLUICE_NAME":        "joiner",
		"SLUICE_GRPC_ADDR":   "127.0.0.1:0",
		"SLUICE_GOSSIP_ADDR": "127.0.0.1:0",
		"SLUICE_HTTP_ADDR":   "127.0.0.1:0",
		"SLUICE_PROFILE":     "local",
		"SLUICE_JOIN":        seedAddr,
	})
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	if code, out, errOut := sluice(t, "healthcheck", "--addr", addr, "--timeout", "2s"); code != exitFailure || !strings.Contains(errOut, "NOT_SERVING") || out != "" {
		t.Fatalf("healthcheck before joining: exit %d, stdout %q, stderr %q; want exit 1 naming NOT_SERVING", code, out, errOut)
	}
	code, out, errOut := sluice(t, "check", "--addr", addr, "--name", "api", "--key", "user:42")
	if code != exitFailure || !strings.Contains(errOut, "Unavailable") || !strings.Contains(errOut, "not joined yet; ask another node") || out != "" {
		t.Fatalf("check before joining: exit %d, stdout %q, stderr %q; want exit 1, UNAVAILABLE: not joined yet", code, out, errOut)
	}

	seed, err := rpc.StartNode(rpc.NodeConfig{Name: "seed", GRPCAddr: "127.0.0.1:0", GossipAddr: seedAddr,
		Profile: cluster.Local, Logger: slog.New(slog.DiscardHandler), LeaveTimeout: time.Second})
	if err != nil {
		t.Fatalf("a seed on %s: %v", seedAddr, err)
	}
	t.Cleanup(func() { _ = seed.Close(context.Background()) })
	// The join retries every second; then the ring settles (1 s).
	poll.Until(t, 30*time.Second, "the node to report SERVING", func() bool {
		code, _, _ := sluice(t, "healthcheck", "--addr", addr, "--timeout", "2s")
		return code == 0
	})
	if code, out, errOut := sluice(t, "healthcheck", "--addr", addr); code != 0 || strings.TrimSpace(out) != "SERVING" {
		t.Fatalf("healthcheck once joined: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = sluice(t, "check", "--addr", addr, "--name", "api", "--key", "user:42", "--limit", "3")
	if code != 0 || !strings.HasPrefix(out, "allowed    remaining=2 limit=3") {
		t.Fatalf("check once joined: exit %d, stdout %q, stderr %q; want allowed with 2 remaining", code, out, errOut)
	}
	stopped = true
	if code, log := stop(); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, log)
	}
}
