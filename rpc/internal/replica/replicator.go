package replica

import (
	"context"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// View gives the Replicator the node's routing state at one moment.
type View interface {
	// Current returns the node's current ring and a Sender to the members
	// of that same ring, or false when the node sends no copies now (it
	// is leaving: it hands its keys off itself).
	Current() (r *ring.Ring, to Sender, ok bool)
}

// Sender sends copies to a member.
type Sender interface {
	// Replicate sends req to member, and returns once member has stored
	// the copies, or with the error that kept them from it (e.g. no
	// connection to member). It must not keep req, nor anything req
	// holds, after it returns: the Replicator reuses their memory.
	Replicate(ctx context.Context, member string, req *sluicev1.ReplicateRequest) error
}

// States reads this node's windows; a *window.Store is one.
type States interface {
	// All yields every key that holds state (the states are not used).
	All() iter.Seq2[string, window.State]
	// Get returns key's state.
	Get(key string) (window.State, bool)
	// Now is the windows' clock.
	Now() time.Time
}

// Counters counts the copies the Replicator sends.
type Counters interface {
	// Replicated counts n copies a member stored.
	Replicated(n int)
	// Behind counts n copies a send failed to deliver (sent again next
	// interval).
	Behind(n int)
}

// ReplicatorConfig is what a Replicator works with.
type ReplicatorConfig struct {
	// Self is this node's member name.
	Self string
	// Instance returns this node's gossiped instance id ("" if unknown),
	// sent with each request.
	Instance func() string
	// Replication gives the number of copies (Factor: the members after
	// Self on the ring) and how often they are sent (Interval); it is used
	// as given (see [Config.WithDefaults]).
	Replication Config
	// Batch is the most states one request carries.
	Batch int
	// Timeout bounds one request.
	Timeout time.Duration

	// View gives the ring each tick works on and the Sender to its
	// members.
	View View
	// States are this node's windows, read for the states to send.
	States States
	// Counters counts what is sent and what failed.
	Counters Counters
	// Dirty is the set of keys changed since the last send, which the
	// node marks as it decides.
	Dirty *DirtySet
	// Copies is this node's Store of other owners' copies, swept every 50
	// intervals.
	Copies *Store
	// OnSweep, when set, is called after each sweep of Copies with the
	// same now. (Optional)
	OnSweep func(now time.Time)
	// Log gets a debug line for each failed send.
	Log *slog.Logger
}

// Replicator sends, every interval, the state of the keys this node owns
// that changed since the last send to their successors on the ring; after
// a ring change, every owned key. A failed send marks its keys changed
// again (and counts them in Counters.Behind).
type Replicator struct {
	cfg    ReplicatorConfig
	lastFP string // the fingerprint of the ring of the last tick
	sweeps int

	// The buffers of the last send, reused by the next (a send waits for
	// its calls, and a Sender keeps nothing): the keys, the states'
	// encodings, their messages and the pointers to them. Dropped after a
	// send of more than maxKeptKeys keys, so that the first send after a
	// ring change (every key) does not hold its memory for good.
	kbuf, enc []byte
	slab      []sluicev1.KeyState
	states    []*sluicev1.KeyState
}

// maxKeptKeys is the most keys whose buffers a Replicator keeps between
// sends: some 64 k keys, at most a few MB.
const maxKeptKeys = 1 << 16

// NewReplicator returns a Replicator working with cfg.
func NewReplicator(cfg ReplicatorConfig) *Replicator {
	return &Replicator{cfg: cfg}
}

// Run sends copies every cfg.Replication.Interval until ctx is done.
func (r *Replicator) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Replication.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.tick(ctx)
	}
}

// tick is one interval's work: the send, and every 50 ticks a sweep.
func (r *Replicator) tick(ctx context.Context) {
	rg, to, ok := r.cfg.View.Current()
	if !ok {
		return
	}
	var keys []string
	if fp := rg.Fingerprint(); fp != r.lastFP {
		r.lastFP = fp
		r.cfg.Dirty.Drain()
		for k := range r.cfg.States.All() {
			keys = append(keys, k)
		}
	} else {
		keys = r.cfg.Dirty.Drain()
	}
	r.once(ctx, rg, to, keys)
	if r.sweeps++; r.sweeps%50 == 0 {
		now := r.cfg.States.Now()
		r.cfg.Copies.Sweep(now)
		if r.cfg.OnSweep != nil {
			r.cfg.OnSweep(now)
		}
	}
}

// once sends the current state of keys this node owns under rg to their
// successors, one Replicate call per successor and Batch keys. Every key
// this node owns has the same successors (the members after it on the
// ring), so the states are built once: their keys share one buffer, their
// encodings another and their messages one slab, so a key costs no
// allocation of its own; and those buffers are the last send's, reused
// (see Replicator), so a steady send allocates none. The successors'
// calls share the messages (a marshal only reads them).
func (r *Replicator) once(ctx context.Context, rg *ring.Ring, to Sender, keys []string) {
	succs := rg.SuccessorsOf(r.cfg.Self, r.cfg.Replication.Factor)
	if len(succs) == 0 || len(keys) == 0 {
		return // no other member: nothing to copy to
	}
	kn := 0
	for _, k := range keys {
		kn += len(k)
	}
	kbuf, enc := r.kbuf[:0], r.enc[:0]
	if cap(kbuf) < kn {
		kbuf = make([]byte, 0, kn) // exact: it never grows (a growth would leave earlier keys in the old array, harmlessly)
	}
	slab, states := r.slab[:0], r.states[:0]
	if cap(slab) < len(keys) {
		slab = make([]sluicev1.KeyState, 0, len(keys)) // never grows: states point into it
		states = make([]*sluicev1.KeyState, 0, len(keys))
	}
	defer func() {
		if len(keys) > maxKeptKeys {
			r.kbuf, r.enc, r.slab, r.states = nil, nil, nil, nil
			return
		}
		clear(slab) // no pointers into this send's buffers kept past it
		clear(states)
		r.kbuf, r.enc, r.slab, r.states = kbuf, enc, slab[:0], states[:0]
	}()
	for _, k := range keys {
		// Capped at their ends, so a later append never writes into
		// them (one that outgrows a buffer moves on to a new array).
		start := len(kbuf)
		kbuf = append(kbuf, k...)
		kb := kbuf[start:len(kbuf):len(kbuf)]
		if rg.Owner(kb) != r.cfg.Self {
			continue
		}
		st, ok := r.cfg.States.Get(k)
		if !ok {
			continue
		}
		start = len(enc)
		enc, _ = st.AppendBinary(enc)
		slab = append(slab, sluicev1.KeyState{Key: kb, State: enc[start:len(enc):len(enc)]})
		states = append(states, &slab[len(slab)-1])
	}
	var wg sync.WaitGroup
	for _, succ := range succs {
		wg.Go(func() {
			for rest := states; len(rest) > 0; {
				n := min(len(rest), r.cfg.Batch)
				batch := rest[:n]
				rest = rest[n:]
				cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
				err := to.Replicate(cctx, succ, &sluicev1.ReplicateRequest{Sender: r.cfg.Self, SenderInstance: r.cfg.Instance(), States: batch})
				cancel()
				if err != nil {
					r.cfg.Counters.Behind(len(batch))
					for _, ks := range batch {
						r.cfg.Dirty.Add(ks.Key)
					}
					if ctx.Err() == nil {
						r.cfg.Log.Debug("replication failed", "peer", succ, "keys", len(batch), "error", err)
					}
					continue
				}
				r.cfg.Counters.Replicated(len(batch))
			}
		})
	}
	wg.Wait()
}
