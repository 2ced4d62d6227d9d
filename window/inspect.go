package window

import "time"

// Snapshot is a [State] in numbers an operator reads (see [State.Describe]).
// It is a plain value; its zero value describes no state.
type Snapshot struct {
	// Algorithm is what the state was built for ([Unspecified]: no state).
	Algorithm Algorithm
	// Window is the period the limit applies to (0: no state).
	Window time.Duration
	// Start is, for the window algorithms, the start of the window that
	// holds the time described (the window Count is of); for the buckets,
	// the state's last update.
	Start time.Time
	// Count is, for the window algorithms, the hits counted in the window
	// that holds the time described (0 when the state's window has ended);
	// for the buckets, the hits consumed and not yet refilled (drained) at
	// that time, rounded up. In hits.
	Count int64
	// Previous is, for a sliding window, the previous window's count, in
	// hits; 0 otherwise.
	Previous int64
	// Rate is, for the buckets, the limit the bucket refills (drains) at:
	// hits per Window, the limit of the last check that consumed hits; 0
	// for the window algorithms.
	Rate int64
	// Reset is when the key is back at full capacity if nothing hits it
	// (the state's last update, when it already is).
	Reset time.Time
}

// Describe returns s as of now in a [Snapshot]: the window now falls in
// and its count (a sliding window's previous count beside it), or a
// bucket's hits still consumed. A now before the state's last update is
// read as that update (time going backwards: no time passed), as a check
// would. A zero State gives a zero Snapshot. It changes nothing (s is a
// copy).
func (s State) Describe(now time.Time) Snapshot {
	st := s.st
	if st.spec == 0 {
		return Snapshot{}
	}
	w := st.window()
	out := Snapshot{Algorithm: st.algorithm(), Window: time.Duration(w), Reset: time.Unix(0, st.expires())}
	t := max(now.UnixNano(), st.at)
	switch st.algorithm() {
	case FixedWindow, SlidingWindow:
		start := max(floorDiv(t, w)*w, st.at)
		a, b := st.countersAt(start)
		out.Start, out.Count, out.Previous = time.Unix(0, start), satInt(a), satInt(b)
	default:
		a, b := st.countersAt(t)
		out.Start, out.Count, out.Rate = time.Unix(0, st.at), u128{a, b}.divCeil(uint64(w)), satInt(st.rate)
	}
	return out
}

// satInt returns v as an int64, at most the largest one.
func satInt(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}

// Peek returns the decision a peek with c's numbers (c.Hits is ignored:
// 0) would get from s at now, as [Store.Apply] would answer it for a key
// holding s (a zero s: a key with no state). It changes nothing (s is a
// copy). It returns a *[FieldError] wrapping [ErrInvalid] when c is out of
// range (see [Check.Validate]).
func (s State) Peek(c Check, now time.Time) (Decision, error) {
	c.Hits = 0
	if err := c.Validate(); err != nil {
		return Decision{}, err
	}
	st := s.st
	var r result
	st.applyTo(&c, now.UnixNano(), &r)
	return Decision{Allowed: r.allowed, Limit: c.Limit, Remaining: r.remaining, ResetTime: time.Unix(0, r.reset),
		RetryAfter: time.Duration(r.retry), Delay: time.Duration(r.delay)}, nil
}

// Fresh returns the state of a key of s's algorithm and window (and, for
// the buckets, its rate) that has counted nothing as of now: what a key
// reset by an operator holds. A check decides from it as from a key with
// no state; it differs from the zero State in that it replaces a copy of
// the key where the zero State would merge into one as nothing (see
// [Merge]). A now before s's last update is read as that update. A zero
// s gives a zero State.
func (s State) Fresh(now time.Time) State {
	st := s.st
	if st.spec == 0 {
		return State{}
	}
	t := max(now.UnixNano(), st.at)
	out := state{spec: st.spec, at: t, rate: st.rate}
	if a := st.algorithm(); a == FixedWindow || a == SlidingWindow {
		w := st.window()
		out.at = max(floorDiv(t, w)*w, st.at)
		out.rate = 0
	}
	return State{out}
}
