package window

import (
	"time"
	"unsafe"
)

// Refund gives back the hits that check c consumed for key at appliedAt, as
// of now: a request whose checks must all be consumed or none undoes with
// it the checks already consumed when another one is denied. c is the
// check as it was applied (the same algorithm, window, limit, burst and
// hits); appliedAt is the time it was decided at, i.e. the now passed to
// [Store.Apply] or [Store.ApplyBytes] ([Store.ApplyNow] does not report the
// time it read: a caller that may refund reads [Store.Now] and passes it to
// ApplyBytes); now is the time of the refund, normally the store's clock.
// Both are read to the ns. key is compared byte for byte, as by Apply, and
// is not retained.
//
// It reports whether it gave anything back (and so changed the key's
// state). Rejected checks and peeks consume nothing, so only an allowed
// check with Hits > 0 is worth refunding: a refund of a peek, of hits above
// the capacity (never allowed), of a key that holds no state (it creates
// none), or of a key whose state was built for another algorithm or window
// than c's (the key started afresh since; it is left alone) gives nothing
// back. Otherwise, per algorithm:
//
//   - FixedWindow: if appliedAt is in the window the key's state counts
//     (floor(appliedAt/W)*W is its start) and that window is still the
//     current one at now, its count drops by c.Hits, floored at 0. Once the
//     window has ended nothing is given back: its count no longer matters.
//   - SlidingWindow: if appliedAt is in the current window at now, the
//     current count drops by c.Hits; if it is in the previous one (now is
//     in the next window), the previous count does; if earlier, nothing.
//     Counts are floored at 0.
//   - TokenBucket, LeakyBucket: the state holds a debt of hits consumed
//     and not yet refilled, times W (ns), drained at the limit per W of the
//     last check that consumed, since the key's last update u. Refund takes
//     off that debt hits*W - r*(u - appliedAt), floored at 0 and at the debt
//     left at now, with r the larger of c.Limit and the key's current rate
//     (see below): as if the refund had come at u. Why this never gives
//     back more than the refunded hits still hold, whichever hits the drain
//     took first: at appliedAt the key's debt was c.Hits*W above what it
//     would have been without c; that difference shrinks only while the
//     debt without c is at zero, and then by at most r per ns, so at u it
//     is at least hits*W - r*(u - appliedAt); after u nothing but the
//     drain happened, so giving back at u and giving back at now end at
//     the same debt from now on. (A refund does not move u.) It is exact
//     when the key was not updated at a later time than appliedAt (no
//     consuming check or merge since c, however late the refund comes; in
//     particular when it comes at once); otherwise it may give back less,
//     as the state cannot tell whether the drain took c's share or the
//     others'. A state last updated before appliedAt does not hold c's
//     hits (the key was removed and started afresh since): nothing.
//
// A refund never takes a count or a debt below zero (so never gives back
// more than the capacity), and never lets the key admit more than it would
// have had c been refused, every other check decided as it was. (A check
// refused between c and its refund because of c's hits stays refused: the
// room goes to the next one.) It may give back less: when a clock went
// backwards (appliedAt before the window or time the key had reached, see
// the package documentation), or for the buckets as above. The guarantee
// assumes the key's state lived on since appliedAt: a key removed in
// between (evicted under MaxKeys, taken by [Store.Take]) or reset by a
// change of algorithm or window and back holds other hits than c's, and
// the refund takes from those (never below zero); such a key was handed a
// fresh budget already. For the buckets it assumes the drain rate since
// appliedAt was c.Limit or
// the key's current rate (the limit of its last consuming check); a limit
// changed between c and its refund may give back more than exact, and the
// key keeps draining at the rate of its last consuming check, c included,
// until the next one (as for any change of limit). Refund each check at
// most once: a second refund cannot be told from the first, and gives back
// hits of other checks (never below zero).
//
// It returns c's *[FieldError] (wrapping [ErrInvalid]) when c is out of
// range (see [Check.Validate]), and a *FieldError for "applied_at" when
// appliedAt is zero or after now, or for "now" when now is zero; it then
// changes nothing. A refund is not a use of the key for eviction under
// MaxKeys (the check it undoes was); a key whose refund brings it back to
// full capacity may be swept, as any such key.
func (s *Store) Refund(key []byte, c Check, appliedAt, now time.Time) (refunded bool, err error) {
	if err := c.Validate(); err != nil {
		return false, err
	}
	switch {
	case appliedAt.IsZero():
		return false, &FieldError{Field: "applied_at", Reason: "must be set: the time the refunded check was applied at"}
	case now.IsZero():
		return false, &FieldError{Field: "now", Reason: "must be set"}
	}
	ta, tn := appliedAt.UnixNano(), now.UnixNano()
	if ta > tn {
		return false, &FieldError{Field: "applied_at", Reason: "must not be after now, got " + time.Duration(ta-tn).String() + " after"}
	}
	if c.Hits == 0 || c.Hits > c.Capacity() {
		return false, nil // consumed nothing
	}
	k := unsafe.String(unsafe.SliceData(key), len(key))
	h := s.hash(k)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	slot, found := sh.t.find(h, k)
	if found {
		e := &sh.t.slots[slot]
		st := e.st
		if refunded = st.refund(&c, ta, tn); refunded {
			e.st = st
			// The key may now expire earlier: keep minExpires a lower
			// bound, so that a sweep finds it.
			sh.t.noteExpiry(st.expires())
		}
	}
	sh.mu.Unlock()
	return refunded, nil
}

// refund gives back c's hits, applied at appliedAt, from st at now (Unix
// ns, appliedAt <= now), as [Store.Refund] describes, and reports whether
// st changed. c is valid with 0 < Hits <= capacity.
func (st *state) refund(c *Check, appliedAt, now int64) bool {
	w := int64(c.Window)
	if st.spec != makeSpec(c.Algorithm, w) {
		return false // no state, or one built for another algorithm or window
	}
	hits := uint64(c.Hits)
	switch c.Algorithm {
	case FixedWindow:
		// now >= appliedAt, so both in the stored window means it is
		// still current (and a now behind the stored window, a clock
		// gone backwards, has appliedAt before it too).
		if floorDiv(appliedAt, w)*w != st.at || floorDiv(now, w)*w != st.at || st.a == 0 {
			return false
		}
		st.a -= min(st.a, hits)
		return true
	case SlidingWindow:
		if now < st.at {
			now = st.at // time went backwards: stay in the stored window
		}
		// Roll the counts to now's window, as a check would.
		start := floorDiv(now, w) * w
		cur, prev := st.a, st.b
		if start != st.at {
			if start == st.at+w {
				prev, cur = cur, 0
			} else {
				prev, cur = 0, 0
			}
		}
		// A check applied while the clock was behind the key's window was
		// counted in that later window; taking it from the earlier one
		// instead gives back less (the earlier window weighs less now
		// and nothing in the next).
		switch floorDiv(appliedAt, w) * w {
		case start:
			if cur == 0 {
				return false
			}
			cur -= min(cur, hits)
		case start - w:
			if prev == 0 {
				return false
			}
			prev -= min(prev, hits)
		default:
			return false // its window no longer counts
		}
		st.at, st.a, st.b = start, cur, prev
		return true
	default:
		if appliedAt > st.at {
			return false // the state was last updated before c: not c's
		}
		if now < st.at {
			now = st.at // time went backwards: no drain
		}
		debt := u128{st.a, st.b}
		// What is left at now; 0: the key is back at full capacity.
		left := debt.subFloor(mul64(uint64(now)-uint64(st.at), st.rate))
		rate := max(uint64(c.Limit), st.rate)
		share := mul64(hits, uint64(w)).subFloor(mul64(rate, uint64(st.at)-uint64(appliedAt)))
		back := share
		if left.less(back) {
			back = left
		}
		if back == (u128{}) {
			return false
		}
		// Taken off at the last update: from now on the same debt as
		// taking it off what is left at now (back <= left).
		debt = debt.sub(back)
		st.a, st.b = debt.hi, debt.lo
		return true
	}
}

// Rerate applies a changed rate to key's token or leaky bucket at now:
// the debt drains at the key's old rate up to now, and at c.Limit (hits
// per c.Window) from now on, as if a check under c's numbers had consumed
// at now. A bucket otherwise drains at the rate of the last check that
// consumed, so a rate lowered between checks would keep draining at the
// old rate until the next one (a region whose share of a global bucket
// was lowered must not refill at the share it gave away). It reports
// whether the key held a bucket of c's algorithm and window (other
// states, and missing keys, are left alone). It returns an error when c
// is invalid or not a bucket.
func (s *Store) Rerate(key []byte, c Check, now time.Time) (bool, error) {
	if err := c.Validate(); err != nil {
		return false, err
	}
	if c.Algorithm != TokenBucket && c.Algorithm != LeakyBucket {
		return false, &FieldError{Field: "algorithm", Reason: "must be a bucket to rerate, got " + c.Algorithm.String()}
	}
	k := unsafe.String(unsafe.SliceData(key), len(key))
	h := s.hash(k)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	slot, found := sh.t.find(h, k)
	if !found {
		return false, nil
	}
	e := &sh.t.slots[slot]
	st := e.st
	w := int64(c.Window)
	if st.spec != makeSpec(c.Algorithm, w) {
		return false, nil
	}
	t := now.UnixNano()
	if t < st.at {
		t = st.at // time went backwards: no refill
	}
	debt := u128{st.a, st.b}.subFloor(mul64(uint64(t-st.at), st.rate))
	st.a, st.b, st.at, st.rate = debt.hi, debt.lo, t, uint64(c.Limit)
	e.st = st
	sh.t.noteExpiry(st.expires())
	return true, nil
}
