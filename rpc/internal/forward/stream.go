package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// peerStream is the client side of one ForwardStream to a peer, opened on
// first use and reopened after any failure. Requests are sent in the order
// their waiters were queued, and responses come back in that order, so the
// receive loop hands each response to the oldest waiter. A failure of the
// stream, or a waiter whose deadline passes (the owner is not answering),
// fails every waiter and drops the stream.
type peerStream struct {
	client sluicev1.PeerServiceClient

	sendMu sync.Mutex // serializes queueing a waiter and Send, so their orders match

	mu      sync.Mutex // guards the fields below
	stream  sluicev1.PeerService_ForwardStreamClient
	cancel  context.CancelFunc
	waiters []*streamWaiter
	closed  bool
}

// streamWaiter is one request sent on the stream and not yet answered.
type streamWaiter struct {
	done     func(*sluicev1.ForwardResponse, error) // called once, with no lock held
	timer    *time.Timer                            // fails the stream at the request's deadline
	answered bool                                   // its response came (guarded by peerStream.mu)
}

var errStreamClosed = errors.New("peer stream closed")

// errStreamDeadline fails the requests on a stream whose owner did not
// answer one of them by its deadline.
var errStreamDeadline = status.Error(codes.DeadlineExceeded, "the owner did not answer within the forward timeout")

// start sends req on the stream and returns once it is sent (or failed);
// done is called exactly once, from another goroutine or before start
// returns, with the response or an error. If the response has not come by
// deadline, the stream is dropped and every request on it fails with a
// DeadlineExceeded status: that also unblocks a Send held up by flow
// control towards an owner that stopped reading.
func (ps *peerStream) start(deadline time.Time, req *sluicev1.ForwardRequest, done func(*sluicev1.ForwardResponse, error)) {
	w := &streamWaiter{done: done}
	ps.sendMu.Lock()
	st, err := ps.streamFor(w, deadline)
	if err != nil {
		ps.sendMu.Unlock()
		done(nil, err)
		return
	}
	err = st.Send(req)
	ps.sendMu.Unlock()
	if err != nil {
		ps.fail(st, err)
	}
}

// call sends req on the stream and waits for its response until ctx ends.
// ctx's deadline bounds the request as start's does (when it passes, the
// stream is dropped); a ctx cancelled before only abandons this request,
// whose response is then dropped when it comes. It returns gRPC status
// errors for ctx's end.
func (ps *peerStream) call(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(24 * time.Hour)
	}
	ch := make(chan streamReply, 1)
	ps.start(deadline, req, func(resp *sluicev1.ForwardResponse, err error) { ch <- streamReply{resp, err} })
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

type streamReply struct {
	resp *sluicev1.ForwardResponse
	err  error
}

// streamFor returns the open stream (opening it if needed) with w queued as
// the waiter of the next request, its timer set for deadline. Requires
// sendMu held.
func (ps *peerStream) streamFor(w *streamWaiter, deadline time.Time) (sluicev1.PeerService_ForwardStreamClient, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return nil, errStreamClosed
	}
	if ps.stream == nil {
		st, cancel, err := ps.open(deadline)
		if err != nil {
			return nil, err
		}
		ps.stream, ps.cancel = st, cancel
		go ps.recvLoop(st)
	}
	st := ps.stream
	w.timer = time.AfterFunc(time.Until(deadline), func() { ps.expire(st, w) })
	ps.waiters = append(ps.waiters, w)
	return st, nil
}

// errStreamOpen fails a request whose deadline passed while the stream to
// its owner was being opened (its connection never became ready: the
// owner's host is down or cut off).
var errStreamOpen = status.Error(codes.DeadlineExceeded, "no connection to the owner within the forward timeout")

// open opens a new stream to the peer, waiting for its connection at most
// until deadline: gRPC holds a new stream while the connection is still
// connecting, which to a host that drops packets lasts its connect timeout
// (20 s), and the callers queued behind must not wait that long. The
// returned cancel ends the stream.
func (ps *peerStream) open(deadline time.Time) (sluicev1.PeerService_ForwardStreamClient, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(context.Background())
	type opened struct {
		st  sluicev1.PeerService_ForwardStreamClient
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		st, err := ps.client.ForwardStream(ctx)
		ch <- opened{st, err}
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case o := <-ch:
		if o.err != nil {
			cancel()
			return nil, nil, o.err
		}
		return o.st, cancel, nil
	case <-t.C:
		cancel() // ForwardStream returns; a stream it opened is ended
		return nil, nil, errStreamOpen
	}
}

func (ps *peerStream) recvLoop(st sluicev1.PeerService_ForwardStreamClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			ps.fail(st, err)
			return
		}
		ps.mu.Lock()
		if ps.stream != st || len(ps.waiters) == 0 {
			ps.mu.Unlock()
			ps.fail(st, fmt.Errorf("unexpected response on peer stream"))
			return
		}
		w := ps.waiters[0]
		w.answered = true
		ps.waiters[0] = nil
		ps.waiters = ps.waiters[1:]
		ps.mu.Unlock()
		w.timer.Stop()
		if resp.Error != "" {
			w.done(nil, errors.New(resp.Error))
		} else {
			w.done(resp, nil)
		}
	}
}

// expire is w's timer: its deadline passed. Unless its response came
// meanwhile, the owner is not answering: st is dropped.
func (ps *peerStream) expire(st sluicev1.PeerService_ForwardStreamClient, w *streamWaiter) {
	ps.mu.Lock()
	if w.answered {
		ps.mu.Unlock()
		return
	}
	ps.failLocked(st, errStreamDeadline)
}

// fail drops st, if it is still the current stream, failing its waiters
// with err.
func (ps *peerStream) fail(st sluicev1.PeerService_ForwardStreamClient, err error) {
	ps.mu.Lock()
	ps.failLocked(st, err)
}

// failLocked is fail with mu held; it unlocks mu before it calls the
// waiters.
func (ps *peerStream) failLocked(st sluicev1.PeerService_ForwardStreamClient, err error) {
	if ps.stream != st {
		ps.mu.Unlock()
		return
	}
	ws := ps.waiters
	ps.stream, ps.waiters = nil, nil
	ps.cancel()
	ps.mu.Unlock()
	for _, w := range ws {
		w.timer.Stop()
		w.done(nil, err)
	}
}

// close drops the stream for good.
func (ps *peerStream) close() {
	ps.mu.Lock()
	ps.closed = true
	st := ps.stream
	ps.mu.Unlock()
	if st != nil {
		ps.fail(st, errStreamClosed)
	}
}
