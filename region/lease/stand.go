package lease

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Standing slices: what a region's holder of a new window starts at, set
// by the allocator for many windows at once, so that a key whose demand
// is steady needs no message per window (issue 20: "next windows learn",
// and at most about one message a second per hot key and region). The
// rule is the demarcation protocol's again (Barbará and Garcia-Molina,
// EDBT 1992), per window id: a Stand that lowers what some windows start
// at counts at the allocator only once its holder acknowledged it; one
// that raises is recorded before it is sent, and only for windows that no
// per-window Allocator was made for yet and that the allocator may plan
// (see Stands.Set). A stand lasts until a window id (Through) and the
// windows after it start at the region's base again: standing slices
// expire all at once, by window id, so that an allocator that lost its
// state (a restart, the key moved) needs only wait until every stand that
// another allocator may have set ran out, with no message, before it
// plans again.
//
// For every window id W, at every moment:
//
//	Σ_regions start_r(W) ≤ Σ_regions Stands.At(r, W) ≤ limit
//
// where start_r(W) is what region r's holder of W starts at, if it makes
// it now (Standing.Start); a per-window Allocator of W starts with
// record_r = Stands.At(r, W), which is at least what the holder of W
// started at or will.

// Stand sets a region's standing slice: the holders of windows From to
// Through (window ids, inclusive) that the region makes from now on start
// at Slice hits, those of windows after Through at its base; windows
// before From keep what they had. Alloc names the allocator (as for
// Grant); Seq orders its Stands to the region (a sequence of their own).
type Stand struct {
	Region        string
	Alloc, Seq    uint64
	From, Through int64
	Slice         int64
}

// StandAck answers a Stand: the region applied it from window
// max(From, Made+1) on, Made being the newest window whose holder it had
// made then (a made holder keeps its slice: the per-window allocator
// lowers it, if needed, by a Lower).
type StandAck struct {
	Region     string
	Alloc, Seq uint64
	Made       int64
}

// piece is a run of windows [from, through] starting at slice hits.
type piece struct{ from, through, slice int64 }

// schedule is what each window of a region starts at: its pieces' slices,
// base outside them.
type schedule struct {
	base   int64
	pieces []piece // by from, disjoint
}

// at returns what window w starts at.
func (s *schedule) at(w int64) int64 {
	for _, p := range s.pieces {
		if p.from <= w && w <= p.through {
			return p.slice
		}
	}
	return s.base
}

// set makes windows [from, through] start at slice and the windows after
// through at the base; the windows before from keep theirs.
func (s *schedule) set(from, through, slice int64) {
	out := make([]piece, 0, len(s.pieces)+1)
	for _, p := range s.pieces {
		if p.from >= from {
			continue
		}
		p.through = min(p.through, from-1)
		out = append(out, p)
	}
	if through >= from && slice != s.base {
		out = append(out, piece{from, through, slice})
	}
	s.pieces = out
}

// forget drops the pieces that end before window w.
func (s *schedule) forget(w int64) {
	s.pieces = slices.DeleteFunc(s.pieces, func(p piece) bool { return p.through < w })
}

// last returns the last window a piece covers (math.MinInt64: none).
func (s *schedule) last() int64 {
	out := int64(math.MinInt64)
	for _, p := range s.pieces {
		out = max(out, p.through)
	}
	return out
}

// Standing is one region's side of one key's standing slices: what each
// window's holder starts at (Start). Not safe for concurrent use (under
// the key's holder lock).
type Standing struct {
	region string
	sched  schedule
	made   int64 // the newest window whose holder was made (math.MinInt64: none)
	alloc  uint64
	seq    uint64
	ack    StandAck // the last Ack, sent again for a repeated Stand
}

// NewStanding returns region's standing slices of a key whose base (what
// the region owns with no message) is base hits: every window starts at
// the base until a Stand says otherwise.
func NewStanding(region string, base int64) *Standing {
	return &Standing{region: region, sched: schedule{base: max(base, 0)}, made: math.MinInt64}
}

// Start returns what the holder of window w, made now, starts at (hits),
// and notes that it was made (a later Stand leaves it alone).
func (s *Standing) Start(w int64) int64 {
	s.made = max(s.made, w)
	return s.sched.at(w)
}

// At returns what the holder of window w would start at if made now,
// without noting it.
func (s *Standing) At(w int64) int64 { return s.sched.at(w) }

// Base returns the region's base (hits).
func (s *Standing) Base() int64 { return s.sched.base }

// Forget drops what applies only to windows before w, and reports whether
// every window from w on starts at the base (the caller may then forget
// the Standing: made again, it starts there).
func (s *Standing) Forget(w int64) bool {
	s.sched.forget(w)
	return len(s.sched.pieces) == 0
}

// OnStand applies a Stand to the windows after the newest one made and
// from its From on, and returns the Ack to send (again, for a repeated
// Stand whose Ack may have been lost). A Stand of another region, older
// than the newest one applied of its allocator, or of another allocator
// than the one that last wrote while that one's stands may still run (its
// From not after the last window they cover), changes nothing and gets
// no Ack: an allocator that takes over plans only windows after those
// (Stands' floor), and the former one's late Stands are refused from then
// on.
func (s *Standing) OnStand(m Stand) (StandAck, bool) {
	switch {
	case m.Region != s.region:
		return StandAck{}, false
	case s.alloc != 0 && m.Alloc == s.alloc && m.Seq < s.seq:
		return StandAck{}, false
	case s.alloc != 0 && m.Alloc == s.alloc && m.Seq == s.seq:
		return s.ack, true
	case s.alloc != 0 && m.Alloc != s.alloc && m.From <= s.sched.last():
		return StandAck{}, false
	}
	from := max(m.From, s.made+1)
	s.sched.set(from, m.Through, max(m.Slice, 0))
	s.alloc, s.seq = m.Alloc, m.Seq
	s.ack = StandAck{Region: s.region, Alloc: m.Alloc, Seq: m.Seq, Made: s.made}
	return s.ack, true
}

// Stands is the allocator's side of one key's standing slices: for each
// region, the schedule its holder applied (as far as acknowledged) and
// the Stand in flight, if any. At(r, w) bounds what region r's holder of
// window w may start at; the bounds of every window add up to at most the
// limit. Not safe for concurrent use.
type Stands struct {
	id      uint64
	limit   int64
	regions []string // sorted
	applied map[string]*schedule
	pending map[string]*Stand
	seq     map[string]uint64
	made    int64 // the newest window a per-window Allocator was made for
	floor   int64 // no raise before this window
}

// NewStands returns the standing slices of a key whose limit is limit
// hits per window and whose regions own bases (every region the key may
// be checked in, 0 if it has none), kept by allocator id. floor is the
// first window it may raise a region in: an allocator that may not know
// every stand set before (it started, or took the key over, within the
// stands' horizon) passes the first window after every such stand ran
// out. It returns an error when the bases add up to more than the limit
// or one is negative.
func NewStands(id uint64, limit int64, bases map[string]int64, floor int64) (*Stands, error) {
	s := &Stands{id: id, limit: limit, applied: map[string]*schedule{}, pending: map[string]*Stand{},
		seq: map[string]uint64{}, made: math.MinInt64, floor: floor}
	var sum int64
	for r, b := range bases {
		if b < 0 {
			return nil, fmt.Errorf("lease: base of %s: must be >= 0, got %d", r, b)
		}
		sum += b
		s.regions = append(s.regions, r)
		s.applied[r] = &schedule{base: b}
	}
	if sum > limit {
		return nil, fmt.Errorf("lease: bases add up to %d, over the limit %d", sum, limit)
	}
	slices.Sort(s.regions)
	return s, nil
}

// ID returns the allocator id the stands are set under.
func (s *Stands) ID() uint64 { return s.id }

// Floor returns the first window the stands may raise a region in.
func (s *Stands) Floor() int64 { return s.floor }

// At returns the most region's holder of window w may start at (hits):
// what it applied, or what a Stand in flight sets, whichever is more.
func (s *Stands) At(region string, w int64) int64 {
	a := s.applied[region]
	if a == nil {
		return 0
	}
	v := a.at(w)
	if p := s.pending[region]; p != nil && w >= p.From {
		nv := a.base
		if w <= p.Through {
			nv = p.Slice
		}
		v = max(v, nv)
	}
	return v
}

// Starts returns At(r, w) of every region: a per-window Allocator's
// records of w (NewAllocator's bases).
func (s *Stands) Starts(w int64) map[string]int64 {
	out := make(map[string]int64, len(s.regions))
	for _, r := range s.regions {
		out[r] = s.At(r, w)
	}
	return out
}

// LastMade returns the newest window a per-window Allocator was made for
// (math.MinInt64: none): a Stand's From must be after it.
func (s *Stands) LastMade() int64 { return s.made }

// Made notes that a per-window Allocator of window w was made (its
// records are At(r, w) now): from now on no Stand raises w or an earlier
// window.
func (s *Stands) Made(w int64) { s.made = max(s.made, w) }

// Through returns the last window region's applied stand covers
// (math.MinInt64: none), and what its windows start at then.
func (s *Stands) Through(region string) (through, slice int64) {
	a := s.applied[region]
	if a == nil || len(a.pieces) == 0 {
		return math.MinInt64, 0
	}
	p := a.pieces[len(a.pieces)-1]
	return p.through, p.slice
}

// Busy reports whether region has a Stand in flight.
func (s *Stands) Busy(region string) bool { return s.pending[region] != nil }

// Set returns the Stand that makes region's windows from to through start
// at slice hits (and the windows after through at its base), recorded as
// in flight, when it keeps the bound: from must be after the newest
// window a per-window Allocator was made for, and at or after the floor
// (a holder takes a Stand of a new allocator only after the former one's
// ran out); where it raises a window (above At), the regions' bounds of
// it, with the raise, must add up to at most the limit. It
// returns false, and changes nothing, when it does not, when region has a
// Stand in flight (one at a time) or is not a region of the key.
func (s *Stands) Set(region string, from, through, slice int64) (Stand, bool) {
	a := s.applied[region]
	if a == nil || s.pending[region] != nil || from <= s.made || from < s.floor || slice < 0 {
		return Stand{}, false
	}
	// Windows from..end cover every change: after the last piece of any
	// region, every window starts at the bases.
	end := max(through, a.last()) + 1
	for _, r := range s.regions {
		end = max(end, s.applied[r].last()+1)
	}
	for w := from; w <= end; w++ {
		nv := a.base
		if w <= through {
			nv = slice
		}
		if nv <= s.At(region, w) {
			continue // not a raise of w
		}
		sum := nv
		for _, r := range s.regions {
			if r != region {
				sum += s.At(r, w)
			}
		}
		if sum > s.limit {
			return Stand{}, false
		}
	}
	s.seq[region]++
	m := Stand{Region: region, Alloc: s.id, Seq: s.seq[region], From: from, Through: through, Slice: slice}
	s.pending[region] = &m
	return m, true
}

// Pending returns the Stands awaiting their Ack, to send again.
func (s *Stands) Pending() []Stand {
	var out []Stand
	for _, r := range s.regions {
		if p := s.pending[r]; p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// OnAck applies a region's acknowledgement of its Stand in flight: the
// windows after Made and from the Stand's From on start at what it set.
// It reports whether it was that Ack (another allocator's, an older or a
// repeated one changes nothing).
func (s *Stands) OnAck(k StandAck) bool {
	p := s.pending[k.Region]
	if p == nil || k.Alloc != s.id || k.Seq != p.Seq {
		return false
	}
	s.applied[k.Region].set(max(p.From, k.Made+1), p.Through, p.Slice)
	delete(s.pending, k.Region)
	return true
}

// Forget drops what applies only to windows before w, and reports whether
// every region starts every window from w on at its base with no Stand in
// flight (the caller may then forget the Stands: made again with a floor
// of w, it knows all it needs).
func (s *Stands) Forget(w int64) bool {
	idle := len(s.pending) == 0
	for _, r := range s.regions {
		s.applied[r].forget(w)
		idle = idle && len(s.applied[r].pieces) == 0
	}
	return idle
}

// FairStands divides limit hits among regions by Doorman's fair share
// (water-filling) of their demand (hits per window, as the caller
// estimates it): each region gets up to its demand in equal rounds; what
// the regions that need less leave goes to the others; when the demands
// add up to less than the limit, the rest is shared in proportion to
// them (room to grow with no message), or equally when there is no
// demand. Shares are whole hits adding up to exactly the limit: rounded
// down, and the hits left over go first to the regions that want more
// than their share, then by largest remainder.
func FairStands(limit int64, demand map[string]float64) map[string]int64 {
	regs := make([]string, 0, len(demand))
	for r := range demand {
		regs = append(regs, r)
	}
	slices.Sort(regs)
	share := make(map[string]float64, len(regs))
	left := float64(limit)
	open := slices.Clone(regs)
	for len(open) > 0 && left > 1e-9 {
		each := left / float64(len(open))
		next := open[:0]
		for _, r := range open {
			give := min(each, max(demand[r], 0)-share[r])
			share[r] += give
			left -= give
			if share[r] < demand[r]-1e-9 {
				next = append(next, r)
			}
		}
		if len(next) == len(open) {
			break // every open region took a full round: left is ~0
		}
		open = next
	}
	if left > 1e-9 && len(regs) > 0 {
		var sum float64
		for _, r := range regs {
			sum += share[r]
		}
		for _, r := range regs {
			if sum > 0 {
				share[r] += left * share[r] / sum
			} else {
				share[r] += left / float64(len(regs))
			}
		}
	}
	out := make(map[string]int64, len(regs))
	var given int64
	for _, r := range regs {
		out[r] = int64(math.Floor(share[r] + 1e-9))
		given += out[r]
	}
	// The hits rounding left over go first to the regions that want more
	// than their share (most unmet demand first: they spend them for
	// sure), then by largest remainder: a region whose demand is a hit
	// and a half a window, given two, leaves the second unused half the
	// time while another region is denied.
	unmet := func(r string) float64 {
		if demand[r] <= share[r]+1e-9 {
			return 0 // its share covers its demand
		}
		return demand[r] - float64(out[r])
	}
	byRem := slices.Clone(regs)
	slices.SortStableFunc(byRem, func(x, y string) int {
		return cmp.Or(cmp.Compare(unmet(y), unmet(x)), cmp.Compare(share[y]-float64(out[y]), share[x]-float64(out[x])))
	})
	for i := 0; given < limit && len(byRem) > 0; i = (i + 1) % len(byRem) {
		out[byRem[i]]++
		given++
	}
	return out
}
