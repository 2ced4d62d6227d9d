package lease

import "testing"

// reviewSpendAll makes region a spend the whole limit under alloc: b
// and c give their bases back and a is granted the rest. It returns the
// holders.
func reviewSpendAll(t *testing.T, al *Allocator, limit int64) map[string]*Holder {
	t.Helper()
	w := al.Window()
	hs := map[string]*Holder{"a": NewHolder("a", w, 5), "b": NewHolder("b", w, 5), "c": NewHolder("c", w, 5)}
	for _, r := range []string{"b", "c"} {
		k, _ := hs[r].OnLower(al.lower(r, 0), 0)
		al.OnAck(k)
	}
	grantAll(hs, must(al.OnRequest(hs["a"].Request(limit-5, 0))))
	if got := hs["a"].Slice(); got != limit {
		t.Fatalf("a's slice %d, want %d", got, limit)
	}
	return hs
}

// reviewLearn answers every pending report of al from the holders (with
// consumed per region) and returns the grants the last one made and what
// each holder's TakeSpent gave.
func reviewLearn(t *testing.T, al *Allocator, hs map[string]*Holder, consumed map[string]int64) map[string]int64 {
	t.Helper()
	var gs []Grant
	for _, l := range al.Pending() {
		k, ok := hs[l.Region].OnLower(l, consumed[l.Region])
		if !ok {
			t.Fatalf("no ack from %s", l.Region)
		}
		g, _ := al.OnAck(k)
		gs = append(gs, g...)
	}
	if al.Learning() {
		t.Fatal("still learning after every report")
	}
	return grantAll(hs, gs)
}

// A learning allocator hands over (its node left, or the key moved) after
// a blind region reported and before every region did: Bounds says the
// blind region's report (0: a blind holder holds nothing), not the most
// it can have admitted. The next allocator inherits 0 for it, counts the
// blind region at min(rest, 0) = 0 when it learns, and grants the limit
// again. (rpc: the key's allocator region has two nodes c1, c2; c1 (the
// allocator) is killed, c2 learns; a's only node restarts and reports
// blind; b's report is late; c1 comes back and c2's handOverMoved sends
// Bounds to it.)
func TestReviewLearningAllocatorHandsOverABlindRegionAtItsReport(t *testing.T) {
	const limit = 30
	bases := map[string]int64{"a": 5, "b": 5, "c": 5}
	a0, _ := NewAllocator(1, 1, limit, bases, nil, false)
	hs := reviewSpendAll(t, a0, limit)
	admitted := int64(limit) // a spent it all under a0; a0 is lost (killed)
	// a's only node restarts: blind.
	ha := NewHolder("a", 1, 5)
	ha.StartBlind(41)
	hs["a"] = ha
	// a1 takes over and learns; a's blind report comes, b's and c's not yet.
	a1, _ := NewAllocator(2, 1, limit, bases, nil, true)
	for _, l := range a1.Pending() {
		if l.Region == "a" {
			k, _ := ha.OnLower(l, 0)
			a1.OnAck(k)
		}
	}
	if !a1.Learning() {
		t.Fatal("a1 learnt with one report")
	}
	a1.Close()
	bounds := a1.Bounds()
	// a2 takes over from a1 with a1's bounds.
	a2, _ := NewAllocator(3, 1, limit, bases, nil, true)
	a2.Inherit(bounds)
	ha2 := NewHolder("a", 1, 5)
	ha2.StartBlind(42) // a fresh holder, or the same one: a2 never wrote to it
	hs["a"] = ha2
	a2.OnRequest(ha2.Request(limit, 0))
	spent := reviewLearn(t, a2, hs, map[string]int64{})
	admitted += max(ha2.Slice()-spent["a"], 0)
	if admitted > limit {
		t.Errorf("a1's bounds %v (a blind region at its report); after a2 learnt a may admit %d more (spent %d, slice %d): %d of %d",
			bounds, ha2.Slice()-spent["a"], spent["a"], ha2.Slice(), admitted, limit)
	}
}

// Inherit is sound only when every former allocator of the window handed
// over (its doc): a0 handed over to a1, a1 granted a the rest; a2 given
// a0's bound alone would count a blind a at 5 and grant 25 more (found
// by review). rpc keeps the chain whole: an allocator state that stops
// being the key's is always handed over (handOverMoved, and
// stillAllocator when a message finds it first), and a node forwards an
// inherited bound it is not the allocator for and forgets it, so no bound
// outlives a later allocator that could have granted beyond it; a killed
// allocator takes the bounds it inherited with it, and its successor
// counts blind regions at the rest. With a1's bounds handed over too, a
// is counted at what it had, and the window admits the limit.
func TestReviewHandOverFromEveryFormerAllocatorHolds(t *testing.T) {
	const limit = 30
	bases := map[string]int64{"a": 5, "b": 5, "c": 5}
	a0, _ := NewAllocator(1, 1, limit, bases, nil, false)
	a0.Close()
	stale := a0.Bounds() // a: 5, b: 5, c: 5
	a1, _ := NewAllocator(2, 1, limit, bases, nil, false)
	a1.Inherit(stale)
	hs := reviewSpendAll(t, a1, limit)
	a1.Close()
	admitted := int64(limit)
	ha := NewHolder("a", 1, 5)
	ha.StartBlind(43)
	hs["a"] = ha
	a2, _ := NewAllocator(3, 1, limit, bases, nil, true)
	a2.Inherit(stale)
	a2.Inherit(a1.Bounds())
	a2.OnRequest(ha.Request(limit, 0))
	spent := reviewLearn(t, a2, hs, map[string]int64{})
	admitted += max(ha.Slice()-spent["a"], 0)
	if admitted > limit {
		t.Errorf("a counted at %d (spent %d, slice %d): %d of %d", a2.Record("a"), spent["a"], ha.Slice(), admitted, limit)
	}
}

// A hand-over that arrives after the new allocator learnt changes
// nothing: with every region blind (a rolling deploy with no check
// between the restarts) the window has started afresh already. In rpc
// the race is a restarted allocator node's first check (reports to the
// other regions and their Acks: a round trip) against the forwarded
// hand-over (queued by the former allocator's node on its next view
// change, then the next flush).
func TestReviewHandOverAfterLearningAllBlind(t *testing.T) {
	const limit = 30
	bases := map[string]int64{"a": 5, "b": 5, "c": 5}
	a0, _ := NewAllocator(1, 1, limit, bases, nil, false)
	hs := reviewSpendAll(t, a0, limit)
	admitted := int64(limit)
	a0.Close()
	bounds := a0.Bounds()
	for i, r := range []string{"a", "b", "c"} {
		hs[r] = NewHolder(r, 1, 5)
		hs[r].StartBlind(uint64(50 + i))
	}
	a1, _ := NewAllocator(2, 1, limit, bases, nil, true)
	a1.OnRequest(hs["a"].Request(limit, 0))
	spent := reviewLearn(t, a1, hs, map[string]int64{})
	a1.Inherit(bounds) // late
	grantAll(hs, must(a1.OnRequest(hs["a"].Request(limit, 0))))
	admitted += max(hs["a"].Slice()-spent["a"], 0)
	if admitted > limit {
		t.Errorf("hand-over after learning: a may admit %d more: %d of %d", hs["a"].Slice()-spent["a"], admitted, limit)
	}
}

// Held: two regions blind at once under an allocator that kept its
// records: each is counted at its record.
func TestReviewTwoBlindRegionsWithRecords(t *testing.T) {
	const limit = 30
	bases := map[string]int64{"a": 5, "b": 5, "c": 5}
	al, _ := NewAllocator(1, 1, limit, bases, nil, false)
	hs := map[string]*Holder{"a": NewHolder("a", 1, 5), "b": NewHolder("b", 1, 5), "c": NewHolder("c", 1, 5)}
	k, _ := hs["c"].OnLower(al.lower("c", 0), 0)
	al.OnAck(k)
	grantAll(hs, must(al.OnRequest(hs["a"].Request(5, 0))))  // a: 10
	grantAll(hs, must(al.OnRequest(hs["b"].Request(15, 0)))) // b: up to 20
	admitted := hs["a"].Slice() + hs["b"].Slice()
	for i, r := range []string{"a", "b"} {
		hs[r] = NewHolder(r, 1, 5)
		hs[r].StartBlind(uint64(60 + i))
	}
	for _, r := range []string{"a", "b", "c"} {
		spent := grantAll(hs, must(al.OnRequest(hs[r].Request(30, 0))))
		admitted += max(hs[r].Slice()-spent[r], 0)
	}
	if admitted > limit {
		t.Errorf("two blind regions: %d of %d", admitted, limit)
	}
}

// Held: a blind holder's request, its grant, its first unblinded request
// (which makes the allocator forget it was blind), then a late duplicate
// of its blind request (same nonce): the allocator counts it blind again
// (its record never below what it spent): under-admission, never over.
func TestReviewReorderedBlindRequestAfterUnblinding(t *testing.T) {
	const limit = 30
	bases := map[string]int64{"a": 5, "b": 5, "c": 5}
	al, _ := NewAllocator(1, 1, limit, bases, nil, false)
	hs := map[string]*Holder{"a": NewHolder("a", 1, 5), "b": NewHolder("b", 1, 5), "c": NewHolder("c", 1, 5)}
	grantAll(hs, must(al.OnRequest(hs["a"].Request(10, 0)))) // a: 15, all spent
	admitted := hs["a"].Slice()
	h := NewHolder("a", 1, 5)
	h.StartBlind(70)
	hs["a"] = h
	blindReq := h.Request(5, 0)
	spent := grantAll(hs, must(al.OnRequest(blindReq)))
	consumed := spent["a"]
	grantAll(hs, must(al.OnRequest(h.Request(5, consumed))))
	grantAll(hs, must(al.OnRequest(blindReq))) // late duplicate
	grantAll(hs, must(al.OnRequest(hs["b"].Request(30, 0))))
	grantAll(hs, must(al.OnRequest(hs["c"].Request(30, 0))))
	admitted += max(h.Slice()-consumed, 0) + hs["b"].Slice() + hs["c"].Slice()
	if admitted > limit {
		t.Errorf("reordered blind request: %d of %d", admitted, limit)
	}
}
