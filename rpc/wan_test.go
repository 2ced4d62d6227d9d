package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"

	"github.com/sluicehq/sluice/internal/wan"
)

// Two nodes in two regions 60 ms apart (internal/wan: gossip through
// NodeConfig.GossipTransport, peer calls through NodeConfig.DialOptions)
// join over the simulated link, and a check forwarded to the other
// region's node takes at least the round trip. (Today one ring spans the
// regions, so a key's owner may be in the other region.)
func TestWANForwardAcrossRegions(t *testing.T) {
	w := wan.New(1)
	t.Cleanup(func() { w.Close() }) // after the nodes' cleanups: they stop over the Net
	const rtt = 60 * time.Millisecond
	w.SetRTT("r1", "r2", rtt, 0)
	clock := windowClock()
	start := func(name, region string, join ...string) *testNode {
		t.Helper()
		tr, err := w.Transport(region, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := startNodeWith(t, name, clock, NodeConfig{
			ForwardTimeout: 2 * time.Second, Region: region,
			GossipTransport: tr, DialOptions: w.DialOptions(region),
		}, join...)
		w.Register(n.GRPCAddr(), region)
		return n
	}
	n1 := start("node1", "r1")
	n2 := start("node2", "r2", n1.GossipAddr())
	if r, ok := w.Region(n1.GossipAddr()); !ok || r != "r1" {
		t.Fatalf("node1's gossip address %s is in region %q, want r1 (the transport's address)", n1.GossipAddr(), r)
	}
	nodes := []*testNode{n1, n2}
	waitRingAgrees(t, nodes)
	if w.Messages("r2", "r1") == 0 || w.Messages("r1", "r2") == 0 {
		t.Fatalf("the nodes joined without gossip across the link: r1→r2 %d, r2→r1 %d", w.Messages("r1", "r2"), w.Messages("r2", "r1"))
	}

	region := map[*testNode]string{n1: "r1", n2: "r2"}
	for _, c := range []struct{ from, to *testNode }{{n1, n2}, {n2, n1}} {
		k := keyOwnedBy(t, c.from, "api", c.to.Name())
		check := func() (*sluicev1.Decision, time.Duration) {
			begin := time.Now()
			resp, err := c.from.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
				{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}}})
			d := time.Since(begin)
			if err != nil || len(resp.Decisions) != 1 || resp.Decisions[0].Error != "" {
				t.Fatalf("check from %s: %v, %v", c.from.Name(), resp, err)
			}
			return resp.Decisions[0], d
		}
		check() // opens the peer stream
		before := w.Messages(region[c.from], region[c.to])
		for range 3 {
			dec, d := check()
			if dec.Owner != c.to.Name() || dec.Degraded {
				t.Fatalf("check of a key of %s from %s: %v, want decided by its owner", c.to.Name(), c.from.Name(), dec)
			}
			if d < rtt || d > rtt+time.Second {
				t.Errorf("a check forwarded from %s to %s took %s, want the RTT %s (+ up to 1 s)", c.from.Name(), c.to.Name(), d, rtt)
			}
			t.Logf("forwarded %s→%s across RTT %s: %s", c.from.Name(), c.to.Name(), rtt, d)
		}
		if after := w.Messages(region[c.from], region[c.to]); after < before+3 {
			t.Errorf("3 forwards counted %d messages from %s's region", after-before, c.from.Name())
		}
	}
}
