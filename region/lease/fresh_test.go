package lease

import "testing"

// A holder made afresh (a nonce) that applies a duplicate of an old Lower
// of the current allocator (sent before it was made) still refuses a
// duplicate of an old grant, newer than that Lower but superseded by a
// later Lower the old holder acknowledged: the grant does not carry its
// nonce. Found by review: when the nonce was checked only until an
// allocator wrote to the holder, a held 50 of a record of 10, and the
// slices added up to 140 of 100. One allocator, no split: only
// duplicated, delayed messages.
func TestFreshHolderRefusesAStaleGrantAfterAStaleLower(t *testing.T) {
	const limit = 100
	bases := map[string]int64{"a": 25, "b": 25, "c": 25}
	a, _ := NewAllocator(1, 1, limit, bases, nil, false)
	h0 := NewHolder("a", 1, 25)
	l1 := a.lower("a", 20) // seq 1
	k, _ := h0.OnLower(l1, 0)
	a.OnAck(k) // record 20, free 35
	gs, _ := a.OnRequest(h0.Request(30, 0))
	if len(gs) != 1 {
		t.Fatalf("grants %v", gs)
	}
	g := gs[0] // seq 2, slice 50
	h0.OnGrant(g)
	l2 := a.lower("a", 10) // seq 3
	k, _ = h0.OnLower(l2, 0)
	a.OnAck(k) // record 10
	// h0's node restarts: the holder is made afresh; the bus still holds
	// duplicates of l1 and g.
	h1 := NewHolder("a", 1, 25)
	h1.StartAfresh(99)
	h1.OnLower(l1, 0) // applied: no allocator wrote to h1 yet
	h1.OnGrant(g)     // seq 2 > 1, same allocator, nonce not checked any more
	hb := NewHolder("b", 1, 25)
	for _, g := range must(a.OnRequest(hb.Request(50, 0))) {
		hb.OnGrant(g)
	}
	sum := h1.Slice() + hb.Slice() + 25
	if h1.Slice() > a.Record("a") || sum > limit {
		t.Fatalf("a holds %d (record %d), b %d, c 25: %d of %d", h1.Slice(), a.Record("a"), hb.Slice(), sum, limit)
	}
}

func must(gs []Grant, _ []Lower) []Grant { return gs }

// A closed allocator (a sliding window's, once the next one exists)
// grants nothing, so a request lowers nobody for it (found by review:
// it did, and what the Acks freed stayed in the pool).
func TestClosedAllocatorLowersNothing(t *testing.T) {
	a, _ := NewAllocator(1, 1, 100, map[string]int64{"a": 25, "b": 25}, nil, false)
	a.Slide(nil, map[string]int64{"a": 25, "b": 25})
	ha := NewHolder("a", 1, 25)
	for _, g := range must(a.OnRequest(ha.Request(50, 0))) {
		ha.OnGrant(g)
	}
	a.Close()
	gs, ls := a.OnRequest(NewHolder("b", 1, 25).Request(50, 0))
	if len(gs) > 0 || len(ls) > 0 || len(a.Reclaim()) > 0 {
		t.Errorf("a closed allocator answered a request with grants %v, lowers %v", gs, ls)
	}
}
