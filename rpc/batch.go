package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

func (c BatchConfig) withDefaults() BatchConfig {
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

// pending is one check waiting in a batcher for its decision.
type pending struct {
	check    *sluicev1.RateLimitCheck
	deadline time.Time  // enqueue time + forward timeout: no answer after it
	reply    chan reply // capacity 1: the batcher never blocks on a caller
}

type reply struct {
	d   *sluicev1.Decision
	err error
}

// peerStats counts one peer's forwards; read them through Server.Stats.
type peerStats struct {
	batches, checks, errors, latencyNs atomic.Int64
	obs                                Observer // told of each call; may be nil
}

// senders is the number of long-lived goroutines per peer that make the
// Forward calls: reused, so a call does not grow a fresh goroutine's stack.
const senders = 8

// batcher queues the checks bound for one owner and sends them as one
// Forward call when MaxSize are queued or MaxWait after the first, whichever
// comes first (the per-peer batching of gubernator's peer_client.go), and
// also at once whenever no call to the owner is in flight (the "group
// commit" idea): under light load a check goes without waiting, under heavy
// load checks gather while calls are in flight, so batches grow with the
// load. Calls are made by a few long-lived sender goroutines. Every check
// has a deadline, its enqueue time plus the forward timeout, which bounds
// its call and its wait in the queue alike: a stalled owner never holds a
// check longer than that.
type batcher struct {
	p       *peer
	cfg     BatchConfig
	timeout time.Duration
	sender  string
	stats   *peerStats

	in   chan *pending
	out  chan []*pending // batches for the senders
	sent chan struct{}   // a send finished; room for every batch in flight
	stop chan struct{}   // closed by close
	done chan struct{}   // closed when run has returned
	once sync.Once
}

func newBatcher(p *peer, cfg BatchConfig, timeout time.Duration, sender string, stats *peerStats) *batcher {
	b := &batcher{
		p: p, cfg: cfg, timeout: timeout, sender: sender, stats: stats,
		in:   make(chan *pending, 4*cfg.MaxSize),
		out:  make(chan []*pending, senders),
		sent: make(chan struct{}, 2*senders), // cap(out) + senders: a sender never blocks on it
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go b.run()
	for range senders {
		go b.sendLoop()
	}
	return b
}

// enqueue queues a check and returns the channel its reply arrives on and
// the time by which it will have arrived (or never will: the caller must
// stop waiting then). It fails at once if the batcher has stopped, or when
// ctx ends while the queue is full.
func (b *batcher) enqueue(ctx context.Context, c *sluicev1.RateLimitCheck) (*pending, error) {
	p := &pending{check: c, deadline: time.Now().Add(b.timeout), reply: make(chan reply, 1)}
	select {
	case <-b.stop:
		return nil, errBatcherStopped
	default:
	}
	select {
	case b.in <- p:
		return p, nil
	case <-b.stop:
		return nil, errBatcherStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close stops the batcher: queued checks are failed with
// errBatcherStopped; calls in flight finish on their own. It is
// idempotent and does not wait for calls in flight.
func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	<-b.done
}

func (b *batcher) run() {
	defer close(b.done)
	var (
		batch    []*pending
		inflight int  // batches handed to senders and not yet sent
		due      bool // the batch's wait is over but every sender was busy
	)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// flush hands the batch to a sender. When every sender is busy it
	// keeps gathering (the next finished send flushes), unless the batch
	// is full: then it waits for a sender, still counting finished sends,
	// which holds back new checks until one is free.
	flush := func() {
		if len(batch) == 0 {
			return
		}
		for handed := false; !handed; {
			if len(batch) < b.cfg.MaxSize {
				select {
				case b.out <- batch:
					handed = true
				default:
					return
				}
				continue
			}
			select {
			case b.out <- batch:
				handed = true
			case <-b.sent:
				inflight--
			case <-b.stop:
				return // the stop case fails the batch
			}
		}
		timer.Stop()
		inflight++
		batch, due = nil, false
	}
	for {
		select {
		case p := <-b.in:
			batch = append(batch, p)
			if len(batch) == 1 {
				timer.Reset(b.cfg.MaxWait)
			}
			if len(batch) >= b.cfg.MaxSize || inflight == 0 {
				flush()
			}
		case <-b.sent:
			inflight--
			if inflight == 0 || due {
				flush() // the line to the owner is free, or the batch is overdue
			}
		case <-timer.C:
			due = true
			flush()
		case <-b.stop:
			timer.Stop()
			for {
				select {
				case p := <-b.in:
					batch = append(batch, p)
				default:
					for _, p := range batch {
						p.reply <- reply{err: errBatcherStopped}
					}
					return
				}
			}
		}
	}
}

// sendLoop makes the Forward calls for the batches run hands it, until the
// batcher stops; then it fails the batches it was handed and had not sent.
func (b *batcher) sendLoop() {
	for {
		select {
		case batch := <-b.out:
			b.send(batch)
			select {
			case b.sent <- struct{}{}:
			case <-b.done:
			}
		case <-b.done:
			for {
				select {
				case batch := <-b.out:
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

// errQueueDeadline fails the checks of a batch whose deadline passed before
// a sender was free to send it.
var errQueueDeadline = status.Error(codes.DeadlineExceeded, "forward timeout passed while the check was queued")

// send forwards one batch, bounded by its first (earliest) check's
// deadline, and hands each check its reply.
func (b *batcher) send(batch []*pending) {
	deadline := batch[0].deadline
	var (
		ds  []*sluicev1.Decision
		err error
	)
	if time.Until(deadline) <= 0 {
		b.stats.errors.Add(1)
		err = fmt.Errorf("owner %s unavailable: %w", b.p.name, errQueueDeadline)
	} else {
		req := &sluicev1.ForwardRequest{Sender: b.sender, Checks: make([]*sluicev1.RateLimitCheck, len(batch))}
		for i, p := range batch {
			req.Checks[i] = p.check
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		ds, err = forwardCall(ctx, b.p, req, b.stats)
		cancel()
	}
	for i, p := range batch {
		if err != nil {
			p.reply <- reply{err: err}
		} else {
			p.reply <- reply{d: ds[i]}
		}
	}
}

// forwardCall makes one Forward call to p, bounded by ctx, counts it, and
// checks that the answer has one decision per check.
func forwardCall(ctx context.Context, p *peer, req *sluicev1.ForwardRequest, st *peerStats) ([]*sluicev1.Decision, error) {
	start := time.Now()
	var (
		resp *sluicev1.ForwardResponse
		err  error
	)
	if p.stream != nil {
		resp, err = p.stream.call(ctx, req)
	} else {
		resp, err = p.client.Forward(ctx, req)
	}
	took := time.Since(start)
	st.batches.Add(1)
	st.checks.Add(int64(len(req.Checks)))
	st.latencyNs.Add(int64(took))
	if st.obs != nil {
		st.obs.Forwarded(p.name, len(req.Checks), took, err)
	}
	switch {
	case err != nil:
		st.errors.Add(1)
		// Clients see the owner's name and the gRPC code only: the
		// underlying error names internal addresses.
		return nil, fmt.Errorf("owner %s unavailable: %w", p.name, status.Error(status.Code(err), status.Code(err).String()))
	case len(resp.Decisions) != len(req.Checks):
		st.errors.Add(1)
		return nil, fmt.Errorf("owner %s answered %d decisions for %d checks", p.name, len(resp.Decisions), len(req.Checks))
	}
	return resp.Decisions, nil
}
