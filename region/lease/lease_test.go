package lease

import (
	"math"
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
// the invariant after every step. The allocator may crash: a new one
// takes over in learning mode while the old one's messages are still on
// the bus.
type sim struct {
	t        *testing.T
	rng      *rand.Rand
	limit    int64
	bases    map[string]int64
	alloc    *Allocator
	holders  map[string]*Holder
	consumed map[string]int64
	regions  []string
	bus      []msg
	now      int
	loss     float64 // probability a message is lost
	dup      float64 // probability a message is delivered twice
	delay    int     // a message takes 1..delay ticks
	cut      map[string]bool
	demand   int64   // hits that arrived
	giveBack float64 // probability a region gives back unasked in a tick
	// old is the former allocator while a split lasts (nil: none): it
	// keeps running beside alloc, takes half the regions' requests, the
	// Acks and give-backs that name it, and sends its Lowers, reclaims
	// and grants as if it were alone.
	old       *Allocator
	restarted map[string]bool // regions whose holder was made afresh
	// lost is what earlier processes of a region admitted in the window
	// and a blind restart forgot (the region's current count does not
	// hold it); phantom is what its holders counted of a grant's Spent
	// beyond their own count (hits counted as admitted that were not).
	// What a region truly admitted is lost + consumed - phantom.
	lost, phantom map[string]int64
	seed          uint64
	crashedAt     int // the tick of the last crash or split (0: none)
}

// giveBack is a Holder.GiveBack on the bus (an Ack no Lower asked for).
type giveBack Ack

func newSim(t *testing.T, seed uint64, limit int64, bases map[string]int64) *sim {
	t.Helper()
	a, err := NewAllocator(1, 7, limit, bases, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 99)), limit: limit, bases: bases, alloc: a,
		holders: map[string]*Holder{}, consumed: map[string]int64{}, delay: 1, cut: map[string]bool{},
		restarted: map[string]bool{}, lost: map[string]int64{}, phantom: map[string]int64{}}
	for _, r := range []string{"a", "b", "c"} {
		s.regions = append(s.regions, r)
		s.holders[r] = NewHolder(r, 7, bases[r])
	}
	return s
}

// crash replaces the allocator by a new one in learning mode (the old
// one's messages stay on the bus), and sends its reports.
func (s *sim) crash(id uint64) {
	a, err := NewAllocator(id, 7, s.limit, s.bases, nil, true)
	if err != nil {
		s.t.Fatal(err)
	}
	s.alloc = a
	s.crashedAt = s.now
	for _, l := range a.Pending() {
		s.send(l.Region, l)
	}
}

// split makes a new allocator in learning mode take over while the old
// one keeps running (two nodes' views each make another the key's
// allocator), and sends the new one's reports.
func (s *sim) split(id uint64) {
	old := s.alloc
	s.crash(id)
	s.old = old
}

// restart makes region r's holder afresh (its node restarted, the key
// moved in the region with its count, or the limit changed): it starts
// at 0, not knowing what the allocator left it (a holder made in a
// window an allocator may have written to is unsure: rpc's leases), and
// the window's count (consumed) stays.
func (s *sim) restart(r string) {
	h := NewHolder(r, 7, s.bases[r])
	h.StartAfresh(s.rng.Uint64() | 1)
	s.holders[r] = h
	s.restarted[r] = true
}

// blindRestart makes region r's holder afresh and blind (its only node
// restarted without its state): the window's count is lost with the old
// process (it admitted it all the same), and the new holder admits
// nothing until a grant says what the region is counted as having spent.
func (s *sim) blindRestart(r string) {
	s.lost[r] += s.consumed[r] - s.phantom[r]
	s.consumed[r], s.phantom[r] = 0, 0
	h := NewHolder(r, 7, s.bases[r])
	h.StartBlind(s.rng.Uint64() | 1)
	s.holders[r] = h
	s.restarted[r] = true
}

// truly returns what region r admitted in the window, across its
// processes.
func (s *sim) truly(r string) int64 { return s.lost[r] + s.consumed[r] - s.phantom[r] }

// to returns the allocator a message naming alloc goes to.
func (s *sim) to(alloc uint64) *Allocator {
	if s.old != nil && alloc == s.old.ID() {
		return s.old
	}
	return s.alloc
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

// sendAll puts the allocator's grants and lowers on the bus.
func (s *sim) sendAll(gs []Grant, ls []Lower) {
	for _, g := range gs {
		s.send(g.Region, g)
	}
	for _, l := range ls {
		s.send(l.Region, l)
	}
}

// take admits hits in region r when they fit its slice.
func (s *sim) take(r string, hits int64) bool {
	if s.consumed[r]+hits > s.holders[r].Slice() {
		return false
	}
	s.consumed[r] += hits
	return true
}

// takeDue splits bus into the messages due at tick now (in random order:
// the bus reorders them) and the rest.
func takeDue(rng *rand.Rand, bus []msg, now int) (due, later []msg) {
	for _, m := range bus {
		if m.at <= now {
			due = append(due, m)
		} else {
			later = append(later, m)
		}
	}
	rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	return due, later
}

// step runs one tick with arrivals[r] single-hit checks entering region r.
func (s *sim) step(arrivals map[string]int) {
	s.now++
	var due []msg
	due, s.bus = takeDue(s.rng, s.bus, s.now)
	for _, m := range due {
		switch v := m.val.(type) {
		case Request:
			if s.old != nil && s.rng.IntN(2) == 0 {
				s.sendAll(s.old.OnRequest(v))
				continue
			}
			s.sendAll(s.alloc.OnRequest(v))
		case Grant:
			if !s.cut[v.Region] {
				h := s.holders[v.Region]
				h.OnGrant(v)
				if sp := h.TakeSpent(); sp > s.consumed[v.Region] {
					s.phantom[v.Region] += sp - s.consumed[v.Region]
					s.consumed[v.Region] = sp
				}
			}
		case Lower:
			if !s.cut[v.Region] {
				if k, ok := s.holders[v.Region].OnLower(v, s.consumed[v.Region]); ok {
					s.send(v.Region, k)
				}
			}
		case Ack:
			s.sendAll(s.to(v.Alloc).OnAck(v))
		case giveBack:
			a := s.to(v.Alloc)
			gs, _ := a.OnGiveBack(Ack(v))
			s.sendAll(gs, nil)
			// What is still free goes to regions wanting more (a
			// random hunger: the standing slices' demand may be stale).
			hunger := map[string]int64{}
			for _, r := range s.regions {
				hunger[r] = s.rng.Int64N(s.limit/4 + 1)
			}
			s.sendAll(a.Offer(hunger), nil)
		}
		s.check()
	}
	if s.giveBack > 0 {
		for _, r := range s.regions {
			if s.cut[r] || s.rng.Float64() >= s.giveBack {
				continue
			}
			keep := s.consumed[r] + s.rng.Int64N(max(s.holders[r].Slice()-s.consumed[r], 0)+1)
			if k, ok := s.holders[r].GiveBack(keep, s.consumed[r]); ok {
				s.send(r, giveBack(k))
			}
			s.check()
		}
	}
	for _, a := range []*Allocator{s.alloc, s.old} {
		if a == nil {
			continue
		}
		if s.now%5 == 0 {
			for _, l := range a.Pending() {
				s.send(l.Region, l)
			}
		}
		if s.now%10 == 0 {
			// The window is 400 ticks: late-window reclaims as it goes on.
			a.SetLeft(1 - float64(s.now)/400)
			s.sendAll(nil, a.Reclaim())
		}
		if a == s.old && s.now%7 == 0 {
			s.sendAll(nil, a.Rebalance())
		}
	}
	for _, r := range s.regions {
		h := s.holders[r]
		for range arrivals[r] {
			s.demand++
			s.take(r, 1)
			s.check()
		}
		// Ask before running out: below a low-water mark of a few
		// ticks' arrivals, for a few more ticks' worth.
		if left := h.Slice() - s.consumed[r]; arrivals[r] > 0 && left < int64(4*arrivals[r]) {
			s.send(r, h.Request(int64(8*arrivals[r]), s.consumed[r]))
		}
	}
}

// check asserts the invariant: what the regions consumed, and what they
// may spend (a region's slice, or what it consumed when a holder made
// afresh started below that), never adds up to more than the limit; no
// region consumed more than its slice but by a restart; and once the
// allocator knows every region, none holds more than its record.
func (s *sim) check() {
	s.t.Helper()
	var consumed, held int64
	for r, h := range s.holders {
		consumed += s.truly(r)
		// What it may still spend and what it spent: a blind holder's
		// phantom hits (a grant's spent) fill its slice, not the window.
		held += s.truly(r) + max(h.Slice()-s.consumed[r], 0)
		if s.consumed[r] > h.Slice() && !s.restarted[r] {
			s.t.Fatalf("tick %d: %s consumed %d over its slice %d", s.now, r, s.consumed[r], h.Slice())
		}
		// Against the record of the allocator the holder takes grants
		// from (two run at once in a split).
		if al := s.to(h.alloc); (h.alloc == 0 || h.alloc == al.ID()) && !al.Learning() && h.Slice() > al.Record(r) && s.consumed[r] < h.Slice() {
			s.t.Fatalf("seed %d, tick %d: %s holds %d, its allocator recorded %d (restarted %v, split %v, learning since %d)", s.seed, s.now, r, h.Slice(), al.Record(r), s.restarted[r], s.old != nil, s.crashedAt)
		}
	}
	if consumed > s.limit || held > s.limit {
		s.t.Fatalf("tick %d: consumed %d, held %d, over the limit %d", s.now, consumed, held, s.limit)
	}
}

func (s *sim) total() int64 {
	var n int64
	for _, r := range s.regions {
		n += s.truly(r)
	}
	return n
}

// Under loss, duplication, reordering (delays of 1..4 ticks), cuts, give-
// backs unasked at random (every other seed; what they free is granted
// to waiting regions and offered to regions of random hunger), an
// allocator crash (a new allocator in learning mode while the old one's
// grants are still on the bus) or a split (the old one keeps running
// beside it), and holders made afresh over what their window admitted,
// over random seeds and demand patterns, the regions never consume or
// hold more than the limit (the invariant is checked after every message
// and every hit).
func TestNeverOverTheLimit(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		limit := int64(10 + rng.IntN(1000))
		bases := map[string]int64{"a": limit / 6, "b": limit / 6, "c": limit / 6}
		s := newSim(t, seed, limit, bases)
		s.loss, s.dup, s.delay = rng.Float64()*0.3, rng.Float64()*0.3, 1+rng.IntN(4)
		if seed%2 == 1 {
			s.giveBack = rng.Float64() * 0.1
		}
		rates := map[string]int{"a": rng.IntN(20), "b": rng.IntN(20), "c": rng.IntN(20)}
		crashAt := 50 + rng.IntN(300)
		// A quarter of the seeds split the allocator (the old one keeps
		// running); half restart holders (made afresh at 0, the
		// window's count kept) now and then. Not both at once: a holder
		// made afresh takes the first grant of either allocator, and
		// may take the old one's after it reported to the new one
		// (region/lease's doc, "Two allocators at once").
		split := seed%4 == 1
		restarts := seed%4 >= 2
		for tick := range 400 {
			if tick == 100 {
				s.cut["c"] = rng.IntN(2) == 0
			}
			if tick == 200 {
				s.cut["c"] = false
				rates["a"], rates["b"] = rates["b"], rates["a"] // demand moves
			}
			if tick == crashAt {
				if split {
					s.split(2)
				} else {
					s.crash(2)
				}
			}
			if restarts && rng.IntN(40) == 0 {
				if r := s.regions[rng.IntN(3)]; seed%8 >= 6 {
					s.blindRestart(r) // a region's only node restarted without its state
				} else {
					s.restart(r)
				}
			}
			if tick > crashAt && tick%20 == 0 && s.alloc.Learning() {
				for _, l := range s.alloc.Pending() {
					s.send(l.Region, l)
				}
			}
			s.step(rates)
		}
		if c := s.total(); c > limit {
			t.Fatalf("seed %d: consumed %d over %d", seed, c, limit)
		}
	}
}

// Slices follow demand: with nothing lost, a region that takes all the
// traffic gets the pool and, by reclaim (lower first), what the idle
// regions hold, bases included: the window admits at least 95 % of the
// limit.
func TestGrantsFollowDemand(t *testing.T) {
	const limit = 600
	bases := map[string]int64{"a": 100, "b": 100, "c": 100} // half of the limit as bases
	s := newSim(t, 1, limit, bases)
	s.delay = 2
	// Uniform demand first, then it all moves to a.
	for range 20 {
		s.step(map[string]int{"a": 2, "b": 2, "c": 2})
	}
	for range 200 {
		s.step(map[string]int{"a": 10})
	}
	admitted := s.total()
	if admitted < limit*95/100 {
		t.Errorf("admitted %d of %d", admitted, limit)
	}
	t.Logf("admitted %d of %d (a %d, b %d, c %d); a's slice %d", admitted, limit,
		s.consumed["a"], s.consumed["b"], s.consumed["c"], s.holders["a"].Slice())
}

// Steady uniform demand over the limit: every region ends with about its
// fair third, and the window admits at least 95 % of the limit.
func TestFairShareUnderContention(t *testing.T) {
	const limit = 600
	bases := map[string]int64{"a": 100, "b": 100, "c": 100}
	s := newSim(t, 2, limit, bases)
	s.delay = 2
	for range 200 {
		s.step(map[string]int{"a": 5, "b": 5, "c": 5})
	}
	if got := s.total(); got < limit*95/100 {
		t.Errorf("admitted %d of %d", got, limit)
	}
	for _, r := range s.regions {
		if c := s.consumed[r]; c < limit/3-limit/10 || c > limit/3+limit/10 {
			t.Errorf("%s admitted %d, far from a fair %d", r, c, limit/3)
		}
	}
	t.Logf("a %d, b %d, c %d", s.consumed["a"], s.consumed["b"], s.consumed["c"])
}

// A new allocator learns before it grants: its pool stays closed until
// every region reported, a region's report fences it off the former
// allocator's late grants, and the pool it opens is the limit less what
// the regions reported.
func TestLearningMode(t *testing.T) {
	old, _ := NewAllocator(1, 1, 10, map[string]int64{"a": 2, "b": 2}, nil, false)
	ha, hb := NewHolder("a", 1, 2), NewHolder("b", 1, 2)
	gs, _ := old.OnRequest(ha.Request(3, 0))
	if len(gs) != 1 || gs[0].Slice != 5 {
		t.Fatalf("old grant %v", gs)
	}
	late := gs[0] // on the wire when the old allocator crashes
	a, _ := NewAllocator(2, 1, 10, map[string]int64{"a": 2, "b": 2}, nil, true)
	if gs, ls := a.OnRequest(hb.Request(5, 0)); len(gs)+len(ls) != 0 || a.Free() != 0 {
		t.Fatalf("a learning allocator answered a request: %v %v, free %d", gs, ls, a.Free())
	}
	reports := a.Pending()
	if len(reports) != 2 || reports[0].Target != ReportOnly {
		t.Fatalf("reports %v", reports)
	}
	ka, _ := ha.OnLower(reports[0], 1)
	if ha.OnGrant(late) || ha.Slice() != 2 {
		t.Fatalf("a late grant of the former allocator raised the slice to %d", ha.Slice())
	}
	if gs, _ := a.OnAck(ka); len(gs) != 0 || !a.Learning() {
		t.Fatalf("the pool opened on one report of two: %v", gs)
	}
	kb, _ := hb.OnLower(reports[1], 0)
	gs, _ = a.OnAck(kb)
	if a.Learning() || len(gs) != 1 || gs[0].Region != "b" || gs[0].Slice != 7 || a.Free() != 1 {
		t.Fatalf("after both reports: learning %v, grants %v, free %d; want b's slice 7 and 1 free", a.Learning(), gs, a.Free())
	}
}

// Messages of another window, older than what a holder applied, or
// duplicated change nothing; a Lower keeps what was spent; bases over the
// limit are refused.
func TestMessagesAreIdempotent(t *testing.T) {
	if _, err := NewAllocator(1, 1, 10, map[string]int64{"a": 6, "b": 5}, nil, false); err == nil {
		t.Error("bases over the limit accepted")
	}
	a, _ := NewAllocator(1, 1, 10, map[string]int64{"a": 2, "b": 2}, nil, false)
	h := NewHolder("a", 1, 2)
	gs, _ := a.OnRequest(h.Request(4, 0))
	if len(gs) != 1 || gs[0].Slice != 6 || a.Free() != 2 {
		t.Fatalf("grant %v, free %d", gs, a.Free())
	}
	h.OnGrant(gs[0])
	h.OnGrant(gs[0]) // a duplicate
	h.OnGrant(Grant{Region: "a", Window: 2, Alloc: 1, Seq: 9, Slice: 100})
	if h.Slice() != 6 {
		t.Fatalf("slice %d after a grant of 4, a duplicate and another window's, want 6", h.Slice())
	}
	// b wants more than is free: a is asked to lower to its fair share,
	// keeps the 5 it spent, and the rest returns to the pool only on its
	// Ack, which goes to b at once.
	_, ls := a.OnRequest(Request{Region: "b", Window: 1, Want: 5, Slice: 2})
	if len(ls) != 1 || ls[0].Region != "a" {
		t.Fatalf("lowers %v, free %d", ls, a.Free())
	}
	k, ok := h.OnLower(ls[0], 5)
	if !ok || k.Slice != 5 || h.Slice() != 5 {
		t.Fatalf("after the lower: ack %v, slice %d", k, h.Slice())
	}
	h.OnGrant(gs[0]) // the old grant again, late: ignored
	if h.Slice() != 5 {
		t.Fatalf("a late old grant raised the slice to %d", h.Slice())
	}
	gs, _ = a.OnAck(k)
	a.OnAck(k) // a duplicate
	if a.Record("a") != 5 || len(gs) != 1 || gs[0].Region != "b" || gs[0].Slice != 5 || a.Free() != 0 {
		t.Fatalf("after the ack: a's record %d, grants %v, free %d; want 5, b to 5, 0", a.Record("a"), gs, a.Free())
	}
}

// The fair share is Doorman's: capacity 120, demands 1000/50/10 give
// 60/50/10.
func TestFairShares(t *testing.T) {
	a, _ := NewAllocator(1, 1, 120, map[string]int64{"a": 0, "b": 0, "c": 0},
		map[string]int64{"a": 1000, "b": 50, "c": 10}, false)
	f := a.fairShares(math.Round)
	if f["a"] != 60 || f["b"] != 50 || f["c"] != 10 {
		t.Fatalf("fair shares %v, want a 60, b 50, c 10", f)
	}
	// Next window from last window's demand: a key used in one region
	// lowers the others' bases first.
	a, _ = NewAllocator(1, 1, 120, map[string]int64{"a": 20, "b": 20, "c": 20}, map[string]int64{"a": 500}, false)
	ls := a.Rebalance()
	if len(ls) != 2 || ls[0].Region != "b" || ls[0].Target != 0 || ls[1].Region != "c" {
		t.Fatalf("rebalance %v, want b and c lowered to 0", ls)
	}
}

// The pool never idles while a region waits: what is free after every
// waiting region got its fair share goes to those that want more, and
// each region gets one Grant carrying its whole new slice.
func TestFreePoolGoesToWaitingRegions(t *testing.T) {
	// Limit 10, bases 1 each; last window a needed 8, b 1, c 0: fair
	// shares a 8, b 1, c 0 (leaving 1 to nobody's need).
	a, _ := NewAllocator(1, 1, 10, map[string]int64{"a": 1, "b": 1, "c": 1},
		map[string]int64{"a": 8, "b": 1}, false)
	if a.Free() != 7 {
		t.Fatalf("free %d, want 7", a.Free())
	}
	// b asks for 3 more than it holds: beyond its fair share, but nobody
	// else waits, so it gets them.
	gs, _ := a.OnRequest(Request{Region: "b", Window: 1, Want: 3, Slice: 1})
	if len(gs) != 1 || gs[0].Region != "b" || gs[0].Slice != 4 || a.Free() != 4 {
		t.Fatalf("b's grants %v, free %d; want b to 4, 4 free", gs, a.Free())
	}
	// a asks for 20: the 4 free hits go to it, and c (no demand) is
	// asked to give back its base.
	gs, ls := a.OnRequest(Request{Region: "a", Window: 1, Want: 20, Slice: 1})
	if len(gs) != 1 || gs[0].Region != "a" || gs[0].Slice != 5 || a.Free() != 0 {
		t.Fatalf("a's grants %v, free %d; want a to 5, 0 free", gs, a.Free())
	}
	if len(ls) != 1 || ls[0].Region != "c" || ls[0].Target != 0 {
		t.Fatalf("lowers %v, want c to 0", ls)
	}
	// What c's ack frees goes to a at once, not to the pool.
	hc := NewHolder("c", 1, 1)
	k, _ := hc.OnLower(ls[0], 0)
	gs, _ = a.OnAck(k)
	if len(gs) != 1 || gs[0].Region != "a" || gs[0].Slice != 6 || a.Free() != 0 {
		t.Fatalf("after c's ack: grants %v, free %d; want a to 6, 0 free", gs, a.Free())
	}
}

// Reclaim, late in a window, takes back from every region what it will
// probably not use (what it used plus the whole hits of its expected
// need over what is left), waiting regions included, and only when some
// region waits; what it frees goes to the region that waits.
func TestReclaim(t *testing.T) {
	a, _ := NewAllocator(1, 1, 10, map[string]int64{"a": 2, "b": 2, "c": 2}, map[string]int64{"a": 10, "b": 2, "c": 2}, false)
	if ls := a.Reclaim(); len(ls) != 0 {
		t.Fatalf("reclaim with nobody waiting: %v", ls)
	}
	ha, hb, hc := NewHolder("a", 1, 2), NewHolder("b", 1, 2), NewHolder("c", 1, 2)
	// a asks for 8 and gets the pool's 4 (its fair share is 6); b then
	// asks for 1 and waits (the pool is empty, and c keeps its base: its
	// last window's demand was 2).
	gs, ls := a.OnRequest(ha.Request(8, 2))
	if len(gs) != 1 || gs[0].Slice != 6 || len(ls) != 0 {
		t.Fatalf("a's request: grants %v, lowers %v; want a to 6, no lowers", gs, ls)
	}
	ha.OnGrant(gs[0])
	if gs, ls = a.OnRequest(hb.Request(1, 1)); len(gs)+len(ls) != 0 {
		t.Fatalf("b's request: grants %v, lowers %v; want none", gs, ls)
	}
	// 60 % of the window gone: c's need is 0 + ⌊2 × 0.4⌋ = 0, so c is
	// lowered to 0; a's 2 + ⌊8 × 0.4⌋ = 5 < 6, so a is not. b's need is
	// 1 (used) + ⌊2 × 0.4⌋ = 1, but b expected 2 more when it asked, at
	// the window's start, and has probably admitted ⌊2 × 0.6⌋ = 1 of them
	// since: lowered to 1, it would keep its 2 (what it consumed) and free
	// nothing.
	a.SetLeft(0.4)
	ls = a.Reclaim()
	if len(ls) != 1 || ls[0].Region != "c" || ls[0].Target != 0 {
		t.Fatalf("reclaim %v, want c to 0 alone", ls)
	}
	var freed []Grant
	for _, l := range ls {
		h := map[string]*Holder{"b": hb, "c": hc}[l.Region]
		k, _ := h.OnLower(l, map[string]int64{"b": 1, "c": 0}[l.Region])
		g, _ := a.OnAck(k)
		freed = append(freed, g...)
	}
	for _, g := range freed {
		if g.Region != "a" {
			t.Fatalf("freed hits went to %s: %v", g.Region, freed)
		}
		ha.OnGrant(g)
	}
	if ha.Slice() != 8 || hb.Slice() != 2 || hc.Slice() != 0 || a.Free() != 0 {
		t.Fatalf("after reclaim: a %d, b %d, c %d, free %d; want 8, 2, 0, 0", ha.Slice(), hb.Slice(), hc.Slice(), a.Free())
	}
}

// Demands measures where it can: a region that reported its use well into
// the window is taken at that rate over the whole window (not at what it
// asked for, a guess); one still waiting at what it asked to reach; one
// never heard at what it holds.
func TestDemands(t *testing.T) {
	a, _ := NewAllocator(1, 1, 20, map[string]int64{"a": 2, "b": 2, "c": 4}, nil, false)
	a.SetLeft(0.5)
	// a asks for 10 more at half the window, having used 2: the pool
	// (12) grants them all, so it waits for nothing.
	if gs, _ := a.OnRequest(Request{Region: "a", Window: 1, Want: 10, Consumed: 2, Slice: 2}); len(gs) != 1 {
		t.Fatalf("a's request: %v", gs)
	}
	// b asks for 9 more, having used 2; 2 are left in the pool: it waits.
	a.OnRequest(Request{Region: "b", Window: 1, Want: 9, Consumed: 2, Slice: 2})
	got := a.Demands()
	want := map[string]int64{"a": 4, "b": 11, "c": 4}
	for r, w := range want {
		if got[r] != w {
			t.Errorf("Demands()[%s] = %d, want %d (all %v)", r, got[r], w, got)
		}
	}
}

// A give-back is taken only when it answers the allocator's newest
// message to the region (or the region heard nothing in the window and
// the allocator sent it nothing); what it frees goes to a waiting region
// first, and Offer hands the rest to the hungry by fair share.
func TestGiveBack(t *testing.T) {
	bases := map[string]int64{"a": 2, "b": 2, "c": 2}
	a, _ := NewAllocator(9, 1, 10, bases, nil, false)
	ha, hb, hc := NewHolder("a", 1, 2), NewHolder("b", 1, 2), NewHolder("c", 1, 2)
	// b heard nothing and gives back all but the 1 hit it admitted.
	k, ok := hb.GiveBack(0, 1)
	if !ok || hb.Slice() != 1 || k.Alloc != 0 || k.Seq != 0 || k.Slice != 1 {
		t.Fatalf("b's give-back %+v (%v), slice %d; want slice 1 under 0/0", k, ok, hb.Slice())
	}
	if _, ok := hb.GiveBack(5, 1); ok {
		t.Fatal("a give-back above the slice was made")
	}
	// Meanwhile a asked for 3 and got the pool's 4 (free 4: a to 5, 1 left).
	gs, _ := a.OnRequest(ha.Request(3, 2))
	if len(gs) != 1 || gs[0].Slice != 5 {
		t.Fatalf("grants %v, want a to 5", gs)
	}
	ha.OnGrant(gs[0])
	gs, ok = a.OnGiveBack(k)
	if !ok || a.Record("b") != 1 || a.Free() != 2 || len(gs) != 0 {
		t.Fatalf("give-back taken %v, b's record %d, free %d, grants %v; want true, 1, 2, none", ok, a.Record("b"), a.Free(), gs)
	}
	if !a.Heard("b") || a.Heard("c") {
		t.Fatalf("heard b %v, c %v; want true, false", a.Heard("b"), a.Heard("c"))
	}
	// Offer: a and c hunger 5 and 1; 2 free: a 1, c 1.
	gs = a.Offer(map[string]int64{"a": 5, "c": 1})
	if len(gs) != 2 || gs[0].Region != "a" || gs[0].Slice != 6 || gs[1].Region != "c" || gs[1].Slice != 3 || a.Free() != 0 {
		t.Fatalf("offer %v, free %d; want a to 6, c to 3, none free", gs, a.Free())
	}
	// a gives back under an older sequence number than the offer's grant
	// (it had not seen it): refused, and the grant, when it comes, sets
	// a's slice whole again.
	ka, _ := ha.GiveBack(3, 3)
	if _, ok := a.OnGiveBack(ka); ok || a.Record("a") != 6 {
		t.Fatalf("a stale give-back was taken (record %d)", a.Record("a"))
	}
	ha.OnGrant(gs[0])
	if ha.Slice() != 6 {
		t.Fatalf("a's slice %d after the offer's grant, want 6", ha.Slice())
	}
	// c had heard nothing, but the allocator had sent it a grant: its
	// 0/0 give-back is refused. After the grant, it is taken.
	kc, _ := hc.GiveBack(0, 0)
	if _, ok := a.OnGiveBack(kc); ok {
		t.Fatal("c's give-back from before the allocator's grant was taken")
	}
	hc.OnGrant(gs[1])
	kc, _ = hc.GiveBack(1, 0)
	if _, ok := a.OnGiveBack(kc); !ok || a.Record("c") != 1 || a.Free() != 2 {
		t.Fatalf("c's give-back: taken %v, record %d, free %d; want true, 1, 2", ok, a.Record("c"), a.Free())
	}
	// While learning, nothing is taken.
	l, _ := NewAllocator(10, 1, 10, bases, nil, true)
	if _, ok := l.OnGiveBack(Ack{Region: "b", Window: 1, Slice: 0}); ok {
		t.Fatal("a learning allocator took a give-back")
	}
}

// A late Lower of a former allocator switches a holder away from the
// current one; a duplicate of one of the current allocator's old Lowers
// then switches it back: the holder must not take it, nor a duplicate of
// that allocator's old grant, which would raise it above the record
// (here after a give-back lowered the record). Found by review: before
// holders kept each allocator's newest sequence number, a holds 6 of a
// record of 2, and the slices added up to 14 of 10.
func TestStaleLowerOfAFormerAllocatorAfterAGiveBack(t *testing.T) {
	bases := map[string]int64{"a": 2, "b": 2, "c": 2}
	const limit = 10
	stale := Lower{Region: "a", Window: 1, Alloc: 1, Seq: 1, Target: 5} // allocator 1's, still on the bus
	a2, _ := NewAllocator(2, 1, limit, bases, nil, true)                // takes over, learning
	hs := map[string]*Holder{"a": NewHolder("a", 1, 2), "b": NewHolder("b", 1, 2), "c": NewHolder("c", 1, 2)}
	reports := a2.Pending()
	var reportA Lower
	for _, l := range reports {
		if l.Region == "a" {
			reportA = l
		}
		k, _ := hs[l.Region].OnLower(l, 0)
		a2.OnAck(k)
	}
	if a2.Learning() {
		t.Fatal("still learning")
	}
	gs, _ := a2.OnRequest(hs["a"].Request(4, 0)) // a to 6 (seq 2)
	grantA := gs[0]
	hs["a"].OnGrant(grantA)
	k, _ := hs["a"].GiveBack(2, 0) // a gives 4 back
	if _, ok := a2.OnGiveBack(k); !ok {
		t.Fatal("give-back refused")
	}
	for _, g := range a2.Offer(map[string]int64{"b": 4}) { // b to 6
		hs[g.Region].OnGrant(g)
	}
	// The bus now delivers the stale Lower, then duplicates of a2's report
	// Lower and grant to a.
	hs["a"].OnLower(stale, 0)
	hs["a"].OnLower(reportA, 0)
	hs["a"].OnGrant(grantA)
	var sum int64
	for _, h := range hs {
		sum += h.Slice()
	}
	if hs["a"].Slice() > a2.Record("a") || sum > limit {
		t.Fatalf("a holds %d, record %d; slices add up to %d, limit %d", hs["a"].Slice(), a2.Record("a"), sum, limit)
	}
}

// The same with no give-back: a Lower and its Ack lower the record.
func TestStaleLowerOfAFormerAllocatorAfterALower(t *testing.T) {
	bases := map[string]int64{"a": 2, "b": 2, "c": 2}
	stale := Lower{Region: "a", Window: 1, Alloc: 1, Seq: 1, Target: 5}
	a2, _ := NewAllocator(2, 1, 10, bases, nil, true)
	hs := map[string]*Holder{"a": NewHolder("a", 1, 2), "b": NewHolder("b", 1, 2), "c": NewHolder("c", 1, 2)}
	var reportA Lower
	for _, l := range a2.Pending() {
		if l.Region == "a" {
			reportA = l
		}
		k, _ := hs[l.Region].OnLower(l, 0)
		a2.OnAck(k)
	}
	gs, _ := a2.OnRequest(hs["a"].Request(4, 0))
	grantA := gs[0]
	hs["a"].OnGrant(grantA)
	k, _ := hs["a"].OnLower(a2.lower("a", 2), 0)
	a2.OnAck(k)
	hs["a"].OnLower(stale, 0)
	hs["a"].OnLower(reportA, 0)
	hs["a"].OnGrant(grantA)
	if hs["a"].Slice() > a2.Record("a") {
		t.Fatalf("a holds %d, record %d", hs["a"].Slice(), a2.Record("a"))
	}
}

// A region whose window's holder started below the allocator's record
// (a standing slice raised after the holder was made) says what it holds
// in its request; while the allocator has sent it nothing in the window,
// only its grants can raise the holder, so the record comes down to it
// and the hits it frees are granted: the region's ask is met, not
// refused as if it held them already. Once the allocator wrote to the
// region, a request's slice changes no record.
func TestRequestBringsTheRecordDown(t *testing.T) {
	a, _ := NewAllocator(3, 1, 10, map[string]int64{"a": 10, "b": 0, "c": 0}, nil, false)
	h := NewHolder("a", 1, 2) // made before the raise to 10 reached it
	gs, _ := a.OnRequest(h.Request(8, 2))
	if len(gs) != 1 || gs[0].Slice != 10 || a.Record("a") != 10 || a.Free() != 0 {
		t.Fatalf("grants %v, record %d, free %d; want a to 10 from the 8 freed", gs, a.Record("a"), a.Free())
	}
	h.OnGrant(gs[0])
	if h.Slice() != 10 {
		t.Fatalf("a's slice %d, want 10", h.Slice())
	}
	// A late duplicate of the request (slice 2) lowers nothing now.
	a.OnRequest(Request{Region: "a", Window: 1, Want: 8, Consumed: 2, Slice: 2})
	if a.Record("a") != 10 || a.Free() != 0 {
		t.Fatalf("after a late request: record %d, free %d; want 10, 0", a.Record("a"), a.Free())
	}
}

// Two allocators at once (a split: two nodes' views each make another
// the key's allocator): the new one learnt every region's slice and
// granted; the old one, still running, lowers a region and would grant
// it what it thinks the lowering freed. The holder stays with the
// allocator that learnt last, and its Ack says so: the old one learns
// again (reports to every region) and grants nothing meanwhile. Before
// (a Lower of any allocator took the holder over), the slices added up to
// 125 of 100.
func TestTwoAllocatorsAtOnce(t *testing.T) {
	const limit = 100
	bases := map[string]int64{"x": 25, "y": 25, "z": 25}
	old, _ := NewAllocator(1, 1, limit, bases, nil, false)
	hs := map[string]*Holder{"x": NewHolder("x", 1, 25), "y": NewHolder("y", 1, 25), "z": NewHolder("z", 1, 25)}
	b, _ := NewAllocator(2, 1, limit, bases, nil, true)
	for _, l := range b.Pending() {
		k, _ := hs[l.Region].OnLower(l, 0)
		b.OnAck(k)
	}
	gs, _ := b.OnRequest(hs["y"].Request(25, 20))
	if len(gs) != 1 || !hs["y"].OnGrant(gs[0]) || hs["y"].Slice() != 50 {
		t.Fatalf("the new allocator's grant %v, y's slice %d; want y to 50", gs, hs["y"].Slice())
	}
	// The old allocator takes z's base back (z used nothing) ...
	k, ok := hs["z"].OnLower(Lower{Region: "z", Window: 1, Alloc: old.ID(), Seq: 1, Target: 0}, 0)
	if !ok || hs["z"].Slice() != 0 {
		t.Fatalf("the old allocator's lower: ack %v, z's slice %d; want applied (lowering is safe)", k, hs["z"].Slice())
	}
	old.lowerAt["z"], old.seq["z"] = 1, 1 // as if old.lower had sent it
	if k.Follows != 2 {
		t.Fatalf("z's ack %v: want it to say z follows allocator 2", k)
	}
	_, reports := old.OnAck(k)
	if !old.Learning() || len(reports) != 3 {
		t.Fatalf("after z's ack the old allocator learns %v, reports %v; want learning, 3 reports", old.Learning(), reports)
	}
	// ... and would grant z, on z's request, what it thinks is free.
	gs, _ = old.OnRequest(hs["z"].Request(50, 0))
	for _, g := range gs {
		hs[g.Region].OnGrant(g)
	}
	var sum int64
	for _, h := range hs {
		sum += h.Slice()
	}
	if sum > limit || len(gs) != 0 {
		t.Fatalf("slices x %d, y %d, z %d add up to %d of %d (old's grants %v)", hs["x"].Slice(), hs["y"].Slice(), hs["z"].Slice(), sum, limit, gs)
	}
	// Its reports take the holders back, and what it learns is what they
	// hold: from then on it alone grants, within the limit.
	for _, l := range reports {
		kk, _ := hs[l.Region].OnLower(l, 0)
		old.OnAck(kk)
	}
	gs, _ = old.OnRequest(hs["z"].Request(50, 0))
	for _, g := range gs {
		hs[g.Region].OnGrant(g)
	}
	sum = hs["x"].Slice() + hs["y"].Slice() + hs["z"].Slice()
	if old.Learning() || sum != limit {
		t.Fatalf("after the reports: learning %v, slices add up to %d; want open, exactly %d", old.Learning(), sum, limit)
	}
}

// A holder made afresh over a window that admitted already (its node
// restarted, the key moved in the region with its count, the limit
// changed) starts at 0 below what it admitted: its request, report or
// give-back says both, and the allocator records what it admitted, never
// less; a pool that admitted more than it has goes below 0 and grants
// nothing until what comes back covers it. Before, the record came down
// to the slice of 0 and the 20 hits x had admitted were granted again.
func TestAHolderMadeAfreshKeepsItsCount(t *testing.T) {
	a, _ := NewAllocator(1, 1, 60, map[string]int64{"x": 20, "y": 20, "z": 20}, nil, false)
	x := NewHolder("x", 1, 20)
	x.StartAfresh(7) // made afresh; x admitted 20 before
	gs, _ := a.OnRequest(x.Request(10, 20))
	for _, g := range gs {
		if g.Region != "x" || g.Slice > 20 {
			t.Fatalf("grant %v: more than the 20 x admitted", g)
		}
	}
	if a.Record("x") != 20 || a.Free() != 0 {
		t.Fatalf("x's record %d, free %d; want 20, 0", a.Record("x"), a.Free())
	}
	// Learning: x reports a slice of 0 and 30 admitted (a limit lowered
	// from 90 to 60 mid-window), y and z their bases.
	b, _ := NewAllocator(2, 1, 60, map[string]int64{"x": 20, "y": 20, "z": 20}, nil, true)
	hs := map[string]*Holder{}
	for _, l := range b.Pending() {
		h, consumed := NewHolder(l.Region, 1, 20), int64(0)
		if l.Region == "x" {
			h.StartAfresh(8)
			consumed = 30
		}
		hs[l.Region] = h
		k, _ := h.OnLower(l, consumed)
		b.OnAck(k)
	}
	if b.Learning() || b.Record("x") != 30 || b.Free() != 0 {
		t.Fatalf("learning %v, x's record %d, free %d; want open, 30, 0", b.Learning(), b.Record("x"), b.Free())
	}
	// y gives 15 back: 10 of it covers what x admitted over the pool.
	k, _ := hs["y"].GiveBack(5, 0)
	var ok bool
	gs, ok = b.OnGiveBack(k)
	if !ok || len(gs) != 0 || b.Free() != 5 {
		t.Fatalf("give-back taken %v, grants %v, free %d; want 5 free", ok, gs, b.Free())
	}
}
