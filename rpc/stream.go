package rpc

import (
	"errors"
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
//
// One goroutine receives, decides and sends, so a request costs no hand-off
// between goroutines of this node; the handler's own goroutine only waits
// for it to end or for the drain.
func (s *Server) ForwardStream(stream sluicev1.PeerService_ForwardStreamServer) error {
	var (
		mu      sync.Mutex // held from deciding a request to sending its answer: the handler returns only between requests
		stopped bool
	)
	done := make(chan error, 1)
	go func() { // ends when the stream does, at the latest when the handler has returned
		for {
			req, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				done <- nil
				return
			}
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			if stopped { // drained: the sender fails this request; nothing of it was counted
				mu.Unlock()
				return
			}
			// Decided here means counted: its answer is sent before the
			// handler may return.
			resp, err := s.receive(stream.Context(), req, false)
			if err != nil {
				resp = &sluicev1.ForwardResponse{Error: status.Convert(err).Message()}
			}
			err = stream.Send(resp)
			mu.Unlock()
			if err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		return err
	case <-s.draining:
		mu.Lock()
		stopped = true
		mu.Unlock()
		return nil
	}
}
