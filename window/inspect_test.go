package window

import (
	"testing"
	"time"
)

// stateAfter applies hits single-hit checks of c to a fresh store at now and
// returns the key's state.
func stateAfter(t *testing.T, c Check, hits int, now time.Time) State {
	t.Helper()
	s := NewStore(StoreConfig{})
	c.Hits = 1
	for range hits {
		if d, err := s.Apply("k", c, now); err != nil || !d.Allowed {
			t.Fatalf("Apply: %+v, %v", d, err)
		}
	}
	st, ok := s.Get("k")
	if !ok {
		t.Fatal("no state")
	}
	return st
}

func TestDescribe(t *testing.T) {
	t0 := time.Unix(3600*500_000, 0) // a multiple of every window below
	for _, tc := range []struct {
		name     string
		c        Check
		hits     int
		at       time.Duration // when Describe reads it, after t0 (the hits are at t0)
		want     Snapshot
		wantPeek int64 // remaining of a peek with c's numbers
	}{
		{"fixed, same window", Check{Algorithm: FixedWindow, Limit: 10, Window: time.Minute}, 7, 30 * time.Second,
			Snapshot{Algorithm: FixedWindow, Window: time.Minute, Start: t0, Count: 7, Reset: t0.Add(time.Minute)}, 3},
		{"fixed, window ended", Check{Algorithm: FixedWindow, Limit: 10, Window: time.Minute}, 7, 90 * time.Second,
			Snapshot{Algorithm: FixedWindow, Window: time.Minute, Start: t0.Add(time.Minute), Count: 0, Reset: t0.Add(time.Minute)}, 10},
		{"sliding, next window", Check{Algorithm: SlidingWindow, Limit: 10, Window: time.Minute}, 6, 90 * time.Second,
			// estimate 6*(30/60) = 3: 7 remain.
			Snapshot{Algorithm: SlidingWindow, Window: time.Minute, Start: t0.Add(time.Minute), Count: 0, Previous: 6, Reset: t0.Add(2 * time.Minute)}, 7},
		{"token bucket, half refilled", Check{Algorithm: TokenBucket, Limit: 10, Window: 10 * time.Second}, 8, 4 * time.Second,
			// 8 consumed at t0, 4 refilled by t0+4s: 4 still consumed, 6 left of 10.
			Snapshot{Algorithm: TokenBucket, Window: 10 * time.Second, Start: t0, Count: 4, Rate: 10, Reset: t0.Add(8 * time.Second)}, 6},
		{"leaky bucket, burst", Check{Algorithm: LeakyBucket, Limit: 10, Window: 10 * time.Second, Burst: 20}, 15, 1500 * time.Millisecond,
			// 15 queued, 1.5 drained: 13.5, rounded up.
			Snapshot{Algorithm: LeakyBucket, Window: 10 * time.Second, Start: t0, Count: 14, Rate: 10, Reset: t0.Add(15 * time.Second)}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := stateAfter(t, tc.c, tc.hits, t0)
			now := t0.Add(tc.at)
			got := st.Describe(now)
			if got != tc.want {
				t.Fatalf("Describe:\n got  %+v\n want %+v", got, tc.want)
			}
			d, err := st.Peek(tc.c, now)
			if err != nil || d.Remaining != tc.wantPeek || !d.Allowed {
				t.Fatalf("Peek = %+v, %v; want remaining %d, allowed", d, err, tc.wantPeek)
			}
			// A peek through the store agrees, and neither changed the state.
			s := NewStore(StoreConfig{})
			s.MergeState("k", st, now)
			c := tc.c
			c.Hits = 0
			sd, _ := s.Apply("k", c, now)
			if sd != d {
				t.Fatalf("Store peek %+v, State.Peek %+v", sd, d)
			}
			if after, _ := s.Get("k"); after != st {
				t.Fatal("a peek changed the state")
			}

			// Fresh: nothing counted, the same algorithm and window; a
			// check decides from it as from no state at all.
			f := st.Fresh(now)
			if f.IsZero() || f.Algorithm() != tc.c.Algorithm || f.Window() != tc.c.Window {
				t.Fatalf("Fresh = %+v", f.Describe(now))
			}
			if fd := f.Describe(now); fd.Count != 0 || fd.Previous != 0 || fd.Reset.After(now) {
				t.Fatalf("Fresh counts: %+v", fd)
			}
			fresh, _ := State{}.Peek(tc.c, now)
			if got, _ := f.Peek(tc.c, now); got != fresh {
				t.Fatalf("a peek of the fresh state %+v, of no state %+v", got, fresh)
			}
			if f.Expires().After(now) {
				t.Fatalf("a fresh state expires at %v, after now: not at full capacity", f.Expires())
			}
		})
	}
}

func TestDescribeZeroAndBackwards(t *testing.T) {
	if (State{}).Describe(time.Now()) != (Snapshot{}) {
		t.Fatal("a zero State described as something")
	}
	if !(State{}).Fresh(time.Now()).IsZero() {
		t.Fatal("a zero State made fresh is not zero")
	}
	if _, err := (State{}).Peek(Check{Algorithm: FixedWindow, Limit: 0, Window: time.Second}, time.Now()); err == nil {
		t.Fatal("Peek took a limit of 0")
	}
	t0 := time.Unix(3600*500_000, 0)
	c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Minute}
	st := stateAfter(t, c, 3, t0.Add(10*time.Second))
	// Time gone backwards into the previous window: read as the state's own.
	if got := st.Describe(t0.Add(-time.Hour)); got.Count != 3 || !got.Start.Equal(t0) {
		t.Fatalf("backwards: %+v", got)
	}
}
