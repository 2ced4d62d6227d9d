package window

// state is one key's rate-limit state: 40 bytes. It is a plain value, not
// safe for concurrent use: the Store's shard lock guards it. Times are Unix
// ns.
//
// The fields mean, per algorithm:
//
//	fixed_window:   at = window start, a = count in it
//	sliding_window: at = current window start, a = its count, b = previous window's count
//	token_bucket,
//	leaky_bucket:   at = last update, (a, b) = debt as a 128-bit number (hi, lo),
//	                the hits consumed and not yet refilled, scaled by W (ns):
//	                debt = consumed * W; it drains by rate every ns, rate being
//	                the limit of the last check that consumed hits.
type state struct {
	at   int64
	a, b uint64
	spec uint64 // window in ns << 8 | algorithm; 0 for no state
	rate uint64 // buckets: the limit (hits per window) the debt drains at since at
}

func makeSpec(alg Algorithm, window int64) uint64 { return uint64(window)<<8 | uint64(alg) }

func (st *state) algorithm() Algorithm { return Algorithm(st.spec & 0xff) }
func (st *state) window() int64        { return int64(st.spec >> 8) }

// expires returns the Unix ns at which the key is back at full capacity if
// nothing hits it; from then on the state changes no decision and may be
// dropped.
func (st *state) expires() int64 {
	w := st.window()
	switch st.algorithm() {
	case FixedWindow:
		if st.a > 0 {
			return satAdd(st.at, w)
		}
	case SlidingWindow:
		if st.a > 0 {
			return satAdd(st.at, 2*w)
		}
		if st.b > 0 {
			return satAdd(st.at, w)
		}
	case TokenBucket, LeakyBucket:
		if st.rate > 0 {
			return satAdd(st.at, u128{st.a, st.b}.divCeil(st.rate))
		}
	}
	return st.at
}

// result is a decision in exact ns, before it becomes a Decision.
type result struct {
	allowed   bool
	remaining int64
	reset     int64 // Unix ns
	retry     int64 // ns, or -1
	delay     int64 // ns
}

// apply runs check c (valid, per Check.Validate) on st at now (Unix ns) and
// updates st. It is a pure function of (st, c, now). A state built for
// another algorithm or window starts afresh.
func (st *state) apply(c Check, now int64) result {
	var r result
	st.applyTo(&c, now, &r)
	return r
}

// applyTo is apply with the check read and the result written through
// pointers: the store's hot path, where copying the two 40-byte structs
// through each call cost more than the arithmetic. r must be zero.
func (st *state) applyTo(c *Check, now int64, r *result) {
	w := int64(c.Window)
	if spec := makeSpec(c.Algorithm, w); st.spec != spec {
		*st = state{spec: spec, at: now, rate: uint64(c.Limit)}
		if c.Algorithm == FixedWindow || c.Algorithm == SlidingWindow {
			st.at = floorDiv(now, w) * w
		}
	}
	switch c.Algorithm {
	case FixedWindow:
		st.fixed(c, now, r)
	case SlidingWindow:
		st.sliding(c, now, r)
	default:
		st.bucket(c, now, r)
	}
}

// need returns the hits a check must fit: its hits, or 1 for a peek.
func need(c *Check) uint64 {
	if c.Hits == 0 {
		return 1
	}
	return uint64(c.Hits)
}

func (st *state) fixed(c *Check, now int64, r *result) {
	w := st.window()
	if now < st.at {
		now = st.at // time went backwards: stay in the stored window
	}
	if start := floorDiv(now, w) * w; start != st.at {
		st.at, st.a = start, 0
	}
	limit := uint64(c.Limit)
	end := satAdd(st.at, w)
	switch {
	case uint64(c.Hits) > limit:
		r.retry = -1
	case st.a+need(c) <= limit:
		r.allowed = true
		st.a += uint64(c.Hits)
	default:
		r.retry = end - now
	}
	if st.a < limit {
		r.remaining = int64(limit - st.a)
	}
	r.reset = now
	if st.a > 0 {
		r.reset = end
	}
}

func (st *state) sliding(c *Check, now int64, r *result) {
	w := st.window()
	if now < st.at {
		now = st.at
	}
	if start := floorDiv(now, w) * w; start != st.at {
		if start == st.at+w {
			st.b, st.a = st.a, 0
		} else {
			st.b, st.a = 0, 0
		}
		st.at = start
	}
	uw := uint64(w)
	limit := uint64(c.Limit)
	p, cur := st.b, st.a
	e := uint64(now - st.at)
	capacity := mul64(limit, uw)       // L*W
	decayed := mul64(p, uw-e)          // p*(W-e)
	fits := func(cur, n uint64) bool { // p*(W-e) + (cur+n)*W <= L*W
		return !capacity.less(decayed.add(mul64(cur+n, uw)))
	}
	switch {
	case uint64(c.Hits) > limit:
		r.retry = -1
	case fits(cur, need(c)):
		r.allowed = true
		cur += uint64(c.Hits)
		st.a = cur
	default:
		r.retry = st.slidingRetry(limit, need(c), p, cur, now)
	}
	// remaining = floor((L*W - p*(W-e) - c*W) / W), floored at 0.
	r.remaining = capacity.subFloor(decayed.add(mul64(cur, uw))).div(uw)
	switch {
	case cur > 0:
		r.reset = satAdd(st.at, 2*w)
	case p > 0:
		r.reset = satAdd(st.at, w)
	default:
		r.reset = now
	}
}

// slidingRetry returns the ns until a check needing n hits (n <= limit) fits,
// given previous count p and current count cur, at now. The estimate only
// decays as time passes, so the answer is the first of: a point later in the
// current window, a point in the next one (previous = cur), or the start of
// the one after (both counts 0).
func (st *state) slidingRetry(limit, n, p, cur uint64, now int64) int64 {
	w := st.window()
	uw := uint64(w)
	// In the current window: p*(W-e') <= (L-cur-n)*W, so
	// e' >= W - floor((L-cur-n)*W/p).
	if p > 0 && cur+n <= limit {
		q, _ := mul64(limit-cur-n, uw).divmod(p)
		if q.hi == 0 && q.lo > 0 && q.lo < uw {
			return st.at + (w - int64(q.lo)) - now
		}
	}
	next := st.at + w
	// In the next window, with previous = cur and current = 0.
	if cur == 0 {
		return next - now
	}
	q, _ := mul64(limit-n, uw).divmod(cur)
	if q.hi != 0 || q.lo >= uw {
		return next - now
	}
	return next + (w - int64(q.lo)) - now
}

func (st *state) bucket(c *Check, now int64, r *result) {
	if now < st.at {
		now = st.at // time went backwards: no refill
	}
	w := uint64(st.window())
	// The debt drains at the limit of the last check that consumed hits
	// (st.rate); a check that consumes switches it to its own limit.
	debt := u128{st.a, st.b}.subFloor(mul64(uint64(now-st.at), st.rate))
	st.at = now
	rate := st.rate
	capacity := uint64(c.Capacity())
	full := mul64(capacity, w) // B*W
	switch {
	case uint64(c.Hits) > capacity:
		r.retry = -1
	case !full.less(debt.add(mul64(need(c), w))):
		r.allowed = true
		if c.Hits > 0 {
			rate = uint64(c.Limit)
			st.rate = rate
			if c.Algorithm == LeakyBucket {
				r.delay = debt.divCeil(rate)
			}
			debt = debt.add(mul64(uint64(c.Hits), w))
		}
	default:
		// debt - d*rate <= B*W - n*W  =>  d >= (debt - (B-n)*W) / rate
		r.retry = debt.sub(mul64(capacity-need(c), w)).divCeil(rate)
	}
	st.a, st.b = debt.hi, debt.lo
	// remaining = floor((B*W - debt)/W) = B - ceil(debt/W), floored at 0;
	// debt is usually small, so this divides once in 64 bits.
	if used := debt.divCeil(w); used < int64(capacity) {
		r.remaining = int64(capacity) - used
	}
	r.reset = satAdd(now, debt.divCeil(rate))
}
