// Package lease moves a global limit's capacity between regions without
// ever letting the regions together admit more than the limit: escrowed
// slices (the README, "Regions"; issue 20; the design is the demarcation
// protocol's "lower first, then raise", Barbará and Garcia-Molina, EDBT
// 1992, with YouTube Doorman's leases: capacity leaves a pool only by a
// grant and returns to it only when its holder gave it back).
//
// For one key and one window (identified by its window id, which every
// message carries, so that regions whose clocks differ never mix two
// windows' capacity), each region holds a base share it owns without any
// message, and the key's [Allocator] keeps the pool: the limit minus the
// regions' bases. A region's [Holder] may admit up to its base plus what
// it was granted. The invariant, for every window id at every moment:
//
//	Σ_regions consumed ≤ Σ_regions (base + held) ≤ Σ base + Σ granted ≤ limit
//
// where held is what a holder may spend of its grants and granted is the
// allocator's record of each region's grant, never below what the region
// holds: a grant is recorded before it is sent, a lowering only after the
// holder acknowledged it (having lowered first), and every message carries
// an absolute value and the allocator's sequence number for the region,
// so that lost, duplicated and reordered messages never raise a holder
// above its record. Losing a message costs under-admission, never
// over-admission. This step keeps one allocator (its loss, learning mode
// and next-window weights are the later steps).
//
// The package is pure: no network, no clock; the caller moves messages
// and says which window is current.
package lease

import (
	"fmt"
)

// Grant sets a region's grant for a window to Granted hits (an absolute
// value, not a delta). Seq orders the allocator's messages to the region.
type Grant struct {
	Region  string
	Window  int64
	Seq     uint64
	Granted int64
}

// Lower asks a region to lower what it holds for a window to at most
// Target hits (it keeps what it already spent). Seq as for Grant.
type Lower struct {
	Region string
	Window int64
	Seq    uint64
	Target int64
}

// Ack answers a Lower: the region now holds Held hits for the window and
// will never again hold more under Seq or an older sequence number.
type Ack struct {
	Region string
	Window int64
	Seq    uint64
	Held   int64
}

// Request asks the allocator for Want more hits for a window; Consumed and
// Held report the region's use (for the allocator's reclaim decisions).
type Request struct {
	Region   string
	Window   int64
	Want     int64
	Consumed int64
	Held     int64
}

// Allocator keeps one key's pool for one window: the limit minus the
// regions' bases, granted on request and reclaimed lower-first. It is not
// safe for concurrent use (one per key and window, under its owner's
// lock).
type Allocator struct {
	window  int64
	limit   int64
	free    int64            // pool hits granted to nobody
	granted map[string]int64 // region -> recorded grant (>= what it holds)
	seq     map[string]uint64
	lowerAt map[string]uint64 // region -> seq of the Lower awaiting its Ack (0: none)
	used    map[string]int64  // region -> consumed hits it last reported
}

// NewAllocator returns the allocator of a window whose limit is limit and
// whose regions own bases (hits each, no grant needed). It returns an
// error when the bases add up to more than the limit or one is negative.
func NewAllocator(window, limit int64, bases map[string]int64) (*Allocator, error) {
	var sum int64
	for r, b := range bases {
		if b < 0 {
			return nil, fmt.Errorf("lease: base of %s: must be >= 0, got %d", r, b)
		}
		sum += b
	}
	if sum > limit {
		return nil, fmt.Errorf("lease: bases add up to %d, over the limit %d", sum, limit)
	}
	return &Allocator{window: window, limit: limit, free: limit - sum, granted: map[string]int64{},
		seq: map[string]uint64{}, lowerAt: map[string]uint64{}, used: map[string]int64{}}, nil
}

// Free returns the pool's hits granted to nobody.
func (a *Allocator) Free() int64 { return a.free }

// Granted returns the allocator's record of region's grant.
func (a *Allocator) Granted(region string) int64 { return a.granted[region] }

// OnRequest handles a region's request: it grants what the pool has, up
// to Want (a Grant to send), and when the pool cannot cover the request,
// asks the regions that hold grants they have not used to lower to what
// they used (Lowers to send; what their Acks free is granted on a later
// request). A request for another window is ignored.
func (a *Allocator) OnRequest(r Request) (grants []Grant, lowers []Lower) {
	if r.Window != a.window || r.Want <= 0 {
		return nil, nil
	}
	a.used[r.Region] = max(a.used[r.Region], r.Consumed)
	if a.lowerAt[r.Region] == 0 && a.free > 0 {
		n := min(r.Want, a.free)
		a.free -= n
		a.granted[r.Region] += n // recorded before it is sent
		a.seq[r.Region]++
		grants = append(grants, Grant{Region: r.Region, Window: a.window, Seq: a.seq[r.Region], Granted: a.granted[r.Region]})
		if n == r.Want {
			return grants, nil
		}
	}
	for other, g := range a.granted {
		if other == r.Region || a.lowerAt[other] != 0 || g == 0 {
			continue
		}
		a.seq[other]++
		a.lowerAt[other] = a.seq[other]
		lowers = append(lowers, Lower{Region: other, Window: a.window, Seq: a.seq[other], Target: 0})
	}
	return grants, lowers
}

// Pending returns the Lowers still awaiting their Ack, to send again (a
// Lower or its Ack may be lost; sending it again is harmless).
func (a *Allocator) Pending() []Lower {
	var out []Lower
	for r, s := range a.lowerAt {
		if s != 0 {
			out = append(out, Lower{Region: r, Window: a.window, Seq: s, Target: 0})
		}
	}
	return out
}

// OnAck handles a region's acknowledgement of a Lower: the region holds
// Held hits now and forever under that sequence number, so what it gave
// back returns to the pool. An ack of another window, of an older Lower or
// a duplicate is ignored.
func (a *Allocator) OnAck(k Ack) {
	if k.Window != a.window || a.lowerAt[k.Region] == 0 || k.Seq != a.lowerAt[k.Region] {
		return
	}
	if k.Held < a.granted[k.Region] {
		a.free += a.granted[k.Region] - k.Held
		a.granted[k.Region] = max(k.Held, 0)
	}
	a.lowerAt[k.Region] = 0
}

// Holder is one region's side of one key's window: its base, what it
// holds of its grants, and what it consumed. It admits hits while
// consumed + hits <= base + held. Not safe for concurrent use.
type Holder struct {
	region   string
	window   int64
	base     int64
	held     int64
	consumed int64
	seq      uint64 // the newest allocator sequence number applied
}

// NewHolder returns region's holder of a window with base hits of its own.
func NewHolder(region string, window, base int64) *Holder {
	return &Holder{region: region, window: window, base: max(base, 0)}
}

// Slice returns what the holder may admit in all: base + held.
func (h *Holder) Slice() int64 { return h.base + h.held }

// Consumed returns the hits admitted.
func (h *Holder) Consumed() int64 { return h.consumed }

// Held returns the hits of grants the holder may spend.
func (h *Holder) Held() int64 { return h.held }

// Take admits hits (>= 0) when they fit its slice, and reports whether it
// did; a peek (0) reports whether one more hit would fit.
func (h *Holder) Take(hits int64) bool {
	if hits == 0 {
		return h.consumed+1 <= h.Slice()
	}
	if h.consumed+hits > h.Slice() {
		return false
	}
	h.consumed += hits
	return true
}

// Request returns a request for want more hits, reporting its use.
func (h *Holder) Request(want int64) Request {
	return Request{Region: h.region, Window: h.window, Want: want, Consumed: h.consumed, Held: h.held}
}

// OnGrant applies a grant: the holder may now spend Granted hits of its
// grants. An older or duplicate grant (by sequence number), or one of
// another window, changes nothing.
func (h *Holder) OnGrant(g Grant) {
	if g.Window != h.window || g.Region != h.region || g.Seq <= h.seq {
		return
	}
	h.seq = g.Seq
	h.held = max(h.held, g.Granted)
}

// OnLower lowers what the holder holds to at most Target, keeping what it
// already spent beyond its base, and returns the Ack to send (also for a
// repeated Lower, whose Ack may have been lost). A Lower older than the
// newest message applied, or of another window, gets no Ack.
func (h *Holder) OnLower(l Lower) (Ack, bool) {
	if l.Window != h.window || l.Region != h.region || l.Seq < h.seq {
		return Ack{}, false
	}
	h.seq = l.Seq
	spent := max(h.consumed-h.base, 0)
	h.held = max(min(h.held, l.Target), spent)
	return Ack{Region: h.region, Window: h.window, Seq: l.Seq, Held: h.held}, true
}
