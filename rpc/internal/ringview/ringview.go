// Package ringview turns a sluice node's member lists into its rings: who
// is in the ring (members that said they are leaving are out at once, and
// so is this node while it leaves), the ring's epoch (one more each time
// the fingerprint changes), which members' rings disagree with this
// node's, the rings this node used lately (a hand-off's sender is vetted
// against them) and the members that left it. It is pure: no network, no
// clock of its own (every call that needs the time takes now).
//
// # Locks
//
// A Tracker has one mutex, taken last: nothing is called with it held.
// Apply, Leave and Departing are serialized by the caller (rpc's setMu);
// the readers (Recent, Departed, LastChange, Instance) may be called from
// anywhere, also with other rooms' locks held (a replica shard lock, see
// package replica).
package ringview

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ring"
)

// History bounds: the past rings a hand-off's sender may have owned a key
// under, and how long a member that left is remembered as departed.
const (
	// HistoryAge is how long a replaced ring is kept (10 min).
	HistoryAge = 10 * time.Minute
	// HistoryLen is how many replaced rings are kept at most.
	HistoryLen = 16
	// DepartedAge is how long a member that left the ring counts as
	// departed (10 min), unless it comes back.
	DepartedAge = 10 * time.Minute
)

// Member is what the ring needs of a gossiped member.
type Member struct {
	// Name is the member's name, unique in the cluster.
	Name string
	// Instance is the gossiped id of the member's process ("" unknown).
	Instance string
	// Region is the member's region. A Tracker given a region with
	// SetRegion puts only the members of that region in its ring.
	Region string
	// RingMembers and RingFingerprint are the hash of the member set and
	// the fingerprint of the member's own ring, as it gossips them (""
	// unknown); Version its sluice version, for the mismatch warning.
	RingMembers, RingFingerprint, Version string
}

// Mismatch is a member whose ring has the same member set as this node's
// but another fingerprint: the two were built with different ring configs
// or library versions, and disagree about owners.
type Mismatch struct {
	Member, Theirs, Ours, Version string
}

// Update is what one Apply made of a member list.
type Update struct {
	// Ring is the ring now; Names its members, sorted. Epoch counts the
	// ring builds that changed the fingerprint.
	Ring  *ring.Ring
	Names []string
	Epoch uint64
	// Changed reports whether the fingerprint changed. Prev is the ring
	// before (nil when it was the bootstrap ring, which owned nothing).
	Changed bool
	Prev    *ring.Ring
	// Restarted reports that a member is back under its name as another
	// process (its instance id changed).
	Restarted bool
	// Mismatches are members newly seen with a mismatching ring (each is
	// reported once until it agrees again).
	Mismatches []Mismatch
	// Empty reports that the list left no member (this node is leaving
	// and no other is left): nothing changed.
	Empty bool
}

// Tracker is a node's view of its ring across member lists. Create it
// with [New].
type Tracker struct {
	self   string
	cfg    ring.Config
	region string // "" : every member is in the ring

	// Written by Apply and Leave only (serialized by the caller).
	cur       *ring.Ring
	epoch     uint64
	bootstrap bool
	departing map[string]string // member -> instance that said it is leaving
	mismatch  map[string]string // member -> fingerprint last reported

	instances atomic.Pointer[map[string]string] // member -> instance, this node included

	mu        sync.Mutex
	hist      []pastRing           // replaced rings, oldest first
	changedAt time.Time            // when the ring last changed (zero: never)
	departed  map[string]time.Time // members that left the ring, and when
}

type pastRing struct {
	ring    *ring.Ring
	retired time.Time
}

// New returns a Tracker whose ring holds only self (the bootstrap ring,
// epoch 0). It returns the ring's error for an invalid cfg.
func New(self string, cfg ring.Config) (*Tracker, error) {
	r, err := ring.New([]string{self}, cfg)
	if err != nil {
		return nil, err
	}
	t := &Tracker{self: self, cfg: cfg, cur: r, bootstrap: true,
		departing: map[string]string{}, mismatch: map[string]string{}, departed: map[string]time.Time{}}
	t.instances.Store(&map[string]string{self: ""})
	return t, nil
}

// SetRegion makes the ring hold only the members of region (and this
// node): members of other regions stay members (Instance knows them: they
// may forward checks here) but own no key of this ring. Call it before the
// first Apply; "" (the default) puts every member in the ring.
func (t *Tracker) SetRegion(region string) { t.region = region }

// Ring returns the current ring and its epoch.
func (t *Tracker) Ring() (*ring.Ring, uint64) { return t.cur, t.epoch }

// Bootstrap reports whether the ring is still the one New made.
func (t *Tracker) Bootstrap() bool { return t.bootstrap }

// Apply builds the ring of the member list ms (this node is always in it,
// listed or not, unless leaving) at now. Members that said they are
// leaving (Departing) under their listed instance are left out. When the
// fingerprint is unchanged the ring is the same *ring.Ring as before (one
// ring per fingerprint), and the epoch too. On a change not while leaving,
// the old ring joins the history and members gone from it count as
// departed. selfInstance is this node's instance id. It returns the ring
// library's error (e.g. more members than partitions), keeping the old
// ring.
func (t *Tracker) Apply(ms []Member, selfInstance string, leaving bool, now time.Time) (Update, error) {
	set := map[string]string{t.self: selfInstance}
	restarted := false
	prevSet := *t.instances.Load()
	for _, m := range ms {
		set[m.Name] = m.Instance
		if was := prevSet[m.Name]; was != "" && m.Instance != "" && was != m.Instance {
			restarted = true
		}
	}
	t.instances.Store(&set)
	for name := range t.departing {
		if !slices.ContainsFunc(ms, func(m Member) bool { return m.Name == name }) {
			delete(t.departing, name) // gone from the gossip too
		}
	}
	var names []string
	for _, m := range ms {
		if inst, ok := t.departing[m.Name]; ok && m.Name != t.self && inst == m.Instance {
			continue
		}
		if m.Name == t.self && leaving {
			continue
		}
		if t.region != "" && m.Name != t.self && m.Region != t.region {
			continue // another region's: a member, not in this ring
		}
		if !slices.Contains(names, m.Name) {
			names = append(names, m.Name)
		}
	}
	if !leaving && !slices.Contains(names, t.self) {
		names = append(names, t.self)
	}
	if len(names) == 0 {
		return Update{Empty: true, Restarted: restarted}, nil
	}
	slices.Sort(names)
	r, err := ring.New(names, t.cfg)
	if err != nil {
		return Update{}, fmt.Errorf("ring of %d members: %w", len(names), err)
	}
	up := Update{Names: names, Restarted: restarted, Epoch: t.epoch}
	old := t.cur
	up.Changed = r.Fingerprint() != old.Fingerprint()
	if !up.Changed {
		r = old // one ring per fingerprint
	} else {
		up.Epoch++
		if !t.bootstrap {
			up.Prev = old
		}
		if !leaving {
			t.mu.Lock()
			t.noteDepartedLocked(old, r, now)
			t.changedAt = now
			if !t.bootstrap {
				t.rememberLocked(old, now)
			}
			t.mu.Unlock()
		}
	}
	t.cur, t.epoch, t.bootstrap = r, up.Epoch, t.bootstrap && !up.Changed
	up.Ring = r
	up.Mismatches = t.mismatches(ms, names, r)
	return up, nil
}

// Leave makes the ring of others (this node's members but itself), one
// epoch on, for a node that hands its keys off before it leaves. It
// returns the ring library's error.
func (t *Tracker) Leave(others []string) (*ring.Ring, uint64, error) {
	r, err := ring.New(others, t.cfg)
	if err != nil {
		return nil, 0, err
	}
	t.cur, t.epoch = r, t.epoch+1
	return r, t.epoch, nil
}

// Without returns a ring of the current ring's members but those in skip
// (members found gone or leaving while this node hands off); it does not
// change the Tracker.
func (t *Tracker) Without(r *ring.Ring, skip map[string]bool) (*ring.Ring, error) {
	var names []string
	for _, m := range r.Members() {
		if !skip[m] {
			names = append(names, m)
		}
	}
	return ring.New(names, t.cfg)
}

// Departing records that member, as process instance, said it handed off
// all its keys and is leaving: the next Apply leaves it out (an impostor
// under its name, another instance, is not). Call Apply after.
func (t *Tracker) Departing(member, instance string) {
	t.departing[member] = instance
}

// Instance returns member's gossiped instance id as of the last Apply,
// and whether it is this node or was in that list.
func (t *Tracker) Instance(member string) (string, bool) {
	inst, ok := (*t.instances.Load())[member]
	return inst, ok
}

// mismatches returns the members of ms in the ring (names) with r's
// member set but another fingerprint, each once until it agrees again.
func (t *Tracker) mismatches(ms []Member, names []string, r *ring.Ring) []Mismatch {
	var out []Mismatch
	for _, m := range ms {
		if m.Name == t.self || m.RingMembers != r.MembersHash() || m.RingFingerprint == "" || !slices.Contains(names, m.Name) {
			continue
		}
		if m.RingFingerprint == r.Fingerprint() {
			delete(t.mismatch, m.Name)
			continue
		}
		if prev, ok := t.mismatch[m.Name]; ok && prev == m.RingFingerprint {
			continue
		}
		t.mismatch[m.Name] = m.RingFingerprint
		out = append(out, Mismatch{Member: m.Name, Theirs: m.RingFingerprint, Ours: r.Fingerprint(), Version: m.Version})
	}
	return out
}

// noteDepartedLocked records the members that left (and came back)
// between two rings. Requires mu.
func (t *Tracker) noteDepartedLocked(prev, next *ring.Ring, now time.Time) {
	for _, m := range prev.Members() {
		if !next.Has(m) {
			t.departed[m] = now
		}
	}
	for m, at := range t.departed {
		if next.Has(m) || now.Sub(at) > DepartedAge {
			delete(t.departed, m)
		}
	}
}

// rememberLocked keeps r, just replaced at now, among the recent rings.
// Requires mu.
func (t *Tracker) rememberLocked(r *ring.Ring, now time.Time) {
	h := append(t.hist, pastRing{ring: r, retired: now})
	for len(h) > 0 && (len(h) > HistoryLen || now.Sub(h[0].retired) > HistoryAge) {
		h = h[1:]
	}
	t.hist = slices.Clone(h)
}

// Recent returns cur and the rings this node used in the HistoryAge
// before now, newest first.
func (t *Tracker) Recent(cur *ring.Ring, now time.Time) []*ring.Ring {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []*ring.Ring{cur}
	for i := len(t.hist) - 1; i >= 0; i-- {
		if now.Sub(t.hist[i].retired) <= HistoryAge {
			out = append(out, t.hist[i].ring)
		}
	}
	return out
}

// ReplacedSince returns the rings this node replaced at or after since
// (by its ring changes; not the bootstrap ring, nor while it leaves),
// newest first.
func (t *Tracker) ReplacedSince(since time.Time) []*ring.Ring {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*ring.Ring
	for i := len(t.hist) - 1; i >= 0 && !t.hist[i].retired.Before(since); i-- {
		out = append(out, t.hist[i].ring)
	}
	return out
}

// Departed reports whether member was in this node's ring and has left
// it (within DepartedAge of the ring change that showed it) without
// coming back.
func (t *Tracker) Departed(member string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.departed[member]
	return ok
}

// LastChange returns when the ring last changed (zero if never).
func (t *Tracker) LastChange() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changedAt
}
