// Package lease moves a global limit's capacity between regions without
// ever letting the regions together admit more than the limit: escrowed
// slices (docs/regions.md; issue 20; the design is the demarcation
// protocol's "lower first, then raise", Barbará and Garcia-Molina, EDBT
// 1992, with YouTube Doorman's leases, fair share and learning mode:
// capacity leaves a pool only by a grant and returns to it only when its
// holder gave it back).
//
// For one key and one window (identified by its window id, which every
// message carries, so that regions whose clocks differ never mix two
// windows' capacity), each region starts with its standing slice (its
// base, owned without any message, unless the allocator's [Stands] set
// another for that window: stand.go), and the key's [Allocator] keeps the
// pool: the limit minus what the regions start with. A region's [Holder] may admit up to its
// slice. The invariant, for every window id at every moment:
//
//	Σ_regions consumed ≤ Σ_regions max(slice, consumed) ≤ Σ_regions record ≤ limit
//
// where record is the allocator's record of a region's slice (its base
// until a message changes it), never below what the region holds: a grant
// is recorded before it is sent, a lowering (of a grant or of the base)
// only after the holder acknowledged it, having lowered first; every
// message carries an absolute value and the allocator's sequence number
// for the region, so that lost, duplicated and reordered messages never
// raise a holder above its record. Losing a message costs
// under-admission, never over-admission.
//
// A region's consumed passes its slice only when its holder was made
// afresh, at 0, over a window that had admitted already (a restart, a key
// moved with its count, a limit changed mid-window). Every request, Ack
// and give-back says both; the allocator records what the region
// admitted, and when that makes the records pass the limit its pool goes
// below 0 and grants nothing until what comes back covers it: such a
// window admits at most the larger of the limit and what it had admitted
// when the holder was made.
//
// An allocator that takes over a key (its node restarted, the key moved
// on the ring of its region, or the allocator region changed) starts in
// learning mode: it grants nothing until every region has reported what
// it holds (a Lower with target [ReportOnly]), since another allocator
// may have granted before it; a region that cannot report (cut off, down)
// keeps the pool closed for that window (what is unaccounted counts as
// spent). A holder takes grants only from the allocator it reported to
// last (or that wrote to it first), so that a late grant of a former
// allocator never raises it after it reported to the new one.
//
// Two allocators at once (a split: while views differ, two nodes each
// take themselves for the key's allocator) keep the bound as long as
// one of them learnt (it did, unless the views were stable for a whole
// learning horizon): the holders stay with the one that learnt last, the
// other's Lowers are applied without taking a holder back, and its
// grants are refused. Not covered: a holder made afresh (it has
// forgotten whom it reported to) during a split takes the first grant of
// either, and may so take the former one's after it reported to the new
// one.
//
// The package is pure: no network, no clock; the caller moves messages,
// says which window is current and reads what a region consumed from its
// window.
package lease

import (
	"fmt"
	"math"
	"slices"
)

// ReportOnly is a Lower's Target that lowers nothing: the holder only
// reports its slice and consumption (learning mode).
const ReportOnly int64 = -1

// Grant sets a region's slice for a window to Slice hits (an absolute
// value: its base and grants together). Alloc names the allocator (an id
// unique to one allocator state); Seq orders its messages to the region.
type Grant struct {
	Region string
	Window int64
	Alloc  uint64
	Seq    uint64
	Slice  int64
	Nonce  uint64 // the nonce of the region's last request (0: none): see Holder.StartAfresh
	// Spent is, for a blind holder (Holder.StartBlind) whose nonce the
	// grant carries, the hits its region is counted as having admitted
	// in the window before the holder was made (0: none): the holder
	// counts them before it admits anything.
	Spent int64
}

// Lower asks a region to lower its slice for a window to at most Target
// hits (it keeps what it already consumed); Target ReportOnly lowers
// nothing. Alloc and Seq as for Grant.
type Lower struct {
	Region string
	Window int64
	Alloc  uint64
	Seq    uint64
	Target int64
}

// Ack answers a Lower: the region's slice for the window is now Slice
// hits and will never again be more under Seq or an older sequence number
// of Alloc (nor under another allocator's grant); Consumed is what it
// admitted in the window.
type Ack struct {
	Region   string
	Window   int64
	Alloc    uint64
	Seq      uint64
	Slice    int64
	Consumed int64
	// Follows is the allocator the holder takes grants from when it is
	// not the Lower's (0: it is the Lower's): see Allocator.OnAck.
	Follows uint64
	// Blind and Nonce: the holder is blind (Holder.StartBlind), with
	// that nonce: the allocator counts the region at its spent.
	Blind bool
	Nonce uint64
}

// Request asks the allocator for Want more hits for a window; Consumed
// and Slice report the region's use (the allocator's fair share and
// reclaim decisions use them).
type Request struct {
	Region   string
	Window   int64
	Want     int64
	Consumed int64
	Slice    int64
	Nonce    uint64 // the holder's nonce (0: none): see Holder.StartAfresh
	Blind    bool   // the holder is blind: see Holder.StartBlind
}

// Allocator keeps one key's pool for one window: the limit minus the
// regions' slices, granted on request by fair share of the regions'
// demand and reclaimed lower-first. It is not safe for concurrent use (one
// per key and window, under its owner's lock).
type Allocator struct {
	id         uint64
	window     int64
	limit      int64
	regions    []string          // sorted
	record     map[string]int64  // region -> recorded slice (>= what it holds)
	known      map[string]bool   // learning mode: the regions that reported
	free       int64             // pool hits granted to nobody (0 while learning; below 0: see hold)
	floor      map[string]int64  // region -> hits it counts for in the pool at least (Slide; nil: none)
	said       map[string]int64  // region -> the slice its last request said it holds
	nonce      map[string]uint64 // region -> the nonce of its last request
	closed     bool              // Close: grants nothing more
	seq        map[string]uint64
	lowerAt    map[string]uint64  // region -> seq of the Lower awaiting its Ack (0: none)
	target     map[string]int64   // region -> that Lower's target
	used       map[string]int64   // region -> consumed hits it last reported
	demand     map[string]int64   // region -> hits it expects to need in the window (its slice + want when it asked)
	prior      map[string]int64   // region -> its demand in the last window (the constructor's demand)
	extra      map[string]int64   // region -> hits it expected to admit beyond what it had used, when it last asked
	askedAt    map[string]float64 // region -> the part of the window left when it last asked
	waiting    map[string]int64   // region -> hits it asked for and was not granted yet
	reportLeft map[string]float64 // region -> the part of the window left when it last reported its use in the window (0: never)
	heard      map[string]bool    // region -> it sent a message in the window (a request, an Ack or a give-back)
	left       float64            // the part of the window still to come (0..1), as the caller last said
	blind      map[string]uint64  // region -> the nonce of its blind holder (see Holder.StartBlind; absent: none)
	spent      map[string]int64   // region -> what its blind holder is counted as having admitted (-1: not known yet, while learning)
	inherit    map[string]int64   // region -> the most it admitted under the allocators before this one (Inherit; absent: not known)
}

// NewAllocator returns the allocator id of a window whose limit is limit
// and whose regions start with bases (hits each, no grant needed; every
// region the key may be checked in must be listed, with 0 if it has no
// base). demand, which may be nil, is each region's expected demand for
// the window (its last window's, for a key seen before): the fair share
// starts from it. learning says another allocator may have granted in
// this window: nothing is granted until every region reported. It returns
// an error when the bases add up to more than the limit or one is
// negative.
func NewAllocator(id uint64, window, limit int64, bases map[string]int64, demand map[string]int64, learning bool) (*Allocator, error) {
	var sum int64
	a := &Allocator{id: id, window: window, limit: limit, record: map[string]int64{},
		seq: map[string]uint64{}, lowerAt: map[string]uint64{}, target: map[string]int64{},
		used: map[string]int64{}, demand: map[string]int64{}, prior: map[string]int64{}, waiting: map[string]int64{}, left: 1,
		extra: map[string]int64{}, askedAt: map[string]float64{}, reportLeft: map[string]float64{}, heard: map[string]bool{},
		said: map[string]int64{}, nonce: map[string]uint64{}, blind: map[string]uint64{}, spent: map[string]int64{}}
	for r, b := range bases {
		if b < 0 {
			return nil, fmt.Errorf("lease: base of %s: must be >= 0, got %d", r, b)
		}
		sum += b
		a.regions = append(a.regions, r)
		a.record[r] = b
	}
	if sum > limit {
		return nil, fmt.Errorf("lease: bases add up to %d, over the limit %d", sum, limit)
	}
	slices.Sort(a.regions)
	for r, d := range demand {
		if _, ok := a.record[r]; ok {
			a.prior[r] = max(d, 0)
		}
	}
	if learning {
		a.known = map[string]bool{}
		for _, r := range a.regions {
			a.record[r] = limit // unknown: the most it can hold
			a.lower(r, ReportOnly)
		}
		return a, nil
	}
	a.free = limit - sum
	return a, nil
}

// ID returns the allocator's id.
func (a *Allocator) ID() uint64 { return a.id }

// Window returns the window id the allocator keeps.
func (a *Allocator) Window() int64 { return a.window }

// Learning reports whether the allocator still waits for regions'
// reports before it grants.
func (a *Allocator) Learning() bool { return a.known != nil }

// Demands returns each region's demand in the window as the allocator
// knows it (hits): for a region still waiting for hits, what it used or
// asked to reach, whichever is more (it was not granted what it needed);
// for one that last reported what it used (a request or an Ack) a
// quarter of the window or more after its start, that carried over the
// whole window (a measure, where what a region asks for is a guess, and
// a region whose demand is a hit or two a window guesses high);
// otherwise what it holds (it may have spent it without a word). The
// next window's allocator starts from it.
func (a *Allocator) Demands() map[string]int64 {
	out := make(map[string]int64, len(a.regions))
	for _, r := range a.regions {
		switch k := a.reportLeft[r]; {
		case a.waiting[r] > 0:
			out[r] = max(a.used[r], a.demand[r])
		case k > 0 && 1-k >= 0.25:
			out[r] = max(a.used[r], min(int64(math.Round(float64(a.used[r])/(1-k))), a.limit))
		default:
			out[r] = max(a.used[r], a.record[r])
		}
	}
	return out
}

// Heard reports whether region sent the allocator a message in its
// window (a request, an Ack or a give-back): what Demands says of a
// region not heard is only what it holds.
func (a *Allocator) Heard(region string) bool { return a.heard[region] }

// Asked reports whether region asked the allocator for hits in its
// window (a request, for more or to report its use).
func (a *Allocator) Asked(region string) bool { return a.askedAt[region] > 0 }

// Free returns the pool's hits granted to nobody (0 when the regions
// admitted more than the limit less the pool: see hold).
func (a *Allocator) Free() int64 { return max(a.free, 0) }

// hold records that region r may spend, or has spent, held hits in all,
// the pool taking the difference: held comes from the region (a report,
// an Ack or a request) and is at least what it admitted. While learning
// the pool is counted when it opens. free goes below 0 when the regions
// admitted more than the limit less the pool (a window whose holders
// were made afresh over what it had admitted: a restart, a limit
// changed): nothing is granted then until what comes back covers it.
func (a *Allocator) hold(r string, held int64) {
	if sp := a.spent[r]; a.blind[r] != 0 && sp > held {
		held = sp // unknown means spent: a blind region never counts for less
	}
	if !a.Learning() {
		a.free += a.counted(r) - max(held, a.floor[r])
	}
	a.record[r] = held
}

// counted returns what region r takes of the pool: its record, or its
// floor when that is more (Slide).
func (a *Allocator) counted(r string) int64 { return max(a.record[r], a.floor[r]) }

// seeBlind notes that region r's holder of the window is blind (see
// Holder.StartBlind) with nonce: unknown means spent, so the region is
// counted as having admitted, before that holder was made, the most it
// can have: its record (a grant is recorded before it is sent, a lower
// only once acknowledged, so no region admits beyond its record), or
// what it says it consumed, if more. From then on its record never goes
// below that (hold), and the grants answering its requests carry it
// (Grant.Spent). While learning the records are not known yet: spent is
// set when learning ends (learnt). A nonce already seen changes nothing.
func (a *Allocator) seeBlind(r string, nonce uint64, consumed int64) {
	if _, ok := a.record[r]; !ok || nonce == 0 || a.blind[r] == nonce {
		return
	}
	a.blind[r] = nonce
	if a.Learning() {
		a.spent[r] = max(a.spent[r], -1)
		return
	}
	a.spent[r] = max(a.record[r], consumed, a.spent[r], 0)
}

// learnt sets, as learning mode ends, what each blind region is counted
// as having spent: what the other regions' reports leave of the limit
// (the regions together never admitted more than the limit, and each of
// the others holds at least what it reported, since only an allocator's
// acknowledged lower or its own give-back lowers a holder), or its own
// record, if more. Every region has reported, so the records are the
// reports. With two blind regions each is counted at that rest: the
// pool goes below 0 and grants nothing until what comes back covers it
// (under-admission, never over). When every region is blind (every
// region's only node restarted within the window, and no check of the
// key came since in any region), the rest is the whole limit: only what
// former allocators handed over lets the window admit more.
func (a *Allocator) learnt() {
	rest := a.limit
	blind := false
	for _, r := range a.regions {
		if a.blind[r] == 0 {
			rest -= a.counted(r)
		} else {
			blind = true
		}
	}
	if !blind {
		return
	}
	nBlind := int64(0)
	for _, r := range a.regions {
		if a.blind[r] != 0 {
			nBlind++
		}
	}
	for _, r := range a.regions {
		if a.blind[r] != 0 {
			bound := rest
			if a.window == BucketLease {
				// A bucket's record is a share of its rate, not hits
				// spent: the blind regions share the rest (each drains its
				// bucket: see rpc's drain), so the shares still add up to
				// at most the rate.
				bound = max(rest, 0) / nBlind
				a.spent[r] = max(bound, 0)
				a.record[r] = a.spent[r]
				continue
			}
			if b, ok := a.inherit[r]; ok {
				bound = min(bound, b)
			}
			a.spent[r] = max(a.record[r], bound, a.spent[r], 0)
			a.record[r] = a.spent[r]
		}
	}
}

// Inherit takes what a former allocator of the window (one that stopped
// being the key's: its node left, or the key's allocator moved) recorded
// for each region when it stopped (bounds, hits): the most each region
// can have admitted under it and the allocators before it. When learning
// ends, a blind region is counted at the least of that and what the
// other regions' reports leave of the limit (learnt), so that a window
// whose every region restarted (a rolling deploy of a region's only node
// per region) is not taken for a cluster started afresh. Bounds of
// several former allocators: the largest is kept per region. Sound only
// when every former allocator of the window that may have granted
// handed over (a bound of one allocator says nothing of what a later one
// granted): the caller keeps the chain whole or hands over nothing.
func (a *Allocator) Inherit(bounds map[string]int64) {
	if a.inherit == nil {
		a.inherit = map[string]int64{}
	}
	for r, b := range bounds {
		if _, ok := a.record[r]; ok {
			if old, ok := a.inherit[r]; !ok || b > old {
				a.inherit[r] = max(b, 0)
			}
		}
	}
}

// Bounds returns, per region, the most it can have admitted in the
// window under this allocator and those before it (hits): its record (a
// grant is recorded before it is sent, a lower only once acknowledged);
// while learning, for a region that has not reported yet, what a former
// allocator handed over (Inherit), else the limit. A former allocator
// hands them to the next one (Inherit); Close it first, so that nothing
// it grants after is missing from them.
func (a *Allocator) Bounds() map[string]int64 {
	out := make(map[string]int64, len(a.regions))
	for _, r := range a.regions {
		// Not known: a region that has not reported while learning, or a
		// blind one not counted yet (its report says only what its new
		// process admitted).
		unknown := a.Learning() && (!a.known[r] || a.blind[r] != 0)
		switch b, ok := a.inherit[r]; {
		case unknown && ok:
			out[r] = min(max(b, a.counted(r)), a.limit)
		case unknown:
			out[r] = a.limit
		default:
			out[r] = a.counted(r)
		}
	}
	return out
}

// spentFor returns the Spent of a grant to region r: its blind holder's
// spent when the grant answers that holder's requests (0 otherwise).
func (a *Allocator) spentFor(r string) int64 {
	if n := a.blind[r]; n != 0 && n == a.nonce[r] {
		return max(a.spent[r], 0)
	}
	return 0
}

// Slide makes the allocator one of a sliding window's (Cloudflare's
// two-window counter: a region's estimate is its last window's count,
// weighted by the part of that window still inside the sliding one, plus
// its current count). Call it before any message. carry is, per region,
// at most what it admitted in the window before (the former window's
// records): in this window its estimate starts there, so its record
// starts at least there. floors is, per region, what its holder of the
// next window starts at without a message (its standing slice): what a
// region admits in this window still counts in the next one, so a region
// takes at least that of the pool, and a region holds no more than
// max(record, floor) in either window. Granting a region up to its floor
// then costs the pool nothing. So for every window id at every moment,
// Σ max(record, floor) ≤ limit (or the pool is below 0 and grants
// nothing), and the regions' estimates add up to at most the limit. The
// allocator of the window before must grant nothing once this one exists
// (Close), so that carry stays above what it admitted.
func (a *Allocator) Slide(carry, floors map[string]int64) {
	a.floor = map[string]int64{}
	for _, r := range a.regions {
		a.floor[r] = max(floors[r], 0)
		if c := carry[r]; c > a.record[r] {
			a.record[r] = c
		}
	}
	if !a.Learning() {
		a.free = a.limit
		for _, r := range a.regions {
			a.free -= a.counted(r)
		}
	}
}

// Relearn puts the allocator in learning mode again (as NewAllocator's
// learning): it grants nothing until every region reported what it
// holds; it returns the reports (Lowers with target ReportOnly) to send.
// Nothing while learning already.
func (a *Allocator) Relearn() []Lower {
	if a.Learning() {
		return nil
	}
	a.known = map[string]bool{}
	a.free = 0
	var out []Lower
	for _, r := range a.regions {
		a.record[r] = a.limit // unknown: the most it can hold
		out = append(out, a.lower(r, ReportOnly))
	}
	return out
}

// Close makes the allocator grant nothing more (a sliding window's,
// once the next window's allocator exists: see Slide). Lowers, Acks and
// reports are taken as before.
func (a *Allocator) Close() { a.closed = true }

// Record returns the allocator's record of region's slice.
func (a *Allocator) Record(region string) int64 { return a.record[region] }

func (a *Allocator) lower(r string, target int64) Lower {
	a.seq[r]++
	a.lowerAt[r] = a.seq[r]
	a.target[r] = target
	return Lower{Region: r, Window: a.window, Alloc: a.id, Seq: a.seq[r], Target: target}
}

// SetLeft tells the allocator how much of its window is still to come
// (0..1): a region's expected demand is what it used plus its last
// window's demand over what is left, so that late in a window what a
// region does not need any more can go where it is needed.
func (a *Allocator) SetLeft(left float64) { a.left = min(max(left, 0), 1) }

// Rebalance returns the Lowers that take back, from the regions holding
// more than their fair share of the regions' expected demand (and not
// waiting for more themselves), what they will not need (their bases
// included): at a window's start from last window's demand, so that a
// key used in one region gets nearly all of the limit. What the Acks
// free goes to the regions waiting for it.
func (a *Allocator) Rebalance() []Lower { return a.rebalance(math.Round, false) }

// Reclaim is Rebalance for the last moment in a window when what it
// frees can still be granted and used (the caller picks it: a few round
// trips before the window ends): a region keeps what it used and the
// whole hits of its expected need over what is left of the window
// (rounded down, where Rebalance rounds to the nearest), since a hit a
// region is less likely than not to use is better spent by a region that
// waits for it. A region that waits itself is lowered too when it holds
// more than that (it asked early in the window, from a guess of its
// demand; lowered, it waits no more, and asks again if it needs to). It
// returns nothing unless a region waits.
func (a *Allocator) Reclaim() []Lower {
	if !a.Waiting() {
		return nil
	}
	return a.rebalance(math.Floor, true)
}

// rebalance lowers the regions that hold more than their fair share (by
// round) and what they used; waiting regions only when all is set.
func (a *Allocator) rebalance(round func(float64) float64, all bool) []Lower {
	if a.Learning() || a.closed {
		return nil // a closed allocator could grant nothing a lower frees
	}
	fair := a.fairShares(round)
	var out []Lower
	for _, r := range a.regions {
		if a.lowerAt[r] != 0 || (a.waiting[r] > 0 && !all) {
			continue
		}
		keep := max(fair[r], a.used[r]+a.since(r))
		if a.record[r] > keep {
			a.waiting[r] = 0
			out = append(out, a.lower(r, keep))
		}
	}
	return out
}

// since returns the hits region r probably admitted since it last asked
// (in the window, or ahead of it): what it then expected to admit beyond
// what it had used, in proportion to the part of what was left of the
// window that has gone by since. A Lower that would take only those frees
// nothing (the holder keeps what it consumed) and costs two messages.
func (a *Allocator) since(r string) int64 {
	at := a.askedAt[r]
	if at <= 0 || a.left >= at {
		return 0
	}
	return int64(float64(a.extra[r]) * (at - a.left) / at)
}

// fairShares divides the limit among the regions by Doorman's fair share
// (water-filling): every region gets up to its demand, in equal rounds,
// and what the regions that need less leave goes to the others. A region
// that has used more than its share keeps what it used.
func (a *Allocator) fairShares(round func(float64) float64) map[string]int64 {
	// A region's expected need: what it used, plus what it expected to
	// admit beyond that when it last asked (or, if it did not, its last
	// window's demand), scaled down to what is left of the window.
	need := make(map[string]int64, len(a.regions))
	for _, r := range a.regions {
		more := float64(a.prior[r]) * a.left
		if at := a.askedAt[r]; at > 0 {
			more = max(more, float64(a.extra[r])*min(a.left/at, 1))
		}
		need[r] = a.used[r] + int64(round(more))
	}
	out := make(map[string]int64, len(a.regions))
	left := a.limit
	open := slices.Clone(a.regions)
	for len(open) > 0 && left > 0 {
		share := left / int64(len(open))
		if share == 0 {
			share = 1
		}
		next := open[:0]
		for _, r := range open {
			give := min(share, need[r]-out[r], left)
			out[r] += give
			left -= give
			if out[r] < need[r] {
				next = append(next, r)
			}
			if left == 0 {
				break
			}
		}
		open = next
	}
	return out
}

// OnRequest handles a region's request: it grants what the pool has to
// the regions waiting (see grantWaiting: fair shares first, then the
// rest; Grants to send, to the requesting region and perhaps others), and
// when the region still waits, asks the regions that hold more than
// their fair share to lower to it (Lowers to send; what their Acks free
// is granted by OnAck). A request of another window, or while learning,
// is only noted.
func (a *Allocator) OnRequest(r Request) (grants []Grant, lowers []Lower) {
	if r.Window != a.window {
		return nil, nil
	}
	if _, ok := a.record[r.Region]; !ok {
		return nil, nil // not a region of the key
	}
	a.heard[r.Region] = true
	if r.Blind {
		a.seeBlind(r.Region, r.Nonce, r.Consumed)
	} else if n := a.blind[r.Region]; n != 0 && n == r.Nonce {
		// Its blind holder took a grant's spent and counts it now (a
		// bucket's drained its bucket): what it says is exact again.
		delete(a.blind, r.Region)
	}
	switch held := max(r.Slice, r.Consumed); {
	case r.Consumed > a.record[r.Region]:
		// A region that admitted more than its record (a holder made
		// afresh over a window that had admitted already, under another
		// limit or another allocator; a sliding window's estimate) is
		// recorded at what it admitted. (Not at a slice above the
		// record: only a request sent before a Lower's Ack says one, its
		// old slice, and raising the record to it would leave the hits
		// in no one's hands until the region spoke again.)
		a.hold(r.Region, r.Consumed)
	case a.seq[r.Region] == 0 && r.Slice >= 0 && held < a.record[r.Region]:
		// The allocator sent the region nothing in the window, so only
		// its grants can raise the region's slice: the record comes down
		// to what the region says it holds (a standing slice raised after
		// the region had made the window's holder, which started lower),
		// never below what it admitted.
		a.hold(r.Region, held)
	}
	a.said[r.Region], a.nonce[r.Region] = r.Slice, r.Nonce
	a.used[r.Region] = max(a.used[r.Region], r.Consumed)
	a.demand[r.Region] = max(a.demand[r.Region], r.Slice+max(r.Want, 0), a.used[r.Region])
	a.extra[r.Region] = max(r.Slice+max(r.Want, 0)-r.Consumed, 0)
	a.askedAt[r.Region] = max(a.left, 1e-3)
	if a.left < 1 {
		a.reportLeft[r.Region] = max(a.left, 1e-3)
	}
	if r.Want <= 0 || a.Learning() {
		a.waiting[r.Region] = max(r.Want, 0)
		return nil, nil
	}
	a.waiting[r.Region] = r.Want
	grants = a.grantWaiting()
	if a.waiting[r.Region] > 0 {
		lowers = a.Rebalance()
	}
	return grants, lowers
}

// grantWaiting gives the free pool to the regions waiting for hits (one
// Grant per region raised): first each up to its fair share (what a
// region below its share waits for comes first), then what is still free
// up to what each waits for, largest fair share first, since capacity
// left in the pool while a region waits is capacity no one admits with. A region
// whose Lower awaits its Ack gets nothing until it answered.
func (a *Allocator) grantWaiting() []Grant {
	if a.Learning() || a.closed {
		return nil
	}
	raised := map[string]int64{}
	if a.free < 0 {
		// Over-committed (holders made afresh over what their window
		// had admitted, blind regions counted at the rest): nothing is
		// raised until what comes back covers it, but a region whose
		// record is above what it holds is still told it (a blind one
		// waits for its spent).
		return a.behind(raised, true)
	}
	give := func(r string, n int64) {
		before := a.counted(r)
		a.record[r] += n // recorded before it is sent
		a.free -= a.counted(r) - before
		a.waiting[r] -= n
		raised[r] += n
	}
	// room is what region r may be granted: the free pool, and what it
	// counts for beyond its record (its floor: Slide).
	room := func(r string) int64 { return a.free + a.counted(r) - a.record[r] }
	fair := a.fairShares(math.Round)
	for _, r := range a.regions {
		if n := min(a.waiting[r], room(r), fair[r]-a.record[r]); n > 0 && a.lowerAt[r] == 0 {
			give(r, n)
		}
	}
	// What is still free goes first to the region with the largest fair
	// share (the largest expected demand: the one most likely to spend
	// it before the window ends), then the next.
	open := slices.Clone(a.regions)
	slices.SortStableFunc(open, func(x, y string) int { return int(fair[y] - fair[x]) })
	for _, r := range open {
		if n := min(a.waiting[r], room(r)); n > 0 && a.lowerAt[r] == 0 {
			give(r, n)
		}
	}
	return a.behind(raised, false)
}

// behind returns the Grants of grantWaiting: to each region raised, and
// to each waiting region whose last request said it holds less than its
// record; only to blind ones when over (the pool below 0: their grant
// says they spent their record, so it lets them admit nothing).
func (a *Allocator) behind(raised map[string]int64, over bool) []Grant {
	var out []Grant
	for _, r := range a.regions {
		// A waiting region whose last request said it holds less than
		// its record (its holder started below it: a sliding window's
		// carry, a holder made afresh) is granted its record too: the
		// record counts in the pool already.
		behind := a.waiting[r] > 0 && a.said[r] < a.record[r] && a.lowerAt[r] == 0
		if over && (a.window == BucketLease || a.spentFor(r) < a.record[r]) {
			behind = false // a bucket's record is a rate: telling it is granting it
		}
		if raised[r] > 0 || behind {
			a.seq[r]++
			a.said[r] = a.record[r]
			out = append(out, Grant{Region: r, Window: a.window, Alloc: a.id, Seq: a.seq[r], Slice: a.record[r], Nonce: a.nonce[r], Spent: a.spentFor(r)})
		}
	}
	return out
}

// Waiting reports whether some region waits for hits the pool did not
// have (the caller then rebalances as the window goes on: what other
// regions will not use goes to it).
func (a *Allocator) Waiting() bool { return a.contended("") }

// contended reports whether a region other than region waits for hits.
func (a *Allocator) contended(region string) bool {
	for r, w := range a.waiting {
		if r != region && w > 0 {
			return true
		}
	}
	return false
}

// Pending returns the Lowers still awaiting their Ack, to send again (a
// Lower or its Ack may be lost; sending it again is harmless).
func (a *Allocator) Pending() []Lower {
	var out []Lower
	for _, r := range a.regions {
		if s := a.lowerAt[r]; s != 0 {
			out = append(out, Lower{Region: r, Window: a.window, Alloc: a.id, Seq: s, Target: a.target[r]})
		}
	}
	return out
}

// OnAck handles a region's acknowledgement of a Lower: the region holds
// Slice hits now and forever under that sequence number, so what it gave
// back returns to the pool, and is granted at once to the regions waiting
// for it (Grants to send). The last report of learning mode opens the
// pool, and takes back (Lowers to send) what regions hold beyond their
// fair share when others wait. An ack of another window or allocator, of
// an older Lower, or a duplicate is ignored.
func (a *Allocator) OnAck(k Ack) ([]Grant, []Lower) {
	if k.Window != a.window || k.Alloc != a.id || a.lowerAt[k.Region] == 0 || k.Seq != a.lowerAt[k.Region] {
		return nil, nil
	}
	a.lowerAt[k.Region] = 0
	a.heard[k.Region] = true
	if k.Blind {
		a.seeBlind(k.Region, k.Nonce, k.Consumed)
	}
	a.reportLeft[k.Region] = max(a.left, 1e-3)
	a.used[k.Region] = max(a.used[k.Region], k.Consumed)
	a.hold(k.Region, max(k.Slice, k.Consumed, 0))
	if k.Follows != 0 && k.Follows != a.id && !a.Learning() {
		// The region takes grants from another allocator (one that
		// learnt after this one: two ran at once), whose grants this
		// one's records do not know: learn again, from every region, as
		// an allocator that takes over; the reports take the holders
		// back. (Without, a holder left with an allocator that then
		// stopped took none of this one's grants again.)
		return nil, a.Relearn()
	}
	var lowers []Lower
	if a.Learning() {
		a.known[k.Region] = true
		if len(a.known) < len(a.regions) {
			return nil, nil
		}
		a.known = nil
		a.learnt()
		a.free = a.limit // below 0 when the regions admitted more (see hold)
		for _, r := range a.regions {
			a.free -= a.counted(r)
		}
		if a.contended("") {
			lowers = a.Rebalance()
		}
	}
	return a.grantWaiting(), lowers
}

// OnGiveBack handles a region's give-back: an Ack no Lower asked for
// (Holder.GiveBack), saying the region holds Slice hits now and forever
// under Seq or an older sequence number of Alloc. It is taken only when
// it answers the newest message the allocator sent the region (Alloc and
// Seq equal to its own; 0 and 0 when it sent the region nothing in the
// window) and no Lower awaits the region's Ack, so that a grant or
// lower the region had not seen yet is never undone; otherwise, and
// while learning, it is ignored (the region gave back for nothing:
// under-admission, never over). What it frees goes to the regions
// waiting, as OnAck's (Grants to send); ok reports whether it was taken.
func (a *Allocator) OnGiveBack(k Ack) (grants []Grant, ok bool) {
	if k.Window != a.window || a.Learning() || a.lowerAt[k.Region] != 0 {
		return nil, false
	}
	if _, known := a.record[k.Region]; !known {
		return nil, false
	}
	newest := k.Alloc == a.id && k.Seq == a.seq[k.Region]
	untouched := k.Alloc == 0 && k.Seq == 0 && a.seq[k.Region] == 0
	if !newest && !untouched {
		return nil, false
	}
	a.heard[k.Region] = true
	if k.Blind {
		a.seeBlind(k.Region, k.Nonce, k.Consumed)
	}
	a.reportLeft[k.Region] = max(a.left, 1e-3)
	a.used[k.Region] = max(a.used[k.Region], k.Consumed)
	a.hold(k.Region, max(k.Slice, k.Consumed, 0))
	return a.grantWaiting(), true
}

// Offer grants what is free in the pool to regions that did not ask but
// are known to want more (hunger: region -> hits it wants beyond what it
// holds, from the demand its standing slices were planned from): by
// Doorman's fair share (water-filling, in whole hits), none to a region
// whose Lower awaits its Ack. It returns the Grants to send (absolute
// slices, recorded before they are sent); none while learning.
func (a *Allocator) Offer(hunger map[string]int64) []Grant {
	if a.Learning() || a.closed || a.free <= 0 {
		return nil
	}
	give := map[string]int64{}
	for a.free > 0 {
		var open []string
		for _, r := range a.regions {
			if hunger[r]-give[r] > 0 && a.lowerAt[r] == 0 {
				open = append(open, r)
			}
		}
		if len(open) == 0 {
			break
		}
		share := max(a.free/int64(len(open)), 1)
		for _, r := range open {
			n := min(share, hunger[r]-give[r], a.free)
			give[r] += n
			a.free -= n
			if a.free == 0 {
				break
			}
		}
	}
	var out []Grant
	for _, r := range a.regions {
		if n := give[r]; n > 0 {
			// Taken from free as if the floor were not there: never
			// more than the pool had.
			a.record[r] += n
			a.seq[r]++
			out = append(out, Grant{Region: r, Window: a.window, Alloc: a.id, Seq: a.seq[r], Slice: a.record[r], Nonce: a.nonce[r], Spent: a.spentFor(r)})
		}
	}
	return out
}

// Holder is one region's side of one key's window: its slice and the
// allocator it takes grants from. What it consumed is the caller's (the
// region's window of the key counts it; the caller admits while consumed
// + hits <= Slice, under the same lock as the holder's). Not safe for
// concurrent use.
type Holder struct {
	region string
	window int64
	base   int64
	slice  int64
	alloc  uint64 // the allocator that last wrote to it (0: none yet)
	seq    uint64 // the newest of its sequence numbers applied
	seen   []allocSeq
	nonce  uint64 // made afresh: its requests' nonce, which its grants must carry (0: not afresh)
	blind  bool   // made blind: admits nothing until a grant says what its region spent (StartBlind)
	owed   int64  // the spent of the grant that ended its blindness, not yet taken (TakeSpent)
}

// allocSeq is the newest sequence number a holder applied of one
// allocator: a holder that went back to an allocator it had left (a late
// Lower of the former one came between) takes none of its older
// messages again.
type allocSeq struct{ alloc, seq uint64 }

// newest returns the newest sequence number of alloc applied (0: none).
func (h *Holder) newest(alloc uint64) uint64 {
	for _, x := range h.seen {
		if x.alloc == alloc {
			return x.seq
		}
	}
	return 0
}

// apply makes alloc the allocator the holder takes grants from, at seq.
func (h *Holder) apply(alloc, seq uint64) {
	h.alloc, h.seq = alloc, seq
	h.saw(alloc, seq)
}

// saw notes seq as applied of alloc, without taking grants from it.
func (h *Holder) saw(alloc, seq uint64) {
	for i := range h.seen {
		if h.seen[i].alloc == alloc {
			h.seen[i].seq = max(h.seen[i].seq, seq)
			return
		}
	}
	h.seen = append(h.seen, allocSeq{alloc, seq})
}

// NewHolder returns region's holder of a window with base hits of its own.
func NewHolder(region string, window, base int64) *Holder {
	return &Holder{region: region, window: window, base: max(base, 0), slice: max(base, 0)}
}

// StartAfresh makes a holder that has applied no message yet start at 0:
// one made afresh for a window an allocator may have written to already
// (its node restarted, the key moved to it, the limit changed), which
// may hold less than its base and has forgotten the sequence numbers it
// applied. nonce (not 0, unique to this holder) goes with its requests,
// and it takes only the grants that carry it: answers to its own
// requests, so never a grant sent before it was made (which a Lower it
// never saw may have superseded), even after a duplicate of an old Lower
// gave it an allocator. Requests and grants then raise it as usual.
func (h *Holder) StartAfresh(nonce uint64) {
	if h.alloc == 0 {
		h.slice, h.nonce = 0, nonce
	}
}

// StartBlind is StartAfresh for a holder that cannot know what its
// region admitted in the window before it was made: a process made
// afresh with no record of the window (a region's only node restarted
// without its state), so unknown means spent. It admits nothing (its
// slice is 0 and only a grant raises it) until a grant that answers its
// requests says what the region is counted as having admitted already
// (Grant.Spent: the allocator's record of the region, the most it can
// have admitted), which the caller counts in the region's window
// (TakeSpent) before the holder admits anything. Its requests, Acks and
// give-backs say it is blind (Request.Blind, Ack.Blind with its nonce),
// so the allocator never records less for the region than that. Like
// StartAfresh, nothing for a holder that applied a message already.
func (h *Holder) StartBlind(nonce uint64) {
	if h.alloc == 0 {
		h.StartAfresh(nonce)
		h.blind = true
	}
}

// Blind reports whether the holder is blind still: see StartBlind.
func (h *Holder) Blind() bool { return h.blind }

// TakeSpent returns, once, the hits the grant that ended the holder's
// blindness said its region had spent (0 after, and for a holder that
// was never blind): the caller counts them in the region's window (at
// least that many) under the lock it admits under, before it admits.
func (h *Holder) TakeSpent() int64 {
	n := h.owed
	h.owed = 0
	return n
}

// Nonce returns the nonce of a holder made afresh (0: not one): see
// StartAfresh.
func (h *Holder) Nonce() uint64 { return h.nonce }

// Base returns the holder's base (what it owns with no message).
func (h *Holder) Base() int64 { return h.base }

// Slice returns what the holder may admit in all in its window.
func (h *Holder) Slice() int64 { return h.slice }

// Window returns the holder's window id.
func (h *Holder) Window() int64 { return h.window }

// Request returns a request for want more hits, reporting its use.
func (h *Holder) Request(want, consumed int64) Request {
	return Request{Region: h.region, Window: h.window, Want: want, Consumed: consumed, Slice: h.slice, Nonce: h.nonce, Blind: h.blind}
}

// OnGrant applies a grant and reports whether it raised the slice. A
// grant of another allocator than the one that last wrote, an older or
// duplicate grant (by sequence number), one of another window or region,
// or, to a holder made afresh that applied nothing yet, one without its
// nonce, changes nothing.
func (h *Holder) OnGrant(g Grant) bool {
	if g.Window != h.window || g.Region != h.region || (h.alloc != 0 && g.Alloc != h.alloc) || g.Seq <= h.newest(g.Alloc) {
		return false
	}
	if h.nonce != 0 && g.Nonce != h.nonce {
		return false // made afresh, and not an answer to one of its requests
	}
	h.apply(g.Alloc, g.Seq)
	if h.blind {
		// The answer to its requests: what its region spent before it
		// is counted first (TakeSpent), and the slice holds it.
		h.blind, h.owed = false, max(g.Spent, 0)
	}
	if g.Slice <= h.slice {
		return false
	}
	h.slice = g.Slice
	return true
}

// GiveBack lowers the slice to keep (at least consumed, what the region
// admitted in the window) unasked, and returns the Ack to send to the
// allocator (Allocator.OnGiveBack), naming the newest allocator message
// applied (0 and 0 for none); false when the slice is not above keep.
// The holder never again holds more under that sequence number: only a
// newer grant raises it.
func (h *Holder) GiveBack(keep, consumed int64) (Ack, bool) {
	keep = max(keep, consumed, 0)
	if keep >= h.slice {
		return Ack{}, false
	}
	h.slice = keep
	return Ack{Region: h.region, Window: h.window, Alloc: h.alloc, Seq: h.seq, Slice: h.slice, Consumed: consumed, Blind: h.blind, Nonce: h.blindNonce()}, true
}

// OnLower lowers the slice to at most Target, keeping consumed (what the
// region admitted in the window), and returns the Ack to send (also for a
// repeated Lower, whose Ack may have been lost). The Ack's Slice is what
// the region may still spend or has spent: the slice, or consumed when
// that is more (a holder made afresh over a window that had admitted
// already). A learning allocator's report (Target [ReportOnly]) makes it
// the allocator grants are taken from (the former one's late grants are
// refused from then on), as does a Lower of any allocator to a holder no
// allocator wrote to; a Lower of another allocator than the holder's is
// applied (lowering is always safe) and acknowledged to it, but does not
// take the holder back: while two allocators run at once (a split: each
// node's view makes a different one the key's), the holder stays with
// the one that learnt last, whose record counts what the other granted
// it. A Lower older than the newest message applied of its allocator
// (also after the holder went to another allocator and back), or of
// another window, gets no Ack.
func (h *Holder) OnLower(l Lower, consumed int64) (Ack, bool) {
	if l.Window != h.window || l.Region != h.region || l.Seq < h.newest(l.Alloc) {
		return Ack{}, false
	}
	var follows uint64
	if h.alloc == 0 || l.Alloc == h.alloc || l.Target == ReportOnly {
		h.apply(l.Alloc, l.Seq)
	} else {
		h.saw(l.Alloc, l.Seq)
		follows = h.alloc
	}
	if l.Target != ReportOnly {
		h.slice = max(min(h.slice, l.Target), consumed)
	}
	return Ack{Region: h.region, Window: h.window, Alloc: l.Alloc, Seq: l.Seq, Slice: max(h.slice, consumed), Consumed: consumed, Follows: follows,
		Blind: h.blind, Nonce: h.blindNonce()}, true
}

// blindNonce returns the holder's nonce while it is blind (0 otherwise).
func (h *Holder) blindNonce() uint64 {
	if h.blind {
		return h.nonce
	}
	return 0
}
