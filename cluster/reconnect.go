package cluster

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Defaults for reconnecting to failed members (Config.ReconnectInterval
// and Config.ReconnectTimeout).
const (
	DefaultReconnectInterval = 5 * time.Second
	DefaultReconnectTimeout  = 24 * time.Hour
)

// reconnector remembers the members that departed and, every interval,
// tries to join one of them at random, the way serf's reconnect loop does. memberlist alone gossips to a dead
// member only for GossipToTheDeadTime (30 s on a LAN) and then never
// contacts it again, so two sides of a network partition that lasted
// longer would each go on as a cluster of their own after it healed, each
// owning the other's keys: a split brain that no gossip repairs. A join
// across the healed link merges the two views; the member that was
// declared dead refutes it and is alive again everywhere.
type reconnector struct {
	interval, timeout time.Duration

	mu     sync.Mutex
	failed map[string]failedMember // by member name
	seeds  []string                // the addresses of the last Join
	stop   chan struct{}
	once   sync.Once
}

// failedMember is a member that departed: its gossip address, and since
// when.
type failedMember struct {
	addr  string
	since time.Time
}

func newReconnector(interval, timeout time.Duration) *reconnector {
	if interval <= 0 {
		interval = DefaultReconnectInterval
	}
	if timeout <= 0 {
		timeout = DefaultReconnectTimeout
	}
	return &reconnector{interval: interval, timeout: timeout, failed: map[string]failedMember{}, stop: make(chan struct{})}
}

// left records that n is no longer a member, to be tried again.
//
// A member that left gracefully is tried too: memberlist keeps a member's
// state beside the Node it hands to NotifyLeave, whose State field it
// never updates (it reads StateAlive whether the member died or left), so
// the two cannot be told apart here. Serf, without a leave intent, does
// the same. Trying one that left costs a refused dial per interval, and a
// join when it is back under the same address, which it would make anyway.
// (Keeping only "dead" ones, as this did at first, kept none: the loop
// then healed a partition only from a side left alone, through its seeds.)
func (r *reconnector) left(n *memberlist.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed[n.Name] = failedMember{addr: n.Address(), since: time.Now()}
}

// alive records that the member name is back (or new).
func (r *reconnector) alive(name string) {
	r.mu.Lock()
	delete(r.failed, name)
	r.mu.Unlock()
}

// setSeeds records the addresses this node joined through.
func (r *reconnector) setSeeds(seeds []string) {
	r.mu.Lock()
	r.seeds = append([]string(nil), seeds...)
	r.mu.Unlock()
}

// pick returns the address to try next: a failed member at random
// (forgetting those that failed more than timeout ago), or, when this
// node is alone and had seeds, a seed; "" for none.
func (r *reconnector) pick(alone bool) (addr, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	var names []string
	for n, f := range r.failed {
		if now.Sub(f.since) > r.timeout {
			delete(r.failed, n)
			continue
		}
		names = append(names, n)
	}
	if len(names) > 0 {
		n := names[rand.IntN(len(names))]
		return r.failed[n].addr, n
	}
	if alone && len(r.seeds) > 0 {
		return r.seeds[rand.IntN(len(r.seeds))], ""
	}
	return "", ""
}

// close stops the loop.
func (r *reconnector) close() { r.once.Do(func() { close(r.stop) }) }

// reconnectLoop runs until the reconnector is closed: every interval,
// once this node has joined, it tries to join one failed member (or a seed
// when it is alone).
func (c *Cluster) reconnectLoop() {
	r := c.reconnect
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		if !c.joined.Load() || c.closed.Load() {
			continue
		}
		addr, name := r.pick(c.list.NumMembers() <= 1)
		if addr == "" {
			continue
		}
		if _, err := c.list.Join([]string{addr}); err != nil {
			c.log.Debug("reconnect failed", "member", name, "addr", addr, "error", err)
			continue
		}
		c.log.Info("reconnected", "member", name, "addr", addr, "members", c.list.NumMembers())
	}
}
