package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// ForwardStream implements PeerService.ForwardStream: Forward over one
// long-lived stream, one response per request, in order. A refused request
// (bad input) gets a response with error set; the stream goes on.
// When the server drains (see Server.Drain) the stream ends, so a graceful
// stop need not wait for peers to hang up.
func (s *Server) ForwardStream(stream sluicev1.PeerService_ForwardStreamServer) error {
	type recvd struct {
		req *sluicev1.ForwardRequest
		err error
	}
	in := make(chan recvd, 1)
	go func() { // ends when the stream does, at the latest when we return
		for {
			req, err := stream.Recv()
			select {
			case in <- recvd{req, err}:
			case <-stream.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recvd
		select {
		case r = <-in:
		case <-s.draining:
			return nil
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		req := r.req
		resp, err := s.Forward(stream.Context(), req)
		if err != nil {
			resp = &sluicev1.ForwardResponse{Error: status.Convert(err).Message()}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// peerStream is the client side of one ForwardStream to a peer, opened on
// first use and reopened after any failure. Requests are sent in the order
// their waiters were queued, and responses come back in that order, so the
// receive loop hands each response to the oldest waiter. A failure of the
// stream (or of a caller's deadline, which means the owner is not
// answering) fails every waiter and drops the stream.
type peerStream struct {
	client sluicev1.PeerServiceClient

	sendMu sync.Mutex // serializes queueing a waiter and Send, so their orders match

	mu      sync.Mutex // guards the fields below
	stream  sluicev1.PeerService_ForwardStreamClient
	cancel  context.CancelFunc
	waiters []chan streamReply
	closed  bool
}

type streamReply struct {
	resp *sluicev1.ForwardResponse
	err  error
}

var errStreamClosed = errors.New("peer stream closed")

// call sends req on the stream and waits for its response until ctx ends.
func (ps *peerStream) call(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	ch := make(chan streamReply, 1)
	ps.sendMu.Lock()
	st, err := ps.streamFor(ch)
	if err != nil {
		ps.sendMu.Unlock()
		return nil, err
	}
	// If ctx ends first, drop the stream: that also unblocks a Send held
	// up by flow control towards an owner that stopped reading.
	stop := context.AfterFunc(ctx, func() { ps.fail(st, ctx.Err()) })
	defer stop()
	err = st.Send(req)
	ps.sendMu.Unlock()
	if err != nil {
		ps.fail(st, err)
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		// The owner did not answer in time; AfterFunc dropped the stream,
		// so the requests behind this one fail now, not one by one.
		ps.fail(st, ctx.Err())
		return nil, ctx.Err()
	}
}

// streamFor returns the open stream (opening it if needed) with ch queued
// as the waiter of the next request. Requires sendMu held.
func (ps *peerStream) streamFor(ch chan streamReply) (sluicev1.PeerService_ForwardStreamClient, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return nil, errStreamClosed
	}
	if ps.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := ps.client.ForwardStream(ctx)
		if err != nil {
			cancel()
			return nil, err
		}
		ps.stream, ps.cancel = st, cancel
		go ps.recvLoop(st)
	}
	ps.waiters = append(ps.waiters, ch)
	return ps.stream, nil
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
		ps.waiters = ps.waiters[1:]
		ps.mu.Unlock()
		if resp.Error != "" {
			w <- streamReply{err: errors.New(resp.Error)}
		} else {
			w <- streamReply{resp: resp}
		}
	}
}

// fail drops st, if it is still the current stream, failing its waiters
// with err.
func (ps *peerStream) fail(st sluicev1.PeerService_ForwardStreamClient, err error) {
	ps.mu.Lock()
	if ps.stream != st {
		ps.mu.Unlock()
		return
	}
	ws := ps.waiters
	ps.stream, ps.waiters = nil, nil
	ps.cancel()
	ps.mu.Unlock()
	for _, w := range ws {
		w <- streamReply{err: err}
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
