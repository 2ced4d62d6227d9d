package window

import (
	"encoding/binary"
	"math"
	"strings"
	"sync/atomic"
	"unsafe"
)

// inlineKey is the longest key an entry holds in its own bytes; a longer
// key is kept in the table's long list and the entry holds its index.
const inlineKey = 20

// entry is one slot of a table: 64 bytes, one cache line, no pointers (so
// the garbage collector never scans the table). A slot is empty when
// st.spec == 0.
type entry struct {
	st state
	// tagMeta holds the key's 24-bit tag (the high 24 bits of its hash)
	// in bits 8-31, and meta bits in 0-7: the key's length when it is held
	// inline (0..inlineKey), or metaLong, plus metaUsed.
	tagMeta uint32
	// key holds the key's bytes when they fit, else (metaLong) the index of
	// the key in table.long as 4 little-endian bytes.
	key [inlineKey]byte
}

const (
	metaLenMask = 0x3f
	metaLong    = 0x3f // the key is in table.long
	metaUsed    = 0x40 // referenced since the clock hand last passed
)

func (e *entry) tag() uint32 { return e.tagMeta >> 8 }
func (e *entry) used() bool  { return e.tagMeta&metaUsed != 0 }
func (e *entry) setUsed(u bool) {
	if u {
		e.tagMeta |= metaUsed
	} else {
		e.tagMeta &^= metaUsed
	}
}
func (e *entry) long() bool        { return e.tagMeta&metaLenMask == metaLong }
func (e *entry) longIndex() uint32 { return binary.LittleEndian.Uint32(e.key[:4]) }

const (
	// A table grows by a quarter when an insert would fill more than
	// maxLoadNum/maxLoadDen of its slots, so it runs between 70 % and
	// 87.5 % full: 73 to 91 bytes a key.
	maxLoadNum, maxLoadDen = 7, 8
	minSlots               = 16
)

// keyTag returns the tag of a key's hash: its high 24 bits. (The shard
// is chosen by the low bits.)
func keyTag(h uint64) uint32 { return uint32(h >> 40) }

// table maps keys to entries: an open-addressing hash table with linear
// probing and Robin Hood displacement (Celis, Larson and Munro, "Robin
// Hood Hashing", FOCS 1985), deletion by backward shift, and entries held
// in the slot array itself. A key's home slot is its 24-bit tag scaled to
// the table's size (Lemire's multiply-shift range reduction), so sizes
// need not be powers of two and the table can grow by a quarter at a
// time; a hit reads the slots from the key's home to its own, each one
// cache line (at load 0.76, 36 % of keys sit at home, 25 % one slot on,
// 16 % two), and one more line when the key is longer than 20 bytes (held
// outside the slot). Recency is kept the CLOCK way (Corbató,
// 1968: the "second chance" approximation of least-recently-used): a use
// sets the entry's used bit; eviction sweeps a hand over the slots,
// clearing used bits, and takes the first entry found unused.
//
// table is not safe for concurrent use: a shard's mutex guards it.
type table struct {
	slots    []entry
	long     []string // keys longer than inlineKey; "" where free
	longFree []uint32 // free indices of long
	n        int      // live entries
	hand     int      // the clock hand: the next slot eviction looks at
	// minExpires is a lower bound of every live entry's expiry (Unix ns):
	// a sweep before it would find nothing.
	minExpires int64
	// group, when set, maps a key to its group, and groups counts the
	// live entries of each group (Store.MaxKeysPerGroup); only inserts
	// and removals touch them.
	group  func(string) string
	groups map[string]*int32
	// view, when set, is the shard's view of slots for readers without
	// the lock (shard.prefetchHome): resize and shrink update it.
	view *slotsView
}

// slotsView is a table's slot array as of its last resize, for readers
// without the shard's lock: its first entry and its length, each read
// atomically. A reader may pair one resize's base with another's length;
// it only computes the address of a prefetch, which is never dereferenced.
type slotsView struct {
	base atomic.Pointer[entry]
	n    atomic.Int64
}

// setView publishes slots to the shard's view, if the table has one.
func (t *table) setView() {
	if t.view == nil {
		return
	}
	t.view.base.Store(unsafe.SliceData(t.slots)) // nil for no slots
	t.view.n.Store(int64(len(t.slots)))
}

// prefetchHome starts loading the shard's lock line and the home slot of
// a key whose hash is h into this core's cache, both for writing (the
// check takes the lock and writes its slot), without the lock, so that
// the two cache misses overlap each other and the work before the lookup
// (validating the check, reading the clock). It reads nothing that
// decides: a view replaced meanwhile only wastes the hint.
func (sh *shard) prefetchHome(h uint64) {
	prefetchWrite(uintptr(unsafe.Pointer(&sh.mu)))
	if p := sh.view.base.Load(); p != nil {
		prefetchWrite(uintptr(unsafe.Pointer(p)) + uintptr(home(keyTag(h), int(sh.view.n.Load())))*unsafe.Sizeof(entry{}))
	}
}

// groupLen returns how many live entries share key's group (0 when groups
// are not counted).
func (t *table) groupLen(key string) int {
	if t.group == nil {
		return 0
	}
	if c, ok := t.groups[t.group(key)]; ok {
		return int(*c)
	}
	return 0
}

// countGroup adds d to the count of key's group. key (and so its group)
// may alias a caller's buffer or an entry's bytes: a map assignment to an
// existing string key would store the new key in the map, so counts are
// changed through pointers, and only a new group's name is stored, cloned.
func (t *table) countGroup(key string, d int32) {
	g := t.group(key)
	if c, ok := t.groups[g]; ok {
		if *c += d; *c <= 0 {
			delete(t.groups, g)
		}
		return
	}
	if d <= 0 {
		return
	}
	if t.groups == nil {
		t.groups = map[string]*int32{}
	}
	t.groups[strings.Clone(g)] = &d
}

// home returns the home slot of tag in a table of size n.
func home(tag uint32, n int) int { return int(uint64(tag) * uint64(n) >> 24) }

// dist returns how far slot i is from home slot h, cyclically.
func (t *table) dist(i, h int) int {
	if d := i - h; d >= 0 {
		return d
	}
	return i - h + len(t.slots)
}

// keyIs reports whether entry e holds key.
func (t *table) keyIs(e *entry, key string) bool {
	if l := int(e.tagMeta & metaLenMask); l != metaLong {
		return l == len(key) && string(e.key[:l]) == key
	}
	return len(key) > inlineKey && t.long[e.longIndex()] == key
}

// keyOf returns the key of entry e (a copy when it is inline).
func (t *table) keyOf(e *entry) string {
	if e.long() {
		return t.long[e.longIndex()]
	}
	return string(e.key[:e.tagMeta&metaLenMask])
}

// find returns the slot holding key, whose hash is h, or ok = false.
func (t *table) find(h uint64, key string) (slot int, ok bool) {
	n := len(t.slots)
	if n == 0 {
		return 0, false
	}
	tag := keyTag(h)
	i := home(tag, n)
	for d := 0; ; d++ {
		e := &t.slots[i]
		if e.st.spec == 0 || t.dist(i, home(e.tag(), n)) < d {
			return 0, false
		}
		if e.tag() == tag && t.keyIs(e, key) {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insert adds key (absent; hash h) with state st and returns its slot.
// clone says key aliases a caller's buffer: a long key is then copied
// before it is kept. A new entry starts unused: it has to be used again to
// earn a second chance, so a stream of one-off keys (a scan, or a client
// inventing keys) is evicted before the keys that come back.
func (t *table) insert(h uint64, key string, clone bool, st state) int {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.resize(max(len(t.slots)+len(t.slots)/4, minSlots))
	}
	e := entry{st: st, tagMeta: keyTag(h) << 8}
	if len(key) <= inlineKey {
		e.tagMeta |= uint32(len(key))
		copy(e.key[:], key)
	} else {
		if clone {
			key = string([]byte(key))
		}
		var li uint32
		if k := len(t.longFree); k > 0 {
			li = t.longFree[k-1]
			t.longFree = t.longFree[:k-1]
			t.long[li] = key
		} else {
			li = uint32(len(t.long))
			t.long = append(t.long, key)
		}
		e.tagMeta |= metaLong
		binary.LittleEndian.PutUint32(e.key[:4], li)
	}
	t.n++
	if t.group != nil {
		t.countGroup(key, 1)
	}
	return t.place(e)
}

// place puts e into the table by Robin Hood displacement and returns the
// slot e itself landed in. There must be an empty slot.
func (t *table) place(e entry) int {
	n := len(t.slots)
	i := home(e.tag(), n)
	at := -1
	for d := 0; ; d++ {
		r := &t.slots[i]
		if r.st.spec == 0 {
			*r = e
			if at < 0 {
				at = i
			}
			return at
		}
		if rd := t.dist(i, home(r.tag(), n)); rd < d {
			// The resident is closer to its home than e is to its own:
			// e takes the slot, and the resident moves on.
			*r, e = e, *r
			d = rd
			if at < 0 {
				at = i
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// resize moves every entry into a slot array of size n (> t.n).
func (t *table) resize(n int) {
	old := t.slots
	t.slots = make([]entry, n)
	t.setView()
	for i := range old {
		if old[i].st.spec != 0 {
			t.place(old[i])
		}
	}
	if t.hand >= n {
		t.hand = 0
	}
}

// remove deletes the entry in slot, closing the gap by shifting the rest
// of its probe run back one slot (no tombstones).
func (t *table) remove(slot int) {
	e := &t.slots[slot]
	if t.group != nil {
		// The key aliases the entry's bytes only for the count's lookup
		// (a decrement never stores it): no copy per removal.
		var k string
		if e.long() {
			k = t.long[e.longIndex()]
		} else {
			k = unsafe.String(&e.key[0], int(e.tagMeta&metaLenMask))
		}
		t.countGroup(k, -1)
	}
	if e.long() {
		li := e.longIndex()
		t.long[li] = ""
		t.longFree = append(t.longFree, li)
	}
	t.n--
	n := len(t.slots)
	i := slot
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		next := &t.slots[j]
		if next.st.spec == 0 || t.dist(j, home(next.tag(), n)) == 0 {
			break
		}
		t.slots[i] = *next
		i = j
	}
	t.slots[i] = entry{}
}

// evict picks the slot whose entry to remove under a cap: the hand moves
// over the slots, giving each used entry a second chance (clearing its
// bit), and stops at the first unused one. The table must not be empty.
func (t *table) evict() int {
	for {
		if t.hand >= len(t.slots) {
			t.hand = 0
		}
		i := t.hand
		t.hand++
		e := &t.slots[i]
		switch {
		case e.st.spec == 0: // empty
		case e.used():
			e.setUsed(false)
		default:
			return i
		}
	}
}

// noteExpiry lowers minExpires to e if e is earlier.
func (t *table) noteExpiry(e int64) {
	if e < t.minExpires {
		t.minExpires = e
	}
}

// sweep removes every entry that expires at or before now and returns how
// many it removed. It does nothing when minExpires shows that no entry has
// expired.
func (t *table) sweep(now int64) int {
	if t.n == 0 || t.minExpires > now {
		return 0
	}
	removed := 0
	next := int64(math.MaxInt64)
	// A removal shifts later entries of the run back into slot i, so i
	// is looked at again; entries only ever move to slots not yet passed
	// (or from slot 0 to the last slot, looked at twice), so none is
	// skipped.
	for i := 0; i < len(t.slots); {
		e := &t.slots[i]
		if e.st.spec == 0 {
			i++
			continue
		}
		if exp := e.st.expires(); exp > now {
			next = min(next, exp)
			i++
			continue
		}
		t.remove(i)
		removed++
	}
	t.minExpires = next
	t.shrink()
	return removed
}

// shrink gives memory back after a sweep left the table sparse: an empty
// table is dropped whole; one filled under 1/4 (and larger than 64 slots)
// is rebuilt at half full.
func (t *table) shrink() {
	switch {
	case t.n == 0:
		*t = table{minExpires: t.minExpires, group: t.group, view: t.view}
		t.setView()
	case t.n*4 < len(t.slots) && len(t.slots) > 64:
		t.resize(max(2*t.n, minSlots))
		if len(t.longFree) > 0 && len(t.longFree)*2 > len(t.long) {
			t.compactLong()
		}
	}
}

// compactLong rebuilds the long key list without its free indices.
func (t *table) compactLong() {
	long := make([]string, 0, len(t.long)-len(t.longFree))
	for i := range t.slots {
		if e := &t.slots[i]; e.st.spec != 0 && e.long() {
			long = append(long, t.long[e.longIndex()])
			binary.LittleEndian.PutUint32(e.key[:4], uint32(len(long)-1))
		}
	}
	t.long, t.longFree = long, nil
}
