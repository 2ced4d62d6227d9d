package rpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Review: the deadline a forwarded check carries is the batcher's
// (enqueue time plus the forward timeout, 2 s by default), not the
// caller's. With the Go client's default Timeout (1 s) below the default
// forward timeout, a check whose owner is silent (a stalled path, a hung
// host: not a refused connection) fails at the caller's deadline, and
// then:
//   - under deny, the owner still applies it when the path heals within
//     the forward timeout, though the caller got no allowed answer (a
//     FailClosed client answered ErrUnavailable): counted behind its back;
//   - under local (the default), answerUnavailable runs with the caller's
//     context already done, so the stand-in holder is never asked and the
//     entry node decides the check in its own fallback window: a
//     stand-in hit counted (and later handed to the owner) for an answer
//     nobody received, while the client itself fails open.
func TestReviewCheckCountedAfterTheCallerGaveUp(t *testing.T) {
	clock := windowClock()
	stall := newStallDialer()
	cfg := fastReplication // default forward timeout (2 s in these tests too)
	cfg.ForwardTimeout = 2 * time.Second
	n1cfg := cfg
	n1cfg.DialOptions = []grpc.DialOption{stall.option()}
	n1 := startNodeWith(t, "node1", clock, n1cfg)
	n2 := startNodeWith(t, "node2", clock, cfg, n1.GossipAddr())
	n3 := startNodeWith(t, "node3", clock, cfg, n1.GossipAddr())
	waitRingAgrees(t, []*testNode{n1, n2, n3})
	k := keyOwnedBy(t, n1, "caller-deadline", "node2")
	deny := &sluicev1.RateLimitCheck{Name: "caller-deadline", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 3_600_000,
		OnOwnerUnavailable: sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY}
	local := proto.CloneOf(deny)
	local.Key = keyOwnedBy(t, n1, "caller-deadline-local", "node2")
	local.Name = "caller-deadline-local"
	local.OnOwnerUnavailable = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED
	for _, rc := range []*sluicev1.RateLimitCheck{deny, local} { // the connections are up
		if d := check(t, n1.client, rc); !d.Allowed || d.Degraded {
			t.Fatalf("before the stall: %+v", d)
		}
	}

	stall.set(true)
	// The owner gets half the caller's budget, a stand-in the rest: each
	// check is answered within the budget (degraded), or the caller's
	// deadline passes with nothing counted.
	answeredAllowed := int64(0)
	for _, rc := range []*sluicev1.RateLimitCheck{deny, local} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond) // a caller's budget
		resp, err := n1.client.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
		cancel()
		switch {
		case status.Code(err) == codes.DeadlineExceeded:
		case err == nil && resp.Decisions[0].Error != "" && !resp.Decisions[0].Allowed:
			// Answered as undecided at the caller's deadline: nothing counted.
		case err != nil:
			t.Fatalf("check %s during the stall: %v", rc.Name, err)
		case !resp.Decisions[0].Degraded || (rc == deny && resp.Decisions[0].Allowed):
			t.Fatalf("check %s during the stall: %+v, want a degraded answer (denied under deny)", rc.Name, resp.Decisions[0])
		case resp.Decisions[0].Allowed:
			answeredAllowed++
		}
	}
	time.Sleep(200 * time.Millisecond)
	admitted := n1.Server().Stats().StandInAdmitted + n3.Server().Stats().StandInAdmitted - answeredAllowed
	stall.set(false) // the path heals within the forward timeout
	time.Sleep(2500 * time.Millisecond)

	var errs []string
	if got := peekRemaining(t, n2, deny); got != 9 {
		errs = append(errs, fmt.Sprintf("deny: the owner has %d left, want 9: it counted a check whose caller had given up (got no answer) before it was applied", got))
	}
	if admitted != 0 {
		errs = append(errs, fmt.Sprintf("local: %d stand-in hit(s) counted for a check answered to nobody (the caller's deadline had passed)", admitted))
	}
	for _, e := range errs {
		t.Error(e)
	}
}
