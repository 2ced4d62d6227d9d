//go:build e2e && linux

package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A netfilter queue (NFQUEUE) client, with the standard library only: the
// WAN's delay when the kernel has no sch_netem (wan_test.go). An iptables
// rule in a container's network namespace sends the packets bound for the
// other regions to queue number num; the suite, bound to that queue in the
// same namespace, holds each packet for the one-way delay and then gives
// the kernel its verdict: accept, or drop while a cut separates the two
// regions. A packet is held from when the suite reads it, so it is delayed
// at least the delay; packets leave in the order they came (one delay per
// queue).
//
// The protocol is linux/netfilter/nfnetlink_queue.h over a NETLINK_NETFILTER
// socket: a config message binds the queue and asks for the first bytes of
// each packet (its IPv4 header: the destination says which region), the
// kernel sends one packet message per queued packet, and a verdict message
// per packet id answers it.
const (
	netlinkNetfilter = 12 // NETLINK_NETFILTER
	nfnlSubsysQueue  = 3  // NFNL_SUBSYS_QUEUE
	nfqnlMsgPacket   = 0  // NFQNL_MSG_PACKET
	nfqnlMsgVerdict  = 1  // NFQNL_MSG_VERDICT
	nfqnlMsgConfig   = 2  // NFQNL_MSG_CONFIG
	nfqaPacketHdr    = 1  // NFQA_PACKET_HDR
	nfqaVerdictHdr   = 2  // NFQA_VERDICT_HDR
	nfqaPayload      = 10 // NFQA_PAYLOAD
	nfqaCfgCmd       = 1  // NFQA_CFG_CMD
	nfqaCfgParams    = 2  // NFQA_CFG_PARAMS
	nfqaCfgQueueLen  = 3  // NFQA_CFG_QUEUE_MAXLEN
	nfqnlCfgCmdBind  = 1  // NFQNL_CFG_CMD_BIND
	nfqnlCopyPacket  = 2  // NFQNL_COPY_PACKET
	nfDrop           = 0  // NF_DROP
	nfAccept         = 1  // NF_ACCEPT
	// nfqCopyRange is how much of each packet the kernel copies to us:
	// the IPv4 header without options.
	nfqCopyRange = 20
	// nfqMaxLen is the most packets the kernel holds for the queue (its
	// default, 1024, is a few floods' worth at 50 ms).
	nfqMaxLen = 65536
)

// nfqueue is one bound queue in one network namespace.
type nfqueue struct {
	fd    int
	num   uint16
	delay time.Duration
	// drop reports whether a packet bound for dst must be dropped (a cut);
	// asked when the packet is read and again when it is due.
	drop func(dst netip.Addr) bool

	seq      atomic.Uint32
	held     chan heldPacket
	stop     chan struct{}
	wg       sync.WaitGroup
	closeOne sync.Once

	// Counters, for the log.
	packets, dropped, errs atomic.Int64
	maxHeld                atomic.Int64
	firstErr               atomic.Pointer[error]
}

// heldPacket is a packet waiting for its verdict.
type heldPacket struct {
	id   uint32
	dst  netip.Addr
	due  time.Time
	drop bool // cut off when it was read
}

// openNfqueue binds queue num in the network namespace of process pid
// (the container's), then serves it until close: every packet is held
// delay, then accepted unless drop says otherwise.
func openNfqueue(pid int, num uint16, delay time.Duration, drop func(netip.Addr) bool) (*nfqueue, error) {
	fd, err := netlinkSocketIn(pid)
	if err != nil {
		return nil, err
	}
	q := &nfqueue{fd: fd, num: num, delay: delay, drop: drop, held: make(chan heldPacket, nfqMaxLen), stop: make(chan struct{})}
	// Received messages wait in the socket's buffer while we work; a full
	// buffer loses packets (the kernel drops what it cannot deliver).
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 8<<20); err != nil {
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<20)
	}
	// A read wakes up every 100 ms so that close is noticed.
	tv := syscall.NsecToTimeval(int64(100 * time.Millisecond))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("nfqueue: SO_RCVTIMEO: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("nfqueue: bind: %w", err)
	}
	cmd := []byte{nfqnlCfgCmdBind, 0, 0, 0}
	binary.BigEndian.PutUint16(cmd[2:], syscall.AF_INET)
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, nfqCopyRange)
	params[4] = nfqnlCopyPacket
	qlen := binary.BigEndian.AppendUint32(nil, nfqMaxLen)
	for _, a := range []struct {
		typ uint16
		val []byte
	}{{nfqaCfgCmd, cmd}, {nfqaCfgParams, params}, {nfqaCfgQueueLen, qlen}} {
		if err := q.request(nfqnlMsgConfig, a.typ, a.val); err != nil {
			syscall.Close(fd)
			return nil, fmt.Errorf("nfqueue %d: config attribute %d: %w", num, a.typ, err)
		}
	}
	q.wg.Go(q.read)
	q.wg.Go(q.release)
	return q, nil
}

// netlinkSocketIn opens a NETLINK_NETFILTER socket in the network
// namespace of process pid: a socket belongs to the namespace it was made
// in, so one OS thread enters it, makes the socket and goes back.
func netlinkSocketIn(pid int) (int, error) {
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return -1, fmt.Errorf("nfqueue: the container's network namespace: %w", err)
	}
	defer target.Close()
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked if the thread could not go back: it then ends with this goroutine
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer own.Close()
		if err := setns(int(target.Fd())); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("nfqueue: setns into pid %d's network namespace (needs root, CAP_SYS_ADMIN): %w", pid, err)}
			return
		}
		fd, serr := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, netlinkNetfilter)
		if err := setns(int(own.Fd())); err == nil {
			runtime.UnlockOSThread()
		}
		if serr != nil {
			done <- result{-1, fmt.Errorf("nfqueue: netlink socket: %w", serr)}
			return
		}
		done <- result{fd, nil}
	}()
	r := <-done
	return r.fd, r.err
}

func setns(fd int) error {
	if _, _, e := syscall.RawSyscall(sysSetns, uintptr(fd), syscall.CLONE_NEWNET, 0); e != 0 {
		return e
	}
	return nil
}

// message returns a netfilter-queue netlink message of type msg with the
// attributes attrs (type, value pairs).
func (q *nfqueue) message(msg uint16, flags uint16, attrs ...any) []byte {
	b := make([]byte, syscall.NLMSG_HDRLEN, 64)
	// nfgenmsg: family, version, resource id (the queue number, big endian)
	b = append(b, syscall.AF_UNSPEC, 0, byte(q.num>>8), byte(q.num))
	for i := 0; i < len(attrs); i += 2 {
		typ, val := attrs[i].(uint16), attrs[i+1].([]byte)
		b = binary.NativeEndian.AppendUint16(b, uint16(syscall.SizeofRtAttr+len(val)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, val...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], nfnlSubsysQueue<<8|msg)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], q.seq.Add(1))
	return b
}

// request sends a config message with one attribute and waits for the
// kernel's acknowledgement (before the queue is served: nothing else is
// read meanwhile).
func (q *nfqueue) request(msg, typ uint16, val []byte) error {
	m := q.message(msg, syscall.NLM_F_REQUEST|syscall.NLM_F_ACK, typ, val)
	seq := binary.NativeEndian.Uint32(m[8:])
	if err := syscall.Sendto(q.fd, m, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := syscall.Recvfrom(q.fd, buf, 0)
		if err == syscall.EAGAIN || err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == syscall.NLMSG_ERROR && m.Header.Seq == seq && len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
					return syscall.Errno(-code)
				}
				return nil
			}
		}
	}
	return errors.New("no acknowledgement from the kernel within 5s")
}

// read reads the kernel's packet messages and queues each packet for its
// verdict at its due time.
func (q *nfqueue) read() {
	defer close(q.held)
	buf := make([]byte, 1<<16)
	for {
		select {
		case <-q.stop:
			return
		default:
		}
		n, _, err := syscall.Recvfrom(q.fd, buf, 0)
		now := time.Now()
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			continue
		case err == syscall.ENOBUFS: // the socket's buffer overflowed: those packets are lost
			q.fail(err)
			continue
		case err != nil:
			q.fail(err)
			return
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			q.fail(err)
			continue
		}
		for _, m := range msgs {
			switch {
			case m.Header.Type == syscall.NLMSG_ERROR:
				if len(m.Data) >= 4 && binary.NativeEndian.Uint32(m.Data) != 0 {
					q.fail(syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data))))
				}
				continue
			case m.Header.Type != nfnlSubsysQueue<<8|nfqnlMsgPacket || len(m.Data) < 4:
				continue
			}
			p, ok := parsePacket(m.Data[4:])
			if !ok {
				q.fail(errors.New("a packet message without its id"))
				continue
			}
			q.packets.Add(1)
			p.due = now.Add(q.delay)
			if n := int64(len(q.held)) + 1; n > q.maxHeld.Load() {
				q.maxHeld.Store(n)
			}
			p.drop = q.drop(p.dst)
			select {
			case q.held <- p:
			case <-q.stop:
				return
			}
		}
	}
}

// parsePacket reads a packet message's attributes: its id and, from its
// IPv4 header, its destination.
func parsePacket(b []byte) (heldPacket, bool) {
	var p heldPacket
	found := false
	for len(b) >= syscall.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff // without NLA_F_NESTED, NLA_F_NET_BYTEORDER
		if l < syscall.SizeofRtAttr || l > len(b) {
			break
		}
		val := b[syscall.SizeofRtAttr:l]
		switch typ {
		case nfqaPacketHdr:
			if len(val) >= 4 {
				p.id, found = binary.BigEndian.Uint32(val), true
			}
		case nfqaPayload:
			if len(val) >= 20 && val[0]>>4 == 4 {
				p.dst = netip.AddrFrom4([4]byte(val[16:20]))
			}
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return p, found
}

// release gives each held packet its verdict once it is due, in order.
func (q *nfqueue) release() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for p := range q.held {
		if d := time.Until(p.due); d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-q.stop:
				return
			}
		}
		v := uint32(nfAccept)
		if p.drop || q.drop(p.dst) {
			v = nfDrop
			q.dropped.Add(1)
		}
		hdr := binary.BigEndian.AppendUint32(nil, v)
		hdr = binary.BigEndian.AppendUint32(hdr, p.id)
		if err := syscall.Sendto(q.fd, q.message(nfqnlMsgVerdict, syscall.NLM_F_REQUEST, uint16(nfqaVerdictHdr), hdr), 0,
			&syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
			q.fail(err)
		}
	}
}

// fail counts an error and keeps the first.
func (q *nfqueue) fail(err error) {
	q.errs.Add(1)
	q.firstErr.CompareAndSwap(nil, &err)
}

// stats describes the queue's work, for the log.
func (q *nfqueue) stats() string {
	s := fmt.Sprintf("queue %d: %d packets delayed %s, %d dropped (cuts), at most %d held at once, %d errors",
		q.num, q.packets.Load(), q.delay, q.dropped.Load(), q.maxHeld.Load(), q.errs.Load())
	if e := q.firstErr.Load(); e != nil {
		s += fmt.Sprintf(" (first: %v)", *e)
	}
	return s
}

// close stops serving the queue (packets still queued in the kernel are
// dropped with the socket, as is whatever the rule sends after: the suite
// removes the containers next).
func (q *nfqueue) close() {
	q.closeOne.Do(func() {
		close(q.stop)
		q.wg.Wait()
		syscall.Close(q.fd)
	})
}
