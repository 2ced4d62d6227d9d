package lease

import (
	"math/rand/v2"
	"testing"
)

// msg is a message on the simulated bus, delivered at tick at.
type msg struct {
	at  int
	val any
}

// sim is one key's window over three regions on a lossy bus: each tick
// the due messages are delivered (in random order), each region takes its
// arrivals and asks for more below a low-water mark, and the allocator
// answers; lost, duplicated and delayed messages are the bus's. It checks
// the invariant after every step.
type sim struct {
	t       *testing.T
	rng     *rand.Rand
	limit   int64
	alloc   *Allocator
	holders map[string]*Holder
	regions []string
	bus     []msg
	now     int
	loss    float64 // probability a message is lost
	dup     float64 // probability a message is delivered twice
	delay   int     // a message takes 1..delay ticks
	cut     map[string]bool
	demand  int64 // hits that arrived
}

func newSim(t *testing.T, seed uint64, limit int64, bases map[string]int64) *sim {
	t.Helper()
	a, err := NewAllocator(7, limit, bases)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, 99)), limit: limit, alloc: a, holders: map[string]*Holder{},
		delay: 1, cut: map[string]bool{}}
	for _, r := range []string{"a", "b", "c"} {
		s.regions = append(s.regions, r)
		s.holders[r] = NewHolder(r, 7, bases[r])
	}
	return s
}

// send puts v on the bus from or to region r (nothing crosses a cut).
func (s *sim) send(r string, v any) {
	if s.cut[r] || s.rng.Float64() < s.loss {
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

// step runs one tick with arrivals[r] single-hit checks entering region r.
func (s *sim) step(arrivals map[string]int) {
	s.now++
	var due, later []msg
	for _, m := range s.bus {
		if m.at <= s.now {
			due = append(due, m)
		} else {
			later = append(later, m)
		}
	}
	s.bus = later
	s.rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	for _, m := range due {
		switch v := m.val.(type) {
		case Request:
			gs, ls := s.alloc.OnRequest(v)
			for _, g := range gs {
				s.send(g.Region, g)
			}
			for _, l := range ls {
				s.send(l.Region, l)
			}
		case Grant:
			if !s.cut[v.Region] {
				s.holders[v.Region].OnGrant(v)
			}
		case Lower:
			if !s.cut[v.Region] {
				if k, ok := s.holders[v.Region].OnLower(v); ok {
					s.send(v.Region, k)
				}
			}
		case Ack:
			s.alloc.OnAck(v)
		}
		s.check()
	}
	if s.now%5 == 0 {
		for _, l := range s.alloc.Pending() {
			s.send(l.Region, l)
		}
	}
	for _, r := range s.regions {
		h := s.holders[r]
		for range arrivals[r] {
			s.demand++
			h.Take(1)
			s.check()
		}
		// Ask before running out: below a low-water mark of a few
		// ticks' arrivals, for a few more ticks' worth.
		if left := h.Slice() - h.Consumed(); arrivals[r] > 0 && left < int64(4*arrivals[r]) {
			s.send(r, h.Request(int64(8*arrivals[r])))
		}
	}
}

// check asserts the invariant: what the regions consumed, and what they
// may spend, never adds up to more than the limit, and no region holds
// more than the allocator recorded for it.
func (s *sim) check() {
	s.t.Helper()
	var consumed, slices int64
	for r, h := range s.holders {
		consumed += h.Consumed()
		slices += h.Slice()
		if h.Held() > s.alloc.Granted(r) {
			s.t.Fatalf("tick %d: %s holds %d, the allocator recorded %d", s.now, r, h.Held(), s.alloc.Granted(r))
		}
	}
	if consumed > s.limit || slices > s.limit {
		s.t.Fatalf("tick %d: consumed %d, slices %d, over the limit %d", s.now, consumed, slices, s.limit)
	}
}

func (s *sim) consumed() int64 {
	var n int64
	for _, h := range s.holders {
		n += h.Consumed()
	}
	return n
}

// Under loss, duplication, reordering (delays of 1..4 ticks) and cuts,
// over random seeds and demand patterns, the regions never consume more
// than the limit, and no region ever holds more than the allocator
// recorded (the invariant is checked after every message and every hit).
func TestNeverOverTheLimit(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		limit := int64(10 + rng.IntN(1000))
		bases := map[string]int64{"a": limit / 6, "b": limit / 6, "c": limit / 6}
		s := newSim(t, seed, limit, bases)
		s.loss, s.dup, s.delay = rng.Float64()*0.3, rng.Float64()*0.3, 1+rng.IntN(4)
		rates := map[string]int{"a": rng.IntN(20), "b": rng.IntN(20), "c": rng.IntN(20)}
		for tick := range 400 {
			if tick == 100 {
				s.cut["c"] = rng.IntN(2) == 0
			}
			if tick == 200 {
				s.cut["c"] = false
				rates["a"], rates["b"] = rates["b"], rates["a"] // demand moves
			}
			s.step(rates)
		}
		if c := s.consumed(); c > limit {
			t.Fatalf("seed %d: consumed %d over %d", seed, c, limit)
		}
	}
}

// Slices follow demand: with nothing lost, a region that takes all the
// traffic gets the pool and, by reclaim (lower first), what the idle
// regions were granted; the window admits at least 95 % of the limit
// (its bases stay with the idle regions: this step has no next-window
// weights, so a one-region key still leaves the others' bases unused).
func TestGrantsFollowDemand(t *testing.T) {
	const limit = 600
	bases := map[string]int64{"a": 50, "b": 50, "c": 50} // a quarter of the limit as bases
	s := newSim(t, 1, limit, bases)
	s.delay = 2
	// Uniform demand first, then it all moves to a.
	for range 20 {
		s.step(map[string]int{"a": 2, "b": 2, "c": 2})
	}
	for range 200 {
		s.step(map[string]int{"a": 10})
	}
	admitted := s.consumed()
	reachable := int64(limit - 50 - 50 + s.holders["b"].Consumed() + s.holders["c"].Consumed())
	if admitted < reachable*95/100 {
		t.Errorf("admitted %d of a reachable %d (the limit less the idle regions' unused bases)", admitted, reachable)
	}
	if s.alloc.Free() != 0 && s.holders["a"].Slice() < limit-100 {
		t.Errorf("a's slice %d, pool left %d", s.holders["a"].Slice(), s.alloc.Free())
	}
	t.Logf("admitted %d of %d (a %d, b %d, c %d); a's slice %d", admitted, limit,
		s.holders["a"].Consumed(), s.holders["b"].Consumed(), s.holders["c"].Consumed(), s.holders["a"].Slice())
}

// Messages of another window, older than what a holder applied, or
// duplicated change nothing; a Lower keeps what was spent; bases over the
// limit are refused.
func TestMessagesAreIdempotent(t *testing.T) {
	if _, err := NewAllocator(1, 10, map[string]int64{"a": 6, "b": 5}); err == nil {
		t.Error("bases over the limit accepted")
	}
	a, _ := NewAllocator(1, 10, map[string]int64{"a": 2, "b": 2})
	h := NewHolder("a", 1, 2)
	gs, _ := a.OnRequest(h.Request(4))
	if len(gs) != 1 || gs[0].Granted != 4 || a.Free() != 2 {
		t.Fatalf("grant %v, free %d", gs, a.Free())
	}
	h.OnGrant(gs[0])
	h.OnGrant(gs[0]) // a duplicate
	h.OnGrant(Grant{Region: "a", Window: 2, Seq: 9, Granted: 100})
	if h.Slice() != 6 {
		t.Fatalf("slice %d after a grant of 4, a duplicate and another window's, want 6", h.Slice())
	}
	for range 5 {
		h.Take(1)
	}
	// b wants more than is free: a is asked to lower, keeps its 3 spent
	// beyond its base, and the rest returns to the pool only on its Ack.
	_, ls := a.OnRequest(Request{Region: "b", Window: 1, Want: 5})
	if len(ls) != 1 || ls[0].Region != "a" || a.Free() != 0 {
		t.Fatalf("lowers %v, free %d", ls, a.Free())
	}
	k, ok := h.OnLower(ls[0])
	if !ok || k.Held != 3 || h.Slice() != 5 || h.Take(1) {
		t.Fatalf("after the lower: ack %v, slice %d", k, h.Slice())
	}
	h.OnGrant(gs[0]) // the old grant again, late: ignored
	if h.Slice() != 5 {
		t.Fatalf("a late old grant raised the slice to %d", h.Slice())
	}
	a.OnAck(k)
	a.OnAck(k) // a duplicate
	if a.Free() != 1 || a.Granted("a") != 3 {
		t.Fatalf("after the ack: free %d, a's grant %d; want 1 and 3", a.Free(), a.Granted("a"))
	}
}
