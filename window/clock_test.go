package window

import (
	"testing"
	"time"
)

// SystemClock reads wall time as an anchor plus monotonic time, and takes a
// fresh anchor once the old one is reanchorEvery old. The anchors are
// planted, so no test waits for time to pass.
func TestSystemClock(t *testing.T) {
	old := systemAnchor.Load()
	t.Cleanup(func() { systemAnchor.Store(old) })
	c := SystemClock{}

	near := func(what string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want); d < -time.Second/2 || d > time.Second/2 {
			t.Fatalf("%s: SystemClock says %v, want about %v (off by %v)", what, got, want, d)
		}
	}
	near("first read", c.Now(), time.Now())
	if n := c.Now(); n != n.Round(0) {
		t.Fatal("SystemClock's time carries a monotonic reading")
	}

	// A fresh anchor whose wall time is an hour ahead (as after the wall
	// clock was stepped back by an hour): it is used as it stands.
	now := time.Now()
	systemAnchor.Store(&clockAnchor{wall: now.Add(time.Hour).UnixNano(), mono: now})
	near("fresh anchor", c.Now(), now.Add(time.Hour))

	// The same anchor, read more than reanchorEvery later: the clock
	// takes a new one from time.Now, so a step shows within a second.
	systemAnchor.Store(&clockAnchor{wall: now.Add(time.Hour).UnixNano(), mono: now.Add(-reanchorEvery)})
	near("stale anchor", c.Now(), time.Now())
	if a := systemAnchor.Load(); a.mono.Before(now) {
		t.Fatalf("the stale anchor (%v) was not replaced", a.mono)
	}

	// Successive reads never go backwards within one anchor.
	prev := c.Now()
	for range 1000 {
		n := c.Now()
		if n.Before(prev) {
			t.Fatalf("SystemClock went back from %v to %v", prev, n)
		}
		prev = n
	}
}

// ApplyNow decides at the store's clock, and a prefetch of a table that
// grew, shrank or emptied changes no decision.
func TestApplyNowUsesTheStoreClock(t *testing.T) {
	clock := NewManualClock(time.Unix(1000, 0))
	s := NewStore(StoreConfig{Clock: clock})
	c := Check{Algorithm: FixedWindow, Limit: 2, Window: time.Minute, Hits: 1}
	for i := range 3 {
		d, err := s.ApplyNow([]byte("k"), c)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d.Allowed != want {
			t.Fatalf("check %d: allowed %v, want %v", i+1, d.Allowed, want)
		}
		if want := time.Unix(1020, 0); !d.ResetTime.Equal(want) {
			t.Fatalf("check %d: reset %v, want %v (the window of the store's clock)", i+1, d.ResetTime, want)
		}
	}
	clock.Advance(time.Minute)
	if d, _ := s.ApplyNow([]byte("k"), c); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("next window: %+v, want allowed with 1 remaining", d)
	}
	if _, err := s.ApplyNow([]byte("k"), Check{Algorithm: FixedWindow, Window: time.Minute}); err == nil {
		t.Fatal("limit 0 was accepted")
	}
	// Grow one shard's table well past its first size, then sweep it empty:
	// checks before, between and after see their own counts.
	keys := make([][]byte, 5000)
	for i := range keys {
		keys[i] = []byte{byte(i), byte(i >> 8), 'x'}
		if d, _ := s.ApplyNow(keys[i], c); !d.Allowed || d.Remaining != 1 {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	for i := range keys {
		if d, _ := s.ApplyNow(keys[i], c); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("key %d, second check: %+v", i, d)
		}
	}
	clock.Advance(3 * time.Minute)
	s.Sweep(clock.Now())
	if n := s.Stats().Keys; n != 0 {
		t.Fatalf("%d keys after the sweep, want 0", n)
	}
	if d, _ := s.ApplyNow(keys[7], c); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after the sweep: %+v, want a fresh window", d)
	}
}
