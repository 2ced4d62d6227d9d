package replica

// Peek returns key's copy, with the member it came from, and leaves it in
// place (for an operator's inspection of the key).
func (r *Store) Peek(k string) (Entry, bool) {
	sh := &r.shards[r.shard(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		return *e, true
	}
	return Entry{}, false
}
