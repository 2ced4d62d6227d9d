package replica

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/window"
)

const shards = 32

// Store holds the copies of other owners' keys this node keeps. It is
// safe for concurrent use; see the package documentation for its locks.
type Store struct {
	seed   maphash.Seed
	shards [shards]struct {
		mu sync.Mutex
		m  map[string]*Entry
	}
}

// Entry is the copy of one key's state.
type Entry struct {
	State    window.State
	Owner    string // the member that sent it
	Instance string // the owner's gossiped instance id when the copy came ("" if unknown)
}

// NewStore returns an empty Store.
func NewStore() *Store {
	r := &Store{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[string]*Entry{}
	}
	return r
}

func (r *Store) shard(k string) int { return int(maphash.String(r.seed, k) % shards) }

// shardBytes is shard for a key held as bytes (maphash.Bytes and
// maphash.String agree on the same content), without a copy.
func (r *Store) shardBytes(k []byte) int { return int(maphash.Bytes(r.seed, k) % shards) }

// Set replaces key's copy. A key it holds already is updated in place, so
// that the steady stream of copies of the same keys allocates nothing.
func (r *Store) Set(k []byte, owner, instance string, st window.State) {
	sh := &r.shards[r.shardBytes(k)]
	sh.mu.Lock()
	put(sh.m, k, Entry{State: st, Owner: owner, Instance: instance})
	sh.mu.Unlock()
}

// put stores e as k's copy in a shard's map m (its lock held), updating a
// copy m holds already in place (no allocation: e is copied, never kept).
func put(m map[string]*Entry, k []byte, e Entry) {
	if old, ok := m[string(k)]; ok {
		*old = e
		return
	}
	n := new(Entry)
	*n = e
	m[string(k)] = n
}

// SetAll replaces the copies of keys[i] with states[i], all from owner
// (process instance), as Set does for each, taking each shard's lock once:
// a replica receives copies a thousand keys at a time. keys and states
// have the same length.
func (r *Store) SetAll(keys [][]byte, owner, instance string, states []window.State) {
	// A counting sort of the keys by shard: order holds the indexes of
	// shard 0's keys, then shard 1's, ...
	var ends [shards + 1]int
	sh := make([]uint8, len(keys))
	for i, k := range keys {
		sh[i] = uint8(r.shardBytes(k))
		ends[sh[i]+1]++
	}
	for i := 1; i <= shards; i++ {
		ends[i] += ends[i-1]
	}
	order := make([]int, len(keys))
	next := ends
	for i := range keys {
		order[next[sh[i]]] = i
		next[sh[i]]++
	}
	for s := range shards {
		if ends[s] == ends[s+1] {
			continue
		}
		shard := &r.shards[s]
		shard.mu.Lock()
		for _, i := range order[ends[s]:ends[s+1]] {
			put(shard.m, keys[i], Entry{State: states[i], Owner: owner, Instance: instance})
		}
		shard.mu.Unlock()
	}
}

// Get returns key's copy (its state alone; see Peek).
func (r *Store) Get(k string) (window.State, bool) {
	e, ok := r.Peek(k)
	return e.State, ok
}

// PutBack restores a copy taken for a hand-off that failed, unless a newer
// copy arrived meanwhile.
func (r *Store) PutBack(k string, e Entry) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	if _, ok := sh.m[k]; !ok {
		sh.m[k] = &e
	}
	sh.mu.Unlock()
}

// ownerFacts is what Orphans needs to know of one owner of copies.
type ownerFacts struct {
	inRing   bool   // the owner is a member of the ring
	instance string // its current instance id, when inRing
	departed bool   // it was in this node's ring and left it, when not inRing
}

// Orphans removes and returns the copies whose owner has departed (was in
// this node's ring and left it), grouped by the key's owner under rg.
// Copies whose owner is in the ring but no longer owns the key are stale
// (the key moved with its state): it drops them. Copies of an owner this
// node's ring has not met yet (gossip still spreading) stay. A copy sent
// by an earlier process of a member that is in the ring again under its
// name (it crashed and restarted: instance, given a member's name, returns
// its current instance id) goes back to that member: the new process
// starts with nothing, and must not come back empty-handed.
//
// departed and instance are called once per owner of copies, with no
// shard lock held (they may take locks of their own): Orphans first reads
// the owners under the shard locks, asks about each with no lock held,
// then removes the copies. A copy that arrives meanwhile from an owner it
// did not read stays (as one that arrives after Orphans returns).
func (r *Store) Orphans(rg *ring.Ring, departed func(string) bool, instance func(string) string) map[string]map[string]Entry {
	return r.orphans(rg, departed, instance, "")
}

// OrphansOf removes and returns the copies whose owner has departed (see
// Orphans) and whose key rg gives to the member to; it leaves every other
// copy as it is.
func (r *Store) OrphansOf(rg *ring.Ring, departed func(string) bool, to string) map[string]Entry {
	return r.orphans(rg, departed, func(string) string { return "" }, to)[to]
}

// orphans is Orphans, or OrphansOf when only is not "".
func (r *Store) orphans(rg *ring.Ring, departed func(string) bool, instance func(string) string, only string) map[string]map[string]Entry {
	facts := map[string]ownerFacts{}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			facts[e.Owner] = ownerFacts{}
		}
		sh.mu.Unlock()
	}
	for o := range facts { // no shard lock held
		f := ownerFacts{inRing: rg.Has(o)}
		switch {
		case f.inRing:
			f.instance = instance(o)
		case o != "":
			f.departed = departed(o)
		}
		facts[o] = f
	}
	out := map[string]map[string]Entry{}
	give := func(to, k string, e *Entry) {
		if out[to] == nil {
			out[to] = map[string]Entry{}
		}
		out[to][k] = *e
	}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			f, ok := facts[e.Owner]
			switch {
			case !ok: // an owner whose first copy came meanwhile: it stays
			case only != "":
				if !f.inRing && (e.Owner == "" || f.departed) && rg.Owner([]byte(k)) == only {
					delete(sh.m, k)
					give(only, k, e)
				}
			case f.inRing && rg.Owner([]byte(k)) != e.Owner:
				delete(sh.m, k) // the key moved with its state: this copy is stale
			case f.inRing:
				if e.Instance != "" && f.instance != "" && f.instance != e.Instance {
					delete(sh.m, k) // an earlier process's copy: back to the new one
					give(e.Owner, k, e)
				}
			case e.Owner != "" && !f.departed: // not met yet: it stays
			default:
				delete(sh.m, k)
				give(rg.Owner([]byte(k)), k, e)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Take removes and returns key's copy and its owner, for the key's new
// owner. This node's ring may not know yet that the owner is gone; the new
// owner decides whether the copy stands in for it (if the owner is alive
// the key moves with its state, and the copy is stale anyway).
func (r *Store) Take(k string) (Entry, bool) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok {
		return Entry{}, false
	}
	delete(sh.m, k)
	return *e, true
}

// DropOwner drops every copy of owner's keys.
func (r *Store) DropOwner(owner string) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.Owner == owner {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// Sweep drops copies that are back at full capacity at now.
func (r *Store) Sweep(now time.Time) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if !e.State.Expires().After(now) {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// Len returns the number of copies held.
func (r *Store) Len() int {
	n := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
