package window

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// shardCount is the number of lock stripes of a Store: enough that 64
// concurrent callers on random keys rarely meet on one lock.
const shardCount = 256

// DefaultSweepInterval is how often a node removes idle keys by default.
const DefaultSweepInterval = 5 * time.Second

// StoreConfig configures a Store.
type StoreConfig struct {
	// Clock is read by [Store.Now] and the sweeper. Default SystemClock.
	// (Optional)
	Clock Clock
	// MaxKeys caps the keys that hold state, spread evenly over the shards
	// (each holds at most ceil(MaxKeys/256)). When a new key would go over
	// the cap, keys back at full capacity are removed first, then the least
	// recently used key (approximately: the CLOCK algorithm); removing a key still inside its window hands its
	// client a fresh budget and is counted in [StoreStats.EvictedLive].
	// 0 means no cap. (Optional)
	MaxKeys int
}

// Store keeps the rate-limit state of every key this node owns, in memory.
// It is safe for concurrent use: the key space is split over 256 shards by
// a hash of the key, each shard a hash table under its own mutex, so there
// is no global lock on the hot path. A check on a key that holds state
// allocates nothing. The zero value is not usable; call [NewStore].
type Store struct {
	seed        maphash.Seed
	clock       Clock
	maxPerShard int // 0: no cap
	shards      [shardCount]shard

	evictedLive, swept atomic.Int64
}

// shard is one lock stripe; t is guarded by mu.
type shard struct {
	mu sync.Mutex
	t  table
	_  [24]byte // keep shards on separate cache lines
}

// StoreStats counts what a Store holds and has removed.
type StoreStats struct {
	// Keys is the number of keys that hold state now.
	Keys int
	// Swept is the number of keys removed because they were back at full
	// capacity (by the sweep or to make room under MaxKeys); removing them
	// changes no decision.
	Swept int64
	// EvictedLive is the number of keys removed under MaxKeys while still
	// inside their window: each handed its client a fresh budget.
	EvictedLive int64
}

// NewStore returns an empty Store.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	s := &Store{seed: maphash.MakeSeed(), clock: cfg.Clock}
	if cfg.MaxKeys > 0 {
		s.maxPerShard = (cfg.MaxKeys + shardCount - 1) / shardCount
	}
	for i := range s.shards {
		s.shards[i].t.minExpires = math.MaxInt64
	}
	return s
}

// Now returns the store's clock reading: the "now" a caller without a time
// of its own passes to [Store.Apply].
func (s *Store) Now() time.Time { return s.clock.Now() }

func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }

// Apply runs check c against key at now and returns the decision; allowed
// hits are consumed, rejected ones are not (see the package documentation
// for each algorithm and the rules on peeks, capacity, changed limits and
// time going backwards). key is compared byte for byte; callers that
// combine a limit name and a key must encode them unambiguously.
//
// It returns a *[FieldError] wrapping [ErrInvalid], and changes nothing,
// when c is out of range (see [Check.Validate]). A check that consumes
// nothing (a peek, or a refused check) changes no state: it cannot reset a
// key by naming another algorithm or window.
func (s *Store) Apply(key string, c Check, now time.Time) (Decision, error) {
	return s.apply(key, false, c, now)
}

// ApplyBytes is [Store.Apply] with the key as bytes; it copies key only
// when the key is new, so the caller may reuse its buffer.
func (s *Store) ApplyBytes(key []byte, c Check, now time.Time) (Decision, error) {
	return s.apply(unsafe.String(unsafe.SliceData(key), len(key)), true, c, now)
}

// apply is Apply; clone says key aliases a caller's buffer and must be
// copied before it is stored.
func (s *Store) apply(key string, clone bool, c Check, now time.Time) (Decision, error) {
	if err := c.Validate(); err != nil {
		return Decision{}, err
	}
	t := now.UnixNano()
	h := s.hash(key)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	// The check runs on a copy; only a check that consumed hits writes
	// its state back, so a peek or a refused check changes nothing (not
	// even under a changed algorithm, window or limit).
	slot, found := sh.t.find(h, key)
	var st state
	if found {
		st = sh.t.slots[slot].st
	}
	r := st.apply(c, t)
	if found {
		// Any check is a use, denied ones included: a key being refused
		// is the one a client hammers, and must not look idle to
		// eviction (which would hand it a fresh budget).
		sh.t.slots[slot].setUsed(true)
	}
	if r.allowed && c.Hits > 0 {
		if found {
			sh.t.slots[slot].st = st
		} else {
			s.makeRoomLocked(sh, t)
			sh.t.insert(h, key, clone, st)
		}
		sh.t.noteExpiry(r.reset)
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

// makeRoomLocked keeps sh under the per-shard cap before an insert:
// expired keys go first, then the least recently used (as the CLOCK
// approximation finds it). Requires sh.mu held.
func (s *Store) makeRoomLocked(sh *shard, now int64) {
	if s.maxPerShard == 0 || sh.t.n < s.maxPerShard {
		return
	}
	if n := sh.t.sweep(now); n > 0 {
		s.swept.Add(int64(n))
		return
	}
	slot := sh.t.evict()
	if sh.t.slots[slot].st.expires() > now {
		s.evictedLive.Add(1)
	} else {
		s.swept.Add(1)
	}
	sh.t.remove(slot)
}

// Len returns the number of keys that hold state.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n
		sh.mu.Unlock()
	}
	return n
}

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	return StoreStats{Keys: s.Len(), Swept: s.swept.Load(), EvictedLive: s.evictedLive.Load()}
}

// Sweep removes every key that is back at full capacity at now (its reset
// time has passed), one shard at a time, and returns how many it removed.
// Removing such a key changes no future decision. A shard in which no key
// can have expired yet is skipped without a scan.
func (s *Store) Sweep(now time.Time) int {
	t := now.UnixNano()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		removed += sh.t.sweep(t)
		sh.mu.Unlock()
	}
	s.swept.Add(int64(removed))
	return removed
}

// RunSweeper calls [Store.Sweep] with the store's clock every interval until
// ctx is done. It blocks; run it in a goroutine. An interval <= 0 means
// [DefaultSweepInterval]. A key is thus removed at most one interval after
// it is back at full capacity. observe, if not nil, is called after each
// sweep with how many keys it removed and how long it took (for metrics).
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration, observe func(removed int, took time.Duration)) {
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			start := time.Now()
			n := s.Sweep(s.clock.Now())
			if observe != nil {
				observe(n, time.Since(start))
			}
		}
	}
}
