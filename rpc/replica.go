package rpc

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Defaults for ReplicationConfig.
const (
	DefaultReplicationFactor   = 1
	DefaultReplicationInterval = 100 * time.Millisecond
)

// ReplicationConfig shapes the copies each owner keeps of its keys on the
// next members of the ring.
type ReplicationConfig struct {
	// Factor is the number of extra copies of each key, on the members
	// that follow its owner on the ring. Default 1; negative turns
	// replication off (Disabled). (Optional)
	Factor int
	// Disabled turns replication off (same as a negative Factor).
	// (Optional)
	Disabled bool
	// Interval is how often an owner sends the keys that changed since
	// the last send. A crashed owner loses at most the hits it admitted
	// in the last Interval plus the duration of one send (bounded by the
	// forward timeout). Default 100 ms. (Optional)
	Interval time.Duration
}

func (c ReplicationConfig) withDefaults() ReplicationConfig {
	if c.Factor < 0 {
		c.Disabled = true
	}
	if c.Factor == 0 {
		c.Factor = DefaultReplicationFactor
	}
	if c.Disabled {
		c.Factor = 0
	}
	if c.Interval <= 0 {
		c.Interval = DefaultReplicationInterval
	}
	return c
}

const replicaShards = 32

// replicaStore holds the copies of other owners' keys this node keeps. It
// is safe for concurrent use.
type replicaStore struct {
	seed   maphash.Seed
	shards [replicaShards]struct {
		mu sync.Mutex
		m  map[string]*replicaEntry
	}
}

type replicaEntry struct {
	st       window.State
	owner    string
	instance string // the owner's gossiped instance id when the copy came ("" if unknown)
}

func newReplicaStore() *replicaStore {
	r := &replicaStore{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[string]*replicaEntry{}
	}
	return r
}

func (r *replicaStore) shard(k string) int { return int(maphash.String(r.seed, k) % replicaShards) }

// shardBytes is shard for a key held as bytes (maphash.Bytes and
// maphash.String agree on the same content), without a copy.
func (r *replicaStore) shardBytes(k []byte) int { return int(maphash.Bytes(r.seed, k) % replicaShards) }

// set replaces key's copy. A key it holds already is updated in place, so
// that the steady stream of copies of the same keys allocates nothing.
func (r *replicaStore) set(k []byte, owner, instance string, st window.State) {
	sh := &r.shards[r.shardBytes(k)]
	sh.mu.Lock()
	if e, ok := sh.m[string(k)]; ok {
		*e = replicaEntry{st: st, owner: owner, instance: instance}
	} else {
		sh.m[string(k)] = &replicaEntry{st: st, owner: owner, instance: instance}
	}
	sh.mu.Unlock()
}

// get returns key's copy.
func (r *replicaStore) get(k string) (window.State, bool) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		return e.st, true
	}
	return window.State{}, false
}

// putBack restores a copy taken for a hand-off that failed, unless a newer
// copy arrived meanwhile.
func (r *replicaStore) putBack(k string, e replicaEntry) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	if _, ok := sh.m[k]; !ok {
		sh.m[k] = &e
	}
	sh.mu.Unlock()
}

// orphans removes and returns the copies whose owner has departed (was in
// this node's ring and left it), grouped by the key's owner under v.
// Copies whose owner is in the ring but no longer owns the key are stale
// (the key moved with its state): it drops them. Copies of an owner this
// node's ring has not met yet (gossip still spreading) stay. A copy sent
// by an earlier process of a member that is in the ring again under its
// name (it crashed and restarted: instance, given a member's name, returns
// its current instance id) goes back to that member: the new process
// starts with nothing, and must not come back empty-handed.
func (r *replicaStore) orphans(v *view, departed func(string) bool, instance func(string) string) map[string]map[string]replicaEntry {
	out := map[string]map[string]replicaEntry{}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if v.ring.Has(e.owner) {
				switch cur := instance(e.owner); {
				case v.ring.Owner([]byte(k)) != e.owner:
					delete(sh.m, k) // the key moved with its state: this copy is stale
				case e.instance != "" && cur != "" && cur != e.instance:
					delete(sh.m, k)
					if out[e.owner] == nil {
						out[e.owner] = map[string]replicaEntry{}
					}
					out[e.owner][k] = *e
				}
				continue
			}
			if e.owner != "" && !departed(e.owner) {
				continue
			}
			delete(sh.m, k)
			o := v.ring.Owner([]byte(k))
			if out[o] == nil {
				out[o] = map[string]replicaEntry{}
			}
			out[o][k] = *e
		}
		sh.mu.Unlock()
	}
	return out
}

// take removes and returns key's copy and its owner, for the key's new
// owner. This node's ring may not know yet that the owner is gone; the new
// owner decides whether the copy stands in for it (if the owner is alive
// the key moves with its state, and the copy is stale anyway).
func (r *replicaStore) take(k string) (replicaEntry, bool) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok {
		return replicaEntry{}, false
	}
	delete(sh.m, k)
	return *e, true
}

// dropOwner drops every copy of owner's keys.
func (r *replicaStore) dropOwner(owner string) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.owner == owner {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// sweep drops copies that are back at full capacity at now.
func (r *replicaStore) sweep(now time.Time) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if !e.st.Expires().After(now) {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// len returns the number of copies held.
func (r *replicaStore) len() int {
	n := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// dirtySet is the set of keys changed since the last replication send.
type dirtySet struct {
	shards [replicaShards]struct {
		mu sync.Mutex
		m  map[string]struct{}
	}
	seed maphash.Seed
}

func newDirtySet() *dirtySet {
	d := &dirtySet{seed: maphash.MakeSeed()}
	for i := range d.shards {
		d.shards[i].m = map[string]struct{}{}
	}
	return d
}

// add marks key (ring.Key bytes) changed; it copies key only when new.
func (d *dirtySet) add(key []byte) {
	sh := &d.shards[maphash.Bytes(d.seed, key)%replicaShards]
	sh.mu.Lock()
	if _, ok := sh.m[string(key)]; !ok {
		sh.m[string(key)] = struct{}{}
	}
	sh.mu.Unlock()
}

// drain removes and returns every marked key.
func (d *dirtySet) drain() []string {
	var out []string
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			out = append(out, k)
		}
		clear(sh.m)
		sh.mu.Unlock()
	}
	return out
}

// replicateLoop sends, every interval, the state of the keys this node
// owns that changed since the last send to their successors on the ring;
// after a ring change, every owned key. A failed send marks its keys
// changed again (and counts them in Stats.ReplicaBehind).
func (s *Server) replicateLoop(ctx context.Context) {
	t := time.NewTicker(s.replication.Interval)
	defer t.Stop()
	lastFP := ""
	sweeps := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v := s.view.Load()
		if s.leaving.Load() {
			continue
		}
		var keys []string
		if fp := v.ring.Fingerprint(); fp != lastFP {
			lastFP = fp
			s.dirty.drain()
			for k := range s.store.All() {
				keys = append(keys, k)
			}
		} else {
			keys = s.dirty.drain()
		}
		s.replicateOnce(ctx, v, keys)
		if sweeps++; sweeps%50 == 0 {
			now := s.store.Now()
			s.replicas.sweep(now)
			s.custody.SweepTakenOver(now)
		}
	}
}

// replicateOnce sends the current state of keys this node owns under v to
// their successors, one Replicate call per successor and 1000 keys. Every
// key this node owns has the same successors (the members after it on the
// ring), so the states are built once: their keys share one buffer, their
// encodings another and their messages one slab, so a key costs no
// allocation of its own. The successors' calls share the messages (a
// marshal only reads them).
func (s *Server) replicateOnce(ctx context.Context, v *view, keys []string) {
	succs := v.ring.SuccessorsOf(s.name, s.replication.Factor)
	if len(succs) == 0 || len(keys) == 0 {
		return // no other member: nothing to copy to
	}
	var (
		kbuf, enc []byte
		slab      = make([]sluicev1.KeyState, 0, len(keys))
		states    = make([]*sluicev1.KeyState, 0, len(keys))
	)
	for _, k := range keys {
		// Capped at their ends, so a later append never writes into
		// them (one that outgrows a buffer moves on to a new array).
		start := len(kbuf)
		kbuf = append(kbuf, k...)
		kb := kbuf[start:len(kbuf):len(kbuf)]
		if v.ring.Owner(kb) != s.name {
			continue
		}
		st, ok := s.store.Get(k)
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
		p := v.peers[succ]
		wg.Go(func() {
			for rest := states; len(rest) > 0; {
				n := min(len(rest), handOffBatch)
				batch := rest[:n]
				rest = rest[n:]
				err := errors.New("no connection")
				if p != nil {
					cctx, cancel := context.WithTimeout(ctx, s.forwardTimeout)
					_, err = p.client.Replicate(cctx, &sluicev1.ReplicateRequest{Sender: s.name, SenderInstance: s.instanceID(), States: batch})
					cancel()
				}
				if err != nil {
					s.stats.replicaBehind.Add(int64(len(batch)))
					for _, ks := range batch {
						s.dirty.add(ks.Key)
					}
					if ctx.Err() == nil {
						s.log.Debug("replication failed", "peer", succ, "keys", len(batch), "error", err)
					}
					continue
				}
				s.stats.replicated.Add(int64(len(batch)))
			}
		})
	}
	wg.Wait()
}

// Replicate implements PeerService.Replicate: each state replaces this
// node's copy of the key.
func (s *Server) Replicate(ctx context.Context, req *sluicev1.ReplicateRequest) (*sluicev1.ReplicateResponse, error) {
	switch {
	case req.Sender == "":
		return nil, invalidArgument(&fieldError{"sender", "must not be empty"})
	case len(req.States) > handOffBatch:
		return nil, invalidArgument(&fieldError{"states", fmt.Sprintf("at most %d per request, got %d", handOffBatch, len(req.States))})
	}
	states := make([]window.State, len(req.States))
	for i, ks := range req.States {
		if len(ks.GetKey()) == 0 {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("states[%d].key", i), "must not be empty"})
		}
		if err := states[i].UnmarshalBinary(ks.GetState()); err != nil {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("states[%d].state", i), err.Error()})
		}
	}
	if s.leaving.Load() {
		return &sluicev1.ReplicateResponse{}, nil
	}
	instance := req.SenderInstance
	if instance == "" {
		instance = s.memberInstance(req.Sender)
	}
	for i, ks := range req.States {
		s.replicas.set(ks.Key, req.Sender, instance, states[i])
	}
	return &sluicev1.ReplicateResponse{}, nil
}
