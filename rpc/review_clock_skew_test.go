package rpc

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review: ForwardRequest.deadline_unix_ns is the sender's wall clock, and
// the owner compares it with its own (decide, and Forward's stand-in
// path). Node clocks are not assumed to agree (hand-offs allow a minute
// of skew): an owner whose clock is ahead of a sender's by more than the
// forward timeout answers every check that sender forwards with
// errExpired (an error answer: not a failure, so no stand-in; the client
// fails open or closed for every key of that owner), and one whose clock
// is behind applies checks after the sender gave up. Here a sender whose
// clock is 3 s behind the owner's forwards a check with its 2 s budget
// untouched: the owner refuses it at once.
func TestReviewForwardDeadlineIsWallClockSkewSensitive(t *testing.T) {
	n := startNode(t, "node1", windowClock())
	peer := dialPeer(t, n.GRPCAddr())
	rc := &sluicev1.RateLimitCheck{Name: "skew", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	// A member's requests carry their sending time on its clock: the
	// owner reads deadlines on the sender's clock (deadlineHere).
	n.Server().hooks.holdMembers.Store(true) // gossip's lists (node1 alone) must not undo it
	if err := n.Server().SetMembers([]cluster.Member{{Name: "node1", State: cluster.Alive}, {Name: "node9", GRPCAddr: "127.0.0.1:1", Region: testRegion(), State: cluster.Alive}}); err != nil {
		t.Fatal(err)
	}
	rc.Key = keyOwnedBy(t, n, "skew", "node1")
	// Its first trustSamples requests are read on the owner's clock
	// (nothing tells a late one from a skew yet): refused as late, which
	// its sender takes as an owner not reached. From then on the estimate
	// holds.
	for range trustSamples {
		first := time.Now().Add(-3 * time.Second)
		if _, err := peer.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node9", Checks: []*sluicev1.RateLimitCheck{{Name: "skew", Key: rc.Key, Hits: proto.Int64(0), Limit: 10, WindowMs: 60_000}},
			DeadlineUnixNs: first.Add(2 * time.Second).UnixNano(), SentUnixNs: first.UnixNano()}); err != nil {
			t.Fatal(err)
		}
	}
	senderNow := time.Now().Add(-3 * time.Second) // the sender's clock
	resp, err := peer.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node9", Checks: []*sluicev1.RateLimitCheck{rc},
		DeadlineUnixNs: senderNow.Add(2 * time.Second).UnixNano(), SentUnixNs: senderNow.UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Error != "" || !d.Allowed {
		t.Fatalf("a check forwarded a moment ago with 2 s to go, from a sender whose clock is 3 s behind: %+v", d)
	}
}
