package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	// however small it is: the most a lone check waits. Default 200 us.
	// (Optional)
	MaxWait time.Duration
}

func (c BatchConfig) withDefaults() BatchConfig {
	if c.MaxSize <= 0 || c.MaxSize > MaxBatch {
		c.MaxSize = min(max(c.MaxSize, DefaultBatchSize), MaxBatch)
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
	check *sluicev1.RateLimitCheck
	reply chan reply // capacity 1: the batcher never blocks on a caller
}

type reply struct {
	d   *sluicev1.Decision
	err error
}

// peerStats counts one peer's forwards; read them through Server.Stats.
type peerStats struct {
	batches, checks, errors, latencyNs atomic.Int64
}

// batcher queues the checks bound for one owner and sends them as one
// Forward call when MaxSize are queued or MaxWait after the first, whichever
// comes first (the per-peer batching of gubernator's peer_client.go), and
// also at once whenever no call to the owner is in flight (the "group
// commit" idea): under light load a check goes without waiting, under heavy
// load checks gather while calls are in flight, so batches grow with the
// load. Each batch is sent by a goroutine of its own, bounded by the
// forward timeout, so a slow owner never stalls the queue, and every
// queued check gets a reply: a decision, or the error that failed its
// batch.
type batcher struct {
	p       *peer
	cfg     BatchConfig
	timeout time.Duration
	sender  string
	stats   *peerStats

	in       chan *pending
	out      chan []*pending // batches for the senders
	sent     chan struct{}   // a send finished
	inflight int             // batches handed to senders and not yet sent; owned by run
	stop     chan struct{}   // closed by close
	done     chan struct{}   // closed when run has returned
	// mu makes enqueue and close exclusive, so nothing is queued after run
	// drained the queue; closed is guarded by mu.
	mu     sync.RWMutex
	closed bool
}

func newBatcher(p *peer, cfg BatchConfig, timeout time.Duration, sender string, stats *peerStats) *batcher {
	b := &batcher{
		p: p, cfg: cfg, timeout: timeout, sender: sender, stats: stats,
		in:   make(chan *pending, 4*cfg.MaxSize),
		out:  make(chan []*pending, senders),
		sent: make(chan struct{}, senders),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go b.run()
	for range senders {
		go b.sendLoop()
	}
	return b
}

// senders is the number of long-lived goroutines per peer that make the
// Forward calls: reused, so a call does not grow a fresh goroutine's stack.
const senders = 8

// sendLoop makes Forward calls for the batches run hands it, until close.
func (b *batcher) sendLoop() {
	for {
		select {
		case batch := <-b.out:
			b.send(batch)
			select {
			case b.sent <- struct{}{}:
			case <-b.done: // run has returned: nobody counts any more
			}
		case <-b.done:
			// Batches handed over but not sent yet fail like queued ones.
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

// enqueue queues a check and returns the channel its reply arrives on. It
// returns an error at once if the batcher has stopped.
func (b *batcher) enqueue(c *sluicev1.RateLimitCheck) (<-chan reply, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, errBatcherStopped
	}
	p := &pending{check: c, reply: make(chan reply, 1)}
	b.in <- p // run keeps draining until close, which waits for us
	return p.reply, nil
}

// close stops the batcher: queued checks are failed with
// errBatcherStopped; batches in flight finish on their own. It is
// idempotent.
func (b *batcher) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
	b.mu.Unlock()
	<-b.done
}

func (b *batcher) run() {
	defer close(b.done)
	var batch []*pending
	due := false // the batch's wait is over but every sender was busy
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// flush hands the batch to a sender. When every sender is busy it
	// keeps gathering (the next finished send flushes), unless the batch
	// is full: then it waits for a sender, which holds back new checks.
	flush := func() {
		if len(batch) == 0 {
			return
		}
		if len(batch) >= b.cfg.MaxSize {
			select {
			case b.out <- batch:
			case <-b.stop:
				return // run's stop case fails the batch
			}
		} else {
			select {
			case b.out <- batch:
			default:
				return
			}
		}
		timer.Stop()
		b.inflight++
		batch, due = nil, false
	}
	for {
		select {
		case p := <-b.in:
			batch = append(batch, p)
			if len(batch) == 1 {
				timer.Reset(b.cfg.MaxWait)
			}
			if len(batch) >= b.cfg.MaxSize || b.inflight == 0 {
				flush()
			}
		case <-b.sent:
			b.inflight--
			if b.inflight == 0 || due {
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

// send forwards one batch and hands each check its reply.
func (b *batcher) send(batch []*pending) {
	req := &sluicev1.ForwardRequest{Sender: b.sender, Checks: make([]*sluicev1.RateLimitCheck, len(batch))}
	for i, p := range batch {
		req.Checks[i] = p.check
	}
	ds, err := forwardCall(context.Background(), b.p, req, b.timeout, b.stats)
	for i, p := range batch {
		if err != nil {
			p.reply <- reply{err: err}
		} else {
			p.reply <- reply{d: ds[i]}
		}
	}
}

// forwardCall makes one Forward call to p, bounded by timeout, counts it,
// and checks that the answer has one decision per check.
func forwardCall(ctx context.Context, p *peer, req *sluicev1.ForwardRequest, timeout time.Duration, st *peerStats) ([]*sluicev1.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	resp, err := p.client.Forward(ctx, req)
	st.batches.Add(1)
	st.checks.Add(int64(len(req.Checks)))
	st.latencyNs.Add(int64(time.Since(start)))
	switch {
	case err != nil:
		st.errors.Add(1)
		return nil, fmt.Errorf("owner %s (%s) unavailable: %w", p.name, p.addr, err)
	case len(resp.Decisions) != len(req.Checks):
		st.errors.Add(1)
		return nil, fmt.Errorf("owner %s answered %d decisions for %d checks", p.name, len(resp.Decisions), len(req.Checks))
	}
	return resp.Decisions, nil
}
