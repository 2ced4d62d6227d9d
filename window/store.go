package window

import (
	"context"
	"fmt"
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
	// 0 means no cap. What happens when a new key would go over the cap
	// is OnKeyCap's choice. (Optional)
	MaxKeys int
	// OnKeyCap is what a new key past MaxKeys gets: [KeyCapDeny] (the zero
	// value) refuses it, [KeyCapEvict] evicts as described on MaxKeys.
	// (Optional)
	OnKeyCap KeyCapPolicy
	// MaxKeysPerGroup caps the keys of one group (see Group), so that one
	// group cannot take the whole table and starve the others: a new key
	// of a group that holds its share is refused under either policy
	// (counted in [StoreStats.Refused]), never admitted by evicting
	// another key. Like MaxKeys it is spread over the shards (each holds
	// at most ceil(MaxKeysPerGroup/256) keys of one group). 0, or a nil
	// Group, means no per-group cap. (Optional)
	MaxKeysPerGroup int
	// Group returns the group of a store key, e.g. the limit name encoded
	// at its start. It is called only when a key is inserted or removed,
	// never on a check of a key that holds state; it must be fast, pure
	// and safe for concurrent use, and it may return a substring of key.
	// (Optional)
	Group func(key string) string
}

// KeyCapPolicy says what a new key that would take a Store over its
// MaxKeys gets.
type KeyCapPolicy uint8

const (
	// KeyCapDeny refuses the new key: its check is not admitted
	// ([Decision.NoRoom] is set, Allowed false, nothing consumed) and is
	// counted in [StoreStats.Refused]. No live key ever loses its state to
	// make room, so a flood of new keys cannot hand a key a fresh budget;
	// the price is that new clients are refused while the table is full of
	// keys still inside their windows. Keys back at full capacity are
	// removed first to make room.
	KeyCapDeny KeyCapPolicy = iota
	// KeyCapEvict admits the new key and removes another one: keys back at
	// full capacity first, then the least recently used (CLOCK). An
	// evicted key still inside its window starts afresh (counted in
	// [StoreStats.EvictedLive]).
	KeyCapEvict
)

// String returns "deny" or "evict".
func (p KeyCapPolicy) String() string {
	switch p {
	case KeyCapDeny:
		return "deny"
	case KeyCapEvict:
		return "evict"
	}
	return fmt.Sprintf("KeyCapPolicy(%d)", uint8(p))
}

// ParseKeyCapPolicy parses "deny" or "evict"; it returns an error for
// anything else.
func ParseKeyCapPolicy(s string) (KeyCapPolicy, error) {
	switch s {
	case "deny":
		return KeyCapDeny, nil
	case "evict":
		return KeyCapEvict, nil
	}
	return 0, fmt.Errorf("want deny or evict, got %q", s)
}

// Store keeps the rate-limit state of every key this node owns, in memory.
// It is safe for concurrent use: the key space is split over 256 shards by
// a hash of the key, each shard a hash table under its own mutex, so there
// is no global lock on the hot path. A check on a key that holds state
// allocates nothing. The zero value is not usable; call [NewStore].
type Store struct {
	// shards comes first: a Store is a large object (over 32 KB), which
	// the Go allocator places at the start of a page, so every shard
	// starts on a cache line of its own.
	shards      [shardCount]shard
	seed        maphash.Seed
	clock       Clock
	maxPerShard int // 0: no cap
	onCap       KeyCapPolicy
	maxPerGroup int // per shard; 0: no per-group cap
	group       func(string) string

	evictedLive, swept, refused, overCap atomic.Int64
}

// shard is one lock stripe; t is guarded by mu. It is 256 bytes, four
// cache lines, and starts a line (see Store.shards). mu, which every check
// writes, has the first line to itself. The second holds view, the
// table's slots and the header of its long keys: every check reads them,
// and only a resize or the insert of a new long key writes them, so each
// core usually keeps a copy. The table's other fields follow. When
// two cores check random keys, a shard's lock line moves from one core's
// cache to the other's on about every other check; as view is not on it,
// a check asks for the lock line and for its key's slot at once
// (prefetchHome) instead of one after the other.
type shard struct {
	mu   sync.Mutex
	_    [64 - unsafe.Sizeof(sync.Mutex{})]byte
	view slotsView
	t    table
	_    [256 - 64 - unsafe.Sizeof(slotsView{}) - unsafe.Sizeof(table{})]byte
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
	// Refused is the number of new keys not admitted because the store
	// was full under [KeyCapDeny], or their group held its share
	// (MaxKeysPerGroup).
	Refused int64
	// MergedOverCap is the number of keys [Store.MergeState] inserted
	// although their shard was full under KeyCapDeny (a merge never drops
	// consumed hits); the cap refuses new keys until sweeps bring the
	// shard back under it.
	MergedOverCap int64
}

// NewStore returns an empty Store.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	s := &Store{seed: maphash.MakeSeed(), clock: cfg.Clock, onCap: cfg.OnKeyCap}
	if cfg.MaxKeys > 0 {
		s.maxPerShard = (cfg.MaxKeys + shardCount - 1) / shardCount
	}
	if cfg.MaxKeysPerGroup > 0 && cfg.Group != nil {
		s.maxPerGroup = (cfg.MaxKeysPerGroup + shardCount - 1) / shardCount
		s.group = cfg.Group
	}
	for i := range s.shards {
		s.shards[i].t.minExpires = math.MaxInt64
		s.shards[i].t.group = s.group
		s.shards[i].t.view = &s.shards[i].view
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
	var d Decision
	err := s.apply(&d, key, false, &c, now, false)
	return d, err
}

// ApplyBytes is [Store.Apply] with the key as bytes; it copies key only
// when the key is new, so the caller may reuse its buffer.
func (s *Store) ApplyBytes(key []byte, c Check, now time.Time) (Decision, error) {
	var d Decision
	err := s.apply(&d, unsafe.String(unsafe.SliceData(key), len(key)), true, &c, now, false)
	return d, err
}

// ApplyNow is [Store.ApplyBytes] at the store's clock ([Store.Now]), with
// the same decision (times in Unix ns, rounded up) and the same error: a
// *[FieldError] wrapping [ErrInvalid] when c is out of range. It is the
// fast path of a node: it reads the clock while the key's slot is being
// fetched from memory, so the two waits overlap.
func (s *Store) ApplyNow(key []byte, c Check) (Decision, error) {
	var d Decision
	err := s.apply(&d, unsafe.String(unsafe.SliceData(key), len(key)), true, &c, time.Time{}, true)
	return d, err
}

// apply is Apply, writing the decision to d (which must be zero); clone
// says key aliases a caller's buffer and must be copied before it is
// stored; readClock says to decide at the store's clock instead of now.
// The check and the decision go by pointer: copying them through each
// call of the hot path cost more than the arithmetic of a check.
func (s *Store) apply(d *Decision, key string, clone bool, c *Check, now time.Time, readClock bool) error {
	h := s.hash(key)
	sh := &s.shards[h%shardCount]
	sh.prefetchHome(h)
	if err := c.Validate(); err != nil {
		return err
	}
	if readClock {
		now = s.clock.Now()
	}
	t := now.UnixNano()
	d.Limit = c.Limit
	sh.mu.Lock()
	// The check runs on a copy; only a check that consumed hits writes
	// its state back, so a peek or a refused check changes nothing (not
	// even under a changed algorithm, window or limit).
	slot, found := sh.t.find(h, key)
	var st state
	if found {
		st = sh.t.slots[slot].st
	}
	var r result
	st.applyTo(c, t, &r)
	if found {
		// Any check is a use, denied ones included: a key being refused
		// is the one a client hammers, and must not look idle to
		// eviction (which would hand it a fresh budget).
		sh.t.slots[slot].setUsed(true)
	}
	if r.allowed && c.Hits > 0 {
		if found {
			sh.t.slots[slot].st = st
			sh.t.noteExpiry(r.reset)
		} else if s.makeRoomLocked(sh, key, t) {
			sh.t.insert(h, key, clone, st)
			sh.t.noteExpiry(r.reset)
		} else {
			// No room: the check is refused and consumes nothing. It
			// says nothing remains (a client must not read "denied, 5
			// remaining") and to try again after NoRoomRetry, when
			// sweeps may have made room.
			sh.mu.Unlock()
			s.refused.Add(1)
			d.ResetTime = time.Unix(0, t).Add(NoRoomRetry)
			d.RetryAfter = NoRoomRetry
			d.NoRoom = true
			return nil
		}
	}
	sh.mu.Unlock()
	d.Allowed = r.allowed
	d.Remaining = r.remaining
	d.ResetTime = time.Unix(0, r.reset)
	d.RetryAfter = time.Duration(r.retry)
	d.Delay = time.Duration(r.delay)
	return nil
}

// makeRoomLocked makes room in sh for the new key before an insert and
// reports whether it may go in. Under the per-shard cap, expired keys go
// first; then, under KeyCapEvict, the least recently used (as the CLOCK
// approximation finds it), while under KeyCapDeny the key is refused. A
// key whose group holds its share is refused under either policy (after
// expired keys are swept). Requires sh.mu held.
func (s *Store) makeRoomLocked(sh *shard, key string, now int64) bool {
	full := s.maxPerShard > 0 && sh.t.n >= s.maxPerShard
	groupFull := s.maxPerGroup > 0 && sh.t.groupLen(key) >= s.maxPerGroup
	if !full && !groupFull {
		return true
	}
	if n := sh.t.sweep(now); n > 0 {
		s.swept.Add(int64(n))
		full = s.maxPerShard > 0 && sh.t.n >= s.maxPerShard
		groupFull = s.maxPerGroup > 0 && sh.t.groupLen(key) >= s.maxPerGroup
	}
	switch {
	case groupFull:
		return false
	case !full:
		return true
	case s.onCap == KeyCapDeny:
		return false
	}
	slot := sh.t.evict()
	if sh.t.slots[slot].st.expires() > now {
		s.evictedLive.Add(1)
	} else {
		s.swept.Add(1)
	}
	sh.t.remove(slot)
	return true
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
	return StoreStats{Keys: s.Len(), Swept: s.swept.Load(), EvictedLive: s.evictedLive.Load(),
		Refused: s.refused.Load(), MergedOverCap: s.overCap.Load()}
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
