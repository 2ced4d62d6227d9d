package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// End to end: a killed owner's checks are answered within the forward
// timeout, never a hang: degraded (decided by node1 from its own windows,
// the default policy) or, once node1 saw node2 go, by node1 as owner.
func TestDeadOwnerFailsChecksWithinTimeout(t *testing.T) {
	clock := windowClock()
	nodes := startInprocCluster(t, 2, clock)
	k := keyOwnedBy(t, nodes[0], "api", "node2")
	nodes[1].Kill()
	start := time.Now()
	resp, err := nodes[0].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000},
		{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000, NoBatching: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for i, d := range resp.Decisions {
		if d.Error != "" || d.Owner != "node1" || !d.Allowed {
			t.Fatalf("decision %d: %+v", i, d)
		}
	}
	if took > 2*time.Second+time.Second {
		t.Fatalf("answered after %s, over the 2s forward timeout", took)
	}
}
