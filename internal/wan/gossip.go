package wan

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport returns a memberlist transport for a node in region from: a
// memberlist.NetTransport bound on bindAddr (an IP and a port, e.g.
// "127.0.0.1:0": port 0 lets the OS pick one, for TCP and UDP alike),
// whose address (FinalAdvertiseAddr("", 0)) is registered in region from,
// and through which gossip to an address registered in another region
// crosses the link between the two regions. It implements
// memberlist.NodeAwareTransport. Give it to memberlist.Config.Transport
// (memberlist then ignores BindAddr and BindPort; leave AdvertiseAddr
// empty so that the node advertises the bound address).
//
// A packet (UDP) is sent one-way later, or dropped when lost or when the
// link is cut at its sending or its delivery; packets may overtake each
// other under jitter, as UDP's do. A stream (TCP) dial takes a round trip
// (the handshake: two one-way draws) before it connects, and one while
// the link is cut is held until the link heals or the dial's timeout
// passes (then it fails with a timeout, a net.Error). On a connection it
// made, each Write returns at once and its bytes are written one-way
// later, and bytes read come one-way after they arrived, each way in
// order; bytes held by a cut wait for the link to heal (writes at most
// [Hold], then the connection is closed; reads until their deadline).
// Close on such a connection is queued after its writes, as TCP's FIN.
// Connections the node accepts are not wrapped: their peer's side delays
// both ways.
//
// Shutdown (which memberlist calls) drops the packets in flight and closes
// the connections it dialed. It returns an error when bindAddr is not an
// IP address and port, or when the sockets cannot be bound.
func (n *Net) Transport(from string, bindAddr string) (memberlist.Transport, error) {
	host, portStr, err := net.SplitHostPort(bindAddr)
	if err != nil {
		return nil, fmt.Errorf("wan: bind address %q: %w", bindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || net.ParseIP(host) == nil {
		return nil, fmt.Errorf("wan: bind address %q: want an IP address and a port", bindAddr)
	}
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{host},
		BindPort:  port,
		Logger:    log.New(io.Discard, "", 0),
	})
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	ip, advPort, err := inner.FinalAdvertiseAddr("", 0)
	if err != nil {
		_ = inner.Shutdown()
		return nil, fmt.Errorf("wan: %w", err)
	}
	n.Register(net.JoinHostPort(ip.String(), strconv.Itoa(advPort)), from)
	t := &transport{NetTransport: inner, n: n, from: from, timers: map[*time.Timer]struct{}{},
		conns: map[*conn]struct{}{}, done: make(chan struct{})}
	t.untrack = n.track(t.drop)
	return t, nil
}

// transport is a NetTransport across the Net's links.
type transport struct {
	*memberlist.NetTransport // FinalAdvertiseAddr, PacketCh, StreamCh, the ingest methods
	n                        *Net
	from                     string

	mu      sync.Mutex
	timers  map[*time.Timer]struct{} // packets in flight
	conns   map[*conn]struct{}       // connections dialed, still open
	done    chan struct{}            // closed by drop
	dropped bool
	untrack func()
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// WriteTo sends a packet to addr (see WriteToAddress).
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends the packet b to a.Addr, one-way later when that
// is in another region (or drops it: a loss, a cut), and returns the time
// it was handed to the network: now.
func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	to, ok := t.n.crosses(t.from, a.Addr)
	if !ok {
		return t.NetTransport.WriteToAddress(b, a)
	}
	t.n.count(t.from, to)
	p := t.n.path(t.from, to, false)
	now := time.Now()
	if p.blocked || p.dropped {
		return now, nil
	}
	buf := bytes.Clone(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dropped {
		return now, nil
	}
	var tm *time.Timer
	tm = time.AfterFunc(p.delay, func() {
		t.mu.Lock() // tm is set: the timer was made with mu held
		_, ok := t.timers[tm]
		delete(t.timers, tm)
		t.mu.Unlock()
		if ok && !t.n.blocked(t.from, to) {
			_, _ = t.NetTransport.WriteToAddress(buf, a)
		}
	})
	t.timers[tm] = struct{}{}
	return now, nil
}

// DialTimeout connects to addr (see DialAddressTimeout).
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout connects to a.Addr within timeout (0: [Hold]); to
// another region it takes a round trip, and returns a connection whose
// bytes cross the link both ways.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	to, ok := t.n.crosses(t.from, a.Addr)
	if !ok {
		return t.NetTransport.DialAddressTimeout(a, timeout)
	}
	t.n.count(t.from, to)
	if timeout <= 0 {
		timeout = t.n.holdFor
	}
	start := time.Now()
	limit := start.Add(timeout)
	timedOut := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	// The handshake: SYN there, SYN-ACK back.
	if _, err := t.n.transit(t.from, to, start, time.Time{}, t.done, limit, nil); err != nil {
		return nil, timedOut
	}
	back, err := t.n.transit(to, t.from, time.Now(), time.Time{}, t.done, limit, nil)
	if err != nil || back.After(limit) {
		return nil, timedOut
	}
	c, err := t.NetTransport.DialAddressTimeout(a, time.Until(limit))
	if err != nil {
		return nil, err
	}
	return t.wrap(c, to), nil
}

// Shutdown drops the packets in flight, closes the connections dialed,
// and shuts the NetTransport down.
func (t *transport) Shutdown() error {
	t.drop()
	t.untrack()
	return t.NetTransport.Shutdown()
}

// drop drops the packets in flight and closes the connections dialed;
// later packets and dials pass, or are dropped, at once.
func (t *transport) drop() {
	t.mu.Lock()
	if t.dropped {
		t.mu.Unlock()
		return
	}
	t.dropped = true
	close(t.done)
	for tm := range t.timers {
		tm.Stop()
	}
	clear(t.timers)
	conns := t.conns
	t.conns = map[*conn]struct{}{}
	t.mu.Unlock()
	for c := range conns {
		c.kill()
	}
}

// wrap returns c, a connection to region to, across the link.
func (t *transport) wrap(c net.Conn, to string) net.Conn {
	w := &conn{Conn: c, t: t, to: to, notify: make(chan struct{}), killed: make(chan struct{})}
	t.mu.Lock()
	if t.dropped {
		t.mu.Unlock()
		_ = c.Close()
		return w.closedConn()
	}
	t.conns[w] = struct{}{}
	t.mu.Unlock()
	go w.readAhead()
	return w
}

// conn is a gossip stream dialed across a link. Writes are queued and
// written in order by a goroutine that runs while the queue has some;
// reads come from a goroutine that reads the connection ahead, stamping
// each chunk with the time it came.
type conn struct {
	net.Conn // the dialed connection: LocalAddr, RemoteAddr
	t        *transport
	to       string

	mu        sync.Mutex
	writeq    []chunk
	writing   bool      // the write loop runs
	writeErr  error     // what Write returns from now on
	lastWrite time.Time // the delivery time of the last write (write loop only)
	readq     []chunk   // chunks read ahead; the last may be the end (err)
	lastRead  time.Time // the delivery time of the last chunk read
	deadline  time.Time // the read deadline
	notify    chan struct{}
	closed    bool // Close was called: Read and Write fail
	closing   bool // Close waits for the write loop
	killOnce  sync.Once
	killed    chan struct{} // closed by kill
	innerOnce sync.Once
}

// chunk is bytes written or read (or a read's error), with the time they
// were handed over and, once drawn, their delivery time.
type chunk struct {
	data []byte
	err  error
	at   time.Time
	due  time.Time // zero until drawn
}

// Write queues b, to be written one-way later, and returns len(b) at once,
// or the error an earlier write failed with (net.ErrClosed after Close).
func (c *conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.writeErr != nil {
		return 0, c.writeErr
	}
	c.writeq = append(c.writeq, chunk{data: bytes.Clone(b), at: time.Now()})
	if !c.writing {
		c.writing = true
		go c.writeLoop()
	}
	return len(b), nil
}

// writeLoop writes the queued chunks in order, each at its delivery time;
// it returns when the queue is empty (closing the connection if Close was
// called) or the connection failed.
func (c *conn) writeLoop() {
	for {
		c.mu.Lock()
		if len(c.writeq) == 0 || c.writeErr != nil {
			c.writeq, c.writing = nil, false
			closing := c.closing
			c.mu.Unlock()
			if closing {
				c.closeInner()
			}
			return
		}
		ch := c.writeq[0]
		c.writeq[0] = chunk{}
		c.writeq = c.writeq[1:]
		c.mu.Unlock()

		due, err := c.t.n.transit(c.t.from, c.to, ch.at, c.lastWrite, c.killed, time.Now().Add(c.t.n.holdFor), nil)
		if err == nil {
			c.lastWrite = due
			_, err = c.Conn.Write(ch.data)
		}
		if err != nil {
			c.mu.Lock()
			c.writeErr = err
			c.mu.Unlock()
			c.closeInner() // the connection timed out, or was killed
		}
	}
}

// readAhead reads the connection as bytes come, until it fails or ends,
// queueing each chunk and then the error.
func (c *conn) readAhead() {
	for {
		buf := make([]byte, 32<<10)
		k, err := c.Conn.Read(buf)
		now := time.Now()
		c.mu.Lock()
		if k > 0 {
			c.readq = append(c.readq, chunk{data: buf[:k], at: now})
		}
		if err != nil {
			c.readq = append(c.readq, chunk{err: err, at: now})
		}
		c.wakeLocked()
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Read returns bytes one-way after they came, in order (the connection's
// end or error likewise); os.ErrDeadlineExceeded once the read deadline
// passes, net.ErrClosed after Close.
func (c *conn) Read(b []byte) (int, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		now := time.Now()
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			c.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		wake, until := c.notify, c.deadline
		var changed <-chan struct{}
		if len(c.readq) > 0 {
			head := &c.readq[0]
			if head.due.IsZero() {
				// Drawn when Read first looks at it; held while the link
				// is cut, then sent again (at zero: when it heals).
				if p := c.t.n.path(c.to, c.t.from, true); p.blocked {
					head.at, changed = time.Time{}, p.changed
				} else {
					at := head.at
					if at.IsZero() {
						at = now
					}
					head.due = at.Add(p.delay)
					if head.due.Before(c.lastRead) {
						head.due = c.lastRead
					}
					c.lastRead = head.due
				}
			}
			switch {
			case head.due.IsZero(): // held
			case now.Before(head.due):
				if until.IsZero() || head.due.Before(until) {
					until = head.due
				}
			case c.t.n.blocked(c.to, c.t.from): // a cut began in flight
				head.at, head.due = time.Time{}, time.Time{}
				c.mu.Unlock()
				continue
			default:
				return c.readHeadLocked(b)
			}
		}
		c.mu.Unlock()
		c.wait(wake, changed, until)
	}
}

// readHeadLocked reads from the head chunk, which is due, into b; it
// unlocks mu.
func (c *conn) readHeadLocked(b []byte) (int, error) {
	defer c.mu.Unlock()
	head := &c.readq[0]
	if head.err != nil {
		return 0, head.err // stays: every later Read returns it
	}
	k := copy(b, head.data)
	head.data = head.data[k:]
	if len(head.data) == 0 {
		c.readq[0] = chunk{}
		c.readq = c.readq[1:]
	}
	return k, nil
}

// wait blocks until wake or changed is closed, the time until comes
// (zero: none), or the connection is killed.
func (c *conn) wait(wake, changed <-chan struct{}, until time.Time) {
	var timeout <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-wake:
	case <-changed:
	case <-timeout:
	case <-c.killed:
	}
}

// wakeLocked wakes a Read waiting. Requires mu.
func (c *conn) wakeLocked() {
	close(c.notify)
	c.notify = make(chan struct{})
}

// Close closes the connection once its queued writes are written (or
// fail); Read and Write fail with net.ErrClosed from now on.
func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return net.ErrClosed
	}
	c.closed = true
	c.wakeLocked()
	if c.writing {
		c.closing = true
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	c.closeInner()
	return nil
}

// kill closes the connection at once, dropping its queued writes.
func (c *conn) kill() {
	c.killOnce.Do(func() { close(c.killed) })
	c.mu.Lock()
	c.closed = true
	c.writeq = nil
	c.wakeLocked()
	c.mu.Unlock()
	c.closeInner()
}

// closeInner closes the dialed connection (once), which ends readAhead,
// and forgets c in its transport.
func (c *conn) closeInner() {
	c.innerOnce.Do(func() {
		_ = c.Conn.Close()
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
}

// closedConn returns c closed: for a dial that completed after Shutdown.
func (c *conn) closedConn() net.Conn {
	c.closed = true
	c.innerOnce.Do(func() {})
	return c
}

// SetDeadline sets the read deadline (writes never block).
func (c *conn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline sets the time after which Read fails with
// os.ErrDeadlineExceeded; zero: none.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	c.wakeLocked()
	return nil
}

// SetWriteDeadline does nothing: Write only queues, and never blocks.
func (c *conn) SetWriteDeadline(time.Time) error { return nil }
