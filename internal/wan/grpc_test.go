package wan

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// echo is a TestService that answers each request with its payload.
type echo struct {
	testpb.UnimplementedTestServiceServer
}

func (echo) UnaryCall(_ context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{Payload: req.Payload}, nil
}

func (echo) FullDuplexCall(st testpb.TestService_FullDuplexCallServer) error {
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: req.Payload}); err != nil {
			return err
		}
	}
}

// startEcho serves echo on 127.0.0.1 (an OS-picked port) until the test
// ends, and returns its address.
func startEcho(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, echo{})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// dialEcho connects to target through w from region from, and makes one
// call (not timed) so that the connection is up.
func dialEcho(t *testing.T, w *Net, from, target string) testpb.TestServiceClient {
	t.Helper()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, w.DialOptions(from)...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := testpb.NewTestServiceClient(conn)
	if _, err := unary(c, 10*time.Second); err != nil {
		t.Fatalf("first call: %v", err)
	}
	return c
}

// unary makes one echo call bounded by timeout, and returns how long it
// took.
func unary(c testpb.TestServiceClient, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("ping")}})
	return time.Since(start), err
}

// slack bounds loosely how much longer than its delay a call may take
// on a busy 2-core machine running the race detector.
const slack = 500 * time.Millisecond

func TestWANUnaryDelaysAcrossRegions(t *testing.T) {
	w := New(1)
	defer w.Close()
	addr := startEcho(t)
	w.Register(addr, "b")
	const rtt = 100 * time.Millisecond
	w.SetRTT("a", "b", rtt, 0)

	across := dialEcho(t, w, "a", addr)
	within := dialEcho(t, w, "b", "dns:///"+addr) // a scheme is stripped
	w.Reset()
	for range 3 {
		d, err := unary(across, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if d < rtt || d > rtt+slack {
			t.Errorf("a call from a to b took %s, want %s (+ up to %s)", d, rtt, slack)
		}
		t.Logf("across, RTT %s: %s", rtt, d)
		if d, err = unary(within, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if d >= rtt/2 {
			t.Errorf("a call within region b took %s, want no delay (< %s)", d, rtt/2)
		}
	}
	if ab, ba := w.Messages("a", "b"), w.Messages("b", "a"); ab != 3 || ba != 3 {
		t.Errorf("Messages a→b %d, b→a %d: want 3 and 3 (requests and answers)", ab, ba)
	}
	if bb := w.Messages("b", "b"); bb != 0 {
		t.Errorf("Messages b→b %d, want 0 (within a region nothing crosses)", bb)
	}
}

func TestWANUnregisteredTargetIsNotDelayed(t *testing.T) {
	w := New(1)
	defer w.Close()
	addr := startEcho(t)
	w.SetRTT("a", "b", time.Second, 0)
	c := dialEcho(t, w, "a", "passthrough:///"+addr)
	if d, err := unary(c, 5*time.Second); err != nil || d >= 500*time.Millisecond {
		t.Fatalf("call to an unregistered address: %s, %v; want no delay", d, err)
	}
}

func TestWANCutFailsAtDeadlineAndHeals(t *testing.T) {
	w := New(1)
	defer w.Close()
	addr := startEcho(t)
	w.Register(addr, "b")
	const rtt = 40 * time.Millisecond
	w.SetRTT("a", "b", rtt, 0)
	c := dialEcho(t, w, "a", addr)

	w.Cut("b")
	const timeout = 300 * time.Millisecond
	d, err := unary(c, timeout)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call across a cut: %v, want Unavailable", err)
	}
	if d < timeout || d > timeout+slack {
		t.Errorf("call across a cut failed after %s, want at its deadline %s", d, timeout)
	}
	t.Logf("cut: failed after %s (deadline %s): %v", d, timeout, err)

	w.Heal("b")
	if d, err := unary(c, 5*time.Second); err != nil || d < rtt {
		t.Fatalf("after Heal: %s, %v; want success after at least %s", d, err, rtt)
	}

	// A call held by a cut goes on when the link heals.
	w.Cut("a") // either end cuts the link
	go func() {
		time.Sleep(150 * time.Millisecond) // the call must be held meanwhile: real time is the point
		w.Heal("a")
	}()
	d, err = unary(c, 5*time.Second)
	if err != nil || d < 150*time.Millisecond+rtt {
		t.Fatalf("call held by a cut healed at 150 ms: %s, %v; want success after at least %s", d, err, 150*time.Millisecond+rtt)
	}
}

func TestWANCutWithoutDeadlineFailsAfterHold(t *testing.T) {
	w := New(1)
	defer w.Close()
	w.holdFor = 200 * time.Millisecond
	addr := startEcho(t)
	w.Register(addr, "b")
	c := dialEcho(t, w, "a", addr)
	w.Cut("b")
	start := time.Now()
	_, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{})
	if d := time.Since(start); status.Code(err) != codes.Unavailable || d < w.holdFor || d > w.holdFor+slack {
		t.Fatalf("call without deadline across a cut: %v after %s, want Unavailable after %s", err, d, w.holdFor)
	}
}

func TestWANLossOnGRPCIsRetransmitted(t *testing.T) {
	w := New(7)
	defer w.Close()
	addr := startEcho(t)
	w.Register(addr, "b")
	const rtt = 20 * time.Millisecond
	w.SetRTT("a", "b", rtt, 0)
	w.SetLoss("a", "b", 0.2)
	c := dialEcho(t, w, "a", addr)
	slowest := time.Duration(0)
	for range 10 {
		d, err := unary(c, 10*time.Second)
		if err != nil {
			t.Fatalf("a call on a lossy link failed: %v (loss must show as latency)", err)
		}
		if d < rtt {
			t.Fatalf("a call took %s, below the RTT %s", d, rtt)
		}
		slowest = max(slowest, d)
	}
	// 20 messages at p = 0.2 (and the first call's 2): all getting
	// through the first time has probability 0.7 %, and the seed fixes
	// the draws (the calls are made one after the other).
	if slowest < rtt+MinRTO {
		t.Errorf("the slowest of 10 calls at 20%% loss took %s, want one retransmission at least (%s)", slowest, rtt+MinRTO)
	}
	t.Logf("slowest of 10 calls at 20%% loss, RTT %s: %s", rtt, slowest)

	w.SetLoss("a", "b", 1) // a black hole between a and b only
	if _, err := unary(c, 200*time.Millisecond); status.Code(err) != codes.Unavailable {
		t.Fatalf("call at loss 1: %v, want Unavailable", err)
	}
}

// seq and unseq put a sequence number in a payload.
func seq(i int) *testpb.Payload {
	return &testpb.Payload{Body: binary.BigEndian.AppendUint32(nil, uint32(i))}
}

func unseq(p *testpb.Payload) int { return int(binary.BigEndian.Uint32(p.GetBody())) }

func TestWANStreamKeepsOrderUnderJitter(t *testing.T) {
	w := New(3)
	defer w.Close()
	addr := startEcho(t)
	w.Register(addr, "b")
	const rtt, jitter = 60 * time.Millisecond, 40 * time.Millisecond
	w.SetRTT("a", "b", rtt, jitter)
	c := dialEcho(t, w, "a", addr)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One round trip on the stream takes the RTT.
	start := time.Now()
	if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: seq(0)}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || unseq(r.Payload) != 0 {
		t.Fatalf("Recv: %v, %v", r, err)
	}
	if d := time.Since(start); d < rtt || d > rtt+2*jitter+slack {
		t.Errorf("a round trip on the stream took %s, want %s..%s", d, rtt, rtt+2*jitter)
	}

	// Many messages at once: in order, and pipelined (not one round trip
	// each, which would take 200 × 60 ms).
	const n = 200
	w.Reset()
	start = time.Now()
	go func() {
		for i := 1; i <= n; i++ {
			if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: seq(i)}); err != nil {
				return // Recv reports it
			}
		}
		st.CloseSend()
	}()
	for i := 1; i <= n; i++ {
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if got := unseq(r.Payload); got != i {
			t.Fatalf("message %d came as number %d: the stream reordered", got, i)
		}
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream's end: %v, want io.EOF", err)
	}
	d := time.Since(start)
	if d < rtt || d > 2*time.Second {
		t.Errorf("%d messages each way took %s, want %s.. about %s (pipelined)", n, d, rtt, rtt+2*jitter)
	}
	t.Logf("%d messages each way on one stream, RTT %s jitter %s: %s", n, rtt, jitter, d)
	if ab, ba := w.Messages("a", "b"), w.Messages("b", "a"); ab != n || ba != n {
		t.Errorf("Messages a→b %d, b→a %d: want %d each", ab, ba, n)
	}
}

func TestWANStreamCutFailsUnavailable(t *testing.T) {
	w := New(1)
	defer w.Close()
	addr := startEcho(t)
	w.Register(addr, "b")
	w.SetRTT("a", "b", 20*time.Millisecond, 0)
	c := dialEcho(t, w, "a", addr)

	// With a deadline: held until it, then Unavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.Cut("b")
	start := time.Now()
	if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: seq(1)}); err != nil {
		t.Fatalf("Send only queues: %v", err)
	}
	_, err = st.Recv()
	if d := time.Since(start); status.Code(err) != codes.Unavailable || d > 300*time.Millisecond+slack {
		t.Fatalf("Recv on a stream cut off: %v after %s, want Unavailable at the deadline", err, d)
	}
	if err := st.Send(&testpb.StreamingOutputCallRequest{}); status.Code(err) != codes.Unavailable && !errors.Is(err, io.EOF) {
		t.Fatalf("Send after the stream was cut off: %v, want Unavailable or io.EOF", err)
	}

	// Without a deadline: a message held for Hold ends the stream.
	w.holdFor = 200 * time.Millisecond
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	st2, err := c.FullDuplexCall(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := st2.Send(&testpb.StreamingOutputCallRequest{Payload: seq(1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Recv on a stream without deadline cut off: %v after %s, want Unavailable", err, time.Since(start))
	}
	if d := time.Since(start); d < w.holdFor {
		t.Errorf("the stream failed after %s, before Hold (%s)", d, w.holdFor)
	}

	// Healed: a new stream works.
	w.Heal("b")
	st3, err := c.FullDuplexCall(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st3.Send(&testpb.StreamingOutputCallRequest{Payload: seq(3)}); err != nil {
		t.Fatal(err)
	}
	if r, err := st3.Recv(); err != nil || unseq(r.Payload) != 3 {
		t.Fatalf("after Heal: %v, %v", r, err)
	}
	st3.CloseSend()
	if _, err := st3.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
}

func TestTargetAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:80":                 "127.0.0.1:80",
		"dns:///127.0.0.1:80":          "127.0.0.1:80",
		"dns://8.8.8.8/example.com:80": "example.com:80",
		"passthrough:///[::1]:80":      "[::1]:80",
	} {
		if got := targetAddr(in); got != want {
			t.Errorf("targetAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
