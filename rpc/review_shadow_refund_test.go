package rpc

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review: allOrNothing refunds an allowed check of a shadow limit (right:
// the request was refused) and answers it refunded with allowed false;
// then Check's shadow rewrite, which runs after it, takes that "not
// allowed" for a would-be denial: the check is answered allowed, shadow
// and refunded at once, and counted as outcome shadow_denied, the metric
// operators read before they enforce a shadow limit, though the limit had
// room.
func TestReviewRefundedShadowCheckAnsweredAllowedAndShadowDenied(t *testing.T) {
	n := startNodeCfg(t, NodeConfig{Name: "solo", Clock: windowClock(), Limits: mustParseLimits(t, testLimits)})
	shadow := named("signup", "u1") // shadow: true, limit 2 per hour
	shadow.Hits = proto.Int64(1)
	tight := &sluicev1.RateLimitCheck{Name: "tight", Key: "u1", Hits: proto.Int64(1), Limit: 1, WindowMs: 60_000}
	check(t, n.client, tight) // used up
	resp, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{shadow, tight}, AllOrNothing: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; !d.Refunded || d.Allowed || d.Shadow {
		t.Fatalf("the shadow limit's check, refunded because the request was refused: %+v; want refunded, not allowed, not shadow (it had room)", d)
	}
}
