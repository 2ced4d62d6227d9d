package lease

import (
	"testing"
	"time"
)

// The demand estimate a request is sized by: a few hits early in a window
// are pooled with the last window's demand (a key checked about once a
// window does not look like four), a busy key's rate shows at once, and a
// key with no history here falls back to the rate so far (over at least a
// quarter window).
func TestEstimate(t *testing.T) {
	const w = time.Second
	mk := func(first int64, prev int64, hasPrev bool, demand int64) (*KeyHolder, *WindowHolder) {
		k := NewKeyHolder("a", w, 100, 1, first, 0)
		if hasPrev {
			k.MakeWin(9, false, false).Demand = prev
		}
		cur := k.MakeWin(10, false, false)
		cur.Demand = demand
		k.first = first // as if the key's first holder here were of window first
		return k, cur
	}
	for _, c := range []struct {
		name             string
		first, prev      int64
		hasPrev          bool
		demand           int64
		elapsed          time.Duration
		minPred, maxPred int64
	}{
		{"once a window, one check at 100 ms", 9, 1, true, 1, 100 * time.Millisecond, 1, 2},
		{"quiet last window, one check", 8, 0, false, 1, 100 * time.Millisecond, 1, 1},
		{"no history: rate so far over a quarter window", 10, 0, false, 1, 100 * time.Millisecond, 4, 4},
		{"busy key: 30 last window, 3 hits in 100 ms", 9, 30, true, 3, 100 * time.Millisecond, 20, 30},
		{"demand moved here: 8 hits in 250 ms, none before", 9, 0, true, 8, 250 * time.Millisecond, 24, 32},
	} {
		k, cur := mk(c.first, c.prev, c.hasPrev, c.demand)
		_, pred := k.Estimate(cur, c.elapsed)
		if pred < c.minPred || pred > c.maxPred {
			t.Errorf("%s: predicted %d, want %d..%d", c.name, pred, c.minPred, c.maxPred)
		}
	}
}

// A key wanted beyond the limit in every region: once a window of it
// ended, the allocator sets each region's standing slice at its fair
// share and says (the Stand's hint) that its demand is above it; such a
// region is capped (asks for nothing), and an uncapped one stays quiet
// while its prediction is within twice what the allocator planned (plus
// StandStep). Outside the windows the hint's Stand set, or unsure of its
// start, a region asks as usual.
func TestContendedHolderRules(t *testing.T) {
	const limit = 10 // StandStep 2
	for _, c := range []struct {
		name                  string
		base, slice           int64 // the window's standing slice, and its slice now
		demand, wanted        int64 // the hint
		from, through         int64 // the windows the hint holds for (the holder's is 10)
		unsure                bool
		predicted             int64
		wantCapped, wantKnown bool
	}{
		{"at the limit, lowered, wanting it all", 10, 9, 10, 0, 10, 12, false, 10, true, false},
		{"standing 3, demand 5", 3, 3, 5, 0, 10, 12, false, 5, true, false},
		{"standing 3, demand 4", 3, 3, 4, 0, 10, 12, false, 5, false, false},
		{"planned 0, others capped, a hit or three", 0, 0, 0, 9, 10, 12, false, 3, false, true},
		{"planned 0, others capped, four", 0, 0, 0, 9, 10, 12, false, 4, false, false},
		{"planned 2, others capped, seven", 2, 2, 2, 9, 10, 12, false, 7, false, true},
		{"planned 2, others capped, eight", 2, 2, 2, 9, 10, 12, false, 8, false, false},
		{"planned 0, nobody capped", 0, 0, 0, 0, 10, 12, false, 1, false, false},
		{"window before the hint", 3, 3, 10, 9, 11, 12, false, 1, false, false},
		{"window after the hint", 3, 3, 10, 9, 8, 9, false, 1, false, false},
		{"unsure of its start", 3, 3, 10, 9, 10, 12, true, 1, false, false},
	} {
		k := NewKeyHolder("a", time.Second, limit, c.base, 10, 0)
		w := k.MakeWin(10, c.unsure, false)
		if c.slice < c.base && !c.unsure {
			if _, ok := w.H.OnLower(Lower{Region: "a", Window: 10, Alloc: 1, Seq: 1, Target: c.slice}, 0); !ok {
				t.Fatalf("%s: the holder refused a lower to %d", c.name, c.slice)
			}
		}
		k.hintDemand, k.hintWanted, k.hintFrom, k.hintThrough = c.demand, c.wanted, c.from, c.through
		if got := k.Capped(w); got != c.wantCapped {
			t.Errorf("%s: capped %v, want %v", c.name, got, c.wantCapped)
		}
		if got := k.Known(w, c.predicted); got != c.wantKnown {
			t.Errorf("%s: known at %d predicted %v, want %v", c.name, c.predicted, got, c.wantKnown)
		}
	}
}

// When a region asks, and for how much: a key at 10 hits in the first
// 100 ms of a 1 s window (a rate of 10 per quarter window, so 46
// predicted over the window) with a slice of 10 asks for 36; the same key with a slice of 50 does not
// ask (what is left covers the lead); right after a request it waits a
// round trip; with no grant since, it stays quiet unless its demand grew
// by half again; a region holding the whole limit never asks; an unsure
// holder at 0 asks for at least its base.
func TestWantMore(t *testing.T) {
	const (
		w     = time.Second
		limit = 100
		lead  = 150 * time.Millisecond
		rtt   = 70 * time.Millisecond
	)
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name             string
		base             int64
		unsure           bool
		demand, used     int64
		elapsed          time.Duration
		askedAgo         time.Duration // 0: never asked
		askedFor         int64
		minWant, maxWant int64
	}{
		{"busy, slice 10", 10, false, 10, 10, 100 * time.Millisecond, 0, 0, 36, 36},
		{"busy, slice 50: enough left for the lead", 50, false, 10, 10, 100 * time.Millisecond, 0, 0, 0, 0},
		{"asked 30 ms ago: within a round trip", 10, false, 10, 10, 100 * time.Millisecond, 30 * time.Millisecond, 40, 0, 0},
		{"asked 100 ms ago for 40, no grant, demand about the same", 10, false, 10, 10, 100 * time.Millisecond, 100 * time.Millisecond, 40, 0, 0},
		{"asked 100 ms ago for 20, no grant, demand doubled", 10, false, 10, 10, 100 * time.Millisecond, 100 * time.Millisecond, 20, 36, 36},
		{"holding the whole limit", 100, false, 90, 90, 500 * time.Millisecond, 0, 0, 0, 0},
		{"unsure at 0, one hit: its base back", 20, true, 1, 0, 100 * time.Millisecond, 0, 0, 20, 20},
		{"idle: no demand", 10, false, 0, 0, 500 * time.Millisecond, 0, 0, 0, 0},
	} {
		k := NewKeyHolder("a", w, limit, c.base, 10, 0)
		win := k.MakeWin(10, c.unsure, false)
		win.Demand, win.Consumed = c.demand, c.used
		if c.askedAgo > 0 {
			win.Asked, win.AskedAt, win.AskedFor = now.Add(-c.askedAgo), win.H.Slice(), c.askedFor
		}
		got := k.WantMore(win, c.elapsed, now, lead, rtt)
		if got < c.minWant || got > c.maxWant {
			t.Errorf("%s: wants %d, want %d..%d", c.name, got, c.minWant, c.maxWant)
		}
	}
}

// A Stand's hint holds for the windows it set; a renewal (a Stand from
// the window after the last one's end, or overlapping it) keeps the
// windows the last one set under the new hint, so the current window of
// a renewed key stays hinted; a Stand that says no demand is no hint; and
// only a hint of wanting regions makes the region give back.
func TestSetHint(t *testing.T) {
	k := NewKeyHolder("a", time.Second, 10, 3, 10, 0)
	w10 := k.MakeWin(10, false, false)
	if giving := k.SetHint(10, 14, 4, 5_000); !giving || !k.Hinted(w10) || !k.Capped(w10) {
		t.Fatalf("first hint: giving %v, hinted %v, capped %v; want all", giving, k.Hinted(w10), k.Capped(w10))
	}
	if k.SetHint(13, 20, 0, 5_000) || !k.Hinted(w10) {
		t.Fatalf("renewal from 13: want window 10 still hinted, no giving (nobody wants)")
	}
	if k.SetHint(30, 40, 4, 5_000); k.Hinted(w10) {
		t.Fatal("a Stand from window 30 (not a renewal) kept window 10 hinted")
	}
	if k.SetHint(10, 20, 4, -1) || k.Hinted(w10) {
		t.Fatal("a hint with no demand said holds")
	}
	k.SetHint(10, 12, 4, 2_600) // 2.6 hits: rounds to 3
	if expired, gives := k.GivesBack(12); expired || !gives {
		t.Fatalf("window 12: expired %v, gives %v; want giving", expired, gives)
	}
	if expired, _ := k.GivesBack(13); !expired {
		t.Fatal("window 13, past the hint: not expired")
	}
	if k.hintDemand != 3 {
		t.Fatalf("demand %d from 2,600 thousandths, want 3", k.hintDemand)
	}
}

// The region's demand average says nothing until three windows were
// folded in (the first is partial), averages the first few evenly, then
// weighs each ended window by StandAlpha; a window without a check
// counts 0.
func TestDemandAverage(t *testing.T) {
	k := NewKeyHolder("a", time.Second, 100, 10, 10, 0) // made in window 10: the average starts at it
	for id, d := range map[int64]int64{10: 4, 11: 10, 12: 10} {
		k.MakeWin(id, false, false).Demand = d
	}
	k.Fold(12)
	if got := k.DemandSaid(); got != -1 {
		t.Fatalf("after two windows: %d, want -1", got)
	}
	k.Fold(13)
	if got := k.DemandSaid(); got != 8_000 {
		t.Fatalf("after 4, 10, 10: %d thousandths, want 8000", got)
	}
	k.Fold(14) // window 13 had no check
	if got := k.DemandSaid(); got != 5_600 {
		t.Fatalf("after a window of 0: %d thousandths, want 5600 (8 + 0.3 × (0 − 8))", got)
	}
}
