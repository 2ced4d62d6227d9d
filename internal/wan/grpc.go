package wan

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DialOptions returns the dial options of a gRPC client in region from:
// a unary and a stream client interceptor (chained after any others)
// that carry each call to an address registered in another region over
// the link between the two regions. The address is the connection's
// target (grpc.ClientConn.Target) without a resolver scheme such as
// "dns:///" or "passthrough:///"; a target not registered, or in region
// from, is not touched.
//
// A unary call's request is delayed one-way before it is sent, and its
// answer (a response or an error status) one-way after it comes. On a
// stream, each SendMsg returns at once and its message is sent one-way
// later, and each message RecvMsg returns came one-way before, in order
// (each stream has one queue per direction; a stream reads its messages
// ahead of RecvMsg to time them); CloseSend follows the messages sent
// before it.
//
// While the link is cut (see [Net.Cut]; [Net.SetLoss] with p = 1), a
// message is held, as in a black hole (a cut that begins while a message
// travels holds it too), and goes on when the link heals. A unary call
// held until its context ends fails then with codes.Unavailable, not at
// once; one whose context has no deadline fails so once its request or
// its answer has been held [Hold] (5 s). A stream whose message is held
// until the stream's context ends (no deadline: for [Hold]) is ended, and
// its SendMsg and RecvMsg fail with codes.Unavailable. A call whose
// context ends while its message travels (not held) fails with the
// context's status (DeadlineExceeded or Canceled).
//
// Loss (see [Net.SetLoss]) delays a message by TCP's retransmissions; it
// never fails a call.
func (n *Net) DialOptions(from string) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(n.unaryInterceptor(from)),
		grpc.WithChainStreamInterceptor(n.streamInterceptor(from)),
	}
}

// unaryInterceptor delays the calls of a client in region from.
func (n *Net) unaryInterceptor(from string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		to, ok := n.crosses(from, targetAddr(cc.Target()))
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		n.count(from, to)
		if _, err := n.transit(from, to, time.Now(), time.Time{}, ctx.Done(), n.holdLimit(ctx), nil); err != nil {
			return callError(ctx, err, from, to)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if ctx.Err() != nil {
			return err // the context ended: no answer travels back
		}
		if answered(err) {
			n.count(to, from)
		}
		if _, terr := n.transit(to, from, time.Now(), time.Time{}, ctx.Done(), n.holdLimit(ctx), nil); terr != nil {
			return callError(ctx, terr, to, from)
		}
		return err
	}
}

// answered reports whether err (of a call whose context has not ended)
// is an answer of the server rather than a failure to reach it.
func answered(err error) bool {
	if err == nil {
		return true
	}
	c := status.Code(err)
	return c != codes.Unavailable && c != codes.Canceled && c != codes.DeadlineExceeded
}

// holdLimit is until when a message of a call of ctx, held on a cut link
// from now, may wait: ctx's deadline, or Hold from now.
func (n *Net) holdLimit(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(n.holdFor)
}

// callError is the status error of a call whose message on the link from
// region from to region to failed with err (of transit).
func callError(ctx context.Context, err error, from, to string) error {
	if errors.Is(err, errCut) {
		return status.Errorf(codes.Unavailable, "wan: the link from region %s to region %s is cut", from, to)
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// targetAddr returns the host:port of a gRPC target: target without a
// resolver scheme and authority ("dns:///h:p", "dns://8.8.8.8/h:p",
// "passthrough:///h:p" are all "h:p").
func targetAddr(target string) string {
	i := strings.Index(target, "://")
	if i < 0 {
		return target
	}
	rest := target[i+len("://"):]
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		return rest[j+1:]
	}
	return rest
}

// streamInterceptor delays the streams of a client in region from.
func (n *Net) streamInterceptor(from string) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		to, ok := n.crosses(from, targetAddr(cc.Target()))
		if !ok {
			return streamer(ctx, desc, cc, method, opts...)
		}
		sctx, cancel := context.WithCancelCause(ctx)
		cs, err := streamer(sctx, desc, cc, method, opts...)
		if err != nil {
			cancel(nil)
			return nil, err
		}
		return &stream{ClientStream: cs, n: n, from: from, to: to, ctx: sctx, cancel: cancel,
			recvq: make(chan recvItem, recvAhead), readEnd: make(chan struct{})}, nil
	}
}

// recvAhead bounds the messages a stream reads ahead of RecvMsg.
const recvAhead = 1024

// stream is a client stream across a link: a queue of messages to send,
// sent in order by a goroutine that runs while the queue has some, and
// the messages received, read ahead by a goroutine (started by the first
// RecvMsg) with the time each came.
type stream struct {
	grpc.ClientStream
	n        *Net
	from, to string
	ctx      context.Context // the stream's: cancel ends it
	cancel   context.CancelCauseFunc

	sendMu   sync.Mutex // guards the fields below it
	sendq    []sendItem
	sending  bool      // the send loop runs
	sendErr  error     // what SendMsg returns from now on
	lastSent time.Time // the delivery time of the last message sent (send loop only)

	failOnce sync.Once
	holding  atomic.Int32 // messages held by a cut now, or when the stream failed

	readOnce sync.Once
	recvq    chan recvItem // messages read ahead
	readEnd  chan struct{} // closed when readAhead has set last
	last     recvItem      // the stream's end
	recvType reflect.Type  // the message type read ahead (RecvMsg only, like the fields below)
	recvErr  error         // the stream's end, once RecvMsg returned it
	lastRecv time.Time     // the delivery time of the last message received
}

// sendItem is a message (or CloseSend) queued to be sent.
type sendItem struct {
	msg       any
	closeSend bool
	at        time.Time // when SendMsg was called
}

// recvItem is a message read ahead, or the stream's end.
type recvItem struct {
	msg any
	err error
	at  time.Time // when it came
}

// SendMsg queues m, to be sent one-way later, and returns at once: the
// error the stream's send side failed with before, if any (io.EOF when
// the stream ended: RecvMsg then returns its status). As with any gRPC
// stream, m must not be changed after SendMsg.
func (s *stream) SendMsg(m any) error {
	return s.enqueue(sendItem{msg: m})
}

// CloseSend queues the end of the send side, after the messages queued
// before it, and returns nil at once (on a stream that failed, it does
// nothing).
func (s *stream) CloseSend() error {
	_ = s.enqueue(sendItem{closeSend: true})
	return nil
}

func (s *stream) enqueue(it sendItem) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.sendErr != nil {
		return s.sendErr
	}
	if !it.closeSend {
		s.n.count(s.from, s.to)
	}
	it.at = time.Now()
	s.sendq = append(s.sendq, it)
	if !s.sending {
		s.sending = true
		go s.sendLoop()
	}
	return nil
}

// sendLoop sends the queued messages in order, each at its delivery
// time, and returns when the queue is empty or the stream failed.
func (s *stream) sendLoop() {
	for {
		s.sendMu.Lock()
		if len(s.sendq) == 0 || s.sendErr != nil {
			s.sendq, s.sending = nil, false
			s.sendMu.Unlock()
			return
		}
		it := s.sendq[0]
		s.sendq[0] = sendItem{}
		s.sendq = s.sendq[1:]
		s.sendMu.Unlock()

		var err error
		due, terr := s.n.transit(s.from, s.to, it.at, s.lastSent, s.ctx.Done(), s.n.holdLimit(s.ctx), &s.holding)
		switch {
		case errors.Is(terr, errCut):
			s.fail()
			err = s.cutError()
		case terr != nil:
			err = status.FromContextError(s.ctx.Err()).Err()
		case it.closeSend:
			err = s.ClientStream.CloseSend()
		default:
			err = s.ClientStream.SendMsg(it.msg)
		}
		s.lastSent = due
		if err != nil {
			s.sendMu.Lock()
			s.sendErr = err
			s.sendMu.Unlock()
		}
	}
}

// fail ends the stream because a message was held on a cut link too
// long.
func (s *stream) fail() {
	s.failOnce.Do(func() {
		s.cancel(errCut)
	})
}

// cutError is the status of a stream ended by a cut.
func (s *stream) cutError() error {
	return status.Errorf(codes.Unavailable, "wan: the link between regions %s and %s is cut", s.from, s.to)
}

// RecvMsg returns the next message into m (a pointer, as gRPC requires)
// one-way after it came, in order, or the stream's end one-way after it
// came (at once if the stream's context ended): io.EOF or its status;
// codes.Unavailable if a cut ended it.
func (s *stream) RecvMsg(m any) error {
	if s.recvErr != nil {
		return s.recvErr
	}
	rv := reflect.ValueOf(m)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return status.Errorf(codes.Internal, "wan: RecvMsg(%T): want a non-nil pointer", m)
	}
	s.readOnce.Do(func() {
		s.recvType = rv.Type().Elem()
		go s.readAhead(s.recvType)
	})
	if rv.Type().Elem() != s.recvType {
		return status.Errorf(codes.Internal, "wan: RecvMsg(%T) on a stream of %s", m, s.recvType)
	}
	it := s.next()
	if it.err != nil && s.ctx.Err() != nil {
		return s.end(it.err)
	}
	if it.err == nil {
		s.n.count(s.to, s.from)
	}
	due, terr := s.n.transit(s.to, s.from, it.at, s.lastRecv, s.ctx.Done(), s.n.holdLimit(s.ctx), &s.holding)
	switch {
	case errors.Is(terr, errCut):
		s.fail()
		return s.end(terr)
	case terr != nil:
		return s.end(status.FromContextError(s.ctx.Err()).Err())
	}
	s.lastRecv = due
	if it.err != nil {
		return s.end(it.err)
	}
	rv.Elem().Set(reflect.ValueOf(it.msg).Elem())
	return nil
}

// next returns the next message read ahead, in order, or the stream's
// end once every message before it was returned.
func (s *stream) next() recvItem {
	select {
	case it := <-s.recvq:
		return it
	default:
	}
	select {
	case it := <-s.recvq:
		return it
	case <-s.readEnd:
		select {
		case it := <-s.recvq: // queued before the end
			return it
		default:
			return s.last
		}
	}
}

// end records err (codes.Unavailable instead if a cut ended the stream)
// as what RecvMsg returns from now on (and SendMsg: io.EOF, or
// Unavailable), releases the stream's context, and returns it.
func (s *stream) end(err error) error {
	sendErr := io.EOF // as gRPC's SendMsg on a stream that ended
	if errors.Is(err, errCut) || context.Cause(s.ctx) == errCut || s.holding.Load() > 0 {
		err = s.cutError()
		sendErr = err
	}
	s.recvErr = err
	s.sendMu.Lock()
	if s.sendErr == nil {
		s.sendErr = sendErr
	}
	s.sendMu.Unlock()
	s.cancel(nil) // the stream is over; a cut's cause, if first, stays
	return err
}

// readAhead receives the stream's messages of type t as they come, until
// the stream's end, which it leaves in last. A message that comes after
// the stream's context ended is dropped (RecvMsg returns the end at once
// then).
func (s *stream) readAhead(t reflect.Type) {
	defer close(s.readEnd)
	for {
		m := reflect.New(t).Interface()
		err := s.ClientStream.RecvMsg(m)
		if err != nil {
			s.last = recvItem{err: err, at: time.Now()}
			return
		}
		select {
		case s.recvq <- recvItem{msg: m, at: time.Now()}:
		case <-s.ctx.Done():
		}
	}
}
