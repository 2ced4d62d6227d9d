// Package pause tells a process that it stopped running for a while: a
// long garbage-collection pause, a container frozen by its cgroup, a
// virtual machine paused or live-migrated, a laptop's lid closed, a
// SIGSTOP (Jepsen's process-pause nemesis). Such a process wakes up
// holding what it held before, with no sign that the world went on
// without it: its cluster may have declared it dead and given its keys to
// another member, which counted them meanwhile, or decided its keys'
// checks in its stead. Deciding from what it held would admit again what
// was admitted elsewhere.
//
// A Detector is beaten by a ticker (every threshold/4, say) and read on
// every decision: a gap since the last beat longer than the threshold,
// measured on the monotonic clock or on the wall clock (a suspended host's
// monotonic clock may not advance; its wall clock does once it resumes),
// is a pause. The first caller that sees a gap runs the caller's reaction
// before anyone sees a fresh beat, so a decision made after the pause
// either sees the gap itself (and waits for the reaction) or comes after
// the reaction. A decision already past its check when the process stopped
// is not caught (it decides from what it held: at most one check each).
//
// The package is pure: no goroutines, no clock of its own; callers pass
// time.Now() readings.
package pause

import (
	"sync"
	"sync/atomic"
	"time"
)

// Detector finds gaps in a process's run. The zero value is not usable;
// use New. Its methods are safe for concurrent use.
type Detector struct {
	threshold time.Duration
	base      time.Time // a monotonic reading all beats are measured from

	mono atomic.Int64 // ns since base of the last beat (monotonic)
	wall atomic.Int64 // Unix ns of the last beat (wall clock)

	mu     sync.Mutex // held while a pause is reacted to
	pauses atomic.Int64
	last   atomic.Int64 // ns: the longest gap of the last pause seen
	seenAt atomic.Int64 // ns since base when the last pause was seen (0: none)
}

// New returns a Detector whose pauses are gaps longer than threshold (>
// 0), beaten first at now (a time.Now() reading: it must carry the
// monotonic clock).
func New(threshold time.Duration, now time.Time) *Detector {
	d := &Detector{threshold: threshold, base: now}
	d.wall.Store(now.UnixNano())
	return d
}

// Threshold returns the shortest gap that is a pause.
func (d *Detector) Threshold() time.Duration { return d.threshold }

// gap returns how long it has been since the last beat at now: the longer
// of the monotonic and the wall clock's measures (a wall clock stepped
// back gives 0).
func (d *Detector) gap(now time.Time) time.Duration {
	g := now.Sub(d.base) - time.Duration(d.mono.Load())
	if w := time.Duration(now.UnixNano() - d.wall.Load()); w > g {
		g = w
	}
	return g
}

// Check is what a decision calls first, at now (time.Now()): when the
// last beat is more than the threshold ago, the process may have stopped
// since, and Check beats, running react(gap) first if no other caller
// has reacted to this pause yet (react runs once per pause, and every
// concurrent Check waits until it returned). It costs two atomic loads
// when there is no gap. It reports whether it saw a pause.
func (d *Detector) Check(now time.Time, react func(gap time.Duration)) bool {
	if d.gap(now) <= d.threshold {
		return false
	}
	return d.slow(now, react)
}

// Beat records that the process ran at now (time.Now()); it reacts to a
// pause first as Check does, and reports whether it saw one. Called by a
// ticker every threshold/4 or so.
func (d *Detector) Beat(now time.Time, react func(gap time.Duration)) bool {
	if d.gap(now) <= d.threshold {
		d.store(now)
		return false
	}
	return d.slow(now, react)
}

func (d *Detector) slow(now time.Time, react func(gap time.Duration)) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gap(now)
	if g <= d.threshold {
		return false // another caller reacted to it meanwhile
	}
	if react != nil {
		react(g)
	}
	d.pauses.Add(1)
	d.last.Store(int64(g))
	d.seenAt.Store(max(int64(now.Sub(d.base)), 1))
	d.store(now)
	return true
}

// Since returns how long ago, at now, the last pause was seen (its
// reaction ran), and false when none was.
func (d *Detector) Since(now time.Time) (time.Duration, bool) {
	at := d.seenAt.Load()
	if at == 0 {
		return 0, false
	}
	return now.Sub(d.base) - time.Duration(at), true
}

func (d *Detector) store(now time.Time) {
	if m := int64(now.Sub(d.base)); m > d.mono.Load() {
		d.mono.Store(m)
	}
	d.wall.Store(now.UnixNano())
}

// Pauses returns how many pauses were seen, and the gap of the last one.
func (d *Detector) Pauses() (int64, time.Duration) {
	return d.pauses.Load(), time.Duration(d.last.Load())
}

// Backdate moves the last beat back by gap, as if the process had not run
// for that long: the next Check or Beat sees a pause when gap passes the
// threshold. For tests, which cannot stop a process in the middle of
// its own test.
func (d *Detector) Backdate(gap time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mono.Add(-int64(gap))
	d.wall.Add(-int64(gap))
}

// Age moves the last pause seen back by d, as if it had been seen that
// much earlier (Since grows by d); the beats stay. For tests.
func (d *Detector) Age(by time.Duration) {
	if at := d.seenAt.Load(); at != 0 {
		d.seenAt.Store(at - int64(by))
	}
}
