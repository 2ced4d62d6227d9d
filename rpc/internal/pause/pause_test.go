package pause

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGapsAndPauses(t *testing.T) {
	t0 := time.Now()
	d := New(time.Second, t0)
	reacted := 0
	react := func(time.Duration) { reacted++ }
	steps := []struct {
		at        time.Duration
		beat      bool
		wantPause bool
	}{
		{at: 200 * time.Millisecond, beat: true},
		{at: 1100 * time.Millisecond},                            // 0.9 s since the beat at 0.2 s: no pause
		{at: 1300 * time.Millisecond, wantPause: true},           // 1.1 s: a pause (a check sees it first)
		{at: 1400 * time.Millisecond},                            // the check beat: fresh again
		{at: 2300 * time.Millisecond, beat: true},                // 0.9 s: a beat, no pause
		{at: 5 * time.Second, beat: true, wantPause: true},       // a beat sees it
		{at: 5*time.Second + time.Millisecond, wantPause: false}, // once
	}
	want := 0
	for _, s := range steps {
		now := t0.Add(s.at)
		var got bool
		if s.beat {
			got = d.Beat(now, react)
		} else {
			got = d.Check(now, react)
		}
		if s.wantPause {
			want++
		}
		if got != s.wantPause || reacted != want {
			t.Fatalf("at %v (beat %v): pause %v, reacted %d times; want %v, %d", s.at, s.beat, got, reacted, s.wantPause, want)
		}
	}
	if n, g := d.Pauses(); n != 2 || g != 5*time.Second-2300*time.Millisecond {
		t.Errorf("Pauses() = %d, %v; want 2, 2.7s", n, g)
	}
	if since, ok := d.Since(t0.Add(6 * time.Second)); !ok || since != time.Second {
		t.Errorf("Since(6 s) = %v, %v; want 1s since the pause seen at 5 s", since, ok)
	}
	if _, ok := New(time.Second, t0).Since(t0); ok {
		t.Error("Since of a detector that saw no pause: ok")
	}
}

// The wall clock counts too: a host suspended (its monotonic clock
// stopped) wakes with its wall clock ahead. A wall clock stepped back is
// no pause.
func TestWallClockGap(t *testing.T) {
	t0 := time.Now()
	d := New(time.Second, t0)
	// The same monotonic reading, the wall clock 5 s on.
	if !d.Check(t0.Add(10*time.Millisecond).Add(0).Round(0).Add(5*time.Second), nil) {
		// Round(0) strips the monotonic reading: Sub then uses the wall
		// clock, which also moved 5 s.
		t.Fatal("a 5 s wall-clock gap is no pause")
	}
	d2 := New(time.Second, t0)
	if d2.Check(t0.Add(-time.Hour).Round(0), nil) {
		t.Fatal("a wall clock stepped back an hour is a pause")
	}
}

// Concurrent checks after a pause: the reaction runs once, and every
// check returns only once it has (none decides before it).
func TestReactionRunsOnceBeforeAnyCheckGoesOn(t *testing.T) {
	t0 := time.Now()
	d := New(100*time.Millisecond, t0)
	d.Backdate(time.Second)
	var (
		reacting, done atomic.Bool
		runs           atomic.Int32
		early          atomic.Int32
		wg             sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			d.Check(time.Now(), func(time.Duration) {
				reacting.Store(true)
				runs.Add(1)
				time.Sleep(20 * time.Millisecond) // the reaction takes a while
				done.Store(true)
			})
			if !done.Load() {
				early.Add(1)
			}
		})
	}
	wg.Wait()
	if runs.Load() != 1 || early.Load() != 0 || !reacting.Load() {
		t.Fatalf("reaction ran %d times; %d checks went on before it ended", runs.Load(), early.Load())
	}
}
