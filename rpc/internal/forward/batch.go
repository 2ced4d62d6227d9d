package forward

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Defaults for BatchConfig.
const (
	DefaultBatchSize = 1000
	DefaultBatchWait = 200 * time.Microsecond
)

// MaxBatch is the most checks one Forward call may carry (the receiver
// refuses more: rpc.MaxBatch, which must be the same).
const MaxBatch = 1000

// BatchConfig shapes the queue of checks forwarded to one owner.
type BatchConfig struct {
	// MaxSize sends a batch as soon as it holds this many checks.
	// Default 1000, at most MaxBatch. (Optional)
	MaxSize int
	// MaxWait sends a batch this long after its first check was queued,
	// however small it is, when calls to the owner are in flight (with
	// none in flight a check goes at once). Default 200 us.
	// (Optional)
	MaxWait time.Duration
}

// WithDefaults returns c with the defaults filled in: MaxSize
// DefaultBatchSize when not positive, MaxBatch when above it; MaxWait
// DefaultBatchWait when not positive.
func (c BatchConfig) WithDefaults() BatchConfig {
	switch {
	case c.MaxSize <= 0:
		c.MaxSize = DefaultBatchSize
	case c.MaxSize > MaxBatch:
		c.MaxSize = MaxBatch
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultBatchWait
	}
	return c
}

// errBatcherStopped fails the checks still queued for a peer that left the
// ring.
var errBatcherStopped = errors.New("peer removed from the ring")

// pending is the checks of one request for one owner, waiting in a batcher
// for their decisions: a lone check, or several that stay together and in
// their order in one batch, so that the owner applies them in the
// request's order.
type pending struct {
	checks   []*sluicev1.RateLimitCheck
	deadline time.Time              // enqueue time + forward timeout: no answer after it
	reply    chan reply             // capacity 1: the batcher never blocks on a caller
	trace    *sluicev1.TraceContext // the sender's span for the checks; nil: untraced
}

// reply answers a pending: one decision per check, in order, or err.
type reply struct {
	ds  []*sluicev1.Decision
	err error
}

// maxCalls bounds the Forward calls in flight to one owner from one
// batcher.
const maxCalls = 8

// batcher queues the checks bound for one owner and sends them as one
// Forward call when MaxSize are queued or MaxWait after the first, whichever
// comes first (the per-peer batching of gubernator's peer_client.go), and
// also at once whenever no call to the owner is in flight (the "group
// commit" idea): under light load a check goes without waiting, under heavy
// load checks gather while a call is in flight and go together when it is
// answered, so batches grow with the load. At most maxCalls calls are in
// flight. Every check has a deadline, its enqueue time plus the forward
// timeout, which bounds its call and its wait in the queue alike: a stalled
// owner never holds a check longer than that.
//
// No goroutine of its own sits between a caller and the owner: the caller
// whose check starts a batch sends it (on the peer's stream, which returns
// once it is written), the stream's receive loop answers each check of a
// response directly, and a batch that gathered meanwhile is sent by one
// long-lived launcher goroutine (so the receive loop never blocks on a
// Send held up by flow control), or by the timer when its wait is over.
type batcher struct {
	p       *Peer
	cfg     BatchConfig
	timeout time.Duration

	mu     sync.Mutex // guards the fields below
	queue  []*pending
	queued int    // checks in queue
	calls  int    // batches taken and not yet answered, at most maxCalls
	due    bool   // the queue's wait is over: send it at the first chance
	gen    uint64 // counts emptied queues: a timer set for an older queue does nothing
	timer  *time.Timer
	closed bool

	launch chan []*pending // batches taken as a call ended; never blocks: it holds maxCalls
	stop   chan struct{}   // closed by close
	once   sync.Once
}

func newBatcher(p *Peer, cfg BatchConfig, timeout time.Duration) *batcher {
	b := &batcher{
		p: p, cfg: cfg, timeout: timeout,
		launch: make(chan []*pending, maxCalls),
		stop:   make(chan struct{}),
	}
	go b.launcher()
	return b
}

// enqueue queues checks (one or more, at most MaxBatch, of one request)
// and returns their pending: the reply arrives on its channel by its
// deadline (or never will: the caller must stop waiting then). The checks
// go in one batch, in their order. When they start a batch that goes at
// once, enqueue sends it before it returns (it does not wait for the
// answer). It fails at once if the batcher has stopped or ctx has ended.
func (b *batcher) enqueue(ctx context.Context, checks ...*sluicev1.RateLimitCheck) (*pending, error) {
	return b.enqueueBy(ctx, time.Time{}, checks...)
}

// enqueueBy is enqueue with a deadline of the caller's (zero: none) that
// the checks' own deadline (now plus the forward timeout) may not pass.
func (b *batcher) enqueueBy(ctx context.Context, by time.Time, checks ...*sluicev1.RateLimitCheck) (*pending, error) {
	return b.enqueueTraced(ctx, by, nil, checks...)
}

// enqueueTraced is enqueueBy with the trace context of the sender's span
// for the checks (nil: untraced), which their batch carries to the owner.
func (b *batcher) enqueueTraced(ctx context.Context, by time.Time, trace *sluicev1.TraceContext, checks ...*sluicev1.RateLimitCheck) (*pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(b.timeout)
	if !by.IsZero() && by.Before(deadline) {
		deadline = by
	}
	p := &pending{checks: checks, deadline: deadline, reply: make(chan reply, 1), trace: trace}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errBatcherStopped
	}
	b.queue = append(b.queue, p)
	b.queued += len(checks)
	batches := b.takeAllLocked()
	if len(b.queue) > 0 && b.timer == nil { // a new queue: its wait starts now
		g := b.gen
		b.timer = time.AfterFunc(b.cfg.MaxWait, func() { b.wake(g) })
	}
	b.mu.Unlock()
	b.send(batches...)
	return p, nil
}

// takeLocked takes the next batch off the queue if one should go now: the
// queue holds MaxSize checks, or no call is in flight, or its wait is over;
// and fewer than maxCalls calls are in flight. A batch is the oldest
// pendings up to MaxSize checks, never splitting one (a pending larger than
// MaxSize goes alone). It counts the batch as a call. Requires mu held.
func (b *batcher) takeLocked() []*pending {
	n := len(b.queue)
	if n == 0 || b.closed || b.calls >= maxCalls || (b.queued < b.cfg.MaxSize && b.calls > 0 && !b.due) {
		return nil
	}
	k, size := 0, 0
	for k < n && (k == 0 || size+len(b.queue[k].checks) <= b.cfg.MaxSize) {
		size += len(b.queue[k].checks)
		k++
	}
	batch := b.queue[:k:k]
	b.queued -= size
	if k == n {
		b.queue, b.due = nil, false
		b.gen++
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
	} else {
		b.queue = b.queue[k:] // what is left keeps its timer, or its due
	}
	b.calls++
	return batch
}

// takeAllLocked takes every batch that should go now (takeLocked until it
// takes none). Requires mu held.
func (b *batcher) takeAllLocked() [][]*pending {
	var out [][]*pending
	for batch := b.takeLocked(); batch != nil; batch = b.takeLocked() {
		out = append(out, batch)
	}
	return out
}

// wake is the timer of the queue of generation g: its wait is over.
func (b *batcher) wake(g uint64) {
	b.mu.Lock()
	if b.gen != g {
		b.mu.Unlock()
		return
	}
	b.due = true
	batches := b.takeAllLocked()
	b.mu.Unlock()
	b.send(batches...)
}

// launcher sends the batches taken as calls ended, until the batcher
// stops; then it fails those it was handed and had not sent.
func (b *batcher) launcher() {
	for {
		select {
		case batch := <-b.launch:
			b.send(batch)
		case <-b.stop:
			for {
				select {
				case batch := <-b.launch:
					for _, p := range batch {
						p.reply <- reply{err: errBatcherStopped}
					}
				default:
					return
				}
			}
		}
	}
}

// close stops the batcher: queued checks are failed with
// errBatcherStopped, and so are batches handed to the launcher and not yet
// sent; calls in flight finish on their own. It is idempotent and waits
// for neither the calls in flight nor the launcher (which may be in a Send
// that flow control holds until the stream fails).
func (b *batcher) close() {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		q := b.queue
		b.queue, b.queued = nil, 0
		b.gen++
		if b.timer != nil {
			b.timer.Stop()
		}
		b.mu.Unlock()
		for _, p := range q {
			p.reply <- reply{err: errBatcherStopped}
		}
		close(b.stop)
	})
}

// errQueueDeadline fails the checks of a batch whose deadline passed before
// it could be sent.
var errQueueDeadline = status.Error(codes.DeadlineExceeded, "forward timeout passed while the check was queued")

// send starts the Forward call of each batch, bounded by its first
// (earliest) check's deadline; the call's end answers each check and
// launches what gathered meanwhile. A batch whose deadline has passed fails
// at once, and what can go in its place is sent too.
func (b *batcher) send(batches ...[]*pending) {
	for len(batches) > 0 {
		batch := batches[0]
		batches = batches[1:]
		deadline := batch[0].deadline
		for _, p := range batch[1:] {
			if p.deadline.Before(deadline) {
				deadline = p.deadline // callers' deadlines may cut theirs short
			}
		}
		if time.Until(deadline) <= 0 {
			b.p.stats.errors.Add(1)
			batches = append(batches, b.answer(batch, nil, fmt.Errorf("owner %s unavailable: %w", b.p.name, errQueueDeadline), false)...)
			continue
		}
		n := 0
		for _, p := range batch {
			n += len(p.checks)
		}
		checks := make([]*sluicev1.RateLimitCheck, 0, n)
		for _, p := range batch {
			checks = append(checks, p.checks...)
		}
		req := b.p.request(nil, checks, deadline)
		req.Traces = traces(batch)
		startCall(b.p, deadline, req, func(ds []*sluicev1.Decision, err error) { b.answer(batch, ds, err, true) })
	}
}

// traces returns the trace contexts of a batch's checks, one run per
// pending, in order: the pending's own (its checks field set to its
// checks), or an empty run for an untraced one; nil when no pending is
// traced (the batch carries none).
func traces(batch []*pending) []*sluicev1.TraceContext {
	if !slices.ContainsFunc(batch, func(p *pending) bool { return p.trace != nil }) {
		return nil
	}
	out := make([]*sluicev1.TraceContext, len(batch))
	for i, p := range batch {
		t := p.trace
		if t == nil {
			t = &sluicev1.TraceContext{}
		}
		t.Checks = uint32(len(p.checks))
		out[i] = t
	}
	return out
}

// answer hands each check of an ended call its decision (or err), and takes
// the batches to send next, if any: it returns them, or with launch hands
// them to the launcher (under mu, so that close, which stops the launcher,
// sees every batch handed to it).
func (b *batcher) answer(batch []*pending, ds []*sluicev1.Decision, err error, launch bool) [][]*pending {
	for _, p := range batch {
		if err != nil {
			p.reply <- reply{err: err}
			continue
		}
		n := len(p.checks)
		p.reply <- reply{ds: ds[:n:n]}
		ds = ds[n:]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls--
	next := b.takeAllLocked()
	if !launch {
		return next
	}
	for _, batch := range next {
		b.launch <- batch // at most maxCalls batches are out: never blocks
	}
	return nil
}

// startCall starts one Forward call of req to p over its stream, bounded
// by deadline, and calls done exactly once with the call's decisions (one
// per check) or its error (see endCall, which counts the call). It returns
// once the request is written.
func startCall(p *Peer, deadline time.Time, req *sluicev1.ForwardRequest, done func([]*sluicev1.Decision, error)) {
	start := time.Now()
	p.tr.start(deadline, req, func(resp *sluicev1.ForwardResponse, err error) {
		done(p.endCall(req, resp, err, time.Since(start)))
	})
}
