package rpc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A draining node ends the peer streams it serves, idle or not, so a
// graceful stop does not wait for peers to hang up; requests answered
// before were answered in full.
func TestForwardStreamEndsOnDrain(t *testing.T) {
	n := startInprocNode(t, "solo", windowClock())
	st, err := n.peer(t).ForwardStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	good := &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "api", Key: "k", Limit: 2, WindowMs: 1000}}}
	if err := st.Send(good); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || len(resp.Decisions) != 1 || !resp.Decisions[0].Allowed {
		t.Fatalf("before the drain: %v, %v", resp, err)
	}
	n.Server().Drain()
	done := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("after the drain: %v, want the stream ended (EOF)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s of the drain")
	}
}
