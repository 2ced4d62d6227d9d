package rpc

import (
	"sync"
	"time"
)

// senderClockWindow is how long one minimum of a sender's delays stands:
// the estimate is the least of the current window and the one before, so
// a drift of the two clocks (NTP slewing one) is followed within two
// windows.
const senderClockWindow = 30 * time.Second

// senderClock estimates a peer's clock from the requests it sends: the
// least delay seen lately between its sent_unix_ns and this node's receive
// time is the clocks' offset plus the quickest transit (a request held up
// on its way, or queued behind others, only shows a longer delay).
type senderClock struct {
	mu        sync.Mutex
	cur, prev int64 // least delay (ns, this node's clock minus the sender's) of the current and the previous window
	hasPrev   bool
	since     time.Time // start of the current window; zero: no sample yet
	n         int       // samples so far (counted up to trustSamples)
}

// trustSamples is how many requests of a sender this node must have seen
// before it reads their deadlines on the estimate of the sender's clock:
// until then they are read on this node's clock, so that a sender whose
// first requests all came late (held up since before its first answer)
// cannot make the estimate as late as they were.

// sample records a request sent at sent (the sender's Unix ns) and received
// at now, and returns the least delay seen lately, including this one.
func (c *senderClock) sample(sent int64, now time.Time) int64 {
	d, _ := c.sampleFirst(sent, now)
	return d
}

const trustSamples = 8

// sampleFirst is sample that also reports whether the estimate is still
// young (fewer than trustSamples requests seen, this one included).
func (c *senderClock) sampleFirst(sent int64, now time.Time) (int64, bool) {
	d := now.UnixNano() - sent
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n < trustSamples {
		c.n++
	}
	first := c.n < trustSamples
	switch {
	case c.since.IsZero():
		c.cur, c.since = d, now
	case now.Sub(c.since) >= senderClockWindow:
		c.prev, c.hasPrev = c.cur, true
		c.cur, c.since = d, now
	default:
		c.cur = min(c.cur, d)
	}
	if c.hasPrev {
		return min(c.cur, c.prev), first
	}
	return c.cur, first
}

// deadlineHere converts a forwarded request's deadline (the sender's clock)
// to this node's clock, Unix ns; 0 when it has none. With sent (the
// sender's clock at sending) from a member, it uses that member's least
// delay seen lately (see senderClock): a skew between the two clocks
// cancels out, and a request that was held up on its way reaches this node
// past its deadline by as much as it was held up. (The deadline is read
// late by the quickest transit seen: a one-way delay cannot be told from
// the skew; on a LAN well under a millisecond.) Without it (older
// senders, or a sender that is not a member), and for a member's first
// trustSamples requests, the deadline is taken as a time of this node's
// clock.
func (s *Server) deadlineHere(sender string, deadline, sent int64, now time.Time) int64 {
	if deadline <= 0 {
		return 0
	}
	if sent <= 0 || !s.isMember(sender) {
		return deadline
	}
	v, ok := s.senderClocks.Load(sender)
	if !ok { // LoadOrStore alone would allocate on every request
		v, _ = s.senderClocks.LoadOrStore(sender, &senderClock{})
	}
	est, first := v.(*senderClock).sampleFirst(sent, now)
	if first {
		// Too few requests to tell a late one from a skew: read on this
		// node's clock (the estimate starts from them).
		return deadline
	}
	return deadline + est
}
