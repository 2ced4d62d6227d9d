package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"

	"github.com/sluicehq/sluice/internal/wan"
)

// Two nodes in two regions 60 ms apart (internal/wan: gossip through
// NodeConfig.GossipTransport, peer calls through NodeConfig.DialOptions),
// given the region list r1,r2, join over the simulated link, each in a
// ring of its own region. A global check is decided in the region it
// entered, in well under the round trip, and crosses no link; an exact
// check entering r2 goes to the key's owner in r1, the home region, and
// takes at least the round trip.
func TestWANForwardAcrossRegions(t *testing.T) {
	w := wan.New(1)
	t.Cleanup(func() { w.Close() }) // after the nodes' cleanups: they stop over the Net
	const rtt = 60 * time.Millisecond
	w.SetRTT("r1", "r2", rtt, 0)
	regions, err := region.Parse("r1,r2")
	if err != nil {
		t.Fatal(err)
	}
	clock := windowClock()
	start := func(name, r string, join ...string) *testNode {
		t.Helper()
		tr, err := w.Transport(r, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n := startNodeWith(t, name, clock, NodeConfig{
			ForwardTimeout: 2 * time.Second, Region: r, Regions: regions,
			GossipTransport: tr, DialOptions: w.DialOptions(r),
		}, join...)
		w.Register(n.GRPCAddr(), r)
		return n
	}
	n1 := start("node1", "r1")
	n2 := start("node2", "r2", n1.GossipAddr())
	if r, ok := w.Region(n1.GossipAddr()); !ok || r != "r1" {
		t.Fatalf("node1's gossip address %s is in region %q, want r1 (the transport's address)", n1.GossipAddr(), r)
	}
	eventually(t, "both nodes to see each other", func() bool {
		for _, n := range []*testNode{n1, n2} {
			resp, err := n.Server().Members(context.Background(), &sluicev1.MembersRequest{})
			if err != nil || len(resp.Members) != 2 || n.Server().view.Load().ring.Members()[0] != n.Name() {
				return false
			}
		}
		return n2.Server().view.Load().home != nil
	})
	if w.Messages("r2", "r1") == 0 { // node2's join dialed node1 (the dialing side counts)
		t.Fatalf("the nodes joined without gossip across the link: r2→r1 %d", w.Messages("r2", "r1"))
	}
	for _, n := range []*testNode{n1, n2} {
		if ms := n.Server().view.Load().ring.Members(); len(ms) != 1 {
			t.Fatalf("%s's ring holds %v, want itself alone (one ring per region)", n.Name(), ms)
		}
	}
	send := func(n *testNode, rc *sluicev1.RateLimitCheck) (*sluicev1.Decision, time.Duration) {
		t.Helper()
		begin := time.Now()
		resp, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
		d := time.Since(begin)
		if err != nil || len(resp.Decisions) != 1 || resp.Decisions[0].Error != "" {
			t.Fatalf("check via %s: %v, %v", n.Name(), resp, err)
		}
		return resp.Decisions[0], d
	}
	global := &sluicev1.RateLimitCheck{Name: "api", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}
	exact := proto.CloneOf(global)
	exact.Scope = sluicev1.Scope_SCOPE_EXACT
	send(n2, exact) // opens the peer stream
	before := n2.Server().Stats().ForwardedChecks
	for range 3 {
		dec, dg := send(n2, global)
		// A fixed window: r2's slice follows leases (0 in the window the
		// node started in, until a grant); no check waits on a lease.
		if dec.Owner != "node2" || dec.Region != "r2" || dec.Scope != sluicev1.Scope_SCOPE_GLOBAL || dec.Slice > 10 || dec.Limit != 10 {
			t.Fatalf("global via node2: %v, want decided in r2 on its slice", dec)
		}
		if dg >= rtt {
			t.Errorf("a global check took %s, at least the round trip %s", dg, rtt)
		}
		dec, d := send(n2, exact)
		if dec.Owner != "node1" || dec.Region != "r1" || dec.Degraded {
			t.Fatalf("exact via node2: %v, want decided by node1 in r1", dec)
		}
		if d < rtt || d > rtt+time.Second {
			t.Errorf("an exact check from r2 took %s, want the RTT %s (+ up to 1 s)", d, rtt)
		}
		t.Logf("r2: global %s, exact (to r1) %s", dg, d)
	}
	if got := n2.Server().Stats().ForwardedChecks - before; got != 3 {
		t.Errorf("node2 forwarded %d checks, want the 3 exact ones", got)
	}
}
