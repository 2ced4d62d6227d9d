package lease

import (
	"math"
	"math/rand/v2"
	"testing"
)

// standSim is one key over many windows and three regions on a lossy
// bus: the allocator sets standing slices at random (lowers and raises,
// some refused by Stands.Set), makes a per-window Allocator for each
// window when a region first asks in it (records from Stands.Starts),
// grants and reclaims in it; each region's holder makes its windows by a
// clock of its own (up to skew ticks off), from its Standing, admits its
// arrivals and asks below a low-water mark. The allocator may crash: a
// new one takes over with a floor after every stand the old one could
// have set, its per-window Allocators before it in learning mode, while
// the old one's messages are still on the bus. After every message and
// every hit it checks, for every window near the present: the slices the
// regions hold or would start at add up to at most the limit; no region
// consumed more than its slice.
type standSim struct {
	t        *testing.T
	rng      *rand.Rand
	limit    int64
	wl       int64 // ticks per window
	regions  []string
	bases    map[string]int64
	id       uint64
	st       *Stands
	allocs   map[int64]*Allocator
	stand    map[string]*Standing
	holders  map[string]map[int64]*Holder
	consumed map[string]map[int64]int64
	skew     map[string]int64
	bus      []msg
	now      int64
	loss     float64
	dup      float64
	delay    int
	span     int64 // a stand covers at most this many windows after the current one
	admitted int64
}

func newStandSim(t *testing.T, seed uint64) *standSim {
	rng := rand.New(rand.NewPCG(seed, 7))
	limit := int64(5 + rng.IntN(200))
	s := &standSim{t: t, rng: rng, limit: limit, wl: 20, regions: []string{"a", "b", "c"}, bases: map[string]int64{},
		allocs: map[int64]*Allocator{}, stand: map[string]*Standing{}, holders: map[string]map[int64]*Holder{},
		consumed: map[string]map[int64]int64{}, skew: map[string]int64{}, span: 8,
		loss: rng.Float64() * 0.3, dup: rng.Float64() * 0.3, delay: 1 + rng.IntN(6)}
	for _, r := range s.regions {
		s.bases[r] = limit / 6
		s.stand[r] = NewStanding(r, s.bases[r])
		s.holders[r] = map[int64]*Holder{}
		s.consumed[r] = map[int64]int64{}
		s.skew[r] = int64(rng.IntN(5)) - 2
	}
	s.newAllocator(math.MinInt64)
	return s
}

// newAllocator starts an allocator state (a new id, no per-window
// allocators) whose stands may raise from window floor on.
func (s *standSim) newAllocator(floor int64) {
	s.id++
	st, err := NewStands(s.id<<32, s.limit, s.bases, floor)
	if err != nil {
		s.t.Fatal(err)
	}
	s.st, s.allocs = st, map[int64]*Allocator{}
}

func (s *standSim) window(r string) int64 {
	now := s.now
	if r != "" {
		now += s.skew[r]
	}
	return now / s.wl
}

func (s *standSim) send(v any) {
	if s.rng.Float64() < s.loss {
		return
	}
	n := 1
	if s.rng.Float64() < s.dup {
		n = 2
	}
	for range n {
		s.bus = append(s.bus, msg{at: int(s.now) + 1 + s.rng.IntN(s.delay), val: v})
	}
}

// alloc returns window w's allocator, made when the window is not over.
func (s *standSim) alloc(w int64) *Allocator {
	if a := s.allocs[w]; a != nil {
		return a
	}
	if w < s.window("")-1 {
		return nil
	}
	s.id++
	a, err := NewAllocator(s.id, w, s.limit, s.st.Starts(w), nil, w < s.st.Floor())
	if err != nil {
		s.t.Fatal(err)
	}
	s.st.Made(w)
	s.allocs[w] = a
	for _, l := range a.Pending() {
		s.send(l)
	}
	return a
}

// holder returns region r's holder of window w, making it from its
// Standing.
func (s *standSim) holder(r string, w int64) *Holder {
	h := s.holders[r][w]
	if h == nil {
		h = NewHolder(r, w, s.stand[r].Start(w))
		s.holders[r][w] = h
	}
	return h
}

func (s *standSim) deliver(v any) {
	switch v := v.(type) {
	case Stand:
		if k, ok := s.stand[v.Region].OnStand(v); ok {
			s.send(k)
		}
	case StandAck:
		s.st.OnAck(v)
	case Request:
		if a := s.alloc(v.Window); a != nil {
			gs, ls := a.OnRequest(v)
			s.sendAll(gs, ls)
		}
	case Grant:
		s.holder(v.Region, v.Window).OnGrant(v)
	case Lower:
		if k, ok := s.holder(v.Region, v.Window).OnLower(v, s.consumed[v.Region][v.Window]); ok {
			s.send(k)
		}
	case Ack:
		if a := s.allocs[v.Window]; a != nil {
			s.sendAll(a.OnAck(v))
		}
	}
}

func (s *standSim) sendAll(gs []Grant, ls []Lower) { sendEach(s.send, gs, ls) }

// sendEach puts an allocator's grants, then its lowers, on a bus by send.
func sendEach(send func(any), gs []Grant, ls []Lower) {
	for _, g := range gs {
		send(g)
	}
	for _, l := range ls {
		send(l)
	}
}

// check asserts the bound for every window near the present.
func (s *standSim) check() {
	s.t.Helper()
	cur := s.window("")
	for w := cur - 2; w <= cur+s.span+4; w++ {
		var sum, consumed int64
		for _, r := range s.regions {
			slice := s.stand[r].At(w)
			if h := s.holders[r][w]; h != nil {
				slice = h.Slice()
			}
			c := s.consumed[r][w]
			if c > slice {
				s.t.Fatalf("tick %d window %d: %s consumed %d over its slice %d", s.now, w, r, c, slice)
			}
			sum += slice
			consumed += c
		}
		if sum > s.limit || consumed > s.limit {
			s.t.Fatalf("tick %d window %d: slices %d, consumed %d, over the limit %d", s.now, w, sum, consumed, s.limit)
		}
	}
}

// step runs one tick: messages due, the allocator's stands and resends,
// then each region's arrivals (rates: checks per tick).
func (s *standSim) step(rates map[string]int) {
	s.now++
	var due []msg
	due, s.bus = takeDue(s.rng, s.bus, int(s.now))
	for _, m := range due {
		s.deliver(m.val)
		s.check()
	}
	cur := s.window("")
	// A stand now and then: a random region, slice and run of windows
	// (Set refuses what would break the bound).
	if s.rng.IntN(4) == 0 {
		r := s.regions[s.rng.IntN(len(s.regions))]
		from := max(cur+1+int64(s.rng.IntN(3)), s.st.Floor())
		through := min(from+int64(s.rng.IntN(int(s.span))), cur+s.span)
		if m, ok := s.st.Set(r, from, through, int64(s.rng.IntN(int(s.limit)+1))); ok {
			s.send(m)
		}
	}
	if s.now%7 == 0 {
		for _, m := range s.st.Pending() {
			s.send(m)
		}
		for _, a := range s.allocs {
			for _, l := range a.Pending() {
				s.send(l)
			}
		}
	}
	if s.now%5 == 0 {
		if a := s.allocs[cur]; a != nil {
			a.SetLeft(1 - float64(s.now%s.wl)/float64(s.wl))
			s.sendAll(nil, a.Reclaim())
		}
	}
	for _, r := range s.regions {
		w := s.window(r)
		h := s.holder(r, w)
		if s.rng.IntN(3) == 0 {
			// Made ahead: a next-window request.
			s.send(s.holder(r, w+1).Request(int64(1+s.rng.IntN(int(s.limit))), 0))
		}
		for range rates[r] {
			if s.consumed[r][w]+1 <= h.Slice() {
				s.consumed[r][w]++
				s.admitted++
			}
			s.check()
		}
		if left := h.Slice() - s.consumed[r][w]; rates[r] > 0 && left < int64(3*rates[r]) {
			s.send(h.Request(int64(6*rates[r]), s.consumed[r][w]))
		}
	}
	s.check()
	if s.now%(4*s.wl) == 0 {
		for _, r := range s.regions {
			s.stand[r].Forget(cur - 2)
		}
		s.st.Forget(cur - 2)
	}
}

// Standing slices over 60 windows, on random seeds: loss, duplicates,
// reordering, clocks a few ticks apart, random stands (lowers and raises
// in any order), demand that moves, and an allocator crash (a new one
// with a floor after the old one's stands, learning the windows before
// it) never let the regions hold or consume more than the limit in any
// window (checked after every message and hit).
func TestStandsNeverOverTheLimit(t *testing.T) {
	for seed := range uint64(200) {
		s := newStandSim(t, seed)
		rates := map[string]int{"a": s.rng.IntN(4), "b": s.rng.IntN(4), "c": s.rng.IntN(4)}
		crashAt := int64(200 + s.rng.IntN(800))
		for s.now < 60*s.wl {
			if s.now == 30*s.wl {
				rates["a"], rates["c"] = rates["c"], rates["a"]
			}
			if s.now == crashAt {
				// Every stand the old allocator set ends by cur+span:
				// the new one plans after that (and the clocks' skew).
				s.newAllocator(s.window("") + s.span + 2)
			}
			s.step(rates)
		}
		if s.admitted == 0 && rates["a"]+rates["b"]+rates["c"] > 0 {
			t.Fatalf("seed %d: nothing admitted", seed)
		}
	}
}

// A Stand is applied from the window after the newest one made, and the
// allocator counts it the same way from the Ack; a repeated Stand gets
// the same Ack; an older one, or another allocator's while the stands it
// would replace still run, gets none.
func TestStandingApplies(t *testing.T) {
	h := NewStanding("a", 10)
	if got := h.Start(5); got != 10 {
		t.Fatalf("start 5 = %d, want the base 10", got)
	}
	st, err := NewStands(1, 100, map[string]int64{"a": 10, "b": 10}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Lower a from window 4 to 9: window 5 is made, so it applies from 6.
	m, ok := st.Set("a", 4, 9, 2)
	if !ok {
		t.Fatal("a lower was refused")
	}
	if got := st.At("a", 6); got != 10 {
		t.Fatalf("before the ack, At(a, 6) = %d, want 10", got)
	}
	k, ok := h.OnStand(m)
	if !ok || k.Made != 5 {
		t.Fatalf("ack %+v %v, want Made 5", k, ok)
	}
	if !st.OnAck(k) {
		t.Fatal("the ack was not taken")
	}
	for w, want := range map[int64]int64{5: 10, 6: 2, 9: 2, 10: 10} {
		if got := st.At("a", w); got != want {
			t.Errorf("At(a, %d) = %d, want %d", w, got, want)
		}
		if w > 5 {
			if got := h.At(w); got != want {
				t.Errorf("holder at %d = %d, want %d", w, got, want)
			}
		}
	}
	if k2, ok := h.OnStand(m); !ok || k2 != k {
		t.Errorf("a repeated stand got %+v %v, want the same ack", k2, ok)
	}
	// b may now rise to 98 in windows 6..9 (a holds 2), not to 99, and
	// not in window 10, where a is back at its base 10.
	if _, ok := st.Set("b", 6, 9, 99); ok {
		t.Error("b raised to 99 with a at 2: over the limit")
	}
	if _, ok := st.Set("b", 6, 10, 98); ok {
		t.Error("b raised to 98 through window 10, where a is at 10")
	}
	raise, ok := st.Set("b", 6, 9, 98)
	if !ok {
		t.Fatal("b's raise to 98 was refused")
	}
	if got := st.At("b", 7); got != 98 {
		t.Errorf("a raise counts before its ack: At(b, 7) = %d, want 98", got)
	}
	if _, ok := st.Set("b", 6, 9, 50); ok {
		t.Error("a second stand while one is in flight")
	}
	// Another allocator's Stand while a's stand runs (to 9) is refused;
	// after it, taken.
	if _, ok := h.OnStand(Stand{Region: "a", Alloc: 2, Seq: 1, From: 9, Through: 12, Slice: 50}); ok {
		t.Error("another allocator's stand over the running one was taken")
	}
	if _, ok := h.OnStand(Stand{Region: "a", Alloc: 2, Seq: 1, From: 10, Through: 12, Slice: 1}); !ok {
		t.Error("another allocator's stand after the running one was refused")
	}
	if _, ok := h.OnStand(Stand{Region: "a", Alloc: 1, Seq: 9, From: 11, Through: 14, Slice: 1}); ok {
		t.Error("the former allocator's stand over the new one's was taken")
	}
	_ = raise
	// The floor: no stand before it.
	st2, _ := NewStands(3, 100, map[string]int64{"a": 10, "b": 10}, 20)
	if _, ok := st2.Set("a", 19, 25, 50); ok {
		t.Error("a stand before the floor")
	}
	if _, ok := st2.Set("a", 20, 25, 50); !ok {
		t.Error("a stand at the floor refused")
	}
	// Made: no stand for a window a per-window allocator was made for.
	st2.Made(30)
	if _, ok := st2.Set("b", 30, 35, 5); ok {
		t.Error("a stand for a window already made")
	}
}

// FairStands: water-filling of the demand, the rest in proportion, whole
// hits adding up to the limit.
func TestFairStands(t *testing.T) {
	cases := []struct {
		limit  int64
		demand map[string]float64
		want   map[string]int64
	}{
		{10, map[string]float64{"a": 27, "b": 1.5, "c": 1.5}, map[string]int64{"a": 8, "b": 1, "c": 1}},
		{10, map[string]float64{"a": 10, "b": 10, "c": 10}, map[string]int64{"a": 4, "b": 3, "c": 3}},
		{100, map[string]float64{"a": 30, "b": 0, "c": 0}, map[string]int64{"a": 100, "b": 0, "c": 0}},
		{100, map[string]float64{"a": 0, "b": 0}, map[string]int64{"a": 50, "b": 50}},
		{600, map[string]float64{"a": 500, "b": 50, "c": 10}, map[string]int64{"a": 536, "b": 53, "c": 11}},
	}
	for _, c := range cases {
		got := FairStands(c.limit, c.demand)
		var sum int64
		for r, v := range got {
			sum += v
			if v != c.want[r] {
				t.Errorf("FairStands(%d, %v) = %v, want %v", c.limit, c.demand, got, c.want)
			}
		}
		if sum != c.limit {
			t.Errorf("FairStands(%d, %v) adds up to %d", c.limit, c.demand, sum)
		}
	}
}
