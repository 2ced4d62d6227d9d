package rpc

import (
	"context"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/region/lease"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Leases (issue 20; docs/regions.md): a global limit's slices
// follow demand (fixed windows as below; buckets: a share of the rate and
// burst, one lease with no window; sliding windows: per window as fixed
// ones, without standing slices, each window's allocator starting from
// the last one's records: lease.Allocator.Slide). Each region's owner of a key admits up to its
// slice of the key's current window (package region/lease's Holder): its
// standing slice for the window (a base share it owns without any
// message, DefaultLeaseBase of the limit split by region weight, unless
// the allocator set another for many windows at once: planStands),
// raised by grants of the key's allocator and lowered, first, when the
// allocator moves capacity elsewhere. The
// allocator is the key's owner in the key's allocator region: the first
// region, in an order the key picks (rendezvous hashing), that has a live
// member, among the regions this node sees, and only while it sees a
// majority of the regions (a minority side of a partition grants
// nothing). No check waits on a lease: a region whose slice is spent
// denies (slice_exhausted) until a grant arrives. Requests go out before
// the slice runs out (from the key's demand in the window and the lease
// round trip) and, for a busy key, for the next window before it starts;
// the allocator of the next window starts from the last window's demand
// and lowers the regions that will not use what they start with. Messages are
// batched per destination node every leaseFlush, one Lease call each.

// DefaultLeaseBase is the fraction of a global limit the regions own as
// bases (split by weight) when ServerConfig.LeaseBase is 0: what a region
// cut off from the allocator can always admit per window.
const DefaultLeaseBase = 0.5

// leaseFlush is how often queued lease messages are sent, one Lease call
// per destination node: every 5 ms the calls' own cost (a gRPC call each,
// hundreds a second per node) doubled the p99 of in-region checks under
// load (scenario/testdata/load.yaml in the lab); every 20 ms it is within
// about a millisecond of fixed slices'. It adds up to 20 ms to a lease's
// round trip (the lead counts two).
const leaseFlush = 20 * time.Millisecond

// maxLeaseBatch bounds the messages of one Lease call.
const maxLeaseBatch = 4096

// leaseShards is the number of locks the holders' table is split over.
const leaseShards = 64

// leases is a node's lease machinery (nil without several regions).
type leases struct {
	s    *Server
	base float64
	inc  uint64 // random per process: the high bits of allocator ids
	ids  atomic.Uint64

	shards [leaseShards]holderShard

	amu    sync.Mutex
	allocs map[allocKey]*allocEntry
	// inherited is what former allocators handed over, by key and window
	// (see onHandOver); swept when the window ends.
	inherited map[allocKey]*inheritEntry
	// handedView is the view handOverMoved last ran for (run loop only).
	handedView *view
	// handq is the hand-overs of allocator states stillAllocator forgot,
	// to queue (under amu).
	handq  []queued
	stands map[string]*standEntry // store key -> the key's standing slices, where this node is its allocator

	omu    sync.Mutex
	outbox map[string][]*sluicev1.LeaseMessage // destination node -> messages

	rtt atomic.Int64 // ns: an average of Lease calls' round trips
	// blindBefore is, in store-clock ns, the start of this process when it
	// cannot know what its region admitted before it (see blindWin): it
	// started with no state file of its leave and met no other member of
	// its region to take its keys back from; 0 once it knows it can.
	// blindSettled is set once that was decided (the first view that holds
	// another member, or a leave's state file restored).
	blindBefore  atomic.Int64
	blindSettled atomic.Bool
	// shared: at its first view, this node's region had another member.
	shared atomic.Bool
	// since is when this node's cluster began as far as it knows (ms on
	// the store's clock): its start, lowered to the earliest Since of the
	// members it meets (cluster.Member.Since); gossiped in its metadata.
	since atomic.Int64
	// hist is what this node knows of its allocator view's history (see
	// learning); replaced whole by viewChanged, under s.setMu.
	hist atomic.Pointer[leaseHistory]

	hmu sync.Mutex
	hot map[*holderEntry]struct{} // entries that asked in their current or last window

	wmu    sync.Mutex
	givers map[time.Duration]*giverSet // window length -> the entries that give back late in each window (see late)

	st    leaseCounters
	pools sync.Map // limit name label -> *poolCounters
}

// poolCounters are a limit name's lease figures, per window ended: the
// slices this node's region held of it, what it admitted of them, and
// what this node's allocators left in the pool (granted to nobody). With
// every node's summed, used / (slices + free) is the share of the limit
// admitted, and slices / (slices + free) the pool's use.
type poolCounters struct {
	slice, used, free atomic.Int64
}

// pool returns name's counters: a configured limit's own, "(inline)" for
// the rest (a label never holds a name a client made up).
func (l *leases) pool(name string) *poolCounters {
	if set := l.s.limits.Current(); set == nil || !set.Has(name) {
		name = InlineName
	}
	if p, ok := l.pools.Load(name); ok {
		return p.(*poolCounters)
	}
	p, _ := l.pools.LoadOrStore(name, &poolCounters{})
	return p.(*poolCounters)
}

// PoolStats is a limit name's lease figures on one node (see Stats):
// hits of the slices its region held, of them admitted, and left in its
// allocators' pools, summed over the windows that ended.
type PoolStats struct {
	SliceHits, UsedHits, FreeHits int64
}

// poolStats returns the lease figures by limit name label.
func (l *leases) poolStats() map[string]PoolStats {
	out := map[string]PoolStats{}
	l.pools.Range(func(k, v any) bool {
		p := v.(*poolCounters)
		out[k.(string)] = PoolStats{SliceHits: p.slice.Load(), UsedHits: p.used.Load(), FreeHits: p.free.Load()}
		return true
	})
	return out
}

// leaseHistory is when this node's own ring last changed (or the node
// started) and when each region was last seen to lose its last live
// member (the node's start for a region never seen live), in store-clock
// ns.
type leaseHistory struct {
	started    int64      // the node's start
	ring, prev *ring.Ring // this node's ring, and the one before its last change (nil: none yet)
	ownChanged int64
	anyChanged int64 // when a region last gained its first live member or lost its last
	live       map[string]bool
	goneAt     map[string]int64
}

// leaseCounters count lease events; see Stats.
type leaseCounters struct {
	requests, grants, grantedHits, lowers, acks, givenBack, giveBacks, exhausted, sent, replied, calls, callErrors, stands atomic.Int64
	// blindSpent: hits counted in windows as spent by an earlier process
	// of this node's region (blind holders' grants: see spend).
	blindSpent atomic.Int64
}

type holderShard struct {
	mu sync.Mutex
	m  map[string]*holderEntry // store key -> entry
}

// holderEntry is this node's side of one key in its region: package
// region/lease's KeyHolder (a holder per window, the standing slices, the
// allocator's hint, the region's demand), under mu, with what the node
// needs beside it.
type holderEntry struct {
	mu sync.Mutex
	*lease.KeyHolder
	name, key string
	seed      uint64
	sliding   bool // a sliding window's: no standing slices, its consumed is its estimate
	// Buckets (one lease, window id bucketLease): the bucket's capacity
	// (burst) and algorithm from the last check (0 before one), when a
	// check last came (wall clock), and the demand of the current and
	// last rate periods (see bucketPeriod).
	capacity               int64
	algorithm              window.Algorithm
	lastCheck, periodStart time.Time
	periodDemand, lastRate float64   // hits; hits per ns
	idleSent               bool      // an idle report went since the last check
	touched                time.Time // the last check or lease message (wall clock)
}

// holderWin is a KeyHolder's side of one window.
type holderWin = lease.WindowHolder

// maxInherited bounds the keys' windows whose hand-overs a node keeps
// (a hand-over more is dropped: see onHandOver).
const maxInherited = 1 << 17

// inheritEntry is what former allocators handed over for one key's
// window (see onHandOver): each region's bound, for the limit they had.
type inheritEntry struct {
	name, key string
	sliding   bool
	limit     int64
	window    time.Duration
	bounds    map[string]int64
}

// handOver returns in's messages for window id: one per region, its
// bound (forwarded by a node that is not the key's allocator any more).
func (in *inheritEntry) handOver(id int64) []*sluicev1.LeaseMessage {
	var out []*sluicev1.LeaseMessage
	for r, b := range in.bounds {
		out = append(out, &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_HAND_OVER, Name: in.name, Key: in.key,
			WindowId: id, WindowMs: in.window.Milliseconds(), Limit: in.limit, Region: r, Slice: b, Sliding: in.sliding})
	}
	return out
}

type allocKey struct {
	key    string // store key
	window int64
}

type allocEntry struct {
	sliding    bool // a sliding window's (see lease.Allocator.Slide)
	name, key  string
	window     time.Duration
	limit      int64
	a          *lease.Allocator
	sent       time.Time // when its pending lowers were last sent, wall clock
	rebalanced time.Time // when it last rebalanced for a waiting region, wall clock
	reclaimed  bool      // its late-window reclaim went
	touched    time.Time // when a message last came for it, wall clock (buckets: idle ones are forgotten)
	view       *view     // the view it was last found to be the key's allocator under
}

// standEntry is a key's standing slices where this node is the key's
// allocator (fixed windows): package region/lease's KeyStands (the
// Stands, each region's demand as the windows that ended showed it, the
// hints said), with what the node needs beside it.
type standEntry struct {
	*lease.KeyStands
	name, key string
	window    time.Duration
	seed      uint64
	sent      time.Time // when its pending stands were last sent, wall clock
	touched   time.Time // when a per-window allocator was last made for it, wall clock
	view      *view     // the view it was last found to be the key's allocator under
}

func newLeases(s *Server, base float64) *leases {
	if base <= 0 || base > 1 {
		base = DefaultLeaseBase
	}
	l := &leases{s: s, base: base, inc: rand.Uint64() &^ 0xffffffff, allocs: map[allocKey]*allocEntry{}, inherited: map[allocKey]*inheritEntry{},
		stands: map[string]*standEntry{}, outbox: map[string][]*sluicev1.LeaseMessage{}}
	for i := range l.shards {
		l.shards[i].m = map[string]*holderEntry{}
	}
	l.rtt.Store(int64(200 * time.Millisecond))
	now := s.store.Now().UnixNano()
	l.hist.Store(l.freshHistory(now, nil, nil, map[string]bool{}))
	l.blindBefore.Store(now)
	l.since.Store(time.Unix(0, now).UnixMilli())
	l.hot = map[*holderEntry]struct{}{}
	l.givers = map[time.Duration]*giverSet{}
	return l
}

// leased reports whether r's global slice follows demand by leases: a
// limit of scope global with several regions, and a pool to lease
// (LeaseBase below 1; at 1 the bases are the whole limit, and every
// algorithm keeps fixed slices).
func (s *Server) leased(r *request) bool {
	return s.leases != nil && s.leases.base < 1 && r.scope == region.Global
}

// counted returns what the region admitted of e's key in the current
// window as its window in the store says (a sliding window's: its
// estimate, rounded up), peeked with algorithm a at the key's limit.
func (l *leases) counted(sk []byte, e *holderEntry, a window.Algorithm, now time.Time) (int64, bool) {
	d, err := l.s.store.ApplyBytes(sk, window.Check{Algorithm: a, Limit: e.Limit, Window: e.Window}, now)
	if err != nil {
		return 0, false
	}
	return max(e.Limit-d.Remaining, 0), true
}

// algorithmOf returns the window algorithm of e's key (its lease
// messages and checks say whether it is a sliding window's).
func algorithmOf(e *holderEntry) window.Algorithm {
	if e.sliding {
		return window.SlidingWindow
	}
	return window.FixedWindow
}

// burstShare is a bucket's burst share for a slice of slice hits of a
// limit of limit hits per window and capacity capacity: the same part of
// the capacity as of the rate (rounded down, so that the shares never
// add up to more than the capacity).
func burstShare(slice, limit, capacity int64) int64 {
	if limit <= 0 {
		return 0
	}
	return int64((uint64(slice) * uint64(capacity)) / uint64(limit))
}

// baseOf returns region's base of a limit of limit hits for the key of
// seed: its share, by weight, of the bases' part of the limit.
func (l *leases) baseOf(limit int64, reg string, seed uint64) int64 {
	return l.s.regions.Share(int64(float64(limit)*l.base), reg, seed)
}

func (l *leases) bases(limit int64, seed uint64) map[string]int64 {
	out := map[string]int64{}
	for _, r := range l.s.regions.Regions() {
		out[r.Name] = l.baseOf(limit, r.Name, seed)
	}
	return out
}

func windowID(now time.Time, w time.Duration) int64 { return now.UnixNano() / int64(w) }

// bucketLease is the window id of a bucket's lease (lease.BucketLease).
const bucketLease = lease.BucketLease

// isBucket reports whether a is a token or leaky bucket.
func isBucket(a window.Algorithm) bool { return a == window.TokenBucket || a == window.LeakyBucket }

// bucketPeriod is how long a bucket key's demand is measured over before
// its region reports it again: its window, at least a second (so that a
// hot key-region pair sends about a message a second at most).
func bucketPeriod(w time.Duration) time.Duration { return max(w, time.Second) }

// bucketIdle is how long a bucket key's holder and allocator state are
// kept without a check or a message.
const bucketIdle = 10 * time.Minute

// entry returns the holders of a key checked with limit over windows of
// w (a sliding window's or not), made afresh when there are none or the
// check's limit, window or kind of window differs from theirs (the limit
// changed: see replaced).
func (l *leases) entry(storeKey []byte, name, key string, w time.Duration, limit int64, sliding bool) *holderEntry {
	e, _ := l.entryFor(storeKey, name, key, w, limit, sliding, true)
	return e
}

// entryOf returns the holders of a key a lease message names, made when
// there are none; nil when they are of another limit or window than the
// message's (a message of the key's old limit, or of its new one before
// a check here brought it: it is ignored, and resent).
func (l *leases) entryOf(storeKey []byte, m *sluicev1.LeaseMessage) *holderEntry {
	e, ok := l.entryFor(storeKey, m.Name, m.Key, time.Duration(m.WindowMs)*time.Millisecond, m.Limit, m.Sliding, false)
	if !ok {
		return nil
	}
	return e
}

func (l *leases) entryFor(storeKey []byte, name, key string, w time.Duration, limit int64, sliding, replace bool) (*holderEntry, bool) {
	sh := &l.shards[xxhash.Sum64(storeKey)%leaseShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(storeKey)]
	differs := e != nil && (e.Window != w || e.Limit != limit || e.sliding != sliding)
	if differs && !replace {
		return e, false
	}
	if e == nil || differs {
		// New, or the limit's numbers changed: start afresh. The old
		// holders' grants lapse; the key's count in the store stays, so
		// the window of the change starts at 0 (replaced, see unsure)
		// and reports what it admitted.
		replaced := int64(0)
		if e != nil {
			l.giving(e, false)
			replaced = windowID(l.s.store.Now(), w)
		}
		seed := region.SeedOf(name, key)
		e = &holderEntry{name: name, key: key, seed: seed, sliding: sliding,
			KeyHolder: lease.NewKeyHolder(l.s.region, w, limit, l.baseOf(limit, l.s.region, seed), windowID(l.s.store.Now(), w), replaced)}
		sh.m[string(storeKey)] = e
	}
	return e, true
}

// win returns the holder of window id, creating it with the region's
// standing slice, or at 0 when unsure, and blind when this process cannot
// know what its region admitted in the window (blindWin). Requires e.mu.
func (l *leases) win(e *holderEntry, id int64) *holderWin {
	if w := e.Wins[id]; w != nil {
		return w
	}
	blind := l.blindWin(e, id)
	return e.MakeWin(id, blind || l.unsure(e, id), blind)
}

// blindWin reports whether a holder made now for window id of e cannot
// know what its region admitted in it before this process started
// ("unknown means spent"): the process started with no state file of a
// graceful leave and no other member of its region (a region of one node
// restarted: its counts went with the old process; with another member,
// the keys come back from it with their counts, by hand-off or pull, as
// in one region), and the window had begun before the process did (a
// sliding window's: the window before it had, since its count still
// counts; a bucket: a check came within the time its burst takes to
// drain at its rate, for which the old process's debt may still hold).
// Such a holder admits nothing until the allocator says what its region
// is counted as having spent (lease.Holder.StartBlind): under-admission
// in that window, never over.
func (l *leases) blindWin(e *holderEntry, id int64) bool {
	if l.orphan(e, id) {
		return true
	}
	before := l.blindBefore.Load()
	if before == 0 {
		return false
	}
	if l.shared.Load() {
		// Its region had another member: a key that came back with its
		// state (hand-off, pull, copy) is known; one with none here may
		// have been counted by a member that is gone since.
		if _, held := l.s.store.Get(string(ring.Key(nil, e.name, e.key))); held {
			return false
		}
	}
	switch {
	case id == bucketLease:
		drain := e.Window
		if e.capacity > 0 && e.Limit > 0 {
			drain = time.Duration(float64(e.Window) * float64(e.capacity) / float64(e.Limit))
		}
		return l.s.store.Now().UnixNano() < before+int64(max(drain, e.Window))
	case e.sliding:
		return (id-1)*int64(e.Window) < before
	default:
		return id*int64(e.Window) < before
	}
}

// foundingGrace is how soon after the earliest start its cluster knows
// of a node must have started to be one of the cluster's first nodes
// (see founder): nodes of a new cluster start within seconds of each
// other.
const foundingGrace = 15 * time.Second

// founder reports, at this node's first view with other members, whether
// it is one of its cluster's first nodes: the cluster knew no earlier
// process of its name when it joined (memberlist keeps a departed member
// for 30 s, longer than foundingGrace), and no member it meets says the
// cluster began more than foundingGrace before this node started
// (cluster.Member.Since). A first node had no earlier process in its
// region whose counts it could have lost; a cluster stopped whole and
// started again is a new cluster, whose counts start afresh unless its
// nodes keep state (docs/persistence.md).
func (l *leases) founder(v *view) bool {
	if kb := l.s.knownBefore; kb != nil && kb() {
		return false // the cluster knew an earlier process of this node
	}
	own := time.Unix(0, l.hist.Load().started).UnixMilli()
	earliest := own
	for _, m := range v.all {
		if m.Name != l.s.name && m.Since > 0 {
			earliest = min(earliest, m.Since)
		}
	}
	return own-earliest <= foundingGrace.Milliseconds()
}

// clusterSince returns when this node's cluster began as far as it knows
// (ms since the Unix epoch on its store's clock; see leases.since), or
// its start without several regions.
func (s *Server) clusterSince() int64 {
	if s.leases != nil {
		return s.leases.since.Load()
	}
	return s.store.Now().UnixMilli()
}

// orphan reports whether e's key came to this node, in window id, from
// an owner that is gone from its region's ring (it died, or left without
// handing the key over) and left nothing here: no copy of the key, no
// state handed off or pulled. Its count in the window is unknown (the
// copy a replica held may itself have been lost, e.g. with a replica
// node that restarted since the key last changed), so the holder is
// blind, as a restarted region's only node's are (unknown means spent:
// under-admission of the region's unused slice, never over). A key that
// comes with state (a copy within the crash bound, or a hand-off) is not.
func (l *leases) orphan(e *holderEntry, id int64) bool {
	h := l.hist.Load()
	if h.prev == nil || h.ownChanged == 0 {
		return false
	}
	start := id * int64(e.Window)
	switch {
	case id == bucketLease:
		start = l.s.store.Now().UnixNano() - int64(max(e.Window, time.Second))
	case e.sliding:
		start -= int64(e.Window)
	}
	if h.ownChanged <= start {
		return false // the key's owner changed before the window began
	}
	sk := ring.Key(nil, e.name, e.key)
	prev := h.prev.Owner(sk)
	if prev == l.s.name || h.ring == nil || h.ring.Has(prev) {
		return false // this node's before, or its owner is still here and hands it over
	}
	_, held := l.s.store.Get(string(sk))
	return !held
}

// knowsState settles that this process knows what its region admitted
// before it started (a leave's state file was restored, or its region has
// another member to take the keys back from): its holders are never
// blind. Called at most once with effect.
func (l *leases) knowsState() {
	if l.blindSettled.CompareAndSwap(false, true) {
		l.blindBefore.Store(0)
	}
}

// unsure reports whether a holder made now for window id of e may belong
// to a region that holds less than its start: since the window's lowers
// or stands could have gone out (a lead time before it starts, and a
// stand's reach before that; for a bucket, within bucketIdle), the node
// started (an earlier process of it may have held the key's slice) or its
// ring changed and the key had another owner here under the ring before,
// whose slice or standing slice the allocator may have lowered. Such a
// holder starts at 0 and asks (the allocator's grants are absolute: the
// first one gives it the region's record).
func (l *leases) unsure(e *holderEntry, id int64) bool {
	if e.Replaced != 0 && (id == bucketLease || id <= e.Replaced) {
		return true
	}
	if id != bucketLease && e.SureFrom != 0 && id >= e.SureFrom {
		return false // a Stand of the key's allocator set it
	}
	h := l.hist.Load()
	since := id*int64(e.Window) - int64(l.lead()) - (standReach(e.Window)+2)*int64(e.Window)
	if id == bucketLease {
		since = l.s.store.Now().UnixNano() - int64(bucketIdle)
	}
	if h.started > since {
		return true
	}
	return h.ownChanged > since && h.prev != nil && h.prev.Owner(ring.Key(nil, e.name, e.key)) != l.s.name
}

// lead is how long before a slice runs out a request should go: three
// lease round trips (a request, the reports or lowers it may need, the
// grant) and two flushes.
func (l *leases) lead() time.Duration {
	return 3*time.Duration(l.rtt.Load()) + 2*leaseFlush
}

// decide decides a leased check of a key this node owns in its region:
// under the key's holder lock, from the region's slice of the current
// window (the store's window of the key counts what was admitted), then
// asks for more when the slice will run out within the lease lead time.
func (l *leases) decide(storeKey []byte, r *request, now time.Time) *sluicev1.Decision {
	if isBucket(r.check.Algorithm) {
		return l.decideBucket(storeKey, r, now)
	}
	s := l.s
	c := r.check
	e := l.entry(storeKey, r.name, r.key, c.Window, r.full, c.Algorithm == window.SlidingWindow)
	id := windowID(now, c.Window)
	start := time.Unix(0, id*int64(c.Window))
	e.mu.Lock()
	w := l.win(e, id)
	w.Demand += c.Hits
	slice := w.H.Slice()
	var pd *sluicev1.Decision
	exact := false // w.Consumed is what the store's answer says the region holds
	if c.Hits > 0 && c.Hits > slice {
		// More than the whole slice now: denied until a grant comes
		// (the store would answer "never", which is not so).
		reset := start.Add(c.Window)
		pd = &sluicev1.Decision{Limit: slice, Remaining: max(slice-w.Consumed, 0), ResetTime: unixMsCeil(reset),
			RetryAfter: msCeil(reset.Sub(now)), Owner: s.name}
	} else {
		c.Limit = max(slice, 1) // a slice of 0 and a peek: the peek's answer says no
		pd = s.applyOwned(storeKey, c, now)
		if slice == 0 {
			pd.Allowed, pd.Remaining, pd.Limit = false, 0, 0
		}
		if slice > 0 && pd.Error == "" {
			w.Consumed = max(slice-pd.Remaining, 0)
			exact = pd.Remaining > 0
		}
	}
	if !exact && (c.Algorithm == window.SlidingWindow || w.Unsure) {
		// The answer says what the region holds only below its slice. A
		// sliding window's estimate (its last window's count still
		// counts) and the count of a holder made afresh over what the
		// window admitted may pass it: read it at the key's limit (one
		// more store operation, only then).
		if n, ok := l.counted(storeKey, e, c.Algorithm, now); ok {
			w.Consumed = n
		}
	}
	pd.Slice = slice
	var req *sluicev1.LeaseMessage
	if want := l.wantMore(e, w, start, now); want > 0 {
		w.Asked, w.AskedAt, w.AskedFor = time.Now(), w.H.Slice(), w.H.Slice()+want
		rq := w.H.Request(want, w.Consumed)
		req = l.message(e, sluicev1.LeaseKind_LEASE_KIND_REQUEST, id)
		req.Want, req.Consumed, req.Slice, req.Unsure = rq.Want, rq.Consumed, rq.Slice, w.Unsure
	}
	if !pd.Allowed && pd.Error == "" && c.Hits > 0 && slice < r.full && l.pending(w, req != nil) {
		l.retrySoon(pd)
	}
	e.mu.Unlock()
	l.decided(storeKey, e, req, !pd.Allowed && pd.Error == "" && c.Hits > 0 && slice < r.full)
	return pd
}

// decided counts a leased check's denial for want of slice (exhausted)
// and sends its request, if any, marking the key busy. Called without
// e.mu.
func (l *leases) decided(storeKey []byte, e *holderEntry, req *sluicev1.LeaseMessage, exhausted bool) {
	if exhausted {
		l.st.exhausted.Add(1)
	}
	if req != nil {
		l.st.requests.Add(1)
		l.hmu.Lock()
		l.hot[e] = struct{}{}
		l.hmu.Unlock()
		l.toAllocator(storeKey, req)
	}
}

// decideBucket decides a leased token or leaky bucket check: the region's
// slice is a share of the bucket's rate (slice hits per window) and, in
// proportion, of its burst; a check that finds the share spent is denied
// (slice_exhausted, retry after a lease round trip). The region reports
// its demand rate at most once a bucketPeriod, and at once when a check
// is denied for want of share.
func (l *leases) decideBucket(storeKey []byte, r *request, now time.Time) *sluicev1.Decision {
	s := l.s
	c := r.check
	e := l.entry(storeKey, r.name, r.key, c.Window, r.full, false)
	wall := time.Now()
	e.mu.Lock()
	capacity := r.fullBurst
	e.capacity, e.algorithm, e.lastCheck, e.idleSent, e.touched = capacity, c.Algorithm, wall, false, wall
	w := l.win(e, bucketLease)
	period := bucketPeriod(e.Window)
	if e.periodStart.IsZero() || wall.Sub(e.periodStart) >= period {
		if !e.periodStart.IsZero() {
			e.lastRate = e.periodDemand / float64(max(wall.Sub(e.periodStart), 1))
		}
		e.periodStart, e.periodDemand = wall, 0
	}
	e.periodDemand += float64(c.Hits)
	slice := w.H.Slice()
	c.Limit, c.Burst = slice, burstShare(slice, r.full, capacity)
	var pd *sluicev1.Decision
	if slice == 0 || c.Burst == 0 || c.Hits > c.Burst {
		retry := l.lead()
		pd = &sluicev1.Decision{Limit: slice, ResetTime: unixMsCeil(now.Add(retry)), RetryAfter: msCeil(retry), Owner: s.name,
			SlicePending: true}
	} else {
		if (w.Blind && !w.Drained) || (w.Drained && c.Burst > w.DrainedCap && l.blindWin(e, bucketLease)) {
			// Unknown means spent: an earlier process of this region's
			// only node may have emptied its bucket just before it
			// stopped, so the bucket starts empty and fills at the
			// region's rate (blindWin). A share raised within the blind
			// time is emptied again at its new capacity: the earlier
			// process may have held (and emptied) a larger share than
			// the one this holder was first granted (a bucket drained
			// at a share of 6 and raised to 24 had 18 tokens the region
			// may have spent: 37 of 30 in the lab's kill deploy).
			l.drain(storeKey, c, now)
			w.Drained, w.DrainedCap = true, c.Burst
		}
		pd = s.applyOwned(storeKey, c, now)
	}
	pd.Slice = slice
	// The region's rate of demand, in hits per window: this period's so
	// far blended with the last period's, and a quarter more (room to
	// grow; what it does not use goes back when others ask).
	elapsed := max(wall.Sub(e.periodStart), period/4)
	rate := e.periodDemand / float64(elapsed)
	if e.lastRate > 0 {
		rate = (rate + e.lastRate) / 2
	}
	desired := min(int64(rate*float64(e.Window)*1.25)+1, e.Limit)
	var req *sluicev1.LeaseMessage
	denied := !pd.Allowed && pd.Error == "" && c.Hits > 0
	since := wall.Sub(w.Asked)
	rtt := time.Duration(l.rtt.Load()) + 2*leaseFlush
	if want := desired - slice; (w.Asked.IsZero() || since >= period || (denied && want > 0 && since >= rtt)) && (want > 0 || slice > w.H.Base()) {
		w.Asked, w.AskedAt = wall, slice
		req = l.message(e, sluicev1.LeaseKind_LEASE_KIND_REQUEST, bucketLease)
		req.Want, req.Slice = want, slice
	}
	e.mu.Unlock()
	l.decided(storeKey, e, req, denied && slice < r.full)
	return pd
}

// drain empties the region's bucket of a key (check c's rate and burst
// share): it takes what the bucket has room for now. Requires the key's
// holder lock.
func (l *leases) drain(sk []byte, c window.Check, now time.Time) {
	c.Hits = 0
	d, err := l.s.store.ApplyBytes(sk, c, now)
	if err != nil || d.Remaining <= 0 {
		return
	}
	c.Hits = d.Remaining
	if d, err = l.s.store.ApplyBytes(sk, c, now); err == nil && d.Allowed {
		if l.s.replication.Factor > 0 {
			l.s.dirty.Add(sk)
		}
		l.st.blindSpent.Add(c.Hits)
	}
}

// pending reports whether a denial by w's slice is one a retry about a
// lease round trip later may pass: the region asks for more now (asked),
// its holder waits for the grant that says what its region spent
// (blind), or it asked within the last four round trips for more than
// it holds and nothing answered yet. Requires e.mu.
func (l *leases) pending(w *holderWin, asked bool) bool {
	if asked || w.H.Blind() {
		return true
	}
	rtt := time.Duration(l.rtt.Load()) + 2*leaseFlush
	return !w.Asked.IsZero() && time.Since(w.Asked) < 4*rtt && w.AskedFor > w.H.Slice()
}

// retrySoon makes a slice denial say that the region waits for its
// share: retry_after is a lease round trip (its flushes included), not
// the window's end, and slice_pending says so.
func (l *leases) retrySoon(pd *sluicev1.Decision) {
	rt := time.Duration(l.rtt.Load()) + 2*leaseFlush
	if ms := msCeil(rt); pd.RetryAfter < 0 || ms < pd.RetryAfter {
		pd.RetryAfter = ms
	}
	pd.SlicePending = true
}

// wantMore returns the hits w's holder should ask for (0: none): see
// lease.KeyHolder.WantMore, with this node's lead and lease round trip.
// Requires e.mu.
func (l *leases) wantMore(e *holderEntry, w *holderWin, start, now time.Time) int64 {
	return e.WantMore(w, now.Sub(start), time.Now(), l.lead(), time.Duration(l.rtt.Load())+2*leaseFlush)
}

// message returns a lease message of e's key for window id from this
// region: a sliding window's says so, and a request carries its holder's
// nonce (made afresh: see lease.Holder.StartAfresh). Requires e.mu.
func (l *leases) message(e *holderEntry, kind sluicev1.LeaseKind, id int64) *sluicev1.LeaseMessage {
	m := &sluicev1.LeaseMessage{Kind: kind, Name: e.name, Key: e.key, WindowId: id,
		WindowMs: e.Window.Milliseconds(), Limit: e.Limit, Region: l.s.region, Sliding: e.sliding}
	if w := e.Wins[id]; w != nil && kind == sluicev1.LeaseKind_LEASE_KIND_REQUEST {
		m.Nonce, m.Blind = w.H.Nonce(), w.H.Blind()
	}
	return m
}

// allocatorRegion returns the allocator region of the key of seed under
// v: the first region in the key's order (see order) that has a live
// member or lost its last one less than regionDownAfter ago; "" when this
// node sees no majority of the regions live (it then neither grants nor
// asks: a minority side of a partition must not allocate while the
// majority side may).
func (l *leases) allocatorRegion(v *view, seed uint64) string {
	live := func(r string) bool { return r == l.s.region || v.rings[r] != nil }
	n := 0
	for _, r := range l.s.regions.Regions() {
		if live(r.Name) {
			n++
		}
	}
	if n*2 <= l.s.regions.Len() {
		return ""
	}
	h := l.hist.Load()
	recent := l.s.store.Now().UnixNano() - int64(regionDownAfter)
	for _, r := range l.order(seed) {
		if live(r) || h.goneAt[r] > recent {
			// A region gone for less than regionDownAfter keeps its keys'
			// allocators (unreachable: no grants meanwhile), so that a
			// member wrongly suspected, and refuted, never makes two.
			return r
		}
	}
	return ""
}

// regionDownAfter is how long a region must have had no live member
// before the next region takes its keys' allocators over: memberlist
// refutes a wrong suspicion within seconds, and a region cut off sees the
// others' majority gone (and stops granting) within about as long.
const regionDownAfter = 30 * time.Second

// mix is a 64-bit finalizer (SplitMix64's), so that rendezvous scores of
// nearby inputs are independent.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// ownerIn returns the key's owner in region reg under v ("" when reg has
// no live member).
func (l *leases) ownerIn(v *view, reg string, storeKey []byte) string {
	if reg == l.s.region {
		return v.ring.Owner(storeKey)
	}
	if r := v.rings[reg]; r != nil {
		return r.Owner(storeKey)
	}
	return ""
}

// toAllocator queues m for the key's allocator.
func (l *leases) toAllocator(storeKey []byte, m *sluicev1.LeaseMessage) {
	v := l.s.view.Load()
	reg := l.allocatorRegion(v, region.SeedOf(m.Name, m.Key))
	if reg == "" {
		return
	}
	if to := l.ownerIn(v, reg, storeKey); to != "" {
		l.queue(to, m)
	}
}

// toHolder queues m for the key's owner in region reg.
func (l *leases) toHolder(reg string, storeKey []byte, m *sluicev1.LeaseMessage) {
	if to := l.ownerIn(l.s.view.Load(), reg, storeKey); to != "" {
		l.queue(to, m)
	}
}

func (l *leases) queue(to string, m *sluicev1.LeaseMessage) {
	l.omu.Lock()
	l.outbox[to] = append(l.outbox[to], m)
	l.omu.Unlock()
}

// run sends the queued messages every leaseFlush, resends the allocators'
// pending lowers, sends busy keys' next-window requests, and forgets the
// windows that ended, until ctx ends.
func (l *leases) run(ctx context.Context) {
	t := time.NewTicker(leaseFlush)
	defer t.Stop()
	var sweepAt, resendAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, wall := l.s.store.Now(), time.Now()
		if v := l.s.view.Load(); v != l.handedView {
			l.handedView = v
			l.handOverMoved(v)
		}
		l.sendHandq()
		l.ahead(now)
		l.late(now)
		if wall.Sub(resendAt) >= 10*leaseFlush {
			resendAt = wall
			l.resend(wall, now)
		}
		if wall.Sub(sweepAt) > time.Second {
			sweepAt = wall
			l.sweep(now)
		}
		l.flush(ctx)
	}
}

// flush sends each destination's queued messages in one Lease call (this
// node's own to itself, directly), and handles the replies.
func (l *leases) flush(ctx context.Context) {
	l.omu.Lock()
	out := l.outbox
	if len(out) == 0 {
		l.omu.Unlock()
		return
	}
	l.outbox = map[string][]*sluicev1.LeaseMessage{}
	l.omu.Unlock()
	l.deliver(ctx, l.s.view.Load(), out, l.s.bg.Go)
}

// deliver sends each destination's messages of out in Lease calls of at
// most maxLeaseBatch, each run by spawn (this node's own are handled
// directly), and handles the replies; a call's round trip feeds rtt.
func (l *leases) deliver(ctx context.Context, v *view, out map[string][]*sluicev1.LeaseMessage, spawn func(func())) {
	for to, msgs := range out {
		if to == l.s.name {
			for _, rep := range l.handle(msgs) {
				l.handle([]*sluicev1.LeaseMessage{rep})
			}
			continue
		}
		p := v.peers[to]
		if p == nil {
			continue
		}
		for len(msgs) > 0 {
			n := min(len(msgs), maxLeaseBatch)
			batch := msgs[:n]
			msgs = msgs[n:]
			l.st.calls.Add(1)
			l.st.sent.Add(int64(n))
			spawn(func() {
				cctx, cancel := context.WithTimeout(ctx, l.s.forwardTimeout)
				defer cancel()
				began := time.Now()
				resp, err := p.Client().Lease(cctx, &sluicev1.LeaseRequest{Sender: l.s.name, Messages: batch})
				if err != nil {
					l.st.callErrors.Add(1)
					return
				}
				took := time.Since(began)
				old := l.rtt.Load()
				l.rtt.Store(old + (int64(took)-old)/8)
				l.handle(resp.GetMessages())
			})
		}
	}
}

// ahead sends, for each key busy in its current window, a request for the
// next window a lead time before it starts: its demand in the current
// window, so that the next window's allocator lowers the idle regions'
// bases first.
func (l *leases) ahead(now time.Time) {
	lead := l.lead()
	l.hmu.Lock()
	entries := make([]*holderEntry, 0, len(l.hot))
	for e := range l.hot {
		entries = append(entries, e)
	}
	l.hmu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		if bw := e.Wins[bucketLease]; bw != nil {
			// A bucket key gone quiet reports a demand of 0 once, so
			// that its share can go where it is needed.
			var m *sluicev1.LeaseMessage
			if !e.idleSent && time.Since(e.lastCheck) >= bucketPeriod(e.Window) && bw.H.Slice() > 0 {
				e.idleSent = true
				bw.Asked, bw.AskedAt = time.Now(), bw.H.Slice()
				m = l.message(e, sluicev1.LeaseKind_LEASE_KIND_REQUEST, bucketLease)
				m.Want, m.Slice = -bw.H.Slice(), bw.H.Slice()
			}
			quiet := e.idleSent
			sk := ring.Key(nil, e.name, e.key)
			e.mu.Unlock()
			if m != nil {
				l.st.requests.Add(1)
				l.toAllocator(sk, m)
			}
			if quiet {
				l.hmu.Lock()
				delete(l.hot, e)
				l.hmu.Unlock()
			}
			continue
		}
		id := windowID(now, e.Window)
		next := time.Unix(0, (id+1)*int64(e.Window))
		w := e.Wins[id]
		if w == nil || w.Asked.IsZero() || w.Demand == 0 {
			if prev := e.Wins[id-1]; prev == nil || prev.Asked.IsZero() {
				l.hmu.Lock()
				delete(l.hot, e) // quiet for a window
				l.hmu.Unlock()
			}
			e.mu.Unlock()
			continue
		}
		if e.NextWindowSent > id || next.Sub(now) > lead || e.sliding {
			// A sliding window's next allocator closes this window's
			// (lease.Allocator.Slide): it is asked in its window only.
			e.mu.Unlock()
			continue
		}
		e.NextWindowSent = id + 1
		nw := l.win(e, id+1)
		if e.Capped(nw) {
			e.mu.Unlock()
			continue
		}
		_, predicted := e.Estimate(w, now.Sub(time.Unix(0, id*int64(e.Window))))
		predicted = min(predicted, e.Limit)
		var m *sluicev1.LeaseMessage
		if want := predicted - nw.H.Slice(); want > 0 && !e.Known(nw, predicted) {
			nw.Asked, nw.AskedAt, nw.AskedFor = time.Now(), nw.H.Slice(), nw.H.Slice()+want
			m = l.message(e, sluicev1.LeaseKind_LEASE_KIND_REQUEST, id+1)
			m.Want, m.Slice = want, nw.H.Slice()
		}
		sk := ring.Key(nil, e.name, e.key)
		e.mu.Unlock()
		if m != nil {
			l.st.requests.Add(1)
			l.toAllocator(sk, m)
		}
	}
}

// giverSet is the entries of one window length whose last Stand said
// other regions want more than they stand at (hintWanted), and the last
// window id late gave back in.
type giverSet struct {
	m    map[*holderEntry]struct{}
	done int64
}

// giving adds e to the givers of its window length, or takes it out.
func (l *leases) giving(e *holderEntry, on bool) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	g := l.givers[e.Window]
	if g == nil {
		if !on {
			return
		}
		g = &giverSet{m: map[*holderEntry]struct{}{}}
		l.givers[e.Window] = g
	}
	if on {
		g.m[e] = struct{}{}
	} else {
		delete(g.m, e)
	}
}

// late gives back, once a window, for each key whose last Stand said
// other regions want more than they stand at (the givers), what this
// region will not use of its current window's slice: giveBackAhead
// before the window ends (time for the capped regions to be granted it
// and to spend it), it keeps what it admitted and the whole hits its rate would
// admit in what is left of the window, and sends the rest to the
// allocator unasked (LEASE_KIND_GIVE_BACK), which offers it to the
// regions that want more (onGiveBack). A window without a check here
// gives back its whole standing slice. One message a window where a
// Lower, its Ack and the request that set it off were three. now is the
// store's clock.
func (l *leases) late(now time.Time) {
	rtt := time.Duration(l.rtt.Load())
	var todo []*holderEntry
	l.wmu.Lock()
	for w, g := range l.givers {
		id := windowID(now, w)
		end := time.Unix(0, (id+1)*int64(w))
		if g.done >= id || end.Sub(now) > giveBackAhead(rtt, w) {
			continue
		}
		g.done = id
		for e := range g.m {
			todo = append(todo, e)
		}
	}
	l.wmu.Unlock()
	for _, e := range todo {
		if m := l.giveBack(e, now); m != nil {
			l.st.giveBacks.Add(1)
			l.toAllocator(ring.Key(nil, e.name, e.key), m)
		}
	}
}

// giveBack returns e's give-back of its current window (nil when there is
// nothing to give, or its hint no longer asks for one).
func (l *leases) giveBack(e *holderEntry, now time.Time) *sluicev1.LeaseMessage {
	sk := ring.Key(nil, e.name, e.key)
	e.mu.Lock()
	defer e.mu.Unlock()
	id := windowID(now, e.Window)
	expired, gives := e.GivesBack(id)
	if expired {
		l.giving(e, false) // the stands ran out
		return nil
	}
	if !gives || e.sliding || !l.mine(sk) {
		return nil
	}
	w := l.win(e, id)
	if w.Unsure || w.H.Slice() <= 0 {
		return nil
	}
	consumed, ok := l.counted(sk, e, window.FixedWindow, now)
	if !ok {
		return nil
	}
	start := time.Unix(0, id*int64(e.Window))
	w.Consumed = consumed
	var rate float64
	if w.Demand > 0 || e.Wins[id-1] != nil {
		rate, _ = e.Estimate(w, now.Sub(start))
	}
	left := max(start.Add(e.Window).Sub(now), 0)
	k, ok := w.H.GiveBack(consumed+int64(rate*float64(left)), consumed)
	if !ok {
		return nil
	}
	m := l.message(e, sluicev1.LeaseKind_LEASE_KIND_GIVE_BACK, id)
	m.Allocator, m.Seq, m.Slice, m.Consumed = k.Alloc, k.Seq, k.Slice, k.Consumed
	return m
}

// giveBackAll is a leaving node's last word when it is its region's only
// member (its keys go to nobody): for each fixed-window key it holds a
// slice of, in the current window and those ahead, it gives back what it
// has not admitted (lower first: its holders admit nothing more), so that
// each key's allocator records exactly what the region admitted. When
// the node comes back without its state (blind), the allocator counts
// the region at that, not at the slice it held; meanwhile the other
// regions can be granted the rest. A give-back the allocator does not
// take (it crossed a grant or a lower, or the allocator learns) changes
// nothing: the region stays counted at its record (under-admission). The
// messages go out at once, and it waits for their calls (bounded by
// ctx); it returns how many it sent. Call it once no check can be
// decided here any more.
func (l *leases) giveBackAll(ctx context.Context) int {
	v := l.s.view.Load()
	for _, m := range v.members {
		if m.Name != l.s.name {
			return 0 // the keys went to another member of the region, with their counts
		}
	}
	// Twice: a give-back that crossed a grant on its way (the allocator
	// sent a newer message than the holder had applied) is not taken; the
	// grant lands meanwhile (this node still answers lease calls), raises
	// the holder again, and the second round gives that back too.
	n := l.giveBackRound(ctx, v)
	if n > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(l.rtt.Load()) + 2*leaseFlush):
		}
		n += l.giveBackRound(ctx, v)
	}
	return n
}

// giveBackRound is one round of giveBackAll.
func (l *leases) giveBackRound(ctx context.Context, v *view) int {
	now := l.s.store.Now()
	type out struct {
		sk []byte
		m  *sluicev1.LeaseMessage
	}
	var msgs []out
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		entries := slices.Collect(maps.Values(sh.m))
		sh.mu.Unlock()
		for _, e := range entries {
			e.mu.Lock()
			if e.sliding || e.Window <= 0 {
				e.mu.Unlock()
				continue
			}
			sk := ring.Key(nil, e.name, e.key)
			cur := windowID(now, e.Window)
			for id, w := range e.Wins {
				if id < cur || id == bucketLease || w.H.Blind() {
					continue
				}
				var consumed int64
				if id == cur {
					n, ok := l.counted(sk, e, window.FixedWindow, now)
					if !ok {
						continue
					}
					consumed = n
				}
				k, ok := w.H.GiveBack(consumed, consumed)
				if !ok {
					continue
				}
				m := l.message(e, sluicev1.LeaseKind_LEASE_KIND_GIVE_BACK, id)
				m.Allocator, m.Seq, m.Slice, m.Consumed = k.Alloc, k.Seq, k.Slice, k.Consumed
				msgs = append(msgs, out{sk, m})
			}
			e.mu.Unlock()
		}
	}
	if len(msgs) == 0 {
		return 0
	}
	byNode := map[string][]*sluicev1.LeaseMessage{}
	for _, o := range msgs {
		seed := region.SeedOf(o.m.Name, o.m.Key)
		reg := l.allocatorRegion(v, seed)
		if reg == "" {
			continue
		}
		if to := l.ownerIn(v, reg, o.sk); to != "" {
			byNode[to] = append(byNode[to], o.m)
		}
	}
	l.st.giveBacks.Add(int64(len(msgs)))
	l.sendWait(ctx, v, byNode)
	return len(msgs)
}

// sendWait delivers each destination's messages (see deliver) and waits
// for the calls, bounded by ctx.
func (l *leases) sendWait(ctx context.Context, v *view, byNode map[string][]*sluicev1.LeaseMessage) {
	var wg sync.WaitGroup
	l.deliver(ctx, v, byNode, wg.Go)
	wg.Wait()
}

// handOverAll is a leaving node's hand-over when it is its region's only
// member: every allocator state it keeps of a window not ended (buckets
// aside: theirs always learn, and their holders drain what they do not
// know) is closed (it grants nothing more) and its bounds go to the
// key's allocator once this region is gone (the first other region in
// the key's order with a live member), which counts a blind region at no
// more than them once it has learnt (see lease.Allocator.Inherit). It
// waits for the calls (bounded by ctx) and returns how many messages it
// sent. Call it after giveBackAll (whose give-backs to this node's own
// allocators are in the bounds).
func (l *leases) handOverAll(ctx context.Context) int {
	v := l.s.view.Load()
	for _, m := range v.members {
		if m.Name != l.s.name {
			return 0
		}
	}
	now := l.s.store.Now()
	byNode := map[string][]*sluicev1.LeaseMessage{}
	n := 0
	l.amu.Lock()
	for k, ae := range l.allocs {
		if k.window == bucketLease || k.window < windowID(now, ae.window) {
			continue
		}
		ae.a.Close()
		to := ""
		for _, r := range l.order(region.SeedOf(ae.name, ae.key)) {
			if r != l.s.region && v.rings[r] != nil {
				to = l.ownerIn(v, r, []byte(k.key))
				break
			}
		}
		if to == "" {
			continue
		}
		for _, m := range ae.handOver(k.window) {
			byNode[to] = append(byNode[to], m)
			n++
		}
	}
	for k, in := range l.inherited {
		// What former allocators handed here goes on with it.
		for _, r := range l.order(region.SeedOf(in.name, in.key)) {
			if r != l.s.region && v.rings[r] != nil {
				if to := l.ownerIn(v, r, []byte(k.key)); to != "" {
					byNode[to] = append(byNode[to], in.handOver(k.window)...)
					n += len(in.bounds)
				}
				break
			}
		}
	}
	l.amu.Unlock()
	l.sendWait(ctx, v, byNode)
	return n
}

// handOverMoved hands the bounds of each allocator state (of a window,
// not a bucket) this node keeps but is no longer the key's allocator of
// under v (the key's allocator region came back, or the key moved in
// this region's ring) to the key's allocator under v, and forgets the
// state: as stillAllocator does when a message comes for it, but at
// once, so that the new allocator has them before it has learnt.
func (l *leases) handOverMoved(v *view) {
	type out struct {
		to string
		m  *sluicev1.LeaseMessage
	}
	var msgs []out
	l.amu.Lock()
	for k, ae := range l.allocs {
		if k.window == bucketLease || ae.view == v {
			continue
		}
		seed := region.SeedOf(ae.name, ae.key)
		if l.isAllocator(v, seed, []byte(k.key)) {
			ae.view = v
			continue
		}
		delete(l.allocs, k)
		reg := l.allocatorRegion(v, seed)
		if reg == "" {
			continue
		}
		to := l.ownerIn(v, reg, []byte(k.key))
		if to == "" || to == l.s.name {
			continue
		}
		for _, m := range ae.handOver(k.window) {
			msgs = append(msgs, out{to, m})
		}
	}
	for k, in := range l.inherited {
		// What former allocators handed here goes to the key's allocator
		// now, when that is another node.
		seed := region.SeedOf(in.name, in.key)
		if l.isAllocator(v, seed, []byte(k.key)) {
			continue
		}
		reg := l.allocatorRegion(v, seed)
		if reg == "" {
			continue // no majority seen: kept until the view changes again
		}
		delete(l.inherited, k)
		if to := l.ownerIn(v, reg, []byte(k.key)); to != "" && to != l.s.name {
			for _, m := range in.handOver(k.window) {
				msgs = append(msgs, out{to, m})
			}
		}
	}
	l.amu.Unlock()
	for _, o := range msgs {
		l.queue(o.to, o.m)
	}
}

// handOver returns ae's hand-over messages for window id: one per
// region, its bound (lease.Allocator.Bounds) in slice. Requires l.amu.
func (ae *allocEntry) handOver(id int64) []*sluicev1.LeaseMessage {
	var out []*sluicev1.LeaseMessage
	for r, b := range ae.a.Bounds() {
		m := ae.base(sluicev1.LeaseKind_LEASE_KIND_HAND_OVER, r)
		m.WindowId, m.Slice = id, b
		out = append(out, m)
	}
	return out
}

// onHandOver keeps a former allocator's bound of a region for its window
// (see handOverAll): the allocator state of the window takes it, now if
// there is one, else when it is made. Kept until the window ends.
func (l *leases) onHandOver(sk []byte, m *sluicev1.LeaseMessage) {
	if m.WindowId == bucketLease || m.WindowId < windowID(l.s.store.Now(), time.Duration(m.WindowMs)*time.Millisecond) {
		return
	}
	k := allocKey{string(sk), m.WindowId}
	l.amu.Lock()
	defer l.amu.Unlock()
	in := l.inherited[k]
	if in == nil && len(l.inherited) >= maxInherited {
		// Bounded: a bound dropped leaves a blind region counted at what
		// the other regions' reports leave (under-admission, never over).
		return
	}
	if in == nil || in.limit != m.Limit {
		in = &inheritEntry{name: m.Name, key: m.Key, sliding: m.Sliding, limit: m.Limit, window: time.Duration(m.WindowMs) * time.Millisecond, bounds: map[string]int64{}}
		l.inherited[k] = in
	}
	in.bounds[m.Region] = max(in.bounds[m.Region], min(max(m.Slice, 0), m.Limit))
	if ae := l.allocs[k]; ae != nil && ae.limit == m.Limit {
		ae.a.Inherit(map[string]int64{m.Region: in.bounds[m.Region]})
	}
}

// resend sends again the allocators' lowers and reports not acknowledged
// within a lead time, and rebalances the current windows' allocators for
// which a region waits (now: wall clock; storeNow: the store's).
func (l *leases) resend(now, storeNow time.Time) {
	lead := l.lead()
	rtt := time.Duration(l.rtt.Load())
	type out struct {
		reg string
		sk  []byte
		m   *sluicev1.LeaseMessage
	}
	var msgs []out
	l.amu.Lock()
	for k, ae := range l.allocs {
		if !l.stillAllocator(k, ae) {
			continue
		}
		// A region waits for more: take back what the others will not use
		// in what is left of the window (their fair share of the
		// expected demand), once a round trip, and once more, keeping
		// only what they will probably use, at the last moment what it
		// frees can still be granted and spent (reclaimAhead before the
		// window ends); a bucket's, once a round trip.
		var reclaim []lease.Lower
		switch cur := windowID(storeNow, ae.window); {
		case k.window == bucketLease && ae.a.Waiting() && now.Sub(ae.rebalanced) >= rtt:
			ae.rebalanced = now
			reclaim = ae.a.Rebalance()
		case k.window != cur || !ae.a.Waiting() || ae.a.Learning():
		case !ae.reclaimed && time.Unix(0, (cur+1)*int64(ae.window)).Sub(storeNow) <= reclaimAhead(rtt, ae.window):
			ae.rebalanced, ae.reclaimed = now, true
			ae.setLeft(storeNow)
			reclaim = ae.a.Reclaim()
		case now.Sub(ae.rebalanced) >= rtt:
			ae.rebalanced = now
			ae.setLeft(storeNow)
			reclaim = ae.a.Rebalance()
		}
		for _, lw := range reclaim {
			ae.sent = now
			l.st.lowers.Add(1)
			msgs = append(msgs, out{lw.Region, []byte(k.key), ae.lowerMessage(lw)})
		}
		if now.Sub(ae.sent) < lead {
			continue
		}
		for _, lw := range ae.a.Pending() {
			ae.sent = now
			msgs = append(msgs, out{lw.Region, []byte(k.key), ae.lowerMessage(lw)})
		}
	}
	l.planStands(now, storeNow, lead, func(reg string, sk []byte, m *sluicev1.LeaseMessage) {
		msgs = append(msgs, out{reg, sk, m})
	})
	l.amu.Unlock()
	for _, o := range msgs {
		l.toHolder(o.reg, o.sk, o.m)
	}
}

// planStands sets the standing slices of the keys this node allocates:
// each region's fair share (lease.FairStands) of its demand per window as
// the windows that ended showed it (a moving average; see feedStands),
// when it moved by standStep or more from what the region stands at, for
// the windows from the one after the current one to a stand's reach; it
// renews a standing slice other than the base when less than half its
// reach is left, and sends again the stands not acknowledged within a
// lead time. A stand that raises a region waits (lease.Stands.Set
// refuses it) until the lowers it needs were acknowledged. emit queues a
// message for a region's owner of a key. Requires l.amu.
func (l *leases) planStands(now, storeNow time.Time, lead time.Duration, emit func(reg string, sk []byte, m *sluicev1.LeaseMessage)) {
	for sk, se := range l.stands {
		if !l.stillStands(sk, se) {
			continue
		}
		cur := windowID(storeNow, se.window)
		if ae := l.allocs[allocKey{sk, cur - 1}]; ae != nil {
			l.feedStands(sk, cur-1, ae) // the window that just ended
		}
		for _, st := range se.Plan(cur, standReach(se.window), l.regionNames(), l.bases(se.Limit, se.seed)) {
			l.st.stands.Add(1)
			se.sent = now
			emit(st.Region, []byte(sk), se.standMessage(st))
		}
		if now.Sub(se.sent) >= lead {
			for _, st := range se.St.Pending() {
				se.sent = now
				emit(st.Region, []byte(sk), se.standMessage(st))
			}
		}
	}
}

// standMessage returns st as a message, with its hint (lease.KeyStands.Tell).
func (se *standEntry) standMessage(st lease.Stand) *sluicev1.LeaseMessage {
	demand, wanted := se.Tell(st)
	return &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_STAND, Name: se.name, Key: se.key, WindowId: st.From,
		Through: st.Through, WindowMs: se.window.Milliseconds(), Limit: se.Limit, Region: st.Region, Allocator: st.Alloc,
		Seq: st.Seq, Slice: st.Slice, DemandMilli: demand, Wanted: wanted}
}

// feedStands adds what the ended window id of ae showed of each region's
// demand to its key's moving average (lease.KeyStands.Feed). Requires
// l.amu.
func (l *leases) feedStands(sk string, id int64, ae *allocEntry) {
	if se := l.stands[sk]; se != nil && se.Limit == ae.limit && se.window == ae.window {
		se.Feed(id, ae.a)
	}
}

// regionNames returns the configured regions' names, in order.
func (l *leases) regionNames() []string {
	regs := l.s.regions.Regions()
	out := make([]string, len(regs))
	for i, r := range regs {
		out[i] = r.Name
	}
	return out
}

// giveBackAhead is how long before a window ends its regions give back
// what they will not use (late): what they free goes to the capped
// regions by a grant of the allocator's, and must still be spent there:
// a round trip and a half (the give-back to the allocator, the grant to
// the capped region, the jitter of both), two lease flushes, and a fifth
// of the window to spend it in (a twentieth was too little: four light
// regions' hits offered at once take a capped region of 27 hits a second
// 150 ms to spend, and 90/10 skew lost 2-4 points at 50 ms). The later it
// goes, the more of the window the region's rate is measured over: a
// round trip before the allocator's reclaim (reclaimAhead), as it was,
// gave back at 150 ms into a 1 s window with 200 ms round trips, from a
// guess of what the light regions of a skewed key would use (what they
// kept and did not use was lost: skew at 200 ms 0.92-0.93, 0.96-0.97
// since). Capped regions do not wait, so the reclaim does not run for
// them.
func giveBackAhead(rtt, w time.Duration) time.Duration {
	return 3*rtt/2 + 2*leaseFlush + w/5
}

// reclaimAhead is how long before a window ends its allocator reclaims
// what regions will not use for the regions that wait (Allocator.Reclaim):
// three lease round trips (the Lower and its Ack, then the Grant: one and
// a half at most, and time for the regions that wait to spend what it
// frees: at 200 ms round trips in 1 s windows two were too few, 2-3
// points of utilisation under skew) and a twentieth of the window.
func reclaimAhead(rtt, w time.Duration) time.Duration { return 3*rtt + w/20 }

// sweep forgets the holders and allocators of windows that ended.
func (l *leases) sweep(now time.Time) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			id := windowID(now, e.Window)
			e.Fold(id) // the region's demand average: the windows that ended since the last sweep
			for wid := range e.Wins {
				// A bucket's holder is forgotten only when idle and back at
				// its base: one that was lowered must stay lowered (made
				// again, it would start at its base, above the allocator's
				// record).
				if wid != bucketLease && wid < id-1 {
					hw := e.Wins[wid]
					p := l.pool(e.name)
					p.slice.Add(hw.H.Slice())
					p.used.Add(min(hw.Consumed, hw.H.Slice()))
				}
				if (wid != bucketLease && wid < id-1) || (wid == bucketLease && time.Since(e.touched) > bucketIdle && e.Wins[wid].H.Slice() == e.Wins[wid].H.Base()) {
					delete(e.Wins, wid)
				}
			}
			if e.Stand.Forget(id-1) && len(e.Wins) == 0 {
				// A standing slice other than the base keeps the entry:
				// made again, it would start at the base.
				delete(sh.m, k)
				l.hmu.Lock()
				delete(l.hot, e)
				l.hmu.Unlock()
				l.giving(e, false)
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	l.amu.Lock()
	for k, ae := range l.allocs {
		if k.window != bucketLease && k.window < windowID(now, ae.window)-1 && !ae.a.Learning() {
			l.pool(ae.name).free.Add(ae.a.Free())
			l.feedStands(k.key, k.window, ae)
		}
		if (k.window != bucketLease && k.window < windowID(now, ae.window)-1) || (k.window == bucketLease && time.Since(ae.touched) > bucketIdle) {
			delete(l.allocs, k)
		}
	}
	for k, in := range l.inherited {
		if k.window < windowID(now, in.window) {
			delete(l.inherited, k)
		}
	}
	for sk, se := range l.stands {
		// Forgotten when every region is back at its base for good and
		// no window was allocated for a while: made again, it knows all
		// it needs (nothing it set runs any more).
		if se.St.Forget(windowID(now, se.window)-1) && time.Since(se.touched) > standIdle(se.window) {
			delete(l.stands, sk)
		}
	}
	l.amu.Unlock()
}

// standIdle is how long a key's standing slices, all back at the bases,
// are kept (with the demand they learnt) after its last allocated window.
func standIdle(w time.Duration) time.Duration { return max(time.Minute, 4*w) }

// setLeft tells the allocator how much of its window is still to come at
// now (store clock).
func (ae *allocEntry) setLeft(now time.Time) {
	if ae.a.Window() == bucketLease {
		return // no window: a region's need is what it last reported
	}
	end := time.Unix(0, (ae.a.Window()+1)*int64(ae.window))
	ae.a.SetLeft(float64(end.Sub(now)) / float64(ae.window))
}

func (ae *allocEntry) base(kind sluicev1.LeaseKind, reg string) *sluicev1.LeaseMessage {
	return &sluicev1.LeaseMessage{Kind: kind, Name: ae.name, Key: ae.key, WindowId: ae.a.Window(),
		WindowMs: ae.window.Milliseconds(), Limit: ae.limit, Region: reg, Allocator: ae.a.ID(), Sliding: ae.sliding}
}

func (ae *allocEntry) lowerMessage(lw lease.Lower) *sluicev1.LeaseMessage {
	m := ae.base(sluicev1.LeaseKind_LEASE_KIND_LOWER, lw.Region)
	m.Seq, m.Target = lw.Seq, lw.Target
	return m
}

func (ae *allocEntry) grantMessage(g lease.Grant) *sluicev1.LeaseMessage {
	m := ae.base(sluicev1.LeaseKind_LEASE_KIND_GRANT, g.Region)
	m.Seq, m.Slice, m.Nonce, m.Spent = g.Seq, g.Slice, g.Nonce, g.Spent
	return m
}

// viewChanged notes a new view: a change of this node's own ring, and the
// regions that lost their last live member. Requires s.setMu.
func (l *leases) viewChanged(v *view) {
	old := l.hist.Load()
	now := l.s.store.Now().UnixNano()
	h := &leaseHistory{ownChanged: old.ownChanged, anyChanged: old.anyChanged, started: old.started, ring: old.ring, prev: old.prev,
		live: map[string]bool{}, goneAt: maps.Clone(old.goneAt)}
	if old.ring == nil || v.ring.Fingerprint() != old.ring.Fingerprint() {
		h.ownChanged, h.ring, h.prev = now, v.ring, old.ring
	}
	if !l.blindSettled.Load() && len(v.all) > 1 {
		// The first view that holds another member: this node has joined.
		// A region of its own alone: nobody holds its keys' counts,
		// unless the cluster began with this node (see founder).
		// With another member of its region, the keys' counts come back
		// from it (hand-off, pull) unless it lost them too: a key with no
		// state here is blind (blindWin).
		l.shared.Store(len(v.members) > 1)
		if l.founder(v) {
			l.knowsState()
		} else {
			l.blindSettled.Store(true)
		}
	}
	for _, m := range v.all {
		if m.Since > 0 && m.Since < l.since.Load() {
			l.since.Store(m.Since)
		}
	}
	for _, r := range l.s.regions.Regions() {
		h.live[r.Name] = r.Name == l.s.region || v.rings[r.Name] != nil
		if old.live[r.Name] && !h.live[r.Name] {
			h.goneAt[r.Name] = now
		}
		if old.live[r.Name] != h.live[r.Name] {
			h.anyChanged = now
		}
	}
	l.hist.Store(h)
}

// learningHorizon is how long after a change of allocator another
// allocator's grants or stands may still be live for a window: the
// window itself, the next one (requests go ahead of it), a stand's reach
// past the current window and three more (the clocks' offsets and the
// round's delay), and the time a cut-off former allocator takes to see
// that it lost the majority (memberlist's failure detection, seconds).
func learningHorizon(w time.Duration) time.Duration {
	return 2*w + 10*time.Second + time.Duration(standReach(w)+3)*w
}

// standReach is how many windows past its current one an allocator's
// stand may reach (Through): 8 s of windows, at least 4. A stand is
// renewed when it has less than half of that left to run (the window
// after the current one, where a renewal starts, is then still covered),
// so that a region's standing slice costs two messages (the
// Stand and its Ack) every 4 s or so while it differs from the base
// (every other window, for windows of 2 s or more). The learning horizon
// (how long a new allocator learns each window before it plans stands
// again) and the windows a restarted node's holders start at 0 in
// (unsure) grow with it.
func standReach(w time.Duration) int64 {
	return max(4, int64((8*time.Second+w-1)/w))
}

// LeaseLearningHorizon returns how long after a node starts (or its ring
// changes) its allocators of a limit whose window is w (ns) still start
// in learning mode: they grant nothing in a window until every region
// reported what it holds (a round trip, and two messages per region, per
// key and window). A cluster measured for its steady state is measured
// after it.
func LeaseLearningHorizon(w time.Duration) time.Duration { return learningHorizon(w) }

// learning reports whether this node's allocator of window id (length w)
// of the key of seed, created now, must learn first: another allocator
// may have granted or set stands in that window, because this node's own
// ring changed (the key may have had another owner here), a region
// gained its first live member or lost its last (the key's allocator
// region may have been another while this node saw no majority, or saw
// a region before its own live), or a region that comes before this one
// in the key's order (and so was the key's allocator region while it was
// live) was live, within the learning horizon before the window's start.
func (l *leases) learning(id int64, w time.Duration, seed uint64) bool {
	h := l.hist.Load()
	since := id*int64(w) - int64(learningHorizon(w))
	if h.ownChanged > since || h.anyChanged > since {
		return true
	}
	for _, r := range l.order(seed) {
		if r == l.s.region {
			return false
		}
		if h.goneAt[r] > since {
			return true
		}
	}
	return false
}

// order returns the regions in the key of seed's allocator order
// (rendezvous hashing: by a hash of the key and the region's name).
func (l *leases) order(seed uint64) []string {
	regs := l.s.regions.Regions()
	type scored struct {
		name  string
		score uint64
	}
	sc := make([]scored, len(regs))
	for i, r := range regs {
		sc[i] = scored{r.Name, mix(xxhash.Sum64String(r.Name) ^ seed)}
	}
	slices.SortFunc(sc, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, len(sc))
	for i, x := range sc {
		out[i] = x.name
	}
	return out
}

// validLease checks a peer's lease message; it returns the reason it is
// refused ("" when it is not).
func (l *leases) validLease(m *sluicev1.LeaseMessage) string {
	switch {
	case m.GetWindowMs() <= 0 || m.GetWindowMs() > int64(window.MaxWindow/time.Millisecond):
		return "window_ms out of range"
	case m.GetLimit() <= 0 || m.GetLimit() > window.MaxLimit:
		return "limit out of range"
	case !l.s.regions.Has(m.GetRegion()):
		return "region not in the region list"
	case len(m.GetName()) == 0 || len(m.GetName()) > 256 || len(m.GetKey()) > 4096:
		return "name or key length out of range"
	case m.GetKind() == sluicev1.LeaseKind_LEASE_KIND_STAND && (m.GetThrough()-m.GetWindowId() > 1_000_000 || m.GetWindowId() < 0):
		return "stand's windows out of range"
	case m.GetWindowId() < bucketLease && m.GetKind() != sluicev1.LeaseKind_LEASE_KIND_STAND_ACK:
		return "window_id out of range" // (a StandAck's is the newest window made, math.MinInt64 for none)
	case m.GetKind() != sluicev1.LeaseKind_LEASE_KIND_STAND && m.GetKind() != sluicev1.LeaseKind_LEASE_KIND_STAND_ACK &&
		m.GetWindowId() > l.latestWindow(time.Duration(m.GetWindowMs())*time.Millisecond):
		// Messages go for the current window and the next one: a window
		// further ahead would make an allocator state no sweep forgets.
		return "window_id too far ahead"
	}
	return ""
}

// latestWindow is the newest window id of length w (> 0) a window's lease
// message may name here: two windows and 10 s past this node's current
// one (the clocks of the regions may differ).
func (l *leases) latestWindow(w time.Duration) int64 {
	return windowID(l.s.store.Now(), w) + 2 + int64(10*time.Second/w)
}

// handle applies lease messages and returns the replies to send back to
// their sender (Grants for Requests, Acks for Lowers); what goes to other
// nodes is queued.
func (l *leases) handle(msgs []*sluicev1.LeaseMessage) []*sluicev1.LeaseMessage {
	var replies []*sluicev1.LeaseMessage
	for _, m := range msgs {
		if l.validLease(m) != "" {
			continue
		}
		sk := ring.Key(nil, m.Name, m.Key)
		switch m.Kind {
		case sluicev1.LeaseKind_LEASE_KIND_REQUEST:
			replies = append(replies, l.onRequest(sk, m)...)
		case sluicev1.LeaseKind_LEASE_KIND_GRANT:
			l.onGrant(sk, m)
		case sluicev1.LeaseKind_LEASE_KIND_LOWER:
			if k := l.onLower(sk, m); k != nil {
				replies = append(replies, k)
			}
		case sluicev1.LeaseKind_LEASE_KIND_ACK:
			l.onAck(sk, m)
		case sluicev1.LeaseKind_LEASE_KIND_STAND:
			if k := l.onStand(sk, m); k != nil {
				replies = append(replies, k)
			}
		case sluicev1.LeaseKind_LEASE_KIND_STAND_ACK:
			l.onStandAck(sk, m)
		case sluicev1.LeaseKind_LEASE_KIND_GIVE_BACK:
			l.onGiveBack(sk, m)
		case sluicev1.LeaseKind_LEASE_KIND_HAND_OVER:
			l.onHandOver(sk, m)
		}
	}
	return replies
}

// stillAllocator reports whether this node is still the allocator of ae's
// key under its current view, and forgets ae when it is not: an allocator
// state acts (grants, lowers) only while its node is the key's allocator,
// so that two allocators never grant from one pool at once (the next one
// learns first). Requires l.amu.
func (l *leases) stillAllocator(k allocKey, ae *allocEntry) bool {
	v := l.s.view.Load()
	if ae.view == v {
		return true
	}
	seed := region.SeedOf(ae.name, ae.key)
	if l.isAllocator(v, seed, []byte(k.key)) {
		ae.view = v
		return true
	}
	delete(l.allocs, k)
	// Handed over as handOverMoved would (it may not have run for v yet):
	// a later allocator's bounds must never be missing where an earlier
	// one's are inherited (lease.Allocator.Inherit).
	if k.window != bucketLease {
		if reg := l.allocatorRegion(v, seed); reg != "" {
			if to := l.ownerIn(v, reg, []byte(k.key)); to != "" && to != l.s.name {
				for _, m := range ae.handOver(k.window) {
					l.handq = append(l.handq, queued{to, m})
				}
			}
		}
	}
	return false
}

// queued is a lease message to queue for a node.
type queued struct {
	to string
	m  *sluicev1.LeaseMessage
}

// sendHandq queues the hand-overs stillAllocator left (it runs under
// l.amu, and queueing takes l.omu).
func (l *leases) sendHandq() {
	l.amu.Lock()
	q := l.handq
	l.handq = nil
	l.amu.Unlock()
	for _, o := range q {
		l.queue(o.to, o.m)
	}
}

// isAllocator reports whether this node is the allocator of the key of
// seed and store key sk under v: its owner in the key's allocator region,
// that region being this node's.
func (l *leases) isAllocator(v *view, seed uint64, sk []byte) bool {
	return l.allocatorRegion(v, seed) == l.s.region && l.ownerIn(v, l.s.region, sk) == l.s.name
}

// restate returns a Stand that states again, to a region whose holder
// does not know its standing slice (its node restarted, or the key moved
// to it: see unsure), the standing slice the allocator has for it, from
// the first window it may set (nil when a Stand to it is in flight, it
// may set none yet, or there are no stands). Requires l.amu.
func (l *leases) restate(sk []byte, m *sluicev1.LeaseMessage) *sluicev1.LeaseMessage {
	se := l.stands[string(sk)]
	if se == nil || se.Limit != m.Limit || se.window != time.Duration(m.WindowMs)*time.Millisecond || se.St.Busy(m.Region) {
		return nil
	}
	from := se.FirstPlannable(windowID(l.s.store.Now(), se.window))
	last, _ := se.St.Through(m.Region)
	st, ok := se.St.Set(m.Region, from, max(last, from), se.St.At(m.Region, from))
	if !ok {
		return nil
	}
	l.st.stands.Add(1)
	se.sent = time.Now()
	return se.standMessage(st)
}

// stillStands is stillAllocator for a key's standing slices: it forgets
// se when this node is no longer the key's allocator (what it set runs
// out by window id; the next allocator plans only after that). Requires
// l.amu.
func (l *leases) stillStands(sk string, se *standEntry) bool {
	v := l.s.view.Load()
	if se.view == v {
		return true
	}
	if l.isAllocator(v, se.seed, []byte(sk)) {
		se.view = v
		return true
	}
	delete(l.stands, sk)
	return false
}

// alloc returns the allocator state of m's key and window, creating it
// when this node is the key's allocator (nil when it is not).
func (l *leases) alloc(sk []byte, m *sluicev1.LeaseMessage, create bool) *allocEntry {
	k := allocKey{string(sk), m.WindowId}
	w := time.Duration(m.WindowMs) * time.Millisecond
	l.amu.Lock()
	defer l.amu.Unlock()
	ae := l.allocs[k]
	if ae != nil && !l.stillAllocator(k, ae) {
		ae = nil
	}
	if ae != nil && ae.limit == m.Limit && ae.window == w {
		ae.touched = time.Now()
		return ae
	}
	if !create {
		return nil
	}
	v := l.s.view.Load()
	seed := region.SeedOf(m.Name, m.Key)
	if !l.isAllocator(v, seed, sk) {
		return nil
	}
	// A window whose limit changed learns too: the regions may hold
	// grants of the old limit's allocator. So does every bucket's: its
	// leases outlive any allocator state (they have no window to end).
	learning := ae != nil || m.WindowId == bucketLease || l.learning(m.WindowId, w, seed)
	starts := l.bases(m.Limit, seed)
	var demand map[string]int64
	if m.WindowId != bucketLease && !m.Sliding {
		// A fixed window starts at the regions' standing slices, and
		// from their demand in the last window (Allocator.Demands); with
		// no last window here, from the demand the stands learnt (none:
		// a key's first window takes the bases of the regions that do
		// not ask).
		demand = map[string]int64{}
		if se := l.standsOf(sk, m, seed, v); se != nil {
			starts = se.St.Starts(m.WindowId)
			se.St.Made(m.WindowId)
			se.touched = time.Now()
			for r, d := range se.Demand {
				demand[r] = int64(math.Round(d))
			}
		}
		if prev := l.allocs[allocKey{string(sk), m.WindowId - 1}]; prev != nil && prev.limit == m.Limit && !prev.a.Learning() {
			// The last window's, for the regions heard from in it (or all,
			// with no stands): a region quiet in it (capped, spending what
			// it stands at) keeps the demand the stands learnt.
			for r, d := range prev.a.Demands() {
				if _, ok := demand[r]; !ok || prev.a.Heard(r) {
					demand[r] = d
				}
			}
		}
	}
	if m.Sliding && m.WindowId != bucketLease {
		// A sliding window's regions start at their bases (no stands:
		// a standing slice raised from a window on would let a region
		// admit while another's count of the window before, lowered,
		// still counts), from the last window's demand.
		demand = map[string]int64{}
		if prev := l.allocs[allocKey{string(sk), m.WindowId - 1}]; prev != nil && prev.limit == m.Limit && !prev.a.Learning() {
			demand = prev.a.Demands()
		}
	}
	a, err := lease.NewAllocator(l.inc|(l.ids.Add(1)&0xffffffff), m.WindowId, m.Limit, starts, demand, learning)
	if err != nil {
		return nil
	}
	if m.Sliding && m.WindowId != bucketLease {
		// Each region's count of the window before still counts in this
		// one: its records there start this window's, and it grants no
		// more; and what a region admits here counts in the next window,
		// which its holder starts at its base (the floors). Standing
		// slices of the key (made while it was a fixed window's) go.
		delete(l.stands, string(sk))
		carry := map[string]int64{}
		if prev := l.allocs[allocKey{string(sk), m.WindowId - 1}]; prev != nil && prev.limit == m.Limit {
			prev.a.Close()
			for _, r := range l.s.regions.Regions() {
				carry[r.Name] = prev.a.Record(r.Name)
			}
		}
		// With no allocator of the window before here, none granted in it
		// (or this one learns: the regions' reports say their estimates),
		// and the regions held their bases, which the records start at.
		a.Slide(carry, starts)
	}
	if in := l.inherited[k]; in != nil && in.limit == m.Limit {
		a.Inherit(in.bounds)
	}
	ae = &allocEntry{name: m.Name, key: m.Key, window: w, limit: m.Limit, a: a, touched: time.Now(), view: v, sliding: m.Sliding && m.WindowId != bucketLease}
	l.allocs[k] = ae
	return ae
}

// standsOf returns the standing slices of m's key (a fixed window), made
// when there are none (or its limit or window changed) with a floor: the
// first window, the one after the current one or later (after the old
// stands' reach, when the limit or window changed), that this node's
// allocator would not have to learn (learning: another allocator may
// have set stands running until then). Requires l.amu, and that this
// node is the key's allocator under v.
func (l *leases) standsOf(sk []byte, m *sluicev1.LeaseMessage, seed uint64, v *view) *standEntry {
	w := time.Duration(m.WindowMs) * time.Millisecond
	se := l.stands[string(sk)]
	if se != nil && se.Limit == m.Limit && se.window == w {
		return se
	}
	cur := windowID(l.s.store.Now(), w)
	floor := cur + 1
	if se != nil {
		// The key's limit or window changed: the regions' holders of the
		// old one may hold its stands until they run out.
		floor = cur + standReach(se.window)*int64(se.window)/int64(w) + 3
	}
	for l.learning(floor, w, seed) && floor < cur+1_000_000 {
		floor++
	}
	st, err := lease.NewStands(l.inc|(l.ids.Add(1)&0xffffffff), m.Limit, l.bases(m.Limit, seed), floor)
	if err != nil {
		return nil // the bases never add up to more than the limit (baseOf)
	}
	se = &standEntry{KeyStands: lease.NewKeyStands(m.Limit, st), name: m.Name, key: m.Key, window: w, seed: seed, touched: time.Now(), view: v}
	l.stands[string(sk)] = se
	return se
}

func (l *leases) onRequest(sk []byte, m *sluicev1.LeaseMessage) []*sluicev1.LeaseMessage {
	ae := l.alloc(sk, m, true)
	if ae == nil {
		return nil
	}
	l.amu.Lock()
	ae.setLeft(l.s.store.Now())
	fresh := ae.sent.IsZero()
	var lowers []lease.Lower
	if fresh {
		ae.sent = time.Now()
		lowers = append(lowers, ae.a.Pending()...) // learning mode's reports
	}
	gs, ls := ae.a.OnRequest(lease.Request{Region: m.Region, Window: m.WindowId, Want: m.Want, Consumed: m.Consumed, Slice: m.Slice, Nonce: m.Nonce, Blind: m.Blind})
	lowers = append(lowers, ls...)
	var restate *sluicev1.LeaseMessage
	if m.Unsure && m.WindowId != bucketLease {
		restate = l.restate(sk, m)
	}
	if fresh && !ae.a.Learning() {
		lowers = append(lowers, ae.a.Rebalance()...)
	}
	var replies []*sluicev1.LeaseMessage
	var others []*sluicev1.LeaseMessage
	for _, g := range gs {
		l.st.grants.Add(1)
		if g.Region == m.Region {
			replies = append(replies, ae.grantMessage(g))
		} else {
			others = append(others, ae.grantMessage(g))
		}
	}
	for _, lw := range lowers {
		others = append(others, ae.lowerMessage(lw))
	}
	if len(lowers) > 0 {
		ae.sent = time.Now()
	}
	if restate != nil {
		others = append(others, restate)
	}
	l.amu.Unlock()
	for _, o := range others {
		if o.Kind == sluicev1.LeaseKind_LEASE_KIND_LOWER {
			l.st.lowers.Add(1)
		}
		l.toHolder(o.Region, sk, o)
	}
	return replies
}

func (l *leases) onAck(sk []byte, m *sluicev1.LeaseMessage) {
	ae := l.alloc(sk, m, false)
	if ae == nil {
		return
	}
	l.amu.Lock()
	ae.setLeft(l.s.store.Now())
	before := ae.a.Record(m.Region)
	gs, ls := ae.a.OnAck(lease.Ack{Region: m.Region, Window: m.WindowId, Alloc: m.Allocator, Seq: m.Seq, Slice: m.Slice, Consumed: m.Consumed, Follows: m.Follows,
		Blind: m.Blind, Nonce: m.Nonce})
	if after := ae.a.Record(m.Region); after < before && !ae.a.Learning() {
		l.st.givenBack.Add(before - after)
	}
	l.st.acks.Add(1)
	msgs := make([]*sluicev1.LeaseMessage, 0, len(gs))
	for _, g := range gs {
		l.st.grants.Add(1)
		msgs = append(msgs, ae.grantMessage(g))
	}
	for _, lw := range ls {
		l.st.lowers.Add(1)
		msgs = append(msgs, ae.lowerMessage(lw))
	}
	if len(ls) > 0 {
		ae.sent = time.Now()
	}
	l.amu.Unlock()
	for _, g := range msgs {
		l.toHolder(g.Region, sk, g)
	}
}

// onGiveBack applies a region's give-back (see late): what it frees goes
// to the regions waiting, then to the regions its key's standing slices
// say want more than they hold (hunger), by fair share. A give-back that
// makes the window's allocator, in learning mode, sends its reports.
func (l *leases) onGiveBack(sk []byte, m *sluicev1.LeaseMessage) {
	if m.WindowId == bucketLease {
		return
	}
	ae := l.alloc(sk, m, true)
	if ae == nil {
		return
	}
	l.amu.Lock()
	ae.setLeft(l.s.store.Now())
	var gs []lease.Grant
	var ls []lease.Lower
	if ae.a.Learning() {
		if ae.sent.IsZero() {
			ae.sent = time.Now()
			ls = ae.a.Pending()
		}
	} else {
		before := ae.a.Record(m.Region)
		var ok bool
		gs, ok = ae.a.OnGiveBack(lease.Ack{Region: m.Region, Window: m.WindowId, Alloc: m.Allocator, Seq: m.Seq, Slice: m.Slice, Consumed: m.Consumed,
			Blind: m.Blind, Nonce: m.Nonce})
		if ok {
			l.st.givenBack.Add(before - ae.a.Record(m.Region))
			gs = append(gs, ae.a.Offer(l.hunger(sk, ae, m.Region))...)
		}
	}
	msgs := make([]*sluicev1.LeaseMessage, 0, len(gs)+len(ls))
	for _, g := range gs {
		l.st.grants.Add(1)
		msgs = append(msgs, ae.grantMessage(g))
	}
	for _, lw := range ls {
		msgs = append(msgs, ae.lowerMessage(lw))
	}
	l.amu.Unlock()
	for _, o := range msgs {
		l.toHolder(o.Region, sk, o)
	}
}

// hunger returns the hits each capped region but except wants beyond
// what ae records it holds, by the demand the key's standing slices were
// planned from (lease.KeyStands.Hunger; none when there are none).
// Requires l.amu.
func (l *leases) hunger(sk []byte, ae *allocEntry, except string) map[string]int64 {
	se := l.stands[string(sk)]
	if se == nil || se.Limit != ae.limit || se.window != ae.window {
		return nil
	}
	return se.Hunger(ae.a, except)
}

// mine reports whether this node owns the key of sk in its region.
func (l *leases) mine(sk []byte) bool { return l.s.view.Load().ring.Owner(sk) == l.s.name }

func (l *leases) onGrant(sk []byte, m *sluicev1.LeaseMessage) {
	if m.Region != l.s.region || !l.mine(sk) {
		return
	}
	e := l.entryOf(sk, m)
	if e == nil {
		return
	}
	e.mu.Lock()
	e.touched = time.Now()
	w := l.win(e, m.WindowId)
	before := w.H.Slice()
	// A slice is never more than the limit, whatever a peer says.
	raised := w.H.OnGrant(lease.Grant{Region: m.Region, Window: m.WindowId, Alloc: m.Allocator, Seq: m.Seq, Slice: min(m.Slice, e.Limit), Nonce: m.Nonce,
		Spent: min(max(m.Spent, 0), e.Limit)})
	if sp := w.H.TakeSpent(); sp > 0 && m.WindowId != bucketLease {
		l.spend(sk, e, w, sp)
	}
	if raised {
		l.st.grantedHits.Add(w.H.Slice() - before)
		if m.WindowId == bucketLease {
			l.rerate(sk, e, e.Window, w.H, l.s.store.Now())
		}
	}
	e.mu.Unlock()
}

// spend counts, in the region's window of the key, what a grant said its
// region had spent before its blind holder w was made (lease.Holder.
// StartBlind): the window's count (a sliding window's estimate) is raised
// to at least spent hits, so that what the region admits from now on is
// what its slice holds beyond them. A window that has ended needs none.
// Requires e.mu.
func (l *leases) spend(sk []byte, e *holderEntry, w *holderWin, spent int64) {
	now := l.s.store.Now()
	if w.H.Window() != windowID(now, e.Window) {
		return
	}
	a := algorithmOf(e)
	n, ok := l.counted(sk, e, a, now)
	if !ok || n >= spent {
		return
	}
	d, err := l.s.store.ApplyBytes(sk, window.Check{Algorithm: a, Limit: e.Limit, Window: e.Window, Hits: spent - n}, now)
	if err != nil || !d.Allowed {
		return // spent is at most the limit, and the count below it: cannot happen
	}
	if l.s.replication.Factor > 0 {
		l.s.dirty.Add(sk)
	}
	w.Consumed = max(w.Consumed, spent)
	l.st.blindSpent.Add(spent - n)
}

// bucketUsed returns what the region's bucket of the key holds of its
// share now, in slice units (hits per window): the share whose burst
// holds the bucket's debt (hits admitted and not yet drained), rounded
// up; 0 when the store holds nothing of the key; the whole slice when
// it does but the bucket's capacity is not known here yet (state handed
// here before any check came: a lower then frees nothing). Requires e.mu.
func (l *leases) bucketUsed(sk []byte, e *holderEntry, w time.Duration, slice int64, now time.Time) int64 {
	if _, ok := l.s.store.Get(string(sk)); !ok {
		return 0
	}
	if e.capacity <= 0 || e.algorithm == 0 {
		return slice
	}
	c := window.Check{Algorithm: e.algorithm, Limit: max(slice, 1), Burst: e.capacity, Window: w}
	d, err := l.s.store.ApplyBytes(sk, c, now)
	if err != nil {
		return slice
	}
	used := e.capacity - d.Remaining // hits of debt, rounded up
	return min((used*e.Limit+e.capacity-1)/e.capacity, e.Limit)
}

// rerate makes the region's bucket of the key drain at h's slice from now
// on (at least 1 hit per window: a rate of 0 is no bucket; a region whose
// share is 0 admits nothing, and what refills meanwhile is at most its
// burst share when a grant comes). Requires e.mu.
func (l *leases) rerate(sk []byte, e *holderEntry, w time.Duration, h *lease.Holder, now time.Time) {
	for _, a := range []window.Algorithm{window.TokenBucket, window.LeakyBucket} {
		if e.algorithm != 0 && a != e.algorithm {
			continue
		}
		c := window.Check{Algorithm: a, Limit: max(h.Slice(), 1), Window: w}
		if ok, _ := l.s.store.Rerate(sk, c, now); ok {
			return
		}
	}
}

// onLower lowers this region's slice of the key's window (when this node
// owns the key in its region: only the owner's window holds the region's
// count) and returns the Ack.
func (l *leases) onLower(sk []byte, m *sluicev1.LeaseMessage) *sluicev1.LeaseMessage {
	if m.Region != l.s.region || !l.mine(sk) {
		return nil
	}
	wd := time.Duration(m.WindowMs) * time.Millisecond
	e, ok := l.entryFor(sk, m.Name, m.Key, wd, m.Limit, m.Sliding, false)
	if !ok {
		if m.Target == lease.ReportOnly && m.WindowId != bucketLease {
			return l.reportOther(sk, e, m)
		}
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.touched = time.Now()
	if e.sliding && m.WindowId > windowID(l.s.store.Now(), wd) {
		// A sliding window's region still in the window before (its
		// clock behind the allocator's): what it admits there still
		// counts in this one and may still grow, so it answers once it
		// is in the window (the allocator sends the Lower again).
		return nil
	}
	w := l.win(e, m.WindowId)
	now := l.s.store.Now()
	var consumed int64
	switch cur := windowID(now, wd); {
	case m.WindowId == bucketLease:
		// A bucket's share keeps what its region admitted and has not
		// yet drained (its debt, in slice units: the burst share that
		// holds it), and its debt drains at the lowered rate from now on.
		consumed = l.bucketUsed(sk, e, wd, w.H.Slice(), now)
		defer l.rerate(sk, e, wd, w.H, now)
	case m.WindowId == cur:
		n, ok := l.counted(sk, e, algorithmOf(e), now)
		if !ok {
			return nil
		}
		consumed = n
		w.Consumed = consumed
	case m.WindowId < cur:
		consumed = w.H.Slice() // over: nothing more is admitted in it, nothing can be freed
	}
	k, ok := w.H.OnLower(lease.Lower{Region: m.Region, Window: m.WindowId, Alloc: m.Allocator, Seq: m.Seq, Target: m.Target}, consumed)
	if !ok {
		return nil
	}
	if m.Target != lease.ReportOnly {
		w.AskedFor = 0 // the allocator forgot what the region waited for
	}
	a := &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_ACK, Name: m.Name, Key: m.Key, WindowId: m.WindowId,
		WindowMs: m.WindowMs, Limit: m.Limit, Region: m.Region, Allocator: k.Alloc, Seq: k.Seq, Slice: k.Slice, Consumed: k.Consumed,
		Follows: k.Follows, Blind: k.Blind, Nonce: k.Nonce}
	return a
}

// reportOther answers a learning allocator's report for a key whose
// holders here are of another limit, window or kind (no check here has
// brought the allocator's yet), so that the allocator's pool opens: what
// the region may still admit in the window, as its holders stand (its
// slice there, or its start, or what it admitted, whichever is more),
// without taking them over. Nil when there is nothing to say.
func (l *leases) reportOther(sk []byte, e *holderEntry, m *sluicev1.LeaseMessage) *sluicev1.LeaseMessage {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := l.s.store.Now()
	var held, consumed int64
	if cur := windowID(now, e.Window); e.Window == time.Duration(m.WindowMs)*time.Millisecond && m.WindowId <= cur {
		var ok bool
		if consumed, ok = l.counted(sk, e, algorithmOf(e), now); !ok {
			return nil
		}
	}
	if w := e.Wins[m.WindowId]; w != nil {
		held = w.H.Slice()
	} else {
		held = e.Stand.Start(m.WindowId)
	}
	held = max(held, consumed)
	return &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_ACK, Name: m.Name, Key: m.Key, WindowId: m.WindowId,
		WindowMs: m.WindowMs, Limit: m.Limit, Region: m.Region, Allocator: m.Allocator, Seq: m.Seq, Slice: held, Consumed: consumed}
}

// onStand applies a standing slice to this region's holders of the key's
// windows to come (when this node owns the key in its region) and returns
// the Ack.
func (l *leases) onStand(sk []byte, m *sluicev1.LeaseMessage) *sluicev1.LeaseMessage {
	if m.Region != l.s.region || !l.mine(sk) {
		return nil
	}
	e := l.entryOf(sk, m)
	if e == nil || e.sliding {
		return nil // a sliding window's regions have no standing slices
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.touched = time.Now()
	k, ok := e.Stand.OnStand(lease.Stand{Region: m.Region, Alloc: m.Allocator, Seq: m.Seq, From: m.WindowId, Through: m.Through,
		Slice: min(max(m.Slice, 0), e.Limit)})
	if !ok {
		return nil
	}
	if from := max(m.WindowId, k.Made+1); e.SureFrom == 0 || from < e.SureFrom {
		// From there on the schedule is the allocator's: a window made
		// then starts at its standing slice, not at 0.
		e.SureFrom = from
	}
	l.giving(e, e.SetHint(max(m.WindowId, k.Made+1), m.Through, m.Wanted, m.DemandMilli))
	return &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_STAND_ACK, Name: m.Name, Key: m.Key, WindowId: k.Made,
		WindowMs: m.WindowMs, Limit: m.Limit, Region: m.Region, Allocator: k.Alloc, Seq: k.Seq,
		DemandMilli: e.DemandSaid()}
}

// onStandAck applies a region's acknowledgement of a standing slice.
func (l *leases) onStandAck(sk []byte, m *sluicev1.LeaseMessage) {
	l.amu.Lock()
	defer l.amu.Unlock()
	se := l.stands[string(sk)]
	if se == nil || se.Limit != m.Limit || se.window != time.Duration(m.WindowMs)*time.Millisecond || !l.stillStands(string(sk), se) {
		return
	}
	se.OnStandAck(lease.StandAck{Region: m.Region, Alloc: m.Allocator, Seq: m.Seq, Made: m.WindowId}, m.DemandMilli, 1000*window.MaxLimit)
}

// Lease implements PeerService.Lease: it applies a peer's lease messages
// and answers the replies (Grants to its Requests, Acks to its Lowers).
// Without several regions it refuses with FAILED_PRECONDITION.
func (s *Server) Lease(ctx context.Context, req *sluicev1.LeaseRequest) (*sluicev1.LeaseResponse, error) {
	if s.leases == nil {
		return nil, status.Error(codes.FailedPrecondition, "sluice: this node has no region list; leases are between regions")
	}
	if n := len(req.GetMessages()); n > maxLeaseBatch {
		return nil, invalidArgument(&fieldError{"messages", "at most 4096 per call"})
	}
	replies := s.leases.handle(req.GetMessages())
	s.leases.st.replied.Add(int64(len(replies)))
	return &sluicev1.LeaseResponse{Messages: replies}, nil
}

// regionRings returns the ring of each other region's members in ms
// (their own rings: a key's owner there), reusing prev's rings whose
// members did not change; a region without a live member has none.
func (s *Server) regionRings(prev map[string]*ring.Ring, ms []cluster.Member) map[string]*ring.Ring {
	if !s.regions.Multi() {
		return nil
	}
	byRegion := map[string][]string{}
	for _, m := range ms {
		if m.Region != s.region && m.Name != s.name && s.regions.Has(m.Region) {
			byRegion[m.Region] = append(byRegion[m.Region], m.Name)
		}
	}
	out := make(map[string]*ring.Ring, len(byRegion))
	for reg, names := range byRegion {
		slices.Sort(names)
		names = slices.Compact(names)
		if p := prev[reg]; p != nil && slices.Equal(p.Members(), names) {
			out[reg] = p
			continue
		}
		r, err := ring.New(names, s.ringCfg)
		if err != nil {
			s.log.Error("cannot build a region's ring; its members are left out", "region", reg, "members", len(names), "error", err)
			continue
		}
		out[reg] = r
	}
	return out
}

// otherMembers returns the members of ms in the other regions' rings, for
// dialing.
func otherMembers(rings map[string]*ring.Ring, ms []cluster.Member) []cluster.Member {
	var out []cluster.Member
	for _, m := range ms {
		if r := rings[m.Region]; r != nil && r.Has(m.Name) {
			out = append(out, m)
		}
	}
	return out
}

// freshHistory is the allocator view's history of a process that starts
// at now (ns on the store's clock), as a start and a pause make it: its
// ring changed, every region may have changed, and each is taken as gone
// at now (so every allocator learns first); ring, prev and live are kept.
func (l *leases) freshHistory(now int64, r, prev *ring.Ring, live map[string]bool) *leaseHistory {
	h := &leaseHistory{ownChanged: now, anyChanged: now, started: now, ring: r, prev: prev, live: live, goneAt: map[string]int64{}}
	for _, reg := range l.s.regions.Regions() {
		h.goneAt[reg.Name] = now
	}
	return h
}

// paused makes this node's leases start again as a restarted process's
// do, keeping its windows (see Server.paused): while it did not run,
// another region's node may have allocated its keys and handed the records
// back, and another member of its region may have held its keys and
// acknowledged lowers. So its allocators and standing slices are dropped
// (the next ones learn: the regions report what they hold, and what former
// allocators handed over is inherited), and so are its holders (the next
// ones start unsure, at 0, and ask: the allocator's grants are absolute,
// and their first one gives the region's record). Under-admission for a
// lease round trip, never over. Called under s.setMu.
func (l *leases) paused() {
	now := l.s.store.Now().UnixNano()
	old := l.hist.Load()
	l.hist.Store(l.freshHistory(now, old.ring, old.prev, maps.Clone(old.live)))
	l.amu.Lock()
	l.allocs = map[allocKey]*allocEntry{}
	l.stands = map[string]*standEntry{}
	l.amu.Unlock()
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.m = map[string]*holderEntry{}
		sh.mu.Unlock()
	}
	l.hmu.Lock()
	l.hot = map[*holderEntry]struct{}{}
	l.hmu.Unlock()
	l.wmu.Lock()
	l.givers = map[time.Duration]*giverSet{}
	l.wmu.Unlock()
}
