package window

import (
	"encoding/binary"
	"math"
	"math/big"
	"testing"
	"time"
)

// refModel is the slow, obviously correct reference for one key: the
// semantics of DESIGN.md in exact rationals (math/big), with no care for
// speed or memory. The fuzz test checks the fast state against it.
type refModel struct {
	spec  uint64 // algorithm and window of the current state (0: none)
	start int64  // windows: the current window's start (ns)
	cur   int64  // windows: hits in the current window
	prev  int64  // sliding: hits in the previous window
	last  int64  // buckets: last update (ns)
	debt  *big.Rat
	rate  int64 // buckets: the limit the debt drains at
}

func (m *refModel) clone() *refModel {
	c := *m
	if m.debt != nil {
		c.debt = new(big.Rat).Set(m.debt)
	}
	return &c
}

func rat(a int64) *big.Rat { return new(big.Rat).SetInt64(a) }

// ceilRat returns ceil(r) for r >= 0 as an int64 (saturated).
func ceilRat(r *big.Rat) int64 {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 1<<63 - 1
	}
	return q.Int64()
}

func floorRat(r *big.Rat) int64 {
	q := new(big.Int).Quo(r.Num(), r.Denom()) // r >= 0: truncation is floor
	return q.Int64()
}

// apply answers c at now the reference way; it returns (allowed,
// remaining, reset ns, retry ns or -1, delay ns).
func (m *refModel) apply(c Check, now int64) result {
	w := int64(c.Window)
	if spec := makeSpec(c.Algorithm, w); m.spec != spec {
		*m = refModel{spec: spec, start: floorDiv(now, w) * w, last: now, debt: new(big.Rat), rate: c.Limit}
	}
	need := max(c.Hits, 1)
	L, W := c.Limit, rat(w)
	var r result
	switch c.Algorithm {
	case FixedWindow, SlidingWindow:
		now = max(now, m.start)
		if s := floorDiv(now, w) * w; s != m.start {
			if s == m.start+w {
				m.prev, m.cur = m.cur, 0
			} else {
				m.prev, m.cur = 0, 0
			}
			m.start = s
		}
		if c.Algorithm == FixedWindow {
			m.prev = 0
		}
		// estimate(t) = prev*(W-(t-start))/W + cur
		est := func(t int64, prev, cur int64) *big.Rat {
			e := new(big.Rat).Mul(rat(prev), new(big.Rat).Quo(rat(w-(t-m.start)), W))
			return e.Add(e, rat(cur))
		}
		fits := func(t int64, prev, cur int64) bool {
			return new(big.Rat).Add(est(t, prev, cur), rat(need)).Cmp(rat(L)) <= 0
		}
		switch {
		case c.Hits > L:
			r.retry = -1
		case fits(now, m.prev, m.cur):
			r.allowed = true
			m.cur += c.Hits
		default:
			// The first ns at which the check fits: search the current
			// window, the next, then the one after (empty) by bisection
			// on exact estimates.
			r.retry = m.firstFit(c, now, need)
		}
		rem := new(big.Rat).Sub(rat(L), est(now, m.prev, m.cur))
		if rem.Sign() > 0 {
			r.remaining = floorRat(rem)
		}
		switch {
		case m.cur > 0 && c.Algorithm == SlidingWindow:
			r.reset = m.start + 2*w
		case m.cur > 0 || (m.prev > 0 && c.Algorithm == SlidingWindow):
			r.reset = m.start + w
		default:
			r.reset = now
		}
	default:
		now = max(now, m.last)
		drained := new(big.Rat).Mul(rat(now-m.last), new(big.Rat).Quo(rat(m.rate), W))
		m.debt.Sub(m.debt, drained)
		if m.debt.Sign() < 0 {
			m.debt.SetInt64(0)
		}
		m.last = now
		B := c.Capacity()
		// The debt drains at the limit of the last check that consumed.
		perHit := new(big.Rat).Quo(W, rat(m.rate)) // ns per hit of refill
		switch {
		case c.Hits > B:
			r.retry = -1
		case new(big.Rat).Add(m.debt, rat(need)).Cmp(rat(B)) <= 0:
			r.allowed = true
			if c.Hits > 0 {
				m.rate = L
				perHit = new(big.Rat).Quo(W, rat(L))
				if c.Algorithm == LeakyBucket {
					r.delay = ceilRat(new(big.Rat).Mul(m.debt, perHit))
				}
			}
			m.debt.Add(m.debt, rat(c.Hits))
		default:
			over := new(big.Rat).Sub(new(big.Rat).Add(m.debt, rat(need)), rat(B))
			r.retry = ceilRat(over.Mul(over, perHit))
		}
		if rem := new(big.Rat).Sub(rat(B), m.debt); rem.Sign() > 0 {
			r.remaining = floorRat(rem)
		}
		r.reset = satAdd(now, ceilRat(new(big.Rat).Mul(m.debt, perHit)))
	}
	return r
}

// firstFit returns ns from now until need hits fit a window algorithm.
func (m *refModel) firstFit(c Check, now, need int64) int64 {
	w := int64(c.Window)
	L := rat(c.Limit)
	fitsAt := func(t int64) bool {
		// roll a copy to t
		start, prev, cur := m.start, m.prev, m.cur
		if s := floorDiv(t, w) * w; s != start {
			if s == start+w {
				prev, cur = cur, 0
			} else {
				prev, cur = 0, 0
			}
			start = s
		}
		if c.Algorithm == FixedWindow {
			prev = 0
		}
		e := new(big.Rat).Mul(rat(prev), new(big.Rat).Quo(rat(w-(t-start)), rat(w)))
		e.Add(e, rat(cur+need))
		return e.Cmp(L) <= 0
	}
	lo, hi := now, m.start+2*w // fits at hi: both windows empty
	for lo < hi {              // the estimate only falls: bisect
		mid := lo + (hi-lo)/2
		if fitsAt(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo - now
}

// FuzzWindow drives random sequences of checks (times, hits, limits,
// bursts, windows and algorithm changes) through the store's state and
// the reference, and checks the invariants: same answers as the
// reference; remaining within [0, capacity]; retry_after >= 0 or exactly
// -1; waiting retry_after then repeating the check is allowed; and, while
// the numbers stay the same, never more admitted than the algorithm
// allows (per aligned window for the windows, burst + refill for the
// buckets).
func FuzzWindow(f *testing.F) {
	f.Add([]byte("\x01\x0a\x3c\x00\x01\x00\x01\x00\x00\x05\x01\x00\x02\x10"))
	f.Add([]byte("\x03\x05\x01\x0a\x00\x02\x00\x03\x00\xff\x07\x00\x01\x00\x00\x01"))
	f.Add([]byte("\x04\x03\x01\x00\x02\x01\x05\x00\x01\x40\x09\x00\x00\x00\x05\x03\x01"))
	f.Add([]byte("\x02\x64\x3c\x00\x32\x00\x00\x42\x0a\x00\x2d\x00\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd := func() uint64 { // one varint from data, 0 when it runs out
			v, n := binary.Uvarint(data)
			if n <= 0 {
				data = nil
				return 0
			}
			data = data[n:]
			return v
		}
		windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour, MaxWindow}
		limits := []int64{1, 2, 3, 5, 10, 100, 65535, MaxLimit}
		c := Check{
			Algorithm: Algorithm(1 + rd()%4),
			Limit:     limits[rd()%uint64(len(limits))],
			Window:    windows[rd()%uint64(len(windows))],
		}
		var st state
		ref := &refModel{}
		now := int64(3600*500_000) * int64(time.Second)
		var since []hit // admitted since the numbers last changed
		for steps := 0; len(data) > 0 && steps < 200; steps++ {
			op := rd()
			now += int64(rd()%uint64(3*c.Window)) / int64(1+op%7) // time moves by 0..3W, often less
			if op%11 == 10 {                                      // change the numbers
				switch rd() % 4 {
				case 0:
					c.Algorithm = Algorithm(1 + rd()%4)
				case 1:
					c.Limit = limits[rd()%uint64(len(limits))]
				case 2:
					c.Burst = int64(rd() % 20)
				case 3:
					c.Window = windows[rd()%uint64(len(windows))]
				}
				since = since[:0]
			}
			c.Hits = int64(rd() % uint64(min(c.Capacity(), 1<<20)+2))
			// As in Store.Apply: only a check that consumed hits keeps
			// its state.
			before, refBefore := st, ref.clone()
			got := st.apply(c, now)
			want := ref.apply(c, now)
			if !got.allowed || c.Hits == 0 {
				st, ref = before, refBefore
			}
			if got != want {
				t.Fatalf("step %d %+v at %d: got %+v, reference %+v", steps, c, now, got, want)
			}
			capacity := c.Capacity()
			if got.remaining < 0 || got.remaining > capacity {
				t.Fatalf("remaining %d outside [0, %d]", got.remaining, capacity)
			}
			if got.retry < -1 || (got.allowed && got.retry != 0) || (got.retry == -1) != (c.Hits > capacity) {
				t.Fatalf("retry_after %d (allowed %v, hits %d, capacity %d)", got.retry, got.allowed, c.Hits, capacity)
			}
			// (A retry_after that reaches past the year 2262 saturates and
			// cannot be waited out in int64 ns.)
			if !got.allowed && got.retry > 0 && got.retry < math.MaxInt64-now {
				again := st // a denied check consumed nothing
				if r := again.apply(c, now+got.retry); !r.allowed {
					t.Fatalf("%+v denied at %d with retry_after %d, and denied again then: %+v", c, now, got.retry, r)
				}
			}
			if got.allowed && c.Hits > 0 {
				since = append(since, hit{now, c.Hits})
			}
			checkRateBound(t, c, since)
		}
	})
}

// hit is hits admitted at a time (ns).
type hit struct{ at, n int64 }

// checkRateBound fails if the hits admitted under unchanged numbers exceed
// what the algorithm allows.
func checkRateBound(t *testing.T, c Check, hits []hit) {
	if len(hits) == 0 {
		return
	}
	last := hits[len(hits)-1]
	var n int64
	switch c.Algorithm {
	case FixedWindow, SlidingWindow:
		// In the aligned window of the last hit: at most L.
		w := int64(c.Window)
		start := floorDiv(last.at, w) * w
		for _, h := range hits {
			if h.at >= start {
				n += h.n
			}
		}
		if n > c.Limit {
			t.Fatalf("%s: %d hits admitted in one window, limit %d", c.Algorithm, n, c.Limit)
		}
	default:
		// From the first hit to the last: at most B + L*elapsed/W.
		for _, h := range hits {
			n += h.n
		}
		elapsed := last.at - hits[0].at
		bound := new(big.Rat).Add(rat(c.Capacity()), new(big.Rat).Quo(new(big.Rat).Mul(rat(c.Limit), rat(elapsed)), rat(int64(c.Window))))
		if rat(n).Cmp(bound) > 0 {
			t.Fatalf("%s: %d hits admitted in %d ns, bound %s", c.Algorithm, n, elapsed, bound.FloatString(3))
		}
	}
}
