package lease

import "math"

// Hint is what a Stand says beside the standing slice (KeyHolder.SetHint
// takes it): the region's demand per window the allocator planned it from
// (hits; -1: none learnt yet), whether its standing slice is below that
// (Capped: it asks for nothing) and whether other regions want more than
// they stand at (Wanting: it gives back what it will not use).
type Hint struct {
	Demand          int64
	Capped, Wanting bool
}

// KeyStands is one key's standing slices where its node is the key's
// allocator (fixed windows): the Stands, each region's demand per window
// as the windows that ended showed it (a moving average, StandAlpha), and
// what the last Stand to each region said beside its slice. It plans the
// stands (Plan). The caller moves the messages and says the current
// window: no clock, no network. Not safe for concurrent use.
type KeyStands struct {
	Limit int64 // hits per window
	St    *Stands
	// Demand is each region's demand per window, hits, a moving average
	// (nil: no window seen yet).
	Demand  map[string]float64
	fed     int64            // the newest window fed into Demand
	samples map[string]int   // region -> samples folded into Demand
	wanted  map[string]int64 // region -> hits the other regions want beyond their targets, as last planned
	said    map[string]Hint  // region -> what its last Stand said
}

// NewKeyStands returns the planning of a key whose limit is limit hits
// per window over st.
func NewKeyStands(limit int64, st *Stands) *KeyStands {
	return &KeyStands{Limit: limit, St: st}
}

// FirstPlannable returns the first window a stand may set when cur is the
// current window: the one after it, at or after the stands' floor, after
// the newest window a per-window allocator was made for.
func (k *KeyStands) FirstPlannable(cur int64) int64 {
	return max(cur+1, k.St.Floor(), k.St.LastMade()+1)
}

// DemandMilli is region reg's demand per window the stands are planned
// from, in thousandths of a hit (-1: none learnt yet).
func (k *KeyStands) DemandMilli(reg string) int64 {
	if k.Demand == nil {
		return -1
	}
	return int64(math.Round(k.Demand[reg] * 1000))
}

// Tell returns what a Stand st says beside its slice (its hint's demand,
// in thousandths of a hit, and the hits the other regions want beyond
// their standing slices), noting the hint as said to its region.
func (k *KeyStands) Tell(st Stand) (demandMilli, wanted int64) {
	if k.said == nil {
		k.said = map[string]Hint{}
	}
	k.said[st.Region] = k.HintFor(st.Region, st.Slice)
	return k.DemandMilli(st.Region), k.wanted[st.Region]
}

// Said returns what the last Stand to region reg said beside its slice
// (false: none went).
func (k *KeyStands) Said(reg string) (Hint, bool) {
	h, ok := k.said[reg]
	return h, ok
}

// HintFor returns what a Stand setting region reg at slice says: the
// demand the allocator planned it from (-1 before it learnt any), whether
// slice is below it by StandStep or more (or the demand is the whole
// limit), and whether other regions want more than they stand at.
func (k *KeyStands) HintFor(reg string, slice int64) Hint {
	if k.Demand == nil {
		return Hint{Demand: -1}
	}
	d := int64(math.Round(k.Demand[reg]))
	capped := d >= k.Limit || slice+StandStep(k.Limit) <= d
	return Hint{Demand: d, Capped: capped, Wanting: k.wanted[reg] > 0}
}

// hintChanged reports whether h differs from what the region was last
// told enough to change what it does: it becomes capped or not, wanting
// or not, or its demand moved by StandStep (it asks above the demand it
// was told by that much).
func (k *KeyStands) hintChanged(reg string, h Hint) bool {
	if h.Demand < 0 {
		return false
	}
	old, ok := k.said[reg]
	return !ok || old.Capped != h.Capped || old.Wanting != h.Wanting || abs(min(old.Demand, k.Limit)-min(h.Demand, k.Limit)) >= StandStep(k.Limit)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// planWanted notes, for each region, the hits the other regions want
// beyond what they will stand at (their fair share, target, or what they
// stand at from window from when they have none), by the demand the
// stands are planned from.
func (k *KeyStands) planWanted(target map[string]int64, from int64) {
	k.wanted = map[string]int64{}
	if k.Demand == nil {
		return
	}
	hungry := map[string]int64{}
	var all int64
	for r, d := range k.Demand {
		t, ok := target[r]
		if !ok {
			t = k.St.At(r, from)
		}
		if n := int64(math.Round(d)) - t; n > 0 && k.HintFor(r, t).Capped {
			hungry[r] = n
			all += n
		}
	}
	for r := range k.Demand {
		k.wanted[r] = all - hungry[r]
	}
}

// Feed adds what window id's allocator a (ended, not learning) showed of
// each region's demand (Allocator.Demands) to the moving averages: every
// region's in the key's first window; after that, only the regions that
// asked in it (a region that did not ask says nothing reliable of its
// demand: it spent its standing slice, or is quiet because capped, or
// gave back what it guessed it would not use; its StandAcks say it: see
// OnStandAck). A window fed already, or older, changes nothing.
func (k *KeyStands) Feed(id int64, a *Allocator) {
	if id <= k.fed || a.Learning() {
		return
	}
	d := a.Demands()
	first := k.Demand == nil
	if first {
		k.Demand = map[string]float64{}
	}
	for r, n := range d {
		if a.Asked(r) || first {
			k.fold(r, float64(n))
		}
	}
	k.fed = id
}

// fold adds a sample x (hits per window) to region r's moving average of
// demand: the mean of the samples while there are few, then StandAlpha's
// weight.
func (k *KeyStands) fold(r string, x float64) {
	if k.samples == nil {
		k.samples = map[string]int{}
	}
	n := k.samples[r]
	k.samples[r] = n + 1
	k.Demand[r] += max(StandAlpha, 1/float64(n+1)) * (x - k.Demand[r])
}

// OnStandAck applies a region's acknowledgement of a standing slice (see
// Stands.OnAck) and, when it was taken and says the region's own average
// demand per window (demandMilli, thousandths of a hit, 0..maxMilli),
// which counts every check the region had (what the windows' messages
// say is a guess from the moment they went), puts it in place of the
// allocator's. It reports whether the Ack was taken.
func (k *KeyStands) OnStandAck(ack StandAck, demandMilli, maxMilli int64) bool {
	ok := k.St.OnAck(ack)
	if ok && k.Demand != nil && demandMilli >= 0 && demandMilli <= maxMilli {
		k.Demand[ack.Region] = float64(demandMilli) / 1000
		if k.samples == nil {
			k.samples = map[string]int{}
		}
		k.samples[ack.Region] = max(k.samples[ack.Region], 4)
	}
	return ok
}

// Hunger returns the hits each capped region but except wants beyond
// what allocator a records it holds, by the demand the stands are planned
// from: only the capped, a region quiet for want of more and sure to
// spend it (one that asks is granted by the waiting it asked for). Nil
// with no demand learnt.
func (k *KeyStands) Hunger(a *Allocator, except string) map[string]int64 {
	if k.Demand == nil {
		return nil
	}
	out := map[string]int64{}
	for r, d := range k.Demand {
		if n := int64(math.Round(d)) - a.Record(r); r != except && n > 0 && k.HintFor(r, k.St.At(r, a.Window())).Capped {
			out[r] = n
		}
	}
	return out
}

// Plan returns the Stands to send now, cur being the current window and
// reach how many windows past it a stand may reach, for regions (in
// order) whose bases are bases. A region's standing slice moves to its
// fair share of the demand (FairStands) when that moved by StandStep or
// more from what it stands at; all move, by less too, when in all they
// raise regions by StandStep or more (one region's share, or a hit each
// of several: with five regions of a hit each, a region wanting the
// limit gets their hits; two light regions a hit below their shares
// would ask every window); a capped region is raised to its share by a
// hit too (it does not ask, so a hit the stands leave in the pool would
// be left there). A standing slice other than the base, or one whose hint
// makes its region quiet (capped) or give back (wanting), is renewed when
// less than half its reach is left; one whose hint changed is sent at
// once. A region with a Stand in flight is left as it is. Reaching
// further would raise windows the others' standing slices do not reach
// yet (they start at their bases there): such a stand moves over its
// present reach, and is renewed once theirs were.
func (k *KeyStands) Plan(cur, reach int64, regions []string, bases map[string]int64) []Stand {
	from := k.FirstPlannable(cur)
	through := cur + reach
	if from > through {
		return nil
	}
	var target map[string]int64
	if k.Demand != nil {
		target = FairStands(k.Limit, k.Demand)
	}
	var raised int64
	for r, t := range target {
		// (Only up to the whole hits of its demand: a share a hit
		// above it, from rounding, moves with the noise.)
		raised += max(min(t, int64(k.Demand[r]))-k.St.At(r, from), 0)
	}
	raise := raised >= StandStep(k.Limit)
	k.planWanted(target, from)
	var out []Stand
	for _, r := range regions {
		if k.St.Busy(r) {
			continue
		}
		now := k.St.At(r, from)
		next := now
		if t, ok := target[r]; ok && (abs(t-now) >= StandStep(k.Limit) || (raise && t != now) || (t > now && k.HintFor(r, now).Capped)) {
			next = t
		}
		last, _ := k.St.Through(r)
		h := k.HintFor(r, next)
		renew := (next != bases[r] || h.Capped || h.Wanting) && last-cur < reach/2
		if next == now && !renew && !k.hintChanged(r, h) {
			continue
		}
		st, ok := k.St.Set(r, from, through, next)
		if !ok && last >= from && !renew {
			st, ok = k.St.Set(r, from, last, next)
		}
		if ok {
			out = append(out, st)
		}
	}
	return out
}
