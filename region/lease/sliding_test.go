package lease

import (
	"math/rand/v2"
	"testing"
)

// slidingSim is one key under a sliding-window limit (Cloudflare's
// two-window counter) over three regions and several windows of W ticks
// on a lossy, reordering bus: each window has its own Allocator (made at
// the window's start with Slide: the former window's records as carry,
// the bases as floors; the former one closed) and Holders starting at the
// bases; a region admits a hit when its own estimate, its last window's
// count weighted by what is left of the current window plus its current
// count, stays within its slice, and reports its estimate as consumed.
type slidingSim struct {
	t                *testing.T
	rng              *rand.Rand
	limit            int64
	bases            map[string]int64
	regions          []string
	allocs           map[int64]*Allocator
	holders          map[int64]map[string]*Holder
	prev, cur        map[string]int64 // counts of the last and the current window
	win              int64            // the current window id
	tick             int              // ticks into the current window
	bus              []msg
	now              int
	loss, dup        float64
	delay            int
	admitted, offers int64
}

const slidingW = 100 // ticks per window

func (s *slidingSim) send(v any) {
	if s.rng.Float64() < s.loss {
		return
	}
	n := 1
	if s.rng.Float64() < s.dup {
		n = 2
	}
	for range n {
		s.bus = append(s.bus, msg{at: s.now + 1 + s.rng.IntN(s.delay), val: v})
	}
}

// estimate returns region r's estimate times W (exact): its last
// window's count weighted by the ticks left, plus W times its count.
func (s *slidingSim) estimate(r string) int64 {
	return s.prev[r]*int64(slidingW-s.tick) + s.cur[r]*slidingW
}

// consumed is r's estimate rounded up, in hits.
func (s *slidingSim) consumed(r string) int64 {
	return (s.estimate(r) + slidingW - 1) / slidingW
}

// newWindow starts window id: the counts move on, the former allocator
// closes, and the new one starts from its records.
func (s *slidingSim) newWindow() {
	old := s.allocs[s.win]
	s.win++
	s.tick = 0
	for _, r := range s.regions {
		s.prev[r], s.cur[r] = s.cur[r], 0
	}
	a, err := NewAllocator(uint64(s.win), s.win, s.limit, s.bases, nil, false)
	if err != nil {
		s.t.Fatal(err)
	}
	carry := map[string]int64{}
	if old != nil {
		old.Close()
		for _, r := range s.regions {
			carry[r] = old.Record(r)
		}
	}
	a.Slide(carry, s.bases)
	s.allocs[s.win] = a
	s.holders[s.win] = map[string]*Holder{}
	for _, r := range s.regions {
		s.holders[s.win][r] = NewHolder(r, s.win, s.bases[r])
	}
}

func (s *slidingSim) deliver() {
	var due []msg
	due, s.bus = takeDue(s.rng, s.bus, s.now)
	for _, m := range due {
		switch v := m.val.(type) {
		case Request:
			gs, ls := s.allocs[v.Window].OnRequest(v)
			s.sendAll(gs, ls)
		case Grant:
			s.holders[v.Window][v.Region].OnGrant(v)
		case Lower:
			consumed := s.holders[v.Window][v.Region].Slice() // a window that ended admits nothing more
			if v.Window == s.win {
				consumed = s.consumed(v.Region)
			}
			if k, ok := s.holders[v.Window][v.Region].OnLower(v, consumed); ok {
				s.send(k)
			}
		case Ack:
			gs, ls := s.allocs[v.Window].OnAck(v)
			s.sendAll(gs, ls)
		}
		s.check()
	}
}

func (s *slidingSim) sendAll(gs []Grant, ls []Lower) { sendEach(s.send, gs, ls) }

// check asserts the sliding bound: the regions' estimates add up to at
// most the limit.
func (s *slidingSim) check() {
	s.t.Helper()
	var sum int64
	for _, r := range s.regions {
		sum += s.estimate(r)
	}
	if sum > s.limit*slidingW {
		s.t.Fatalf("window %d tick %d: the estimates add up to %.2f, over the limit %d (last %v, current %v)",
			s.win, s.tick, float64(sum)/slidingW, s.limit, s.prev, s.cur)
	}
}

func (s *slidingSim) step(rates map[string]int) {
	s.now++
	s.tick++
	if s.tick == slidingW {
		s.newWindow()
	}
	s.deliver()
	a := s.allocs[s.win]
	if s.now%5 == 0 {
		for _, l := range a.Pending() {
			s.send(l)
		}
	}
	if s.tick%10 == 0 {
		a.SetLeft(1 - float64(s.tick)/slidingW)
		s.sendAll(nil, a.Reclaim())
	}
	for _, r := range s.regions {
		h := s.holders[s.win][r]
		for range rates[r] {
			if s.estimate(r)+slidingW <= h.Slice()*slidingW {
				s.cur[r]++
				s.admitted++
			}
			s.check()
		}
		if left := h.Slice() - s.consumed(r); rates[r] > 0 && left < int64(4*rates[r]) {
			s.send(h.Request(int64(8*rates[r]), s.consumed(r)))
		}
	}
}

func newSlidingSim(t *testing.T, seed uint64, limit int64, bases map[string]int64) *slidingSim {
	s := &slidingSim{t: t, rng: rand.New(rand.NewPCG(seed, 7)), limit: limit, bases: bases, regions: []string{"a", "b", "c"},
		allocs: map[int64]*Allocator{}, holders: map[int64]map[string]*Holder{}, prev: map[string]int64{}, cur: map[string]int64{},
		delay: 1}
	s.newWindow()
	return s
}

// Sliding windows keep the bound with slices that follow demand: over
// random seeds, demand that moves between regions from window to window,
// loss, duplicates and reordering, the regions' estimates never add up
// to more than the limit (checked after every message and every hit).
// Without the carry (a window's records starting at its bases), or
// without the floors (a region lowered below its base counted at its
// record, though its next window starts at the base again), it fails.
func TestSlidingNeverOverTheLimit(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 3))
		limit := int64(30 + rng.IntN(600))
		bases := map[string]int64{"a": limit / 6, "b": limit / 6, "c": limit / 6}
		s := newSlidingSim(t, seed, limit, bases)
		s.loss, s.dup, s.delay = rng.Float64()*0.2, rng.Float64()*0.2, 1+rng.IntN(4)
		for range 6 {
			rates := map[string]int{}
			for _, r := range s.regions {
				if rng.IntN(2) == 0 {
					rates[r] = rng.IntN(int(limit)/30 + 2)
				}
			}
			for range slidingW {
				s.step(rates)
			}
		}
	}
}

// A sliding key used in one region gets, from its second window on, the
// limit less what the other regions' next windows start with (their
// bases): 600 with bases of 100 each gives 400 a window, where fixed
// slices gave 200.
func TestSlidingOneRegion(t *testing.T) {
	const limit = 600
	bases := map[string]int64{"a": 100, "b": 100, "c": 100}
	s := newSlidingSim(t, 1, limit, bases)
	s.delay = 2
	var perWindow []int64
	for range 5 {
		before := s.admitted
		for range slidingW {
			s.step(map[string]int{"a": 10})
		}
		perWindow = append(perWindow, s.admitted-before)
	}
	for i, n := range perWindow[1:] {
		if n < 380 || n > 400 {
			t.Errorf("window %d admitted %d, want about 400 (the limit less the others' bases): %v", i+2, n, perWindow)
		}
	}
	t.Logf("admitted per window: %v", perWindow)
}
