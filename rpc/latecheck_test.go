package rpc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// stallDialer dials peers through connections whose writes it can hold
// back (stall) and let through later (heal), as a path that drops packets
// for a while does to TCP: what was sent meanwhile arrives late, all at
// once. It holds every connection it dialed.
type stallDialer struct {
	mu   sync.Mutex
	cond *sync.Cond
	held bool
}

func newStallDialer() *stallDialer {
	d := &stallDialer{}
	d.cond = sync.NewCond(&d.mu)
	return d
}

func (d *stallDialer) set(held bool) {
	d.mu.Lock()
	d.held = held
	d.mu.Unlock()
	d.cond.Broadcast()
}

func (d *stallDialer) option() grpc.DialOption {
	return d.optionOver(func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	})
}

// optionOver is option for connections that dial makes (e.g. an
// inprocCluster's).
func (d *stallDialer) optionOver(dial func(ctx context.Context, addr string) (net.Conn, error)) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &stallConn{Conn: c, d: d}, nil
	})
}

type stallConn struct {
	net.Conn
	d *stallDialer
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.d.mu.Lock()
	for c.d.held {
		c.d.cond.Wait()
	}
	c.d.mu.Unlock()
	return c.Conn.Write(b)
}

// The owner's path drops packets for a while (gossip fine), with a short
// forward timeout: checks sent meanwhile are answered degraded in time,
// and when the path heals and they reach the owner late, it applies none
// of them: a deny check counts nothing, and a key's count holds only what
// the owner answered in time (plus, under the default policy, what the
// stand-in holder admitted, counted once).
func TestChecksThatReachTheOwnerLateAreNotApplied(t *testing.T) {
	clock := windowClock()
	stall := newStallDialer()
	c := newInproc(t)
	cfg := NodeConfig{Clock: clock, ForwardTimeout: 50 * time.Millisecond, Replication: fastReplication.Replication}
	n1cfg := cfg
	n1cfg.Name, n1cfg.DialOptions = "node1", []grpc.DialOption{stall.optionOver(c.dial)}
	n1 := c.start(n1cfg)
	cfg.Name = "node2"
	n2 := c.start(cfg)
	cfg.Name = "node3"
	c.start(cfg)
	c.join()
	k := keyOwnedBy(t, n1, "late", "node2")
	deny := &sluicev1.RateLimitCheck{Name: "late", Key: k, Hits: proto.Int64(1), Limit: 100, WindowMs: 3_600_000,
		OnOwnerUnavailable: sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY}
	if d := check(t, n1.client, deny); !d.Allowed || d.Degraded || d.Owner != "node2" {
		t.Fatalf("before the stall: %+v", d)
	}
	key := string(ring.Key(nil, "late", k))
	stall.set(true)
	sent := 0
	for range 5 {
		start := time.Now()
		d := check(t, n1.client, deny)
		if d.Allowed || !d.Degraded {
			t.Fatalf("during the stall: %+v, want denied, degraded", d)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("answered after %s", took)
		}
		sent++
	}
	stall.set(false)
	// What was held back now reaches node2: it must count none of it.
	eventually(t, "node2 to have received the late checks", func() bool {
		return n2.Server().Stats().Expired >= 1
	})
	time.Sleep(200 * time.Millisecond) // let any other late request land (not a wait for a state: the assertion below must hold after it)
	if d := peek(t, n2.client, deny).Remaining; d != 99 {
		st, _ := n2.Store().Get(key)
		t.Fatalf("after the path healed node2 has %d left (state %+v), want 99: %d late checks answered degraded deny were applied", d, st, 99-d)
	}
}
