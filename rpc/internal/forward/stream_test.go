package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice/internal/testnet"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// streamPeer is a PeerService whose ForwardStream answers each request
// with one decision per check naming the check's key, in order, unless
// stall is set: then it reads requests and never answers.
type streamPeer struct {
	sluicev1.UnimplementedPeerServiceServer
	mu      sync.Mutex
	stall   bool
	delay   time.Duration // before each answer
	streams int           // ForwardStreams opened
}

func (p *streamPeer) ForwardStream(st sluicev1.PeerService_ForwardStreamServer) error {
	p.mu.Lock()
	p.streams++
	stall, delay := p.stall, p.delay
	p.mu.Unlock()
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if stall {
			continue
		}
		time.Sleep(delay)
		resp := &sluicev1.ForwardResponse{}
		for _, c := range req.Checks {
			resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Owner: c.Key})
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// startStreamPeer serves p over bufconn and returns a peerStream to it.
func startStreamPeer(t *testing.T, p *streamPeer) *peerStream {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	sluicev1.RegisterPeerServiceServer(gs, p)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	ps := &peerStream{client: sluicev1.NewPeerServiceClient(bufDial(t, lis))}
	t.Cleanup(ps.close)
	return ps
}

// bufDial returns a plaintext connection to lis, closed when the test
// ends.
func bufDial(t testing.TB, lis *bufconn.Listener) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufnet", bufDialOptions(lis)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// bufDialOptions dial lis in plaintext, whatever the address.
func bufDialOptions(lis *bufconn.Listener) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	}
}

// silentListener returns a bufconn listener that accepts connections and
// never answers (a hung node, or a host behind a firewall that drops
// packets), until the test ends.
func silentListener(t testing.TB) *bufconn.Listener {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	testnet.Silent(t, lis)
	return lis
}

// startAndWait starts one request for key on ps with deadline and returns
// a channel that gets its outcome.
func startAndWait(ps *peerStream, key string, deadline time.Time) <-chan streamReply {
	ch := make(chan streamReply, 1)
	req := &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: key}}}
	ps.start(deadline, req, func(resp *sluicev1.ForwardResponse, err error) { ch <- streamReply{resp, err} })
	return ch
}

// wantDeadlineExceeded waits for each named reply (at most 10 s, far past
// the tests' deadlines) and fails the test unless it is DeadlineExceeded.
func wantDeadlineExceeded(t *testing.T, replies map[string]<-chan streamReply) {
	t.Helper()
	for name, ch := range replies {
		select {
		case r := <-ch:
			if status.Code(r.err) != codes.DeadlineExceeded {
				t.Fatalf("%s: %+v, want DeadlineExceeded", name, r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer 10s after its deadline", name)
		}
	}
}

// Requests started from many goroutines at once each get their own
// response: the stream keeps the order of its waiters and its Sends.
func TestPeerStreamAnswersEachRequestItsOwn(t *testing.T) {
	ps := startStreamPeer(t, &streamPeer{})
	deadline := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for g := range 20 {
		wg.Go(func() {
			for i := range 20 {
				key := fmt.Sprintf("%d/%d", g, i)
				r := <-startAndWait(ps, key, deadline)
				if r.err != nil || len(r.resp.Decisions) != 1 || r.resp.Decisions[0].Owner != key {
					errs <- fmt.Errorf("request %s: %+v", key, r)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// An owner that reads but never answers: every request on the stream
// fails with DeadlineExceeded when the earliest deadline passes (the
// stream is dropped), not one by one; the next request opens a new stream
// and is answered once the owner answers again.
func TestPeerStreamStalledOwnerFailsByDeadline(t *testing.T) {
	p := &streamPeer{stall: true}
	ps := startStreamPeer(t, p)
	start := time.Now()
	first := startAndWait(ps, "first", start.Add(300*time.Millisecond))
	second := startAndWait(ps, "second", start.Add(time.Hour))
	wantDeadlineExceeded(t, map[string]<-chan streamReply{"first": first, "second": second})
	p.mu.Lock()
	p.stall = false
	p.mu.Unlock()
	r := <-startAndWait(ps, "after", time.Now().Add(10*time.Second))
	if r.err != nil || r.resp.Decisions[0].Owner != "after" {
		t.Fatalf("after the stall: %+v", r)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams != 2 {
		t.Fatalf("%d streams opened, want 2 (the stalled one dropped, one new)", p.streams)
	}
}

// call gives up when its context is cancelled, without dropping the
// stream: the late response is dropped and the next request is answered on
// the same stream. A context that ended before sends nothing.
func TestPeerStreamCallCancelledAlone(t *testing.T) {
	p := &streamPeer{delay: 200 * time.Millisecond}
	ps := startStreamPeer(t, p)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ps.call(ended, &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "never"}}}); status.Code(err) != codes.Canceled {
		t.Fatalf("call with an ended context: %v, want Canceled", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel) // while the owner takes 200ms
	if _, err := ps.call(ctx, &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "gone"}}}); status.Code(err) != codes.Canceled {
		t.Fatalf("call cancelled while waiting: %v, want Canceled", err)
	}
	cctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	resp, err := ps.call(cctx, &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{{Key: "next"}}})
	if err != nil || resp.Decisions[0].Owner != "next" {
		t.Fatalf("next call: %v, %v (want the answer to its own request, not the cancelled one's)", resp, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams != 1 {
		t.Fatalf("%d streams opened, want 1", p.streams)
	}
}

// A closed peerStream refuses new requests at once.
func TestPeerStreamClosedRefuses(t *testing.T) {
	ps := startStreamPeer(t, &streamPeer{})
	ps.close()
	if r := <-startAndWait(ps, "late", time.Now().Add(time.Second)); !errors.Is(r.err, errStreamClosed) {
		t.Fatalf("after close: %+v, want errStreamClosed", r)
	}
}

// An owner whose connection never becomes ready (it accepts TCP and says
// nothing, as a host behind a dropping firewall holds a connect): the
// request fails by its deadline, not after gRPC's 20 s connect timeout,
// and so do the requests queued behind the opening one.
func TestPeerStreamOpenBoundedByDeadline(t *testing.T) {
	ps := &peerStream{client: sluicev1.NewPeerServiceClient(bufDial(t, silentListener(t)))}
	defer ps.close()
	start := time.Now()
	first := startAndWait(ps, "first", start.Add(300*time.Millisecond))
	second := make(chan streamReply, 1)
	go func() { second <- <-startAndWait(ps, "second", start.Add(600*time.Millisecond)) }()
	wantDeadlineExceeded(t, map[string]<-chan streamReply{"first": first, "second": second}) // not gRPC's 20s connect timeout
}
