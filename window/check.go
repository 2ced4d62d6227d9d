package window

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate-limit algorithm. The zero value is [Unspecified],
// which no check may use; see the package documentation for the semantics of
// each.
type Algorithm uint8

// The algorithms. The numbering matches the sluice.v1 protobuf enum.
const (
	Unspecified   Algorithm = 0
	FixedWindow   Algorithm = 1
	SlidingWindow Algorithm = 2
	TokenBucket   Algorithm = 3
	LeakyBucket   Algorithm = 4
)

var algorithmNames = [...]string{
	Unspecified:   "unspecified",
	FixedWindow:   "fixed_window",
	SlidingWindow: "sliding_window",
	TokenBucket:   "token_bucket",
	LeakyBucket:   "leaky_bucket",
}

// String returns the algorithm's snake_case name, e.g. "token_bucket", or
// "algorithm(N)" for a value that names no algorithm.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm turns a snake_case name ("fixed_window", "sliding_window",
// "token_bucket", "leaky_bucket") into an Algorithm. Any other name returns
// a *[FieldError] for the field "algorithm" that wraps [ErrInvalid].
func ParseAlgorithm(name string) (Algorithm, error) {
	for a := FixedWindow; int(a) < len(algorithmNames); a++ {
		if algorithmNames[a] == name {
			return a, nil
		}
	}
	return Unspecified, &FieldError{Field: "algorithm", Reason: fmt.Sprintf("unknown algorithm %q (want fixed_window, sliding_window, token_bucket or leaky_bucket)", name)}
}

// Limits on the numbers of a check. Above them the exact arithmetic of this
// package could overflow, so [Check.Validate] refuses them.
const (
	// MaxLimit is the largest limit and burst, in hits: 2^53.
	MaxLimit int64 = 1 << 53
	// MaxWindow is the longest window: 366 days.
	MaxWindow time.Duration = 366 * 24 * time.Hour
)

// RetryNever is the RetryAfter of a check that can never be allowed as it
// stands, because its hits exceed the capacity (L, or B for the buckets).
const RetryNever time.Duration = -1

// Check is one rate-limit check against one key: consume Hits out of Limit
// hits per Window. It holds no key; [Store.Apply] takes the key beside it.
// The zero value is invalid (it names no algorithm).
type Check struct {
	// Algorithm decides how hits are counted. (Required)
	Algorithm Algorithm
	// Limit is the number of hits allowed per Window, in 1..MaxLimit. For the
	// buckets it is the refill (or drain) rate: Limit per Window. (Required)
	Limit int64
	// Window is the period Limit applies to, in (0, MaxWindow]. (Required)
	Window time.Duration
	// Burst is the bucket capacity in hits for TokenBucket and LeakyBucket,
	// in 0..MaxLimit; 0 means Limit. The window algorithms ignore it.
	// (Optional)
	Burst int64
	// Hits is how much the check consumes, >= 0; 0 is a peek. (Optional)
	Hits int64
}

// ErrInvalid is wrapped by every error that refuses a check's numbers.
var ErrInvalid = errors.New("window: invalid check")

// FieldError refuses one field of a check. It wraps [ErrInvalid].
type FieldError struct {
	// Field is the snake_case name of the field, as on the wire: "limit",
	// "window", "burst", "hits", "algorithm" ([Store.Refund] also names
	// its times: "applied_at", "now").
	Field string
	// Reason says what is wrong, e.g. "must be > 0, got -1".
	Reason string
}

// Error returns "field: reason".
func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap returns [ErrInvalid].
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Validate reports the first field of c that is out of range as a
// *[FieldError] (wrapping [ErrInvalid]), or nil when c can be applied.
func (c Check) Validate() error {
	switch {
	case c.Algorithm == Unspecified || int(c.Algorithm) >= len(algorithmNames):
		return &FieldError{Field: "algorithm", Reason: fmt.Sprintf("unknown algorithm %d", uint8(c.Algorithm))}
	case c.Limit <= 0:
		return &FieldError{Field: "limit", Reason: fmt.Sprintf("must be > 0, got %d", c.Limit)}
	case c.Limit > MaxLimit:
		return &FieldError{Field: "limit", Reason: fmt.Sprintf("must be <= %d (2^53), got %d", MaxLimit, c.Limit)}
	case c.Window <= 0:
		return &FieldError{Field: "window", Reason: fmt.Sprintf("must be > 0, got %s", c.Window)}
	case c.Window > MaxWindow:
		return &FieldError{Field: "window", Reason: fmt.Sprintf("must be <= 366 days, got %s", c.Window)}
	case c.Burst < 0:
		return &FieldError{Field: "burst", Reason: fmt.Sprintf("must be >= 0, got %d", c.Burst)}
	case c.Burst > MaxLimit:
		return &FieldError{Field: "burst", Reason: fmt.Sprintf("must be <= %d (2^53), got %d", MaxLimit, c.Burst)}
	case c.Hits < 0:
		return &FieldError{Field: "hits", Reason: fmt.Sprintf("must be >= 0, got %d", c.Hits)}
	}
	return nil
}

// Capacity returns the most hits the key can ever hold at once: Burst (or
// Limit when Burst is 0) for the buckets, Limit for the windows.
func (c Check) Capacity() int64 {
	if (c.Algorithm == TokenBucket || c.Algorithm == LeakyBucket) && c.Burst > 0 {
		return c.Burst
	}
	return c.Limit
}

// Decision is the answer to one check.
type Decision struct {
	// Allowed is true when the hits were admitted (and consumed); for a
	// peek, whether one more hit would be admitted now.
	Allowed bool
	// Limit echoes the check's limit, in hits.
	Limit int64
	// Remaining is how many hits are still allowed now, after this check,
	// rounded down; in [0, capacity].
	Remaining int64
	// ResetTime is when the key is back at full capacity if nothing else
	// hits it (now, when it already is). Exact to the ns, rounded up.
	ResetTime time.Time
	// RetryAfter is how long to wait before this same check would be
	// allowed: 0 when allowed, [RetryNever] when it never can be. Exact to
	// the ns, rounded up.
	RetryAfter time.Duration
	// Delay is, for an allowed LeakyBucket check, how long until the queue
	// ahead of it has drained (0 into an empty bucket); 0 otherwise.
	Delay time.Duration
	// NoRoom is true when the key held no state and the store had no room
	// for it (MaxKeys under [KeyCapDeny], or its group's share): the check
	// was not admitted (Allowed false) and consumed nothing; Remaining is
	// 0, and RetryAfter is [NoRoomRetry] (ResetTime now plus that).
	NoRoom bool
}

// NoRoomRetry is the RetryAfter of a check refused for want of room
// ([Decision.NoRoom]): 1 s, after which sweeps (or keys freed by their
// owners) may have made room.
const NoRoomRetry = time.Second
