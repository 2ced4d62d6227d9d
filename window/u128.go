package window

import (
	"math"
	"math/bits"
)

// u128 is an unsigned 128-bit integer, for the products of hits (up to 2^53
// and more) and nanoseconds (up to 2^55) that overflow 64 bits.
type u128 struct{ hi, lo uint64 }

func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

// sub returns x-y; it requires x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

// subFloor returns max(x-y, 0).
func (x u128) subFloor(y u128) u128 {
	if x.less(y) {
		return u128{}
	}
	return x.sub(y)
}

func (x u128) less(y u128) bool {
	return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo)
}

// divmod returns x/d and x%d; d must not be 0.
func (x u128) divmod(d uint64) (u128, uint64) {
	if x.hi == 0 { // the common case: one 64-bit division
		return u128{0, x.lo / d}, x.lo % d
	}
	qhi := x.hi / d
	qlo, r := bits.Div64(x.hi%d, x.lo, d)
	return u128{qhi, qlo}, r
}

// div returns floor(x/d), saturated at math.MaxInt64; d must not be 0.
func (x u128) div(d uint64) int64 {
	q, _ := x.divmod(d)
	return q.sat()
}

// divCeil returns ceil(x/d), saturated at math.MaxInt64; d must not be 0.
func (x u128) divCeil(d uint64) int64 {
	q, r := x.divmod(d)
	if r != 0 {
		q = q.add(u128{0, 1})
	}
	return q.sat()
}

// sat returns x as an int64, saturated at math.MaxInt64.
func (x u128) sat() int64 {
	if x.hi != 0 || x.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(x.lo)
}

// satAdd returns a+b for b >= 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// floorDiv returns floor(a/b) for b > 0, also for negative a.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
