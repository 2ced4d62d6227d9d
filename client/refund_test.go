package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/internal/testnet"
)

// Refund gives hits back at the key's owner on three nodes, for inline
// and configured limits, never below zero; a peek or negative hits is
// ErrInvalid; a refund nobody answers is ErrUnavailable even failing
// open (it is never answered by the failure mode).
func TestRefund(t *testing.T) {
	nodes := testcluster.Start(t, 3, testcluster.Options{Limits: "limits:\n  api:\n    limit: 5\n    window: 1h\n", AllowRefunds: true})
	c := newClient(t, client.Config{Addrs: testcluster.Addrs(nodes), Timeout: 20 * time.Second})
	ctx := context.Background()
	inline := client.Check{Name: "tokens", Key: "team:7", Limit: &client.Limit{Limit: 10, Window: time.Hour}}
	for _, step := range []struct {
		refund            bool
		hits              int64
		allowed, refunded bool
		remaining         int64
	}{
		{false, 8, true, false, 2}, {true, 5, true, true, 7}, {true, 6, true, true, 10}, {true, 1, true, false, 10}, {false, 10, true, false, 0},
	} {
		ch := inline
		ch.Hits = step.hits
		var d client.Decision
		var err error
		if step.refund {
			d, err = c.Refund(ctx, ch)
		} else {
			d, err = c.Check(ctx, ch)
		}
		if err != nil || d.Allowed != step.allowed || d.Refunded != step.refunded || d.Remaining != step.remaining || d.Degraded {
			t.Fatalf("%+v: %+v %v", step, d, err)
		}
	}
	named := client.Check{Name: "api", Key: "user:1", Hits: 3}
	if d, err := c.Check(ctx, named); err != nil || d.Remaining != 2 {
		t.Fatalf("named charge: %+v %v", d, err)
	}
	named.Hits = 2
	if d, err := c.Refund(ctx, named); err != nil || !d.Refunded || d.Remaining != 4 || d.Limit != 5 {
		t.Fatalf("named refund: %+v %v, want 4 of 5 remaining", d, err)
	}
	if _, err := c.Refund(ctx, client.Check{Name: "api", Key: "user:1", Peek: true}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a peek refund: %v, want ErrInvalid", err)
	}
	if _, err := c.Refund(ctx, client.Check{Name: "api", Key: "user:1", Hits: -1}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("hits -1: %v, want ErrInvalid", err)
	}
	down := newClient(t, client.Config{Addrs: []string{testnet.DeadAddr(t)}, Timeout: time.Second, FailureMode: client.FailOpen})
	d, err := down.Refund(ctx, named)
	if !errors.Is(err, client.ErrUnavailable) || d.Allowed || !d.Degraded || d.Cause == nil {
		t.Fatalf("no node: %+v %v, want ErrUnavailable, not allowed", d, err)
	}
}

// Refunds are the operator's to allow (serve --allow-refunds): on nodes
// without it Refund is ErrInvalid naming checks[0].hits and the flag, and
// gives nothing back.
func TestRefundOff(t *testing.T) {
	nodes := testcluster.Start(t, 1, testcluster.Options{})
	c := newClient(t, client.Config{Addrs: testcluster.Addrs(nodes), Timeout: 20 * time.Second})
	ctx := context.Background()
	ch := client.Check{Name: "tokens", Key: "team:7", Limit: &client.Limit{Limit: 10, Window: time.Hour}, Hits: 8}
	if d, err := c.Check(ctx, ch); err != nil || d.Remaining != 2 {
		t.Fatalf("charge: %+v %v", d, err)
	}
	ch.Hits = 5
	d, err := c.Refund(ctx, ch)
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "checks[0].hits: must be >= 0, got -5 (refunds are off: serve --allow-refunds)") || d.Allowed || d.Refunded {
		t.Fatalf("a refund with refunds off: %+v %v, want ErrInvalid naming checks[0].hits and the flag", d, err)
	}
	ch.Peek = true
	if d, err := c.Check(ctx, ch); err != nil || d.Remaining != 2 {
		t.Fatalf("after it: %+v %v, want 2 remaining (nothing given back)", d, err)
	}
}
