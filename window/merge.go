package window

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// State is a snapshot of one key's rate-limit state, for handing a key
// from one node to another. The zero value is "no state" (a key at full
// capacity). It is a plain value, safe to copy.
type State struct{ st state }

// IsZero reports whether s holds no state.
func (s State) IsZero() bool { return s.st.spec == 0 }

// Algorithm returns the algorithm s was built for ([Unspecified] if zero).
func (s State) Algorithm() Algorithm { return s.st.algorithm() }

// ErrBadState is wrapped by the errors of [State.UnmarshalBinary].
var ErrBadState = errors.New("window: bad state encoding")

// stateVersion is the first byte of an encoded State.
const stateVersion = 1

// AppendBinary appends the compact binary encoding of s to b: a version
// byte, then the window and algorithm, the time, two counters and the rate
// as varints (at most 51 bytes, typically about 20). It never fails.
func (s State) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, stateVersion)
	b = binary.AppendUvarint(b, s.st.spec)
	b = binary.AppendVarint(b, s.st.at)
	b = binary.AppendUvarint(b, s.st.a)
	b = binary.AppendUvarint(b, s.st.b)
	b = binary.AppendUvarint(b, s.st.rate)
	return b, nil
}

// MarshalBinary returns the encoding of [State.AppendBinary].
func (s State) MarshalBinary() ([]byte, error) { return s.AppendBinary(nil) }

// UnmarshalBinary decodes an encoding made by [State.AppendBinary]. It
// returns an error wrapping [ErrBadState] for truncated or trailing bytes,
// an unknown version or algorithm, or a window out of range; s is then
// unchanged.
func (s *State) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || b[0] != stateVersion {
		return fmt.Errorf("%w: unknown version", ErrBadState)
	}
	b = b[1:]
	var vals [5]uint64
	for i := range vals {
		var n int
		if i == 1 {
			var v int64
			v, n = binary.Varint(b)
			vals[i] = uint64(v)
		} else {
			vals[i], n = binary.Uvarint(b)
		}
		if n <= 0 {
			return fmt.Errorf("%w: truncated", ErrBadState)
		}
		b = b[n:]
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadState, len(b))
	}
	st := state{spec: vals[0], at: int64(vals[1]), a: vals[2], b: vals[3], rate: vals[4]}
	if st.spec != 0 {
		alg, w := st.algorithm(), st.window()
		if alg == Unspecified || int(alg) >= len(algorithmNames) || w <= 0 || w > int64(MaxWindow) {
			return fmt.Errorf("%w: algorithm %d, window %d ns", ErrBadState, alg, w)
		}
		if (alg == TokenBucket || alg == LeakyBucket) && (st.rate == 0 || st.rate > uint64(MaxLimit)) {
			return fmt.Errorf("%w: rate %d", ErrBadState, st.rate)
		}
	}
	s.st = st
	return nil
}

// Merge returns the state as if the hits behind a and b had all gone to one
// owner: counts of the same window add, consumed tokens add (each bucket
// first refilled up to the later of the two times). A count of a window
// that has ended is dropped, as the owner would have dropped it. When a and
// b were built for different algorithms or windows, the more recently
// updated one wins (a on a tie), as a change of either starts a key afresh.
func Merge(a, b State) State {
	x, y := a.st, b.st
	switch {
	case x.spec == 0:
		return b
	case y.spec == 0:
		return a
	case x.spec != y.spec:
		if y.at > x.at {
			return b
		}
		return a
	}
	t := max(x.at, y.at)
	out := state{spec: x.spec, at: t}
	ax, bx := x.countersAt(t)
	ay, by := y.countersAt(t)
	switch x.algorithm() {
	case FixedWindow, SlidingWindow:
		out.a, out.b = ax+ay, bx+by
	default:
		debt := u128{ax, bx}.add(u128{ay, by})
		out.a, out.b = debt.hi, debt.lo
		out.rate = x.rate
		if y.at > x.at || (y.at == x.at && y.rate > x.rate) {
			out.rate = y.rate
		}
	}
	return State{out}
}

// countersAt returns s's two counters as of t (t >= s.at, s not zero): for
// a fixed window the count of the window that starts at t (and 0); for a
// sliding window the counts of that window and of the one before it; for
// a bucket the tokens still consumed once it has refilled up to t, as the
// high and low words of a 128-bit number.
func (s state) countersAt(t int64) (a, b uint64) {
	switch s.algorithm() {
	case FixedWindow:
		if s.at == t {
			return s.a, 0
		}
	case SlidingWindow:
		switch s.at {
		case t:
			return s.a, s.b
		case t - s.window():
			return 0, s.a
		}
	default:
		debt := u128{s.a, s.b}.subFloor(mul64(uint64(t-s.at), s.rate))
		return debt.hi, debt.lo
	}
	return 0, 0
}

// Get returns key's state, or a zero State when the key holds none.
func (s *Store) Get(key string) (State, bool) {
	h := s.hash(key)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot, ok := sh.t.find(h, key); ok {
		return State{sh.t.slots[slot].st}, true
	}
	return State{}, false
}

// MergeState merges st into key's state with [Merge], as if the hits
// behind st had come to this store too, and returns the merged state. now
// only decides, under MaxKeys, which keys have expired. A merge never
// drops consumed hits: a new key goes in even when the cap would refuse a
// check's new key (KeyCapDeny, or its group's share), taking its shard
// over the cap (counted in [StoreStats.MergedOverCap]); under KeyCapEvict
// another key is evicted as for a check.
func (s *Store) MergeState(key string, st State, now time.Time) State {
	h := s.hash(key)
	sh := &s.shards[h%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot, ok := sh.t.find(h, key); ok {
		e := &sh.t.slots[slot]
		m := Merge(State{e.st}, st)
		e.st = m.st
		e.setUsed(true)
		sh.t.noteExpiry(m.st.expires())
		return m
	}
	if st.IsZero() {
		return st
	}
	if !s.makeRoomLocked(sh, key, now.UnixNano()) {
		s.overCap.Add(1)
	}
	sh.t.insert(h, key, false, st.st)
	sh.t.noteExpiry(st.st.expires())
	return st
}

// Window returns the window s was built for (0 if zero).
func (s State) Window() time.Duration { return time.Duration(s.st.window()) }

// Plausible returns an error wrapping [ErrBadState] when s could not have
// come from an honest owner whose clock reads at most slack ahead of now
// and whose checks admitted at most maxHits hits per window (e.g. the
// largest limit times the members that could have counted the key): a
// time after now+slack, or a count (for buckets, hits consumed and not yet
// refilled) over maxHits. A zero State is plausible. maxHits <= 0 means
// MaxLimit. Decoded states are already checked for algorithm, window
// (0 < window <= MaxWindow) and rate by [State.UnmarshalBinary].
func (s State) Plausible(now time.Time, slack time.Duration, maxHits int64) error {
	if s.IsZero() {
		return nil
	}
	if maxHits <= 0 {
		maxHits = MaxLimit
	}
	st := s.st
	if limit := satAdd(now.UnixNano(), int64(slack)); st.at > limit {
		return fmt.Errorf("%w: time %d ns is %s after now", ErrBadState, st.at, time.Duration(st.at-now.UnixNano()))
	}
	m := uint64(maxHits)
	switch st.algorithm() {
	case FixedWindow, SlidingWindow:
		if st.a > m || st.b > m {
			return fmt.Errorf("%w: counts %d and %d, over %d", ErrBadState, st.a, st.b, m)
		}
	default:
		// debt = consumed * window: at most maxHits * window.
		max := mul64(m, uint64(st.window()))
		debt := u128{st.a, st.b}
		if debt.hi > max.hi || (debt.hi == max.hi && debt.lo > max.lo) {
			return fmt.Errorf("%w: more than %d hits consumed", ErrBadState, m)
		}
	}
	return nil
}

// Subtract returns the state of the hits behind a that are not behind b,
// where b is an earlier copy of a state that was merged into a (a key's
// replica that a member took over, then counted on): the inverse of
// [Merge] for that case, so that Merge(Subtract(a, b), b) counts what a
// counts. It works at the later of the two times, as Merge does: counts of
// the same window subtract, consumed tokens subtract (each bucket first
// refilled up to that time); every count is floored at 0. When either is
// zero, or they were built for different algorithms or windows (a started
// afresh since), a is returned as it is.
func Subtract(a, b State) State {
	x, y := a.st, b.st
	if x.spec == 0 || y.spec == 0 || x.spec != y.spec {
		return a
	}
	t := max(x.at, y.at)
	out := state{spec: x.spec, at: t}
	ax, bx := x.countersAt(t)
	ay, by := y.countersAt(t)
	switch x.algorithm() {
	case FixedWindow, SlidingWindow:
		out.a, out.b = ax-min(ax, ay), bx-min(bx, by)
	default:
		debt := u128{ax, bx}.subFloor(u128{ay, by})
		out.a, out.b = debt.hi, debt.lo
		out.rate = x.rate
		if y.at > x.at {
			out.rate = y.rate
		}
	}
	return State{out}
}
