package replica

import (
	"hash/maphash"
	"sync"
)

// DirtySet is the set of keys changed since the last replication send. It
// is safe for concurrent use; see the package documentation for its locks.
type DirtySet struct {
	shards [shards]struct {
		mu sync.Mutex
		m  map[string]struct{}
	}
	seed maphash.Seed
}

// NewDirtySet returns an empty DirtySet.
func NewDirtySet() *DirtySet {
	d := &DirtySet{seed: maphash.MakeSeed()}
	for i := range d.shards {
		d.shards[i].m = map[string]struct{}{}
	}
	return d
}

// Add marks key (ring.Key bytes) changed; it copies key only when new.
func (d *DirtySet) Add(key []byte) {
	sh := &d.shards[maphash.Bytes(d.seed, key)%shards]
	sh.mu.Lock()
	if _, ok := sh.m[string(key)]; !ok {
		sh.m[string(key)] = struct{}{}
	}
	sh.mu.Unlock()
}

// Drain removes and returns every marked key.
func (d *DirtySet) Drain() []string {
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
