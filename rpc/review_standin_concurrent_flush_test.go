package rpc

import (
	"context"
	"testing"
	"time"
)

// Review: flushStandIns has two callers that run at once: the stand-in
// loop (every replication interval, and on every ring change) and a
// leave's hand-off (handOffAll, also FinishLeave). Nothing serializes
// them: each reads the same hits (standInHits), sends them, and takes
// them off (sentStandIn, floored at zero), so the key's owner gets them
// once per flush in flight. Here node1 leaves gracefully while its loop's
// flush of one stand-in hit is in flight: node2 counts it twice.
func TestReviewConcurrentStandInFlushesSendTheSameHitsTwice(t *testing.T) {
	n1, n2, stall, rc, _ := reviewStandInSetup(t, "two-flushes")
	time.Sleep(300 * time.Millisecond) // the loop's flush has read the hit and waits on the stalled path
	left := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		left <- n1.Server().Leave(ctx) // SIGTERM: its flush reads the same hit
	}()
	time.Sleep(300 * time.Millisecond)
	stall.set(false)
	if err := <-left; err != nil {
		t.Logf("leave: %v", err)
	}
	time.Sleep(time.Second) // node2 folds what it got
	if got := 10 - peekRemaining(t, n2, rc); got != 1 {
		t.Fatalf("node2 counted the one stand-in hit %d times", got)
	}
}
