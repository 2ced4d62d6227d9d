package window

import "math"

// entry is one key and its state: 64 bytes.
type entry struct {
	key  string
	st   state
	tag  uint32 // the high 32 bits of the key's hash (its slot tag)
	used bool   // referenced since the clock hand last passed (see evict)
}

const (
	pageBits = 8
	pageSize = 1 << pageBits // entries per page
	// maxLoadNum/maxLoadDen is the most slots a table fills before it
	// doubles.
	maxLoadNum, maxLoadDen = 3, 4
)

// table maps keys to entries: an open-addressing hash table with linear
// probing over a slot array, the entries in fixed-size pages (so growing
// never copies them). Recency is kept the CLOCK way (Corbató, 1968; the
// "second chance" approximation of least-recently-used that operating
// systems use for pages): a use sets the entry's used bit, and eviction
// sweeps a hand over the entries, clearing used bits and taking the first
// entry found unused. A use thus touches no other entry. It takes about
// 64 bytes per entry plus 8 bytes per slot.
//
// table is not safe for concurrent use: a shard's mutex guards it.
type table struct {
	// slots holds, per slot, 0 (empty) or tag<<32 | (entry index + 1),
	// where tag is the high 32 bits of the key's hash; a key's home slot is
	// tag & (len(slots)-1). len(slots) is a power of two.
	slots []uint64
	pages [][]entry
	free  []uint32 // indices of unused entries below next
	next  uint32   // entries ever allocated: the index of the next new one
	n     int      // live entries
	hand  uint32   // the clock hand: the next entry eviction looks at
	// minExpires is a lower bound of every live entry's expiry (Unix ns):
	// a sweep before it would find nothing.
	minExpires int64
}

func (t *table) entry(i uint32) *entry { return &t.pages[i>>pageBits][i&(pageSize-1)] }

func slotTag(h uint64) uint32 { return uint32(h >> 32) }

// find returns the index of key's entry and its slot, or ok = false.
func (t *table) find(h uint64, key string) (idx uint32, slot int, ok bool) {
	if len(t.slots) == 0 {
		return 0, 0, false
	}
	mask := len(t.slots) - 1
	tag := slotTag(h)
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return 0, 0, false
		}
		if uint32(s>>32) == tag {
			idx := uint32(s) - 1
			if t.entry(idx).key == key {
				return idx, i, true
			}
		}
	}
}

// insert adds key (absent) with state st and returns its index. A new
// entry starts unused: it has to be used again to earn a second chance, so
// a stream of one-off keys (a scan, or a client inventing keys) is evicted
// before the keys that come back.
func (t *table) insert(h uint64, key string, st state) uint32 {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
	}
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		idx = t.next
		t.next++
		if int(idx>>pageBits) == len(t.pages) {
			t.pages = append(t.pages, make([]entry, pageSize))
		}
	}
	*t.entry(idx) = entry{key: key, st: st, tag: slotTag(h)}
	t.place(uint64(slotTag(h))<<32 | uint64(idx+1))
	t.n++
	return idx
}

// place puts slot value s into the first empty slot from its home.
func (t *table) place(s uint64) {
	mask := len(t.slots) - 1
	i := int(s>>32) & mask
	for t.slots[i] != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

func (t *table) grow() {
	n := max(2*len(t.slots), 16)
	old := t.slots
	t.slots = make([]uint64, n)
	for _, s := range old {
		if s != 0 {
			t.place(s)
		}
	}
}

// remove deletes the entry in slot, closing the gap by shifting later
// entries of the probe run back (so no tombstones are needed).
func (t *table) remove(slot int) {
	idx := uint32(t.slots[slot]) - 1
	*t.entry(idx) = entry{}
	t.free = append(t.free, idx)
	t.n--
	mask := len(t.slots) - 1
	hole := slot
	for j := (hole + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		home := int(t.slots[j]>>32) & mask
		// Move slot j into the hole unless its home lies cyclically in
		// (hole, j]: then it would become unreachable.
		if (j > hole && (home <= hole || home > j)) || (j < hole && home <= hole && home > j) {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = 0
}

// evict picks the entry to remove under a cap: the hand moves over the
// entries, giving each used one a second chance (clearing its bit), and
// stops at the first unused one. The table must not be empty.
func (t *table) evict() uint32 {
	for {
		if t.hand >= t.next {
			t.hand = 0
		}
		i := t.hand
		t.hand++
		e := t.entry(i)
		switch {
		case e.st.spec == 0: // free
		case e.used:
			e.used = false
		default:
			return i
		}
	}
}

// removeIndex removes entry idx.
func (t *table) removeIndex(idx uint32) {
	e := t.entry(idx)
	if _, slot, ok := t.find(uint64(e.tag)<<32, e.key); ok {
		t.remove(slot)
	}
}

// noteExpiry lowers minExpires to e if e is earlier.
func (t *table) noteExpiry(e int64) {
	if e < t.minExpires {
		t.minExpires = e
	}
}

// sweep removes every entry that expires at or before now and returns how
// many it removed. hash gives a key's hash. It does nothing when
// minExpires shows that no entry has expired.
func (t *table) sweep(now int64) int {
	if t.n == 0 || t.minExpires > now {
		return 0
	}
	removed := 0
	next := int64(math.MaxInt64)
	for i := uint32(0); i < t.next; i++ {
		e := t.entry(i)
		if e.st.spec == 0 { // unused
			continue
		}
		if exp := e.st.expires(); exp > now {
			next = min(next, exp)
			continue
		}
		t.removeIndex(i)
		removed++
	}
	t.minExpires = next
	t.shrink()
	return removed
}

// shrink gives memory back after a sweep left the table sparse: an empty
// table is dropped whole; one whose live entries fill under 1/8 of its
// allocated entries (and more than 4 pages) is rebuilt compactly.
func (t *table) shrink() {
	switch {
	case t.n == 0:
		*t = table{minExpires: t.minExpires}
	case t.n*8 < int(t.next) && t.next > 4*pageSize:
		old := *t
		*t = table{minExpires: old.minExpires}
		for i := uint32(0); i < old.next; i++ {
			if e := old.entry(i); e.st.spec != 0 {
				t.insert(uint64(e.tag)<<32, e.key, e.st)
				t.entry(t.next - 1).used = e.used
			}
		}
	}
}
