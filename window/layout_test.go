package window

import (
	"testing"
	"unsafe"
)

// A shard's lock has a cache line to itself, the view and the table's
// slots and long headers (read by every check, written by resizes and by
// inserts of long keys) share the next, and every shard starts a line: a
// check then waits for one line of shard state from another core, not two
// in a row.
func TestShardsStartOnCacheLines(t *testing.T) {
	const line = 64
	if got := unsafe.Sizeof(shard{}); got%line != 0 {
		t.Fatalf("shard is %d bytes, not a whole number of %d-byte lines", got, line)
	}
	if got := unsafe.Offsetof(shard{}.view); got != line {
		t.Fatalf("the view starts %d bytes into a shard, want %d (the lock alone on the first line)", got, line)
	}
	if end := unsafe.Offsetof(shard{}.t) + unsafe.Offsetof(table{}.long) + unsafe.Sizeof(table{}.long); end > 2*line {
		t.Fatalf("the view and the table's slice headers end at byte %d of a shard, past its second line", end)
	}
	for range 10 {
		s := NewStore(StoreConfig{})
		if a := uintptr(unsafe.Pointer(&s.shards[0])); a%line != 0 {
			t.Fatalf("shards start at %#x, not on a %d-byte line", a, line)
		}
	}
}

// prefetchWrite is a hint: no address faults, and it changes nothing.
func TestPrefetchWriteNeverFaults(t *testing.T) {
	x := [8]uint64{1, 2, 3}
	for _, a := range []uintptr{0, 1, ^uintptr(0), ^uintptr(0) - 63, uintptr(unsafe.Pointer(&x[0]))} {
		prefetchWrite(a)
	}
	if x != [8]uint64{1, 2, 3} {
		t.Fatalf("prefetchWrite changed memory: %v", x)
	}
}
