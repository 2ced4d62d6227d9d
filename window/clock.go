package window

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock tells the time. Implementations must be safe for concurrent use.
// A nil Clock in a Config means the system clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// SystemClock is the real clock. It reads the wall time as the wall time of
// an anchor plus the monotonic time elapsed since it (one read of the
// monotonic clock, about half the cost of [time.Now], which reads both
// clocks), and takes a fresh anchor from [time.Now] once a second. A step of
// the wall clock (a VM resumed, NTP setting the time) therefore shows within
// a second; slewing shows at once, as Linux slews both clocks alike. The
// times it returns carry no monotonic reading.
type SystemClock struct{}

// reanchorEvery is how long SystemClock counts from one anchor.
const reanchorEvery = time.Second

// clockAnchor is a wall time (Unix ns) and the instant it was read, with
// its monotonic reading.
type clockAnchor struct {
	wall int64
	mono time.Time
}

var systemAnchor atomic.Pointer[clockAnchor]

// Now returns the current wall time.
func (SystemClock) Now() time.Time {
	if a := systemAnchor.Load(); a != nil {
		if d := time.Since(a.mono); d >= 0 && d < reanchorEvery {
			return time.Unix(0, a.wall+int64(d))
		}
	}
	now := time.Now()
	systemAnchor.Store(&clockAnchor{wall: now.UnixNano(), mono: now})
	return time.Unix(0, now.UnixNano())
}

// ManualClock is a clock that moves only when told, for tests. Its zero
// value reads the Unix epoch. It is safe for concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a ManualClock reading t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		return time.Unix(0, 0)
	}
	return c.now
}

// Set moves the clock to t (also backwards).
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d and returns the new time.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = time.Unix(0, 0)
	}
	c.now = c.now.Add(d)
	return c.now
}

var (
	_ Clock = SystemClock{}
	_ Clock = (*ManualClock)(nil)
)
