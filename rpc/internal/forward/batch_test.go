package forward

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// fakePeer is a PeerServiceClient that records each Forward call's batch
// size and answers each check with a decision naming its key (so a caller
// can tell its own answer), after delay; block makes it wait for the
// call's context instead.
type fakePeer struct {
	sluicev1.PeerServiceClient // nil: the hand-off and replica calls are not used

	mu      sync.Mutex
	batches []int
	reqs    []*sluicev1.ForwardRequest
	at      []time.Time // when each call started
	delay   time.Duration
	block   bool
	err     error // each call's, when set
}

func (f *fakePeer) Forward(ctx context.Context, in *sluicev1.ForwardRequest, _ ...grpc.CallOption) (*sluicev1.ForwardResponse, error) {
	f.mu.Lock()
	f.batches = append(f.batches, len(in.Checks))
	f.reqs = append(f.reqs, in)
	f.at = append(f.at, time.Now())
	f.mu.Unlock()
	if f.block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if f.err != nil {
		return nil, f.err
	}
	out := &sluicev1.ForwardResponse{}
	for _, c := range in.Checks {
		out.Decisions = append(out.Decisions, &sluicev1.Decision{Allowed: true, Owner: c.Key})
	}
	return out, nil
}

func (f *fakePeer) ForwardStream(context.Context, ...grpc.CallOption) (sluicev1.PeerService_ForwardStreamClient, error) {
	return nil, status.Error(codes.Unimplemented, "the fake peer has no stream")
}

func (f *fakePeer) sizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.batches...)
}

func (f *fakePeer) requests() []*sluicev1.ForwardRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*sluicev1.ForwardRequest(nil), f.reqs...)
}

// unaryTransport makes each Forward call of a peer a unary call of
// client: each batch in a goroutine of its own.
type unaryTransport struct{ client sluicev1.PeerServiceClient }

func (u unaryTransport) start(deadline time.Time, req *sluicev1.ForwardRequest, done func(*sluicev1.ForwardResponse, error)) {
	go func() {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		resp, err := u.client.Forward(ctx, req)
		cancel()
		done(resp, err)
	}()
}

func (u unaryTransport) call(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	return u.client.Forward(ctx, req)
}

func (unaryTransport) close() {}

// newFakePeer returns a Peer whose calls, batched or not, are unary calls
// of f.
func newFakePeer(f *fakePeer, cfg Config) *Peer {
	return newPeer("fake", "fake:1", cfg, nil, f, unaryTransport{f})
}

func newTestBatcher(f *fakePeer, cfg BatchConfig, timeout time.Duration) *batcher {
	return newFakePeer(f, Config{Sender: "test", Timeout: timeout, Batch: cfg}).batcher
}

// enq queues c with no deadline of the caller's and returns its reply channel.
func enq(b *batcher, c *sluicev1.RateLimitCheck) (<-chan reply, error) {
	q, err := b.enqueue(context.Background(), c)
	if err != nil {
		return nil, err
	}
	return q.reply, nil
}

func waitReply(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
		return reply{}
	}
}

// Many callers at once: every caller gets the answer to its own check, in
// batches no larger than MaxSize.
func TestBatcherAnswersInOrderUnderConcurrency(t *testing.T) {
	f := &fakePeer{}
	b := newTestBatcher(f, BatchConfig{MaxSize: 64, MaxWait: time.Millisecond}, time.Second)
	defer b.close()
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for g := 0; g < 50; g++ {
		wg.Go(func() {
			var chans []<-chan reply
			for i := 0; i < 40; i++ {
				ch, err := enq(b, &sluicev1.RateLimitCheck{Key: fmt.Sprintf("%d/%d", g, i)})
				if err != nil {
					errs <- err
					return
				}
				chans = append(chans, ch)
			}
			for i, ch := range chans {
				r := waitReply(t, ch)
				if want := fmt.Sprintf("%d/%d", g, i); r.err != nil || r.ds[0].Owner != want {
					errs <- fmt.Errorf("caller %d check %d: got %+v, want the answer for %s", g, i, r, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, n := range f.sizes() {
		if n < 1 || n > 64 {
			t.Fatalf("a batch of %d checks (max 64)", n)
		}
		total += n
	}
	if total != 2000 {
		t.Fatalf("%d checks forwarded, want 2000", total)
	}
	if st := b.p.stats; st.checks.Load() != 2000 || st.batches.Load() != int64(len(f.sizes())) {
		t.Fatalf("stats: %d checks in %d batches", st.checks.Load(), st.batches.Load())
	}
}

// A full batch goes at once, without waiting for MaxWait; what is left
// waits for the timer (or for the call in flight to end).
func TestBatcherSplitsBySize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: 2 * time.Hour}
		b := newTestBatcher(f, BatchConfig{MaxSize: 10, MaxWait: time.Hour}, 3*time.Hour)
		defer b.close()
		first, _ := enq(b, &sluicev1.RateLimitCheck{Key: "first"})
		synctest.Wait() // nothing in flight: the first check goes alone, at once
		var chans []<-chan reply
		for i := 0; i < 25; i++ {
			ch, _ := enq(b, &sluicev1.RateLimitCheck{Key: fmt.Sprint(i)})
			chans = append(chans, ch)
		}
		synctest.Wait()
		if got := f.sizes(); len(got) != 3 || got[0] != 1 || got[1] != 10 || got[2] != 10 {
			t.Fatalf("batches before the wait: %v, want [1 10 10]", got)
		}
		time.Sleep(time.Hour) // fake time: the timer of the 5 left fires
		synctest.Wait()
		if got := f.sizes(); len(got) != 4 || got[3] != 5 {
			t.Fatalf("batches after the wait: %v, want [1 10 10 5]", got)
		}
		if r := <-first; r.err != nil || r.ds[0].Owner != "first" {
			t.Fatalf("first: %+v", r)
		}
		for i, ch := range chans {
			if r := <-ch; r.err != nil || r.ds[0].Owner != fmt.Sprint(i) {
				t.Fatalf("check %d: %+v", i, r)
			}
		}
	})
}

// A request's several checks for one owner stay together, in order, in
// one batch: a batch takes whole groups up to MaxSize checks, and a group
// larger than MaxSize goes alone. Once MaxSize checks are queued they go
// without waiting, even behind calls in flight.
func TestBatcherKeepsGroupsWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: 2 * time.Hour}
		b := newTestBatcher(f, BatchConfig{MaxSize: 10, MaxWait: time.Hour}, 5*time.Hour)
		defer b.close()
		var qs []*pending
		enqGroup := func(name string, n int) {
			var cs []*sluicev1.RateLimitCheck
			for i := range n {
				cs = append(cs, &sluicev1.RateLimitCheck{Key: fmt.Sprintf("%s%d", name, i)})
			}
			q, err := b.enqueue(context.Background(), cs...)
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, q)
			synctest.Wait()
		}
		sizes := func() []int {
			got := f.sizes()
			slices.Sort(got)
			return got
		}
		enqGroup("first", 1) // nothing in flight: it goes at once
		enqGroup("a", 4)
		enqGroup("b", 4)
		enqGroup("c", 4) // 12 queued: a and b go (8), c would make 12
		if got := sizes(); !slices.Equal(got, []int{1, 8}) {
			t.Fatalf("batches before the wait: %v, want [1 8]", got)
		}
		time.Sleep(time.Hour) // c's wait is over
		synctest.Wait()
		if got := sizes(); !slices.Equal(got, []int{1, 4, 8}) {
			t.Fatalf("batches after the wait: %v, want [1 4 8]", got)
		}
		enqGroup("d", 4)
		enqGroup("big", 15) // 19 queued: d alone, then big alone
		if got := sizes(); !slices.Equal(got, []int{1, 4, 4, 8, 15}) {
			t.Fatalf("batches with a group over MaxSize: %v, want [1 4 4 8 15]", got)
		}
		for j, q := range qs {
			r := <-q.reply
			if r.err != nil || len(r.ds) != len(q.checks) {
				t.Fatalf("group %d: %+v", j, r)
			}
			for i, d := range r.ds {
				if d.Owner != q.checks[i].Key {
					t.Fatalf("group %d check %d: answer for %s, want %s", j, i, d.Owner, q.checks[i].Key)
				}
			}
		}
	})
}

// A lone check goes at once when no call to the owner is in flight; one
// queued behind a call in flight goes MaxWait after it was queued, not
// later.
func TestBatcherLoneCheckWaitsAtMostMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: time.Second}
		b := newTestBatcher(f, BatchConfig{MaxWait: 200 * time.Microsecond}, 10*time.Second)
		defer b.close()
		start := time.Now()
		c1, _ := enq(b, &sluicev1.RateLimitCheck{Key: "one"})
		synctest.Wait()
		c2, _ := enq(b, &sluicev1.RateLimitCheck{Key: "two"})
		r1, r2 := <-c1, <-c2
		if r1.err != nil || r1.ds[0].Owner != "one" || r2.err != nil || r2.ds[0].Owner != "two" {
			t.Fatalf("replies %+v %+v", r1, r2)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.at) != 2 || f.at[0] != start || f.at[1] != start.Add(200*time.Microsecond) {
			t.Fatalf("calls started at %v (start %v): want at once, then after the 200us wait", f.at, start)
		}
	})
}

// Group commit: checks queued while a call is in flight go together as
// soon as it ends (sent by the launcher), not when their wait is over.
func TestBatcherSendsWhatGatheredWhenTheCallEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: time.Second}
		b := newTestBatcher(f, BatchConfig{MaxWait: time.Hour}, 3*time.Hour)
		defer b.close()
		start := time.Now()
		var chans []<-chan reply
		for i := range 6 {
			ch, _ := enq(b, &sluicev1.RateLimitCheck{Key: fmt.Sprint(i)})
			chans = append(chans, ch)
			synctest.Wait()
		}
		for i, ch := range chans {
			if r := <-ch; r.err != nil || r.ds[0].Owner != fmt.Sprint(i) {
				t.Fatalf("check %d: %+v", i, r)
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.batches) != 2 || f.batches[0] != 1 || f.batches[1] != 5 {
			t.Fatalf("batches %v, want [1 5]", f.batches)
		}
		if f.at[1] != start.Add(time.Second) {
			t.Fatalf("second call at %v, want when the first ended (%v)", f.at[1].Sub(start), time.Second)
		}
	})
}

// A peer that never answers fails its waiting checks once the forward
// timeout passes, and the queue keeps working for later checks.
func TestBatcherDeadPeerFailsWithinTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{block: true}
		b := newTestBatcher(f, BatchConfig{MaxWait: time.Millisecond}, 2*time.Second)
		defer b.close()
		start := time.Now()
		var chans []<-chan reply
		for i := 0; i < 5; i++ {
			ch, _ := enq(b, &sluicev1.RateLimitCheck{Key: fmt.Sprint(i)})
			chans = append(chans, ch)
		}
		for i, ch := range chans {
			r := <-ch
			if status.Code(errors.Unwrap(r.err)) != codes.DeadlineExceeded {
				t.Fatalf("check %d: %v, want DeadlineExceeded", i, r.err)
			}
		}
		// The first check went at once, the other four after the 1ms wait;
		// all five were queued at start, and each gives up 2s after that.
		if waited := time.Since(start); waited != 2*time.Second {
			t.Fatalf("failed after %s, want the 2s timeout from when they were queued", waited)
		}
		if st := b.p.stats; st.errors.Load() != 2 || st.checks.Load() != 5 {
			t.Fatalf("%d errors, %d checks counted; want 2 failed calls carrying 5 checks", st.errors.Load(), st.checks.Load())
		}
	})
}

// fanOut queues n checks (keys "0".."n-1") from n goroutines at once and
// calls verify with each key's index and reply, then waits for all.
func fanOut(t *testing.T, b *batcher, n int, verify func(g int, r reply)) {
	var wg sync.WaitGroup
	for g := 0; g < n; g++ {
		wg.Go(func() {
			ch, err := enq(b, &sluicev1.RateLimitCheck{Key: fmt.Sprint(g)})
			if err != nil {
				t.Error(err)
				return
			}
			verify(g, <-ch)
		})
	}
	wg.Wait()
}

// Batches of one, many callers, a slow owner: every sender busy and the
// hand-off full at once must not deadlock; every check is answered.
func TestBatcherNoDeadlockWhenSendersAreBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: 10 * time.Millisecond}
		b := newTestBatcher(f, BatchConfig{MaxSize: 1, MaxWait: time.Millisecond}, time.Hour)
		defer b.close()
		fanOut(t, b, 200, func(g int, r reply) {
			if r.err != nil || r.ds[0].Owner != fmt.Sprint(g) {
				t.Errorf("check %d: %+v", g, r)
			}
		})
		if n := len(f.sizes()); n != 200 {
			t.Fatalf("%d calls for 200 checks in batches of one", n)
		}
	})
}

// A stalled owner with many batches queued behind its busy senders: every
// check still fails by its own deadline (enqueue + forward timeout), not a
// multiple of it.
func TestBatcherStalledOwnerBoundsEveryWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{block: true}
		b := newTestBatcher(f, BatchConfig{MaxSize: 1, MaxWait: time.Millisecond}, 2*time.Second)
		defer b.close()
		start := time.Now()
		fanOut(t, b, 100, func(g int, r reply) {
			if status.Code(errors.Unwrap(r.err)) != codes.DeadlineExceeded {
				t.Errorf("check %d: %v, want DeadlineExceeded", g, r.err)
			}
			if waited := time.Since(start); waited > 2*time.Second {
				t.Errorf("check %d answered after %s, over the 2s forward timeout", g, waited)
			}
		})
	})
}

// Closing a batcher fails what is queued and refuses new checks; a call in
// flight finishes on its own.
func TestBatcherClose(t *testing.T) {
	f := &fakePeer{block: true}
	b := newTestBatcher(f, BatchConfig{MaxWait: time.Hour}, 100*time.Millisecond)
	inFlight, _ := enq(b, &sluicev1.RateLimitCheck{Key: "in flight"})
	for len(f.sizes()) == 0 { // the first check goes at once
		time.Sleep(time.Millisecond)
	}
	queued, err := enq(b, &sluicev1.RateLimitCheck{Key: "queued"})
	if err != nil {
		t.Fatal(err)
	}
	b.close()
	if r := waitReply(t, queued); !errors.Is(r.err, errBatcherStopped) {
		t.Fatalf("queued check: %+v, want errBatcherStopped", r)
	}
	if _, err := enq(b, &sluicev1.RateLimitCheck{Key: "late"}); !errors.Is(err, errBatcherStopped) {
		t.Fatalf("enqueue after close: %v", err)
	}
	if r := waitReply(t, inFlight); status.Code(errors.Unwrap(r.err)) != codes.DeadlineExceeded {
		t.Fatalf("the call in flight: %+v, want its own timeout", r)
	}
}
