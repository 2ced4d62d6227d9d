package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/internal/poll"
	"github.com/sluicehq/sluice/internal/syncbuf"
)

// partition is a cut through the test nodes' loopback network: addresses on
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

// cutTransport is a transport whose packets and streams across the
// partition are lost (packets dropped, dials refused), in both directions
// (each side's transport drops what it would send). It wraps memberlist's
// real UDP and TCP transport on 127.0.0.1: MockNetwork delivers a packet
// by a blocking send on an unbuffered channel, so two nodes pinging each
// other at once on a busy machine could block each other's probe loops
// for good, a deadlock real UDP cannot have (it stalled failure detection
// for over a minute in 1 of about 14 runs under load).
type cutTransport struct {
	*memberlist.NetTransport
	self string
	p    *partition
}

var errCut = errors.New("partitioned")

func (t *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.p.blocks(t.self, addr) {
		return time.Now(), nil // lost on the way
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *cutTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.p.blocks(t.self, addr) {
		return nil, errCut
	}
	return t.NetTransport.DialTimeout(addr, timeout)
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
			p := &partition{}
			var cs []*Cluster
			var logs [3]syncbuf.Buffer
			for i := 1; i <= 3; i++ {
				name := fmt.Sprintf("n%d", i)
				nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
					BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
				if err != nil {
					t.Fatal(err)
				}
				self := net.JoinHostPort("127.0.0.1", fmt.Sprint(nt.GetAutoBindPort()))
				interval := 200 * time.Millisecond
				if !reconnect {
					interval = time.Hour
				}
				c, err := New(Config{Name: name, GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i), Profile: Local,
					Transport:         &cutTransport{NetTransport: nt, self: self, p: p},
					ReconnectInterval: interval,
					tune: func(mc *memberlist.Config) {
						mc.GossipToTheDeadTime = time.Second
						mc.ProbeInterval, mc.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
						mc.SuspicionMult, mc.SuspicionMaxTimeoutMult = 2, 2
					},
					Logger: slog.New(slog.NewTextHandler(&logs[i-1], &slog.HandlerOptions{Level: slog.LevelDebug}))})
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
					for _, c := range cs {
						var names []string
						for _, m := range c.Members() {
							names = append(names, m.Name)
						}
						var ml []string
						for _, m := range c.list.Members() {
							ml = append(ml, fmt.Sprintf("%s/%d", m.Name, m.State))
						}
						c.reconnect.mu.Lock()
						t.Logf("%s: members %v, memberlist %v, failed %v", c.LocalName(), names, ml, c.reconnect.failed)
						i := c.LocalName()[1] - '1'
						t.Logf("%s log:\n%s", c.LocalName(), logs[i].String())
						c.reconnect.mu.Unlock()
					}
				}
			}()
			// 60 s: failure detection runs on its own timers, slow under
			// the race detector on a busy machine.
			// Each side sees the other as dead; n1 and n2 need not see each
			// other at the same instant (under load they may suspect each
			// other for a moment, and that is not what this waits for).
			has := func(c *Cluster, name string) bool {
				for _, m := range c.Members() {
					if m.Name == name {
						return true
					}
				}
				return false
			}
			poll.Until(t, 60*time.Second, "both sides to see the other as dead", func() bool {
				return members(cs[2]) == 1 && !has(cs[0], "n3") && !has(cs[1], "n3")
			})
			// Each side remembers the other as one to try again (memberlist's
			// NotifyLeave says StateAlive even for a dead member; a reconnector
			// that kept only "dead" ones kept none).
			for _, c := range cs {
				want := []string{"n3"}
				if c == cs[2] {
					want = []string{"n1", "n2"}
				}
				c.reconnect.mu.Lock()
				for _, w := range want {
					if _, ok := c.reconnect.failed[w]; !ok {
						t.Errorf("%s does not remember %s to reconnect to: %v", c.LocalName(), w, c.reconnect.failed)
					}
				}
				c.reconnect.mu.Unlock()
			}
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
