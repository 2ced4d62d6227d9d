// Package wan puts a wide-area network between regions whose nodes all
// run in one process on 127.0.0.1: a one-way delay with jitter, loss and
// partitions, on gRPC (client interceptors, see [Net.DialOptions]) and on
// gossip (a hashicorp/memberlist transport, see [Net.Transport]).
//
// Every address a node uses (its gRPC address, its gossip address) is
// registered with the region it is in ([Net.Register]); a message to an
// address of another region crosses the link between the two regions,
// shaped by [Net.SetRTT], [Net.SetLoss], [Net.Cut] and [Net.Heal]. Traffic
// within a region, and to an address that is not registered, passes
// untouched.
//
// gRPC is shaped per message, by client interceptors: connecting, HTTP/2
// pings and flow control are not delayed, and a cut holds messages but
// leaves the connection up. Gossip is shaped per packet and, on the
// streams a node dials, per write and read.
//
// It is meant for tests and scenario runners (the in-process cluster of
// the multi-region test plan); it is no model of congestion or bandwidth:
// a link has no capacity limit and no queue but the order of a stream.
package wan

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Hold bounds how long a message waits on a cut link when nothing else
// bounds it: a gRPC call whose context has no deadline, a gossip stream's
// queued writes, a gossip dial without a timeout. After Hold the message
// fails (see [Net.DialOptions] and [Net.Transport]).
const Hold = 5 * time.Second

// MinRTO is the first retransmission timeout of a message lost on a
// reliable path (a gRPC message, a gossip stream's bytes): the least the
// Linux kernel waits before it retransmits a TCP segment. A link's RTO is
// max(MinRTO, its RTT + 2·jitter), doubled on each loss of the same
// message.
const MinRTO = 200 * time.Millisecond

// maxRetransmits caps the retransmissions one message of a reliable path
// takes (with p < 1): the last one always arrives, so a message waits at
// most 7 RTOs more (RTO + 2·RTO + 4·RTO), not TCP's minutes.
const maxRetransmits = 3

// Net is a simulated network between regions. Create it with [New]; the
// zero value is not usable. All its methods are safe for concurrent use.
type Net struct {
	mu      sync.Mutex
	rng     *rand.Rand
	regions map[string]string   // canonical host:port -> region
	links   map[[2]string]link  // by sorted region pair
	cut     map[string]bool     // regions cut off from all others
	msgs    map[[2]string]int64 // by (from, to) region
	changed chan struct{}       // closed and replaced when a link may have opened
	closers map[uint64]func()   // what Close shuts: the transports (and their streams)
	nextID  uint64
	closed  bool
	done    chan struct{} // closed by Close
	holdFor time.Duration // Hold; tests shorten it
}

// link is the shape of the link between two regions, the same both ways.
type link struct {
	rtt, jitter time.Duration
	loss        float64
}

// New returns a Net where every link between regions is instant, lossless
// and open until configured; seed seeds the draws of jitter and loss.
func New(seed int64) *Net {
	return &Net{
		rng:     rand.New(rand.NewPCG(uint64(seed), 0x5eed)),
		regions: map[string]string{},
		links:   map[[2]string]link{},
		cut:     map[string]bool{},
		msgs:    map[[2]string]int64{},
		changed: make(chan struct{}),
		closers: map[uint64]func(){},
		done:    make(chan struct{}),
		holdFor: Hold,
	}
}

// Register puts the node address addr (host:port: a gRPC address, a
// gossip address) in region. Registering an address again moves it.
// Addresses are compared after canonicalising an IP host (so "[::1]:80"
// and "[0:0::1]:80" are one); a host name is compared as written.
func (n *Net) Register(addr, region string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.regions[canonical(addr)] = region
}

// SetRTT sets the round-trip time of the link between regions a and b
// (a != b): a message either way is delayed by one-way = rtt/2 plus a
// draw uniform in [0, jitter), so a round trip takes rtt to rtt+2·jitter.
// Negative durations count as 0. On a stream (a gRPC stream, a gossip
// stream) messages keep their order: one is never delivered before the
// one sent ahead of it.
func (n *Net) SetRTT(a, b string, rtt, jitter time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[pair(a, b)]
	l.rtt, l.jitter = max(rtt, 0), max(jitter, 0)
	n.links[pair(a, b)] = l
	n.wakeLocked()
}

// SetLoss sets the probability p (0..1, clamped) that a message on the
// link between regions a and b is lost, either way. A gossip packet (UDP)
// that is lost is dropped. A gRPC message or a gossip stream's write
// (TCP) is retransmitted as TCP would: each loss delays it by the link's
// RTO (see [MinRTO]), doubling, so loss shows as latency and holds up
// what follows it on the same stream. p = 1 black-holes the link both
// ways as [Net.Cut] does, for this pair of regions only.
func (n *Net) SetLoss(a, b string, p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[pair(a, b)]
	l.loss = min(max(p, 0), 1)
	n.links[pair(a, b)] = l
	n.wakeLocked()
}

// Cut partitions region from every other region, both ways, until Heal:
// gossip packets across are dropped, and gRPC messages, gossip dials and
// gossip stream bytes are held (a black hole: nothing is refused, nothing
// arrives) until the link heals or their bound passes (see
// [Net.DialOptions], [Net.Transport]). Traffic within region goes on.
func (n *Net) Cut(region string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[region] = true
}

// Heal ends Cut(region); messages held by the cut go on, each then
// delayed as usual.
func (n *Net) Heal(region string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cut, region)
	n.wakeLocked()
}

// Messages returns how many messages were sent from region from to region
// to (from != to) since New or Reset: gRPC requests (a unary call's
// request counts from→to and its answer to→from), gRPC stream messages
// each way, gossip packets, and gossip stream dials (not their writes). A
// message counts when it is sent, whether the link then delivers it,
// loses it or holds it.
func (n *Net) Messages(from, to string) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.msgs[[2]string{from, to}]
}

// Reset sets every counter of Messages to 0. Links, cuts and addresses
// stay.
func (n *Net) Reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.msgs)
}

// Close ends the simulation: gossip packets in flight are dropped, gossip
// streams through the Net are closed (their queued writes dropped), and
// gRPC messages being delayed or held go on at once. From then on every
// wrapper passes traffic through untouched, as if all were one region.
// Close returns nil; calling it again does nothing.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	close(n.done)
	close(n.changed) // wakes the held messages, which go on
	closers := n.closers
	n.closers = map[uint64]func(){}
	n.mu.Unlock()
	for _, f := range closers {
		f()
	}
	return nil
}

// track registers f to run at Close (at once if the Net is closed) and
// returns the function that unregisters it.
func (n *Net) track(f func()) (untrack func()) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		f()
		return func() {}
	}
	n.nextID++
	id := n.nextID
	n.closers[id] = f
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.closers, id)
		n.mu.Unlock()
	}
}

// wakeLocked tells the messages held on a cut link to look again.
// Requires mu.
func (n *Net) wakeLocked() {
	if n.closed {
		return // Close closed changed for good
	}
	close(n.changed)
	n.changed = make(chan struct{})
}

// Region returns the region the address addr (host:port) is registered
// in, and whether it is.
func (n *Net) Region(addr string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.regions[canonical(addr)]
	return r, ok
}

// crosses reports whether a message from region from to the address
// addr crosses a link (the Net is open, addr is registered in another
// region), and addr's region.
func (n *Net) crosses(from, addr string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	to, ok := n.regions[canonical(addr)]
	return to, ok && to != from && !n.closed
}

// count counts one message from region from to region to.
func (n *Net) count(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs[[2]string{from, to}]++
}

// path is the fate of one message on a link, drawn when it enters it.
type path struct {
	blocked bool          // the link is cut (or loses everything): hold the message
	dropped bool          // lost, on an unreliable path
	delay   time.Duration // one-way, with jitter and (reliable) retransmissions
	changed chan struct{} // closed when the link may have opened (when blocked)
}

// path draws the fate of a message from region from to region to now;
// reliable: a lost message is retransmitted (TCP), else dropped (UDP).
// A closed Net, or one region, is an instant open path.
func (n *Net) path(from, to string, reliable bool) path {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || from == to {
		return path{}
	}
	l := n.links[pair(from, to)]
	if n.cut[from] || n.cut[to] || l.loss >= 1 { // as cutNow
		return path{blocked: true, changed: n.changed}
	}
	p := path{delay: n.oneWayLocked(l)}
	if l.loss > 0 {
		if !reliable {
			p.dropped = n.rng.Float64() < l.loss
			return p
		}
		rto := max(MinRTO, l.rtt+2*l.jitter)
		for i := 0; i < maxRetransmits && n.rng.Float64() < l.loss; i++ {
			p.delay += rto
			rto *= 2
		}
	}
	return p
}

// blocked reports whether the link from region from to region to is cut
// now (as path would say).
func (n *Net) blocked(from, to string) bool {
	b, _ := n.cutNow(from, to)
	return b
}

// cutNow reports whether the link from region from to region to is cut
// now, and the channel closed when it may have opened.
func (n *Net) cutNow(from, to string) (bool, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.closed && from != to && (n.cut[from] || n.cut[to] || n.links[pair(from, to)].loss >= 1), n.changed
}

// oneWayLocked draws a one-way delay of l. Requires mu.
func (n *Net) oneWayLocked(l link) time.Duration {
	d := l.rtt / 2
	if l.jitter > 0 {
		d += time.Duration(n.rng.Int64N(int64(l.jitter)))
	}
	return d
}

// hold waits while the link from region from to region to is blocked: it
// returns true once the link is open (or the Net closed), false when done
// is closed or the time limit passes first.
func (n *Net) hold(from, to string, done <-chan struct{}, limit time.Time) bool {
	t := time.NewTimer(time.Until(limit))
	defer t.Stop()
	for {
		blocked, changed := n.cutNow(from, to)
		if !blocked {
			return true
		}
		select {
		case <-changed:
		case <-done:
			return false
		case <-t.C:
			return false
		}
	}
}

// sleep waits d, or until done is closed (false) or the Net closes (true:
// the message goes on at once).
func (n *Net) sleep(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.done:
		return true
	case <-done:
		return false
	}
}

// errCut: a message was held on a cut link until its bound passed.
var errCut = errors.New("wan: the link is cut")

// errGone: the sender gave up on a message in flight (its done closed).
var errGone = errors.New("wan: the message was abandoned in flight")

// transit carries one message of a reliable path (TCP: nothing lost)
// from region from to region to, sent at t0 and delivered no sooner than
// after (the delivery of the message ahead of it on its stream, or the
// zero time): it waits while the link is cut, then until its delivery
// time, then again, if a cut began meanwhile, until it heals (and the
// message travels again). It returns the delivery time; errCut when the
// link stayed cut until done closed or limit passed; errGone when done
// closed while the message travelled. holding, if not nil, counts the
// message while it is held (and still after an errCut).
func (n *Net) transit(from, to string, t0, after time.Time, done <-chan struct{}, limit time.Time, holding *atomic.Int32) (time.Time, error) {
	for {
		p := n.path(from, to, true)
		if p.blocked {
			if holding != nil {
				holding.Add(1)
			}
			if !n.hold(from, to, done, limit) {
				return time.Time{}, errCut
			}
			if holding != nil {
				holding.Add(-1)
			}
			t0 = time.Now() // retransmitted once the link heals
			continue
		}
		due := t0.Add(p.delay)
		if due.Before(after) {
			due = after
		}
		if !n.sleep(time.Until(due), done) {
			return time.Time{}, errGone
		}
		if !n.blocked(from, to) {
			return due, nil
		}
		t0, after = time.Now(), due // cut in flight: held, then sent again
	}
}

// pair is the key of the link between regions a and b.
func pair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// canonical returns addr with an IP host in its canonical form (IPv4 as
// dotted quad, IPv6 compressed), else addr as given.
func canonical(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil {
		return net.JoinHostPort(ip.String(), port)
	}
	return addr
}
