package window

import "iter"

// Take removes key from the store and returns the state it held, for
// handing the key to another node: hits applied to key after Take start
// afresh here. It returns a zero State and false when key holds no state.
func (s *Store) Take(key string) (State, bool) {
	h := s.hash(key)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	slot, ok := sh.t.find(h, key)
	if !ok {
		return State{}, false
	}
	st := State{sh.t.slots[slot].st}
	sh.t.remove(slot)
	return st, true
}

// All returns an iterator over every key that holds state and a snapshot
// of that state, one shard at a time: each shard is copied under its lock,
// and the lock is released before the shard's keys are yielded, so the
// loop body may call back into the store (e.g. [Store.Take]) and checks go
// on meanwhile. A key changed after its shard was copied is yielded with
// the state it had then; a key added meanwhile may be missed. Order is
// unspecified.
func (s *Store) All() iter.Seq2[string, State] {
	return func(yield func(string, State) bool) {
		var keys []string
		var states []State
		for i := range s.shards {
			sh := &s.shards[i]
			keys, states = keys[:0], states[:0]
			sh.mu.Lock()
			for j := range sh.t.slots {
				if e := &sh.t.slots[j]; e.st.spec != 0 {
					keys = append(keys, sh.t.keyOf(e))
					states = append(states, State{e.st})
				}
			}
			sh.mu.Unlock()
			for j, k := range keys {
				if !yield(k, states[j]) {
					return
				}
			}
		}
	}
}
