package lease

import (
	"math"
	"math/rand/v2"
	"time"
)

// BucketLease is the window id of a token or leaky bucket's lease: a
// bucket has no windows, and its slice (a share of its rate and, in
// proportion, of its burst) holds until the allocator lowers it.
const BucketLease int64 = -1

// StandAlpha is the weight of the window that ended in a key's moving
// average of a region's demand per window (the rest is the earlier
// windows'; the first few are averaged evenly): Poisson demand of a hit
// or two a window moved a half-weighted average by a hit a window.
const StandAlpha = 0.3

// StandStep is how far (hits) a region's fair share or planned demand
// must move from its standing slice before a stand changes it: a tenth of
// the limit, at least two hits (a region whose demand is a hit or two a
// window would see its standing slice change every window, two messages
// each time); what the stands miss, the window's own grants and reclaims
// move.
func StandStep(limit int64) int64 { return max(2, limit/10) }

// FewHits is the demand in a window below which Estimate pools it with
// the last window's.
const FewHits = 4

// KeyHolder is one key's side in one region (the region's owner of the
// key keeps it): a [Holder] per window id (the current window and, for a
// busy key, the next; a bucket's one lease under [BucketLease]), what
// each window's holder starts at ([Standing]), what the allocator's last
// Stand said beside the standing slice (its hint: the region's demand the
// allocator planned from, and whether other regions want more than they
// stand at), and the region's own demand per window, a moving average.
// It decides when the region asks for more (WantMore) and whether it
// gives back late in a window (GivesBack). The caller keeps it under a
// lock, counts what the region admitted (its window in the store), moves
// the messages and says the time: the type has no clock and no network.
// Not safe for concurrent use.
type KeyHolder struct {
	Region string
	Window time.Duration // the limit's window
	Limit  int64         // hits per window
	Base   int64         // the region's base share, hits per window
	// Wins is each window id's holder.
	Wins map[int64]*WindowHolder
	// Stand is what each window's holder starts at (fixed windows).
	Stand *Standing
	// SureFrom is the first window a Stand applied here set (0: none):
	// a window made from then on starts at its standing slice.
	SureFrom int64
	// NextWindowSent is the window id of the last next-window request.
	NextWindowSent int64
	// Replaced is the window id current when a check with another limit
	// or window made this KeyHolder over the key's last (0: none): the
	// holders of that window and before start at 0 (unsure), since what
	// the window admitted was admitted under the old one's slices; and a
	// bucket's lease does too.
	Replaced int64
	// The last Stand's hint (see Hinted): the region's demand per window
	// the allocator planned from (hits, at most the limit; -1: none
	// said), the hits the other regions want beyond their standing
	// slices, and the windows the hint holds for (those its Stand set).
	hintDemand, hintWanted int64
	hintFrom, hintThrough  int64
	// The region's demand per window, a moving average (StandAlpha; the
	// mean of the first few) of the windows that ended up to window
	// avgFed (a window without a check here counts 0; it starts at the
	// window before the KeyHolder's own), over avgN windows (the first
	// was partial).
	avgDemand float64
	avgFed    int64
	avgN      int
	first     int64 // the window id of the first holder made (its demand before is not known)
}

// WindowHolder is a KeyHolder's side of one window: its Holder and what
// the region asked and admitted in it.
type WindowHolder struct {
	H        *Holder
	Demand   int64     // hits asked in the window, allowed or not
	Consumed int64     // hits admitted, as last seen
	Asked    time.Time // when the last request went, wall clock (zero: none)
	AskedAt  int64     // the slice when it went
	AskedFor int64     // the slice it asked to reach (its slice then and what it wanted): the allocator owes the rest
	Unsure   bool      // it started at 0, not knowing its standing slice
	// Blind: it was made blind (see Holder.StartBlind). A bucket's
	// region, which has no window to count spent hits in, starts its
	// bucket empty instead (Drained once done: the caller's).
	Blind, Drained bool
	// DrainedCap is the bucket's capacity (hits) when it was last
	// emptied for blindness (the caller's; see Drained).
	DrainedCap int64
}

// NewKeyHolder returns region's side of a key whose limit is limit hits
// per window of w, with base hits of its own per window, made in window
// current; replaced is the window id when it replaces a KeyHolder of
// another limit or window (0: none; see Replaced).
func NewKeyHolder(region string, w time.Duration, limit, base, current, replaced int64) *KeyHolder {
	return &KeyHolder{Region: region, Window: w, Limit: limit, Base: base, Wins: map[int64]*WindowHolder{},
		Stand: NewStanding(region, base), hintDemand: -1, avgFed: current - 1, Replaced: replaced}
}

// MakeWin returns the holder of window id, making it when there is none:
// at the region's standing slice for the window (its base for a
// bucket), or at 0 when unsure (the caller's judgement that the region
// may hold less than that: see WindowHolder.Unsure), and blind (see
// Holder.StartBlind) when blind (the caller's judgement that its process
// cannot know what the region admitted in the window before: blind
// implies unsure).
func (k *KeyHolder) MakeWin(id int64, unsure, blind bool) *WindowHolder {
	if w := k.Wins[id]; w != nil {
		return w
	}
	if len(k.Wins) == 0 || id < k.first {
		k.first = id
	}
	start := k.Base
	if id != BucketLease {
		start = k.Stand.Start(id)
	}
	w := &WindowHolder{H: NewHolder(k.Region, id, start)}
	switch {
	case blind:
		w.H.StartBlind(rand.Uint64() | 1)
		w.Unsure, w.Blind = true, true
	case unsure:
		w.H.StartAfresh(rand.Uint64() | 1)
		w.Unsure = true
	}
	k.Wins[id] = w
	return w
}

// Hinted reports whether the last Stand's hint holds for w's window: it
// said the region's demand, and it set the window's standing slice
// (before, the window started at another; after, the region is back at
// its base, and asks as without a stand).
func (k *KeyHolder) Hinted(w *WindowHolder) bool {
	id := w.H.Window()
	return k.hintDemand >= 0 && !w.Unsure && id != BucketLease && id >= k.hintFrom && id <= k.hintThrough
}

// Capped reports whether w's holder starts at a standing slice below the
// demand its allocator planned it from (the Stand's hint): the key is
// wanted beyond the limit, the region stands at its fair share of it,
// and the allocator knows its demand, so asking for more gets nothing
// that the others' give-backs would not bring (what they free is offered
// to the capped regions). So is a region whose planned demand is the
// whole limit, whatever it stands at: one standing at the limit and
// lowered for another region's request would only ask back what that
// region asked for. A holder that does not know its start (unsure) asks
// as usual.
func (k *KeyHolder) Capped(w *WindowHolder) bool {
	return k.Hinted(w) && (k.hintDemand >= k.Limit || w.H.Base()+StandStep(k.Limit) <= k.hintDemand)
}

// Known reports whether the key's allocator knows the demand predicted
// (hits in the window) for w's window here well enough that asking for
// more is not worth its messages: other regions are capped (the last
// Stand's hint: they want more than they stand at), so the pool is
// empty, what the regions give back goes to them, and a grant could
// only take a hit from another region that would have spent it (the
// regions admit the limit in all either way); and the prediction is less
// than twice the demand the allocator planned from plus StandStep (more,
// and the region asks: its demand rose, not just a window's noise; what
// it says in its StandAcks moves its standing slice meanwhile). A region
// planned at 0 or a hit thus stays quiet for a few hits: asking for them
// took a hit from a region that would have spent it, four messages, and
// the grant often came after the checks that wanted it (2-4 points of
// utilisation and half the messages under 90/10 skew in 5 regions 200 ms
// apart).
func (k *KeyHolder) Known(w *WindowHolder, predicted int64) bool {
	return k.Hinted(w) && k.hintWanted > 0 && predicted < 2*(k.hintDemand+StandStep(k.Limit))
}

// Estimate returns the key's demand rate here (hits per ns) and the
// demand (hits) the whole window will have at it, elapsed into w's
// window: the rate so far (counted from at least a quarter window, so
// that the first checks of a window do not look like a flood), blended
// with the last window's when there was one (half and half at the
// window's start, the current window's alone from its middle on, so that
// demand that moved away is forgotten). Below FewHits in the window, and
// with the last window known, the two windows' demand is pooled, as if
// the last window were observed too: one check early in a window of a
// key that sees one a window is not four.
func (k *KeyHolder) Estimate(w *WindowHolder, elapsed time.Duration) (rate float64, predicted int64) {
	elapsed = min(max(elapsed, 0), k.Window)
	id := w.H.Window()
	prev, known := k.Wins[id-1], k.first < id
	switch {
	case w.Demand < FewHits && known:
		var last int64
		if prev != nil {
			last = prev.Demand
		}
		rate = float64(w.Demand+last) / float64(elapsed+k.Window)
	default:
		rate = float64(w.Demand) / float64(max(elapsed, k.Window/4))
		if prev != nil && prev.Demand > 0 {
			old := max(0.5-float64(elapsed)/float64(k.Window), 0)
			rate = (1-old)*rate + old*float64(prev.Demand)/float64(k.Window)
		}
	}
	predicted = w.Demand + int64(rate*float64(k.Window-elapsed))
	return rate, predicted
}

// WantMore returns the hits w's holder should ask for (0: none), elapsed
// into its window, at wall clock now, with lead (how long before a slice
// runs out a request should go) and rtt (a lease's round trip, flushes
// included): when the key's rate in the window, carried over the lead,
// would spend what is left of the slice, and the whole window at that
// rate would need more than the slice. Never for a region holding the
// whole limit or Capped; at most one request per rtt; and while no grant
// came since the last one, none for the rest of the window unless the
// demand grew well beyond what it asked for (by half, and two hits): the
// allocator remembers what a region waits for and grants it as capacity
// frees (in a key wanted everywhere beyond the limit, asking again each
// few round trips was most of the lease messages, and got nothing; a
// region whose first ask was a guess from a hit or two must say what its
// demand turned out to be, or wait the window through). A region lowered
// since waits no more (the caller clears AskedFor) and may ask again.
// Asking again after a grant is worth its message: it refreshes what the
// region used and waits for, which the allocator's fair shares and
// reclaims go by. A holder that started below its base (unsure) asks for
// at least its base back: the base is the region's own unless it was
// given away.
func (k *KeyHolder) WantMore(w *WindowHolder, elapsed time.Duration, now time.Time, lead, rtt time.Duration) int64 {
	slice := w.H.Slice()
	if slice >= k.Limit || k.Capped(w) {
		return 0
	}
	quiet := false
	if !w.Asked.IsZero() {
		since := now.Sub(w.Asked)
		if since < rtt {
			return 0
		}
		quiet = slice == w.AskedAt && since < max(4*rtt, k.Window+lead)
	}
	rate, predicted := k.Estimate(w, elapsed)
	if quiet && min(predicted, k.Limit) <= w.AskedFor+max(w.AskedFor/2, 2) {
		return 0
	}
	predicted = max(predicted, w.H.Base())
	if predicted <= slice || k.Known(w, predicted) {
		return 0
	}
	if ahead := int64(rate * float64(lead)); slice-w.Consumed > ahead && slice >= w.H.Base() {
		return 0
	}
	return min(predicted-slice, k.Limit)
}

// SetHint takes the hint of a Stand applied from window from through
// through: the region's demand per window the allocator planned from
// (demandMilli, thousandths of a hit; negative: none said) and the hits
// the other regions want beyond their standing slices (wanted). A
// renewal (the last hint held up to the window before from) keeps the
// windows the last Stand set, up to from, under the new hint: without,
// the current window of a renewed key had none, and its region asked as
// if the allocator knew nothing (most of a skewed key's requests). It
// reports whether the region should give back late in its windows (see
// GivesBack).
func (k *KeyHolder) SetHint(from, through, wanted, demandMilli int64) (giving bool) {
	if k.hintDemand >= 0 && k.hintFrom < from && k.hintThrough >= from-1 {
		from = k.hintFrom
	}
	k.hintDemand, k.hintWanted, k.hintFrom, k.hintThrough = -1, max(wanted, 0), from, through
	if demandMilli >= 0 {
		k.hintDemand = min((demandMilli+500)/1000, k.Limit) // beyond the limit, wanting more changes nothing
	}
	return k.hintWanted > 0 && k.hintDemand >= 0
}

// GivesBack reports, for window id, whether the hint no longer holds
// (expired: the stands ran out, the region gives back no more) and
// whether the region gives back what it will not use of the window
// (the last Stand said other regions want more than they stand at).
func (k *KeyHolder) GivesBack(id int64) (expired, gives bool) {
	if id > k.hintThrough {
		return true, false
	}
	return false, k.hintWanted > 0 && k.hintDemand >= 0
}

// DemandSaid is the region's demand per window as a StandAck says it,
// in thousandths of a hit: its moving average, once three windows were
// folded in (the first, in which the KeyHolder was made, is partial); -1
// before.
func (k *KeyHolder) DemandSaid() int64 {
	if k.avgN < 3 {
		return -1
	}
	return int64(math.Round(k.avgDemand * 1000))
}

// Fold folds the windows that ended before window id (at most the last
// 8) into the region's demand average, 0 for those without a check here.
func (k *KeyHolder) Fold(id int64) {
	for wid := max(k.avgFed+1, id-8); wid < id && k.Window > 0; wid++ {
		var d int64
		if hw := k.Wins[wid]; hw != nil {
			d = hw.Demand
		}
		k.avgDemand += max(StandAlpha, 1/float64(k.avgN+1)) * (float64(d) - k.avgDemand)
		k.avgFed = wid
		k.avgN++
	}
}
