package wan

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/internal/poll"
)

// newTransport returns w's transport for region from on 127.0.0.1 (an
// OS-picked port) and its address, shut down when the test ends.
func newTransport(t *testing.T, w *Net, from string) (memberlist.NodeAwareTransport, string) {
	t.Helper()
	tr, err := w.Transport(from, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ip, port, err := tr.FinalAdvertiseAddr("", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(tr) })
	return tr.(memberlist.NodeAwareTransport), net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// shutdown shuts tr down, draining its channels meanwhile: a
// NetTransport's listeners block until what they received is taken.
func shutdown(tr memberlist.Transport) {
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-tr.PacketCh():
			case c := <-tr.StreamCh():
				c.Close()
			case <-stop:
				return
			}
		}
	}()
	_ = tr.Shutdown()
	close(stop)
	<-drained
}

// recvPacket waits up to within for a packet on tr.
func recvPacket(tr memberlist.Transport, within time.Duration) (*memberlist.Packet, bool) {
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case p := <-tr.PacketCh():
		return p, true
	case <-t.C:
		return nil, false
	}
}

func TestWANGossipPackets(t *testing.T) {
	w := New(1)
	defer w.Close()
	const rtt = 100 * time.Millisecond
	w.SetRTT("a", "b", rtt, 0)
	ta, _ := newTransport(t, w, "a")
	tb, addrB := newTransport(t, w, "b")
	if r, ok := w.Region(addrB); !ok || r != "b" {
		t.Fatalf("the transport's address %s is in region %q (%v), want b", addrB, r, ok)
	}

	start := time.Now()
	if _, err := ta.WriteTo([]byte("hello"), addrB); err != nil {
		t.Fatal(err)
	}
	p, ok := recvPacket(tb, 5*time.Second)
	if !ok || string(p.Buf) != "hello" {
		t.Fatalf("packet: %v, %v", p, ok)
	}
	if d := time.Since(start); d < rtt/2 || d > rtt/2+slack {
		t.Errorf("a packet from a to b took %s, want one-way %s", d, rtt/2)
	}
	if got := w.Messages("a", "b"); got != 1 {
		t.Errorf("Messages a→b = %d, want 1", got)
	}

	w.Cut("b")
	if _, err := ta.WriteToAddress([]byte("lost"), memberlist.Address{Addr: addrB, Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if p, ok := recvPacket(tb, rtt+200*time.Millisecond); ok {
		t.Fatalf("a packet crossed a cut: %q", p.Buf)
	}
	w.Heal("b")

	// A packet in flight when the Net closes is dropped.
	if _, err := ta.WriteTo([]byte("in flight"), addrB); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if p, ok := recvPacket(tb, rtt+200*time.Millisecond); ok {
		t.Fatalf("a packet in flight was delivered after Close: %q", p.Buf)
	}
	// After Close, traffic passes untouched.
	start = time.Now()
	if _, err := ta.WriteTo([]byte("after"), addrB); err != nil {
		t.Fatal(err)
	}
	if p, ok := recvPacket(tb, 5*time.Second); !ok || string(p.Buf) != "after" || time.Since(start) >= rtt/2 {
		t.Fatalf("after Close: %v, %v after %s; want the packet at once", p, ok, time.Since(start))
	}
}

func TestWANGossipStreams(t *testing.T) {
	w := New(2)
	defer w.Close()
	const rtt, jitter = 100 * time.Millisecond, 40 * time.Millisecond
	w.SetRTT("a", "b", rtt, jitter)
	ta, _ := newTransport(t, w, "a")
	tb, addrB := newTransport(t, w, "b")

	// b echoes what comes on the streams it accepts.
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		c := <-tb.StreamCh()
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()

	start := time.Now()
	c, err := ta.DialAddressTimeout(memberlist.Address{Addr: addrB, Name: "b"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < rtt || d > rtt+2*jitter+slack {
		t.Errorf("a dial from a to b took %s, want a round trip: %s..%s", d, rtt, rtt+2*jitter)
	}
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}

	// One round trip of bytes, then 100 writes at once, in order.
	start = time.Now()
	if _, err := c.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := io.ReadFull(c, one); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < rtt || d > rtt+2*jitter+slack {
		t.Errorf("a byte's round trip took %s, want %s..%s", d, rtt, rtt+2*jitter)
	}
	var want bytes.Buffer
	for i := 1; i <= 100; i++ {
		b := []byte{byte(i), byte(i), byte(i)}
		want.Write(b)
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("the stream reordered its bytes:\n got %v\nwant %v", got, want.Bytes())
	}

	// A read deadline passes while nothing comes.
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if _, err := c.Read(one); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline: %v, want a timeout", err)
	}

	// Close follows the writes queued before it, as TCP's FIN: the echo
	// ends after it has echoed them (and is delayed, unread, by nothing).
	if _, err := c.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-echoed:
	case <-time.After(5 * time.Second):
		t.Fatal("the far end never saw the stream's end")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

func TestWANGossipDialAcrossCut(t *testing.T) {
	w := New(1)
	defer w.Close()
	w.SetRTT("a", "b", 20*time.Millisecond, 0)
	ta, _ := newTransport(t, w, "a")
	_, addrB := newTransport(t, w, "b")
	w.Cut("a")
	const timeout = 300 * time.Millisecond
	start := time.Now()
	c, err := ta.DialTimeout(addrB, timeout)
	d := time.Since(start)
	var ne net.Error
	if err == nil {
		c.Close()
		t.Fatal("a dial across a cut connected")
	}
	if !errors.As(err, &ne) || !ne.Timeout() || d < timeout || d > timeout+slack {
		t.Fatalf("dial across a cut: %v after %s, want a timeout after %s", err, d, timeout)
	}
}

// memberConfig is a memberlist config with short timings for a link of
// 100 ms RTT: a probe waits 300 ms for its ack, a suspect is dead after
// about 2 probe intervals.
func memberConfig(name string, tr memberlist.Transport) *memberlist.Config {
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.Transport = tr
	c.LogOutput = io.Discard
	c.ProbeInterval = 400 * time.Millisecond
	c.ProbeTimeout = 300 * time.Millisecond
	c.SuspicionMult = 2
	c.GossipInterval = 50 * time.Millisecond
	c.PushPullInterval = time.Second
	c.TCPTimeout = time.Second
	c.GossipToTheDeadTime = time.Second
	return c
}

func TestWANMemberlistJoinCutHeal(t *testing.T) {
	w := New(5)
	defer w.Close()
	const rtt = 100 * time.Millisecond
	w.SetRTT("a", "b", rtt, 10*time.Millisecond)
	start := func(name, region string) (*memberlist.Memberlist, string) {
		tr, err := w.Transport(region, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		m, err := memberlist.Create(memberConfig(name, tr))
		if err != nil {
			shutdown(tr)
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown() })
		ln := m.LocalNode()
		return m, net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port)))
	}
	m1, addr1 := start("one", "a")
	m2, _ := start("two", "b")

	begin := time.Now()
	if _, err := m2.Join([]string{addr1}); err != nil {
		t.Fatal(err)
	}
	// The join's push-pull: a dial (a round trip), then state each way.
	if d := time.Since(begin); d < 2*rtt {
		t.Errorf("a join across a %s RTT took %s, want at least 2 RTT", rtt, d)
	} else {
		t.Logf("join across RTT %s: %s", rtt, d)
	}
	poll.Until(t, 10*time.Second, "both members to see each other", func() bool { return m1.NumMembers() == 2 && m2.NumMembers() == 2 })
	if w.Messages("a", "b") == 0 || w.Messages("b", "a") == 0 {
		t.Errorf("no gossip counted across: a→b %d, b→a %d", w.Messages("a", "b"), w.Messages("b", "a"))
	}

	w.Cut("b")
	begin = time.Now()
	poll.Until(t, 15*time.Second, "each member to declare the other dead", func() bool { return m1.NumMembers() == 1 && m2.NumMembers() == 1 })
	t.Logf("cut: both declared the other dead after %s", time.Since(begin))

	w.Heal("b")
	poll.Until(t, 15*time.Second, "a join after the heal", func() bool {
		_, err := m2.Join([]string{addr1})
		return err == nil
	})
	poll.Until(t, 15*time.Second, "both members to see each other again", func() bool { return m1.NumMembers() == 2 && m2.NumMembers() == 2 })
}
