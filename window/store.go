package window

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// shardCount is the number of lock stripes of a Store: enough that 64
// concurrent callers on random keys rarely meet on one lock.
const shardCount = 256

// Store keeps the rate-limit state of every key this node owns, in memory.
// It is safe for concurrent use: the key space is split over 256 shards,
// each a map under its own mutex, so there is no global lock on the hot path.
// The zero value is not usable; call [NewStore].
type Store struct {
	seed   maphash.Seed
	clock  Clock
	shards [shardCount]shard
}

// shard is one lock stripe. m is guarded by mu.
type shard struct {
	mu sync.Mutex
	m  map[string]state
	_  [40]byte // keep shards on separate cache lines
}

// NewStore returns an empty Store whose [Store.Now] reads clock; a nil clock
// means [SystemClock].
func NewStore(clock Clock) *Store {
	if clock == nil {
		clock = SystemClock{}
	}
	s := &Store{seed: maphash.MakeSeed(), clock: clock}
	for i := range s.shards {
		s.shards[i].m = make(map[string]state)
	}
	return s
}

// Now returns the store's clock reading: the "now" a caller without a time
// of its own passes to [Store.Apply].
func (s *Store) Now() time.Time { return s.clock.Now() }

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shardCount]
}

// Apply runs check c against key at now and returns the decision; allowed
// hits are consumed, rejected ones are not (see the package documentation
// for each algorithm). key is any string, compared byte for byte; callers
// that combine a limit name and a key must encode them unambiguously.
//
// It returns a *[FieldError] wrapping [ErrInvalid], and changes nothing,
// when c is out of range (see [Check.Validate]). A peek (Hits = 0) on a key
// with no state stores nothing.
func (s *Store) Apply(key string, c Check, now time.Time) (Decision, error) {
	if err := c.Validate(); err != nil {
		return Decision{}, err
	}
	t := now.UnixNano()
	sh := s.shard(key)
	sh.mu.Lock()
	st, ok := sh.m[key]
	r := st.apply(c, t)
	if ok || c.Hits > 0 {
		sh.m[key] = st
	}
	sh.mu.Unlock()
	return Decision{
		Allowed:    r.allowed,
		Limit:      c.Limit,
		Remaining:  r.remaining,
		ResetTime:  time.Unix(0, r.reset),
		RetryAfter: time.Duration(r.retry),
		Delay:      time.Duration(r.delay),
	}, nil
}

// Len returns the number of keys that hold state.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes every key that is back at full capacity at now (its reset
// time has passed), one shard at a time, and returns how many it removed.
// Removing such a key changes no future decision.
func (s *Store) Sweep(now time.Time) int {
	t := now.UnixNano()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			if st.expires <= t {
				delete(sh.m, k)
				removed++
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

// RunSweeper calls [Store.Sweep] with the store's clock every interval until
// ctx is done. It blocks; run it in a goroutine. interval must be > 0.
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.Sweep(s.clock.Now())
		}
	}
}
