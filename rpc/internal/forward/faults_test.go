package forward

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Faults on the forwarding path, found by an adversarial review of the
// seventh session's batcher and stream (each failed on that code before
// its fix).

// ctlStream is a client ForwardStream under the test's control.
type ctlStream struct {
	grpc.ClientStream
	ctx   context.Context
	mu    sync.Mutex
	sends int
	block func(n int) bool // Send n (0-based) blocks until ctx ends
	sent  chan *sluicev1.ForwardRequest
	resps chan *sluicev1.ForwardResponse
}

func (s *ctlStream) Send(r *sluicev1.ForwardRequest) error {
	s.mu.Lock()
	n := s.sends
	s.sends++
	s.mu.Unlock()
	if s.block != nil && s.block(n) {
		<-s.ctx.Done()
		return io.EOF
	}
	select {
	case s.sent <- r:
	case <-s.ctx.Done():
		return io.EOF
	}
	return nil
}

func (s *ctlStream) Recv() (*sluicev1.ForwardResponse, error) {
	select {
	case r := <-s.resps:
		return r, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

type ctlClient struct {
	sluicev1.PeerServiceClient
	mu      sync.Mutex
	streams []*ctlStream
	block   func(n int) bool
	openErr func() error
}

func (c *ctlClient) ForwardStream(ctx context.Context, _ ...grpc.CallOption) (sluicev1.PeerService_ForwardStreamClient, error) {
	if c.openErr != nil {
		if err := c.openErr(); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &ctlStream{ctx: ctx, block: c.block, sent: make(chan *sluicev1.ForwardRequest, 1000), resps: make(chan *sluicev1.ForwardResponse, 1000)}
	c.streams = append(c.streams, s)
	return s, nil
}

func (c *ctlClient) stream(i int) *ctlStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[i]
}

func answerOf(req *sluicev1.ForwardRequest) *sluicev1.ForwardResponse {
	resp := &sluicev1.ForwardResponse{}
	for _, c := range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Owner: c.Key})
	}
	return resp
}

func newCtlBatcher(c *ctlClient, cfg BatchConfig, timeout time.Duration) *batcher {
	return newPeer("ctl", "ctl:1", Config{Sender: "test", Timeout: timeout, Batch: cfg}, nil, c, &peerStream{client: c}).batcher
}

// close does not wait for the launcher's Send that flow control holds
// (Server.Close, holding its lock, closes every peer in turn).
func TestBatcherCloseDoesNotWaitForABlockedSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &ctlClient{block: func(n int) bool { return n == 1 }}
		b := newCtlBatcher(c, BatchConfig{MaxWait: time.Hour}, 10*time.Second)
		qa, _ := b.enqueue(context.Background(), &sluicev1.RateLimitCheck{Key: "a"})
		synctest.Wait()
		qb, _ := b.enqueue(context.Background(), &sluicev1.RateLimitCheck{Key: "b"}) // queued behind a
		synctest.Wait()
		s := c.stream(0)
		s.resps <- answerOf(<-s.sent) // a answered: b goes via the launcher, whose Send blocks
		synctest.Wait()
		if r := <-qa.reply; r.err != nil {
			t.Fatal(r.err)
		}
		start := time.Now()
		b.close()
		if time.Since(start) > time.Second {
			t.Errorf("close blocked %v behind the launcher's Send", time.Since(start))
		}
		<-qb.reply
		b.p.tr.close()
	})
}

// call gives up by its context's deadline while the stream is still being
// opened to an owner whose connection never becomes ready.
func TestPeerStreamCallHonoursCtxWhileOpening(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///silent", bufDialOptions(silentListener(t))...)
	if err != nil {
		t.Fatal(err)
	}
	ps := &peerStream{client: sluicev1.NewPeerServiceClient(conn)}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := ps.call(ctx, &sluicev1.ForwardRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("call returned %v after %v, want DeadlineExceeded", err, time.Since(start))
		}
	case <-time.After(3 * time.Second):
		t.Errorf("call still blocked after 3s with a 200ms ctx")
		conn.Close() // the open then fails
		<-done
	}
	conn.Close()
	ps.close()
}

// A request answered right at its deadline: its timer does not then drop
// the stream and fail the other requests on it.
func TestPeerStreamAnsweredAtItsDeadlineKeepsStream(t *testing.T) {
	bad := 0
	for range 300 {
		synctest.Test(t, func(t *testing.T) {
			c := &ctlClient{}
			ps := &peerStream{client: c}
			defer ps.close()
			t0 := time.Now()
			ra := make(chan streamReply, 1)
			rb := make(chan streamReply, 1)
			ps.start(t0.Add(time.Second), &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "a"}}},
				func(r *sluicev1.ForwardResponse, err error) { ra <- streamReply{r, err} })
			ps.start(t0.Add(time.Hour), &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "b"}}},
				func(r *sluicev1.ForwardResponse, err error) { rb <- streamReply{r, err} })
			s := c.stream(0)
			a, b := <-s.sent, <-s.sent
			time.Sleep(time.Second) // a's deadline
			s.resps <- answerOf(a)
			synctest.Wait()
			s.resps <- answerOf(b)
			synctest.Wait()
			x, y := <-ra, <-rb
			if x.err == nil && y.err != nil {
				bad++
			}
		})
	}
	if bad > 0 {
		t.Errorf("%d/300: a answered, yet b (deadline 1h) failed because a's timer dropped the stream", bad)
	}
}
