package window

import (
	"testing"
	"time"
)

// The cases of shared/cases/README.md that belong to the window package.
// Times are seconds from t0, a multiple of every window.

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// C06: a leaky bucket leaks under load.
func TestC06LeakyBucketLeaks(t *testing.T) {
	s := NewStore(StoreConfig{})
	c := Check{Algorithm: LeakyBucket, Limit: 10, Window: 30 * time.Second, Hits: 1}
	want := []int64{9, 8, 7, 7, 6, 5, 5, 4, 3, 3, 2}
	for i, w := range want {
		d := mustApply(t, s, "k", c, at(float64(i)))
		if !d.Allowed || d.Remaining != w {
			t.Fatalf("t=%d: %+v, want allowed with remaining %d", i, d, w)
		}
	}
}

// C07: a leaky bucket never refills past full: limit 3 per second, a hit
// every 100 ms for 10 s: 32 allowed, and no answer jumps from denied to
// remaining 2 within 100 ms.
func TestC07LeakyBucketNeverPastFull(t *testing.T) {
	s := NewStore(StoreConfig{})
	c := Check{Algorithm: LeakyBucket, Limit: 3, Window: time.Second, Hits: 1}
	allowed := 0
	var prev Decision
	for i := 0; i < 100; i++ {
		d := mustApply(t, s, "k", c, t0.Add(time.Duration(i)*100*time.Millisecond))
		if d.Allowed {
			allowed++
		}
		if i > 0 && !prev.Allowed && d.Remaining >= 2 {
			t.Fatalf("hit %d: denied, then 100 ms later remaining %d", i, d.Remaining)
		}
		if d.Remaining < 0 || d.Remaining > 3 {
			t.Fatalf("hit %d: remaining %d", i, d.Remaining)
		}
		prev = d
	}
	if allowed != 32 {
		t.Fatalf("%d allowed, want 32", allowed)
	}
}

// C08: the sliding window counts the previous window.
func TestC08SlidingWindowCountsPrevious(t *testing.T) {
	s := NewStore(StoreConfig{})
	c := Check{Algorithm: SlidingWindow, Limit: 100, Window: time.Minute, Hits: 1}
	for i := 0; i < 50; i++ {
		mustApply(t, s, "k", c, at(float64(i)))
	}
	c.Hits = 10
	if d := mustApply(t, s, "k", c, at(66)); !d.Allowed || d.Remaining != 45 {
		t.Fatalf("10 hits at t=66: %+v, want remaining 45", d)
	}
	c.Hits = 1
	for i := 0; i < 45; i++ {
		if d := mustApply(t, s, "k", c, at(66)); !d.Allowed {
			t.Fatalf("hit %d of 45 more at t=66 denied: %+v", i+1, d)
		}
	}
	if d := mustApply(t, s, "k", c, at(66)); d.Allowed {
		t.Fatalf("the 46th more at t=66 allowed: %+v", d)
	}

	s = NewStore(StoreConfig{})
	c = Check{Algorithm: SlidingWindow, Limit: 1, Window: 10 * time.Second, Hits: 1}
	for _, step := range []struct {
		t       float64
		allowed bool
	}{{0, true}, {1, false}, {10, false}, {15, false}, {20, true}} {
		if d := mustApply(t, s, "k", c, at(step.t)); d.Allowed != step.allowed {
			t.Fatalf("t=%v: allowed %v, want %v", step.t, d.Allowed, step.allowed)
		}
	}
}

// C09: the window edge. 10 hits at 59.9 s and 10 at 60.1 s, limit 10 per
// minute: a fixed window allows all 20 (a documented property), the others
// deny the second ten.
func TestC09WindowEdge(t *testing.T) {
	for _, alg := range allAlgorithms {
		s := NewStore(StoreConfig{})
		c := Check{Algorithm: alg, Limit: 10, Window: time.Minute, Hits: 1}
		allowed := 0
		for _, sec := range []float64{59.9, 60.1} {
			for i := 0; i < 10; i++ {
				if mustApply(t, s, "k", c, at(sec)).Allowed {
					allowed++
				}
			}
		}
		want := 10
		if alg == FixedWindow {
			want = 20
		}
		if allowed != want {
			t.Errorf("%s: %d of 20 allowed across the edge, want %d", alg, allowed, want)
		}
	}
}

// C10: idle does not unlock a burst. Token bucket 1 per second, burst 2.
func TestC10IdleDoesNotUnlockABurst(t *testing.T) {
	for _, start := range []float64{0, 3600} {
		s := NewStore(StoreConfig{})
		c := Check{Algorithm: TokenBucket, Limit: 1, Window: time.Second, Burst: 2, Hits: 1}
		mustApply(t, s, "k", c, at(start))
		allowed := 0
		for i := 0; i < 10; i++ {
			d := mustApply(t, s, "k", c, at(start+2))
			if d.Allowed {
				allowed++
			} else if d.RetryAfter != time.Second {
				t.Fatalf("start %v: denied with retry_after %v, want 1s", start, d.RetryAfter)
			}
		}
		if allowed != 2 {
			t.Fatalf("start %v: %d of 10 allowed at t=2, want 2", start, allowed)
		}
		if d := mustApply(t, s, "k", c, at(start+3)); !d.Allowed {
			t.Fatalf("start %v: the hit at t=3 denied", start)
		}
	}
}

// C11: a cost above the capacity is denied with retry_after -1 and
// consumes nothing.
func TestC11CostAboveCapacity(t *testing.T) {
	s := NewStore(StoreConfig{})
	c := Check{Algorithm: TokenBucket, Limit: 5, Window: time.Second, Burst: 5, Hits: 1}
	mustApply(t, s, "k", c, at(0))
	c.Hits = 10
	if d := mustApply(t, s, "k", c, at(1.2)); d.Allowed || d.Remaining != 5 || d.RetryAfter != RetryNever {
		t.Fatalf("10 hits at t=1.2: %+v, want denied, remaining 5, retry_after -1", d)
	}
	c.Hits = 1
	if d := mustApply(t, s, "k", c, at(1.2)); !d.Allowed || d.Remaining != 4 {
		t.Fatalf("1 hit after: %+v, want allowed, remaining 4", d)
	}
}

// C13: extremes.
func TestC13Extremes(t *testing.T) {
	// Fixed window 65535 per second, a hit every 100 ms: remaining goes
	// down by exactly 1 each hit within a window.
	s := NewStore(StoreConfig{})
	c := Check{Algorithm: FixedWindow, Limit: 65535, Window: time.Second, Hits: 1}
	for i := 0; i < 30; i++ {
		d := mustApply(t, s, "k", c, t0.Add(time.Duration(i)*100*time.Millisecond))
		if want := int64(65535 - 1 - i%10); d.Remaining != want {
			t.Fatalf("hit %d: remaining %d, want %d", i, d.Remaining, want)
		}
	}
	// Token bucket 700 per 60 s, burst 1, saturated for 60 s: exactly 700.
	// Saturated twice over: a client that comes back exactly when
	// retry_after says, and a hit every 100 us. (With a hit only every
	// 1 ms, each token waits up to 1 ms to be taken, and a bucket of 1
	// cannot bank that time: 698 are allowed; no token bucket does better.)
	s = NewStore(StoreConfig{})
	c = Check{Algorithm: TokenBucket, Limit: 700, Window: time.Minute, Burst: 1, Hits: 1}
	allowed := 0
	for now := t0; now.Before(t0.Add(time.Minute)); {
		d := mustApply(t, s, "retry", c, now)
		if d.Allowed {
			allowed++
			now = now.Add(time.Nanosecond)
		} else {
			now = now.Add(d.RetryAfter)
		}
	}
	if allowed != 700 {
		t.Fatalf("retry_after-driven client: %d allowed in 60 s, want 700", allowed)
	}
	allowed = 0
	for us := 0; us < 60_000_000; us += 100 {
		if mustApply(t, s, "every100us", c, t0.Add(time.Duration(us)*time.Microsecond)).Allowed {
			allowed++
		}
	}
	if allowed != 700 {
		t.Fatalf("a hit every 100 us: %d allowed in 60 s, want 700", allowed)
	}
	// Burst 1000 at 1000000 per second, idle 7 days, one hit.
	s = NewStore(StoreConfig{})
	c = Check{Algorithm: TokenBucket, Limit: 1_000_000, Window: time.Second, Burst: 1000, Hits: 1}
	mustApply(t, s, "k", c, t0)
	if d := mustApply(t, s, "k", c, t0.Add(7*24*time.Hour)); !d.Allowed || d.Remaining != 999 {
		t.Fatalf("after 7 idle days: %+v, want allowed, remaining 999", d)
	}
	// Above the documented maximum: refused.
	c.Limit = MaxLimit + 1
	if _, err := s.Apply("k", c, t0); err == nil {
		t.Fatal("limit above 2^53 accepted")
	}
}
