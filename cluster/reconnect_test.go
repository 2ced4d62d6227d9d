package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/internal/poll"
)

// partition is a cut through an in-memory memberlist network: addresses on
// the cut side reach only each other.
type partition struct {
	mu  sync.Mutex
	cut map[string]bool // gossip addresses on the cut side
}

func (p *partition) set(addrs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = map[string]bool{}
	for _, a := range addrs {
		p.cut[a] = true
	}
}

func (p *partition) blocks(from, to string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut[from] != p.cut[to]
}

// cutTransport is a MockTransport whose packets and streams across the
// partition are lost (packets dropped, dials refused), in both directions
// (each side's transport drops what it would send).
type cutTransport struct {
	*memberlist.MockTransport
	self string
	p    *partition
}

var errCut = errors.New("partitioned")

func (t *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.p.blocks(t.self, addr) {
		return time.Now(), nil // lost on the way
	}
	return t.MockTransport.WriteTo(b, addr)
}

func (t *cutTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.p.blocks(t.self, addr) {
		return nil, errCut
	}
	return t.MockTransport.DialTimeout(addr, timeout)
}

func (t *cutTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// A network partition that outlasts memberlist's gossip to the dead (here
// 1 s, 30 s on a LAN) heals once the link is back: each side keeps trying
// one member it saw die, and the join across merges the views. Without the
// reconnect the two sides stay apart for good (the second half of the test
// shows that, with reconnecting off).
func TestPartitionHealsAfterGossipToTheDead(t *testing.T) {
	for _, reconnect := range []bool{true, false} {
		t.Run(fmt.Sprintf("reconnect=%v", reconnect), func(t *testing.T) {
			mn := &memberlist.MockNetwork{}
			p := &partition{}
			var cs []*Cluster
			// All transports first: MockNetwork's maps are not safe for
			// adding one while running nodes look peers up.
			mts := []*memberlist.MockTransport{mn.NewTransport("n1"), mn.NewTransport("n2"), mn.NewTransport("n3")}
			for i := 1; i <= 3; i++ {
				name := fmt.Sprintf("n%d", i)
				mt := mts[i-1]
				ip, port, err := mt.FinalAdvertiseAddr("", 0)
				if err != nil {
					t.Fatal(err)
				}
				self := net.JoinHostPort(ip.String(), fmt.Sprint(port))
				interval := 200 * time.Millisecond
				if !reconnect {
					interval = time.Hour
				}
				c, err := New(Config{Name: name, GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i), Profile: Local,
					Transport:         &cutTransport{MockTransport: mt, self: self, p: p},
					ReconnectInterval: interval,
					tune: func(mc *memberlist.Config) {
						mc.GossipToTheDeadTime = time.Second
						mc.ProbeInterval, mc.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
						mc.SuspicionMult, mc.SuspicionMaxTimeoutMult = 2, 2
					},
					Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Shutdown() })
				cs = append(cs, c)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, c := range cs[1:] {
				if _, err := c.Join(ctx, []string{cs[0].GossipAddr()}); err != nil {
					t.Fatal(err)
				}
			}
			members := func(c *Cluster) int { return len(c.Members()) }
			for _, c := range cs {
				eventually(t, "3 members on "+c.LocalName(), func() bool { return members(c) == 3 })
			}

			p.set(cs[2].GossipAddr()) // n3 alone on its side
			defer func() {
				if t.Failed() {
					t.Logf("members: n1 %d, n2 %d, n3 %d; cut %v", members(cs[0]), members(cs[1]), members(cs[2]), p.cut)
				}
			}()
			// 30 s: failure detection runs on its own timers, slow under
			// the race detector on a busy machine.
			poll.Until(t, 30*time.Second, "both sides to see the other as dead", func() bool {
				return members(cs[0]) == 2 && members(cs[1]) == 2 && members(cs[2]) == 1
			})
			time.Sleep(2 * time.Second) // past gossip to the dead (1 s): no side contacts the other any more
			p.set()                     // the link is back

			if reconnect {
				poll.Until(t, 30*time.Second, "the partition to heal", func() bool {
					return members(cs[0]) == 3 && members(cs[1]) == 3 && members(cs[2]) == 3
				})
				return
			}
			time.Sleep(3 * time.Second)
			if got := members(cs[2]); got != 1 {
				t.Fatalf("without reconnecting, n3 sees %d members 3 s after the link came back; the test no longer shows the split brain it guards against", got)
			}
		})
	}
}
