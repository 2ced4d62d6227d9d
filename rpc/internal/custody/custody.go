// Package custody keeps the keys a sluice node owns: it decides them under
// a gate that orders every decision against the hand-offs and pulls that
// take keys out of the node's windows, gives a key up to a member that
// pulls it (and remembers where it went: a tomb), takes keys out for a
// push and puts them back when the push fails, awaits the keys that moved
// to this node after a ring change (a key's first touch pulls it), and
// remembers which keys were taken over from a copy of a live owner's state
// (so that only what was counted beyond the copy goes back to it).
//
// It is the only caller of window.Store.Take on the owner windows. It has
// no network code: what moves a key between nodes (a pull, a push) is
// given to it as a function by the handoff room, and time is passed in.
//
// # Lock order
//
// Locks are taken in this order, never the other way round:
//
//  1. rpc's setMu (serializes membership changes; see rpc.Server.SetMembers)
//  2. Custody's gate, read-locked by a decision of an owned key (Decide),
//     write-locked by whatever takes keys out (TakeOut, GiveUp)
//  3. Custody's mu (tombs, outgoing keys, moving-in maps, takeovers)
//  4. what a caller's function given to GiveUp or MarkOutgoingIf takes
//     under mu: the stand-in windows' lock (rpc's fbMu), then a replica
//     shard lock (replica.Store.Take; a leaf: it calls nothing)
//  5. the window.Store shard locks, innermost (Take, MergeState, Apply)
//
// Nothing here calls out of the package with mu held except the functions
// of step 4, and nothing holds mu while waiting on the network: a pull
// runs with no custody lock held (Settle), and GiveUp waits for an
// outgoing key before it takes the gate.
package custody

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/window"
)

// Config configures a Custody.
type Config struct {
	// Self is this node's member name. (Required)
	Self string
	// Store holds the windows of the keys this node owns. (Required)
	Store *window.Store
	// HandOffTimeout bounds how long this node, as a key's new owner,
	// awaits the keys that moved to it (pulling each on first touch
	// meanwhile), and how long a tomb sends a pulled key's checks on to
	// its puller. (Required, > 0)
	HandOffTimeout time.Duration
	// Logger for hand-off events. Default slog.Default(). (Optional)
	Logger *slog.Logger
	// Now reads the wall clock that tombs' times are read on. Default
	// time.Now; tests inject theirs. (Optional)
	Now func() time.Time
	// Hooks are tests' seams (nil outside tests). (Optional)
	Hooks *Hooks
}

// Hooks are the seams through which a test holds custody where the order
// of a pull and a push matters. Each runs on the goroutine of the call
// named, with no lock held; a nil field runs nothing.
type Hooks struct {
	// BeforeGiveUpGate runs in GiveUp once key was found not on its way
	// out, before GiveUp takes the gate.
	BeforeGiveUpGate func(key string)
	// Waiting runs in WaitOutgoing (and so in GiveUp) when key is on its
	// way out, before it waits for the way's end.
	Waiting func(key string)
}

// Custody is the custody of one node's owned keys. It is safe for
// concurrent use. Create it with [New].
type Custody struct {
	self    string
	store   *window.Store
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time

	// gate orders decisions of owned keys (read lock) against the
	// hand-offs and pulls that take keys out of the store (write lock).
	gate sync.RWMutex
	// moving is what this node awaits after its last ring change; its
	// maps are guarded by mu.
	moving atomic.Pointer[MovingIn]
	// tombCount is len(tombs), read without mu on every owned decision.
	tombCount atomic.Int64

	mu        sync.Mutex
	doneFrom  map[string]string        // member -> fingerprint of its last done
	outgoing  map[string]chan struct{} // keys on their way out, not yet answered
	tombs     map[string]tomb          // keys given away while this node still owns them
	lastPush  string                   // fingerprint of the last completed push
	takenOver map[string]Takeover      // keys taken over from a copy of a live owner

	handOffTimeouts, returned atomic.Int64

	hooks Hooks // tests' seams; zero outside tests
}

// New returns an empty Custody.
func New(cfg Config) *Custody {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Custody{self: cfg.Self, store: cfg.Store, timeout: cfg.HandOffTimeout, log: cfg.Logger, now: cfg.Now,
		doneFrom: map[string]string{}, outgoing: map[string]chan struct{}{},
		tombs: map[string]tomb{}, takenOver: map[string]Takeover{}}
	if cfg.Hooks != nil {
		c.hooks = *cfg.Hooks
	}
	return c
}

// Stats counts custody's events.
type Stats struct {
	// HandOffTimeouts: ring changes whose hand-off did not complete within
	// the hand-off timeout (keys not yet pulled start from what is here).
	HandOffTimeouts int64
	// ReplicaReturned: keys taken over from a copy and handed back to the
	// process that sent the copy: only what was counted beyond it went.
	ReplicaReturned int64
}

// Stats returns custody's counters.
func (c *Custody) Stats() Stats {
	return Stats{HandOffTimeouts: c.handOffTimeouts.Load(), ReplicaReturned: c.returned.Load()}
}

// tomb says that this node gave a key it owns under its own (stale) ring
// to the member to, which pulled it: until the ring catches up, or until
// the tomb's time ends, checks for the key go there.
type tomb struct {
	to    string
	until time.Time
	owned bool // the key was this node's under its ring when pulled (else a held copy or stand-in hits)
}

// Takeover is the copy a key's state here was taken over from: its owner,
// the owner's process (instance id) that sent it, and the copy.
type Takeover struct {
	Owner, Instance string
	State           window.State
}

// MovingIn is what this node awaits after a ring change: the partitions it
// now owns and did not own before, until every other member has said it
// handed off everything for this ring (NoteDone). Until then the first
// touch of a key of such a partition pulls the key from the members not
// yet done (Settle). Ring, Prev and the partitions are immutable.
type MovingIn struct {
	// Ring is the ring the keys moved under; Prev the ring before it (nil:
	// the bootstrap ring, which owned nothing), whose owners had them.
	Ring, Prev *ring.Ring
	// Stale marks a MovingIn of Relearn: this node's own keys, which it
	// may have held stale state of (it stopped running for a while). A
	// key not pulled yet is not decided from that state.
	Stale    bool
	parts    []bool // by partition id
	deadline time.Time

	waiting map[string]bool          // members whose done has not arrived; guarded by mu
	settled map[string]bool          // keys pulled under this MovingIn; guarded by mu
	pulling map[string]chan struct{} // keys being pulled: closed when settled; guarded by mu
}

// NewMovingIn returns a MovingIn of the partitions of next that are in
// parts (by partition id), awaited from the members of waiting until
// deadline; prev is the ring before (nil: none). For tests and for
// RingChanged.
func NewMovingIn(next, prev *ring.Ring, parts []bool, waiting []string, deadline time.Time) *MovingIn {
	mi := &MovingIn{Ring: next, Prev: prev, parts: parts, deadline: deadline,
		waiting: map[string]bool{}, settled: map[string]bool{}, pulling: map[string]chan struct{}{}}
	for _, m := range waiting {
		mi.waiting[m] = true
	}
	return mi
}

// RingChanged records that this node's ring went from prev to next (prev
// nil: from the bootstrap ring, which owned nothing) at now: what moves to
// this node is awaited from every other member of next that has not said
// it is done under next (keeping what was still awaited before). Tombs go
// when their time has ended, when the member they name is not in next,
// and, for a key pulled from this node as its owner, when next gives the
// key to another member; a tomb of a key pulled for the copy or stand-in
// hits this node held stays until its time ends.
func (c *Custody) RingChanged(prev, next *ring.Ring, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.moving.Store(c.newMovingInLocked(prev, next, c.moving.Load(), now))
	for k, t := range c.tombs {
		switch {
		case now.After(t.until), !next.Has(t.to):
			// Ended, or its member left the ring: checks sent there
			// would fail (the key's state went with it).
			delete(c.tombs, k)
		case t.owned && next.Owner([]byte(k)) != c.self:
			// A key given away as its owner: the ring now sends its
			// checks to its owner itself.
			delete(c.tombs, k)
		}
		// A tomb of a key pulled for the copy or stand-in hits this node
		// held stays (until its time ends): this node decides the key's
		// stand-in checks only until its puller took them over, whatever
		// the ring does meanwhile (a fresh window here would admit the
		// key's budget again).
	}
	c.tombCount.Store(int64(len(c.tombs)))
}

// newMovingInLocked computes what moves to self going from prev to next,
// keeping what was still awaited under old (which may be nil). Requires mu.
func (c *Custody) newMovingInLocked(prev, next *ring.Ring, old *MovingIn, now time.Time) *MovingIn {
	n := next.Config().PartitionCount
	parts := make([]bool, n)
	any := false
	for id := range n {
		if next.PartitionOwner(id) != c.self {
			continue
		}
		if prev == nil || prev.PartitionOwner(id) != c.self || (old != nil && id < len(old.parts) && old.parts[id]) {
			parts[id], any = true, true
		}
	}
	if !any {
		return nil
	}
	if old != nil {
		prev = old.Prev // keys still awaited came from the older owners
	}
	var waiting []string
	for _, m := range next.Members() {
		if m != c.self && (c.doneFrom[m] != next.Fingerprint() || (old != nil && old.Stale && old.waiting[m])) {
			waiting = append(waiting, m)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	mi := NewMovingIn(next, prev, parts, waiting, now.Add(c.timeout))
	mi.Stale = old != nil && old.Stale
	return mi
}

// Relearn records that this node may hold stale state of every key it
// owns under r at now: it stopped running for a while (package pause),
// and meanwhile its cluster may have declared it dead and given its keys
// to other members, which counted them, or decided their checks in its
// stead. Every key it owns is awaited again from every other member of r,
// as after a ring change that brought it all of them (the first touch of
// a key pulls it: what the others counted, and stand-in hits, add to what
// is here), but no member's done ends the wait (they said it for r before
// the pause); it ends for a key once a pull of it got every member's
// answer, and for all after RelearnTimeouts hand-off timeouts (a member
// that took this node for dead gives nothing until it has taken it back,
// see handoff.ErrPullerOutOfRing; gossip takes a few seconds at worst).
// Until a key is pulled the
// MovingIn is Stale: the caller decides nothing from its state. It
// returns false when r has no other member (nothing to learn from).
// RelearnTimeouts is how many hand-off timeouts a Relearn waits for the
// other members at most; past that the keys not pulled yet are decided
// from what this node has (this fallback errs toward over-admission: what
// a member that never answered counted of a key is not in it; the expiry
// is logged and counted in Stats.HandOffTimeouts).
const RelearnTimeouts = 3

func (c *Custody) Relearn(r *ring.Ring, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := r.Config().PartitionCount
	parts := make([]bool, n)
	any := false
	for id := range n {
		if r.PartitionOwner(id) == c.self {
			parts[id], any = true, true
		}
	}
	var waiting []string
	for _, m := range r.Members() {
		if m != c.self {
			waiting = append(waiting, m)
		}
	}
	if !any || len(waiting) == 0 {
		return false
	}
	mi := NewMovingIn(r, r, parts, waiting, now.Add(RelearnTimeouts*c.timeout))
	mi.Stale = true
	c.moving.Store(mi)
	return true
}

// Awaiting returns the MovingIn that covers key under the ring r, or nil
// when key's state is here (or cannot come any more: the hand-off's time
// has ended, counted in Stats.HandOffTimeouts). It costs an atomic load
// when nothing is awaited (the clock is read only when something is).
func (c *Custody) Awaiting(r *ring.Ring, key []byte) *MovingIn {
	mi := c.moving.Load()
	if mi == nil || mi.Ring.Fingerprint() != r.Fingerprint() || !mi.parts[r.Partition(key)] {
		return nil
	}
	if c.now().After(mi.deadline) {
		c.mu.Lock()
		if c.moving.Load() == mi {
			c.moving.Store(nil)
			c.handOffTimeouts.Add(1)
			c.log.Warn("hand-off did not complete in time; keys not yet pulled start from what this node has",
				"fingerprint", mi.Ring.Fingerprint(), "waiting_for", keysOf(mi.waiting))
		}
		c.mu.Unlock()
		return nil
	}
	return mi
}

// Settle makes sure key's state has arrived before this node, its new
// owner, decides it: the first check of key calls pull with the members
// that have not finished their hand-off (pull merges what they give up,
// see MergeIn and TakeOver, and reports whether it got what there was);
// concurrent checks of key wait for that pull. It returns whether the key
// is settled: false when the pull did not get it (the next check of key
// pulls again) or ctx ended first.
func (c *Custody) Settle(ctx context.Context, mi *MovingIn, key []byte, pull func(from []string) bool) bool {
	k := string(key)
	c.mu.Lock()
	if mi.settled[k] || len(mi.waiting) == 0 {
		c.mu.Unlock()
		return true
	}
	if ch, ok := mi.pulling[k]; ok {
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return mi.settled[k] || len(mi.waiting) == 0
	}
	ch := make(chan struct{})
	mi.pulling[k] = ch
	from := keysOf(mi.waiting)
	c.mu.Unlock()

	ok := pull(from)

	c.mu.Lock()
	delete(mi.pulling, k)
	if ok {
		mi.settled[k] = true
	}
	c.mu.Unlock()
	close(ch)
	return ok
}

// NoteDone records that member said it handed off everything for the ring
// of fingerprint fp; when every member has, the keys moved here are all
// here.
func (c *Custody) NoteDone(member, fp string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doneFrom[member] = fp
	mi := c.moving.Load()
	if mi == nil || mi.Ring.Fingerprint() != fp {
		return
	}
	delete(mi.waiting, member)
	if len(mi.waiting) == 0 {
		c.moving.Store(nil)
		c.log.Debug("hand-off complete", "fingerprint", fp)
	}
}

// Decide runs apply, which decides a check of key in this node's windows,
// under the gate's read lock, when key is still this node's to decide:
// the ring the check was routed by (its epoch, routed) is the current one
// (current, read under the lock) and no member pulled key (no tomb); or
// always when force (a reforwarded check, which must not make a third
// hop). It reports whether apply ran, whether the ring changed since the
// check was routed (moved), and the member a tomb names ("" if none).
// Hand-offs and pulls take keys out under the gate's write lock, so a hit
// either lands in the state they carry away or is not made here.
//
// Epochs stand for rings: a node's epoch changes exactly when its ring's
// fingerprint does (rpc.Server.SetMembers and Leave), so comparing epochs
// compares the rings a check was routed and decided by.
func (c *Custody) Decide(key []byte, routed uint64, current func() uint64, force bool, apply func()) (decided, moved bool, to string) {
	c.gate.RLock()
	defer c.gate.RUnlock()
	moved = current() != routed
	to = c.TombFor(key)
	if (!moved && to == "") || force {
		apply()
		return true, moved, to
	}
	return false, moved, to
}

// TombFor returns the member a key this node owns was given to by a pull,
// or "" when none was (or the tomb's time has ended). It costs an atomic
// load when there are no tombs (the clock is read only when there are).
func (c *Custody) TombFor(key []byte) string {
	if c.tombCount.Load() == 0 {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.tombs[string(key)]
	if !ok || c.now().After(t.until) {
		return ""
	}
	return t.to
}

// GiveUp takes key's state out of this node's windows for the member to
// (process toInstance), which pulls it. It waits first while key is on its
// way out (a push or a stand-in send not yet answered), until ctx ends
// (ctx's error), and looks again under the gate and mu, where TakeOut and
// MarkOutgoingIf mark keys: a push that took key after the wait is waited
// for too (else the puller, told there is nothing, would decide key
// before the push had brought its count). Under the gate's write lock (a
// decision of key made here ends before; a later one sees the tomb) and
// mu, it takes the state
// (without a copy it was taken over from when to sent that copy; see
// TakeOut), then calls also, which may take the key's other holdings (a
// replica, stand-in hits) and reports whether this node holds the key for
// to in any way; when also says so or owned (this node owns key under its
// ring), and to is not this node, a tomb sends key's checks to to for the
// hand-off timeout. It returns the state and whether there was one.
func (c *Custody) GiveUp(ctx context.Context, key, to, toInstance string, owned bool, also func() bool) (window.State, bool, error) {
	for {
		if err := c.WaitOutgoing(ctx, key); err != nil {
			return window.State{}, false, err
		}
		if h := c.hooks.BeforeGiveUpGate; h != nil {
			h(key)
		}
		c.gate.Lock()
		c.mu.Lock()
		if _, busy := c.outgoing[key]; !busy {
			break // both held: taken below
		}
		c.mu.Unlock()
		c.gate.Unlock()
	}
	defer c.gate.Unlock()
	defer c.mu.Unlock()
	st, ok := c.store.Take(key)
	if ok {
		st, _ = c.returnStateLocked(key, st, to, toInstance)
	}
	held := also != nil && also()
	if to != c.self && (owned || held) {
		c.tombs[key] = tomb{to: to, until: c.now().Add(c.timeout), owned: owned}
		c.tombCount.Store(int64(len(c.tombs)))
	}
	return st, ok, nil
}

// HandedOver leaves a tomb for each of keys, whose copy (and stand-in
// hits) this node handed to the member to, their new owner, by a push:
// stand-in checks of them that still come here (from members whose rings
// lag) go to to for the hand-off timeout, as after a pull (this node no
// longer holds what they would be decided from).
func (c *Custody) HandedOver(keys []string, to string) {
	if to == c.self || len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	until := c.now().Add(c.timeout)
	for _, k := range keys {
		c.tombs[k] = tomb{to: to, until: until}
	}
	c.tombCount.Store(int64(len(c.tombs)))
}

// WaitOutgoing waits while key is on its way out of this node (see
// TakeOut and MarkOutgoingIf); it returns ctx's error if ctx ends first.
func (c *Custody) WaitOutgoing(ctx context.Context, key string) error {
	for {
		c.mu.Lock()
		ch, busy := c.outgoing[key]
		c.mu.Unlock()
		if !busy {
			return nil
		}
		if h := c.hooks.Waiting; h != nil {
			h(key)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Batch is a set of keys taken out of this node's windows for a push to
// one member (TakeOut): on their way out until End.
type Batch struct {
	// Keys are the keys taken, in the order asked; States their states as
	// they go (without a copy taken over from the receiver's very
	// process), by index.
	Keys   []string
	States []window.State

	taken  []window.State // as taken out, to put back
	forgot map[string]*Takeover
	done   chan struct{}
}

// TakeOut takes keys out of this node's windows for a push to member to
// (process toInstance), under the gate's write lock (a decision of one of
// them begun under an older ring ends first; later ones see the ring
// changed, see Decide) and marks them outgoing, so a pull of one waits
// until End. A key that has no state is left out. A key taken over from a
// copy sent by to's very process goes without that copy (its hits are in
// to's state already), counted in Stats.ReplicaReturned. After the send,
// call PutBack if it failed, then End.
func (c *Custody) TakeOut(keys []string, to, toInstance string) *Batch {
	b := &Batch{done: make(chan struct{}), forgot: map[string]*Takeover{}}
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		st, ok := c.store.Take(k)
		if !ok {
			continue
		}
		c.outgoing[k] = b.done
		out, t := c.returnStateLocked(k, st, to, toInstance)
		if t != nil {
			b.forgot[k] = t
		}
		b.Keys = append(b.Keys, k)
		b.States = append(b.States, out)
		b.taken = append(b.taken, st)
	}
	return b
}

// PutBack merges b's states, as taken out, back into this node's windows
// at now (a push that failed), with the takeovers they were taken with.
func (c *Custody) PutBack(b *Batch, now time.Time) {
	for i, k := range b.Keys {
		c.store.MergeState(k, b.taken[i], now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range b.forgot {
		if _, ok := c.takenOver[k]; !ok {
			c.takenOver[k] = *t
		}
	}
}

// End ends b's keys' way out: a pull waiting for one goes on.
func (c *Custody) End(b *Batch) {
	c.mu.Lock()
	for _, k := range b.Keys {
		if c.outgoing[k] == b.done {
			delete(c.outgoing, k)
		}
	}
	c.mu.Unlock()
	close(b.done)
}

// MarkOutgoingIf marks each key of keys that is not on its way out
// already and for which pick (called with mu held; see the lock order)
// says so as on its way out until ch is closed and ClearOutgoing is
// called; it returns the keys marked. A pull of one waits meanwhile.
func (c *Custody) MarkOutgoingIf(keys []string, ch chan struct{}, pick func(key string) bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var marked []string
	for _, k := range keys {
		if _, busy := c.outgoing[k]; busy {
			continue
		}
		if pick == nil || pick(k) {
			c.outgoing[k] = ch
			marked = append(marked, k)
		}
	}
	return marked
}

// MarkOutgoing marks keys as on their way out until ch is closed and
// ClearOutgoing is called (copies of departed owners' keys on their way to
// the keys' new owners), replacing any mark they had.
func (c *Custody) MarkOutgoing(keys []string, ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		c.outgoing[k] = ch
	}
}

// ClearOutgoing ends the way out of the keys MarkOutgoingIf marked with ch
// (the caller closes ch after).
func (c *Custody) ClearOutgoing(keys []string, ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if c.outgoing[k] == ch {
			delete(c.outgoing, k)
		}
	}
}

// MergeIn adds st, a key's state that came to this node (a hand-off, a
// pull, stand-in hits), to its window of key at now: counts add.
func (c *Custody) MergeIn(key string, st window.State, now time.Time) {
	c.store.MergeState(key, st, now)
}

// TakeOver merges the copy t.State of another member's state of key into
// this node's window at now (it stands in for the lost state) and
// remembers it: if the key goes back to that very process (it was out of
// the ring only for a moment, a flap, and kept its state), only what was
// counted here beyond the copy goes back. A copy of this node's own name
// (an earlier process of it) or of an unknown process is merged and not
// remembered.
func (c *Custody) TakeOver(key string, t Takeover, now time.Time) {
	c.store.MergeState(key, t.State, now)
	c.NoteTakeover(key, t)
}

// NoteTakeover remembers that key's state here includes the copy t (see
// TakeOver), for a state merged by the caller.
func (c *Custody) NoteTakeover(key string, t Takeover) {
	if t.Owner == c.self || t.Owner == "" || t.Instance == "" {
		return
	}
	c.mu.Lock()
	c.takenOver[key] = t
	c.mu.Unlock()
}

// returnStateLocked is the state to send for key, taken out of this
// node's windows as st, to the member to (process toInstance): st without
// the copy it was taken over from when to is the process that sent that
// copy. It forgets the takeover either way (the state leaves this node),
// and returns it so that a failed send can restore it. Requires mu.
func (c *Custody) returnStateLocked(key string, st window.State, to, toInstance string) (window.State, *Takeover) {
	t, ok := c.takenOver[key]
	if !ok {
		return st, nil
	}
	delete(c.takenOver, key)
	if t.Owner == to && toInstance == t.Instance {
		c.returned.Add(1)
		return window.Subtract(st, t.State), &t
	}
	return st, &t
}

// SweepTakenOver forgets the takeovers whose copy's window has ended at
// now (nothing of it is left to count twice).
func (c *Custody) SweepTakenOver(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.takenOver {
		if !t.State.Expires().After(now) {
			delete(c.takenOver, k)
		}
	}
}

// PushDone records that a push of every key this node does not own under
// the ring of fingerprint fp completed.
func (c *Custody) PushDone(fp string) {
	c.mu.Lock()
	c.lastPush = fp
	c.mu.Unlock()
}

// LastPush returns the fingerprint of the ring of the last completed push
// ("" if none).
func (c *Custody) LastPush() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastPush
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Reset starts key afresh in this node's windows for an operator (the
// admin API's ResetKey): under the gate's write lock (a decision of key
// made here ends before; a later one decides from the fresh state) it
// replaces key's state with window.State.Fresh at now (nothing counted,
// the same algorithm and window, so that the copies it replaces on the
// replicas carry no count either) and forgets the copy it was taken
// over from (there is nothing left of it to hand back). It returns the
// state it replaced, and false when key held none here (then nothing
// changes). A key on its way out (a push or a pull under way) is not
// waited for: what left before the reset may still be merged where it
// goes.
func (c *Custody) Reset(key string, now time.Time) (window.State, bool) {
	c.gate.Lock()
	defer c.gate.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.takenOver, key)
	st, ok := c.store.Take(key)
	if !ok {
		return window.State{}, false
	}
	c.store.MergeState(key, st.Fresh(now), now)
	return st, true
}
