package window

import "math"

// entry is one key and its state: 64 bytes.
type entry struct {
	key        string
	st         state
	prev, next uint32 // the recency list: entry index + 1, 0 for none
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
// never copies them), and a doubly linked recency list through the entries.
// It uses about 64 bytes per entry plus 8 bytes per slot.
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
	// head is the most recently used entry, tail the least (index + 1).
	head, tail uint32
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

// insert adds key (absent) with state st as the most recently used entry
// and returns its index.
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
	*t.entry(idx) = entry{key: key, st: st}
	t.place(uint64(slotTag(h))<<32 | uint64(idx+1))
	t.pushFront(idx)
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
	t.unlink(idx)
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

func (t *table) pushFront(idx uint32) {
	e := t.entry(idx)
	e.prev, e.next = 0, t.head
	if t.head != 0 {
		t.entry(t.head - 1).prev = idx + 1
	}
	t.head = idx + 1
	if t.tail == 0 {
		t.tail = idx + 1
	}
}

func (t *table) unlink(idx uint32) {
	e := t.entry(idx)
	if e.prev != 0 {
		t.entry(e.prev - 1).next = e.next
	} else {
		t.head = e.next
	}
	if e.next != 0 {
		t.entry(e.next - 1).prev = e.prev
	} else {
		t.tail = e.prev
	}
	e.prev, e.next = 0, 0
}

// touch makes idx the most recently used entry.
func (t *table) touch(idx uint32) {
	if t.head != idx+1 {
		t.unlink(idx)
		t.pushFront(idx)
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
func (t *table) sweep(now int64, hash func(string) uint64) int {
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
		_, slot, ok := t.find(hash(e.key), e.key)
		if ok {
			t.remove(slot)
			removed++
		}
	}
	t.minExpires = next
	t.shrink(hash)
	return removed
}

// shrink gives memory back after a sweep left the table sparse: an empty
// table is dropped whole; one whose live entries fill under 1/8 of its
// allocated entries (and more than 4 pages) is rebuilt compactly, keeping
// the recency order.
func (t *table) shrink(hash func(string) uint64) {
	switch {
	case t.n == 0:
		*t = table{minExpires: t.minExpires}
	case t.n*8 < int(t.next) && t.next > 4*pageSize:
		old := *t
		*t = table{minExpires: old.minExpires}
		for i := old.tail; i != 0; {
			e := old.entry(i - 1)
			t.insert(hash(e.key), e.key, e.st)
			i = e.prev
		}
	}
}
