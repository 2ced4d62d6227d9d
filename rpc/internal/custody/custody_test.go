package custody

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/window"
)

var t0 = time.Unix(3600*500_000, 0)

// hourly is the check the tests count with: 10 hits an hour, fixed window.
func hourly(hits int64) window.Check {
	return window.Check{Algorithm: window.FixedWindow, Limit: 10, Window: time.Hour, Hits: hits}
}

// fixture is a custody of node "b" over a store on a manual clock, and a
// wall clock for tombs that the test moves.
type fixture struct {
	c     *Custody
	store *window.Store
	clock *window.ManualClock
	wall  time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{clock: window.NewManualClock(t0), wall: t0}
	f.store = window.NewStore(window.StoreConfig{Clock: f.clock})
	f.c = New(Config{Self: "b", Store: f.store, HandOffTimeout: 10 * time.Second, Now: func() time.Time { return f.wall }})
	return f
}

// hit applies n hits to key in f's store and returns what is left.
func (f *fixture) hit(t *testing.T, key string, n int64) int64 {
	t.Helper()
	d, err := f.store.Apply(key, hourly(n), f.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// remaining returns what st leaves of 10 an hour at t0.
func remaining(t *testing.T, st window.State) int64 {
	t.Helper()
	s := window.NewStore(window.StoreConfig{Clock: window.NewManualClock(t0)})
	s.MergeState("k", st, t0)
	d, err := s.Apply("k", hourly(0), t0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func mustRing(t *testing.T, members ...string) *ring.Ring {
	t.Helper()
	r, err := ring.New(members, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// keyOwnedBy returns a key that r gives to owner.
func keyOwnedBy(t *testing.T, r *ring.Ring, owner string) []byte {
	t.Helper()
	return keyWhere(t, func(k []byte) bool { return r.Owner(k) == owner })
}

// keyWhere returns the first key of a fixed sequence that ok takes.
func keyWhere(t *testing.T, ok func([]byte) bool) []byte {
	t.Helper()
	for i := range 10000 {
		if k := ring.Key(nil, "n", "user:"+strconv.Itoa(i)); ok(k) {
			return k
		}
	}
	t.Fatal("no such key")
	return nil
}

func TestDecideUnderTheGate(t *testing.T) {
	tests := []struct {
		name           string
		routed, now    uint64
		tomb           bool
		force          bool
		wantDecided    bool
		wantMoved      bool
		wantTombTarget string
	}{
		{name: "same ring, no tomb", routed: 3, now: 3, wantDecided: true},
		{name: "ring changed", routed: 3, now: 4, wantMoved: true},
		{name: "ring changed, reforwarded", routed: 3, now: 4, force: true, wantDecided: true, wantMoved: true},
		{name: "pulled away", routed: 3, now: 3, tomb: true, wantTombTarget: "c"},
		{name: "pulled away, reforwarded", routed: 3, now: 3, tomb: true, force: true, wantDecided: true, wantTombTarget: "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			if tt.tomb {
				f.hit(t, "k", 1)
				if _, _, err := f.c.GiveUp(context.Background(), "k", "c", "", true, nil); err != nil {
					t.Fatal(err)
				}
			}
			applied := false
			decided, moved, to := f.c.Decide([]byte("k"), tt.routed, func() uint64 { return tt.now }, tt.force, func() { applied = true })
			if decided != tt.wantDecided || applied != tt.wantDecided || moved != tt.wantMoved || to != tt.wantTombTarget {
				t.Fatalf("Decide = decided %v (applied %v), moved %v, to %q; want %v, %v, %q",
					decided, applied, moved, to, tt.wantDecided, tt.wantMoved, tt.wantTombTarget)
			}
		})
	}
}

func TestGiveUpTakesTheStateAndLeavesATomb(t *testing.T) {
	tests := []struct {
		name     string
		to       string
		owned    bool
		held     bool
		wantTomb string
	}{
		{name: "owned here", to: "c", owned: true, wantTomb: "c"},
		{name: "held for the puller (a copy, stand-in hits)", to: "c", held: true, wantTomb: "c"},
		{name: "neither owned nor held", to: "c"},
		{name: "to itself", to: "b", owned: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.hit(t, "k", 4)
			called := false
			st, ok, err := f.c.GiveUp(context.Background(), "k", tt.to, "", tt.owned, func() bool { called = true; return tt.held })
			if err != nil || !ok || !called {
				t.Fatalf("GiveUp: ok %v, also called %v, err %v", ok, called, err)
			}
			if got := remaining(t, st); got != 6 {
				t.Fatalf("given-up state leaves %d, want 6", got)
			}
			if _, held := f.store.Get("k"); held {
				t.Fatal("the store still holds the key")
			}
			if got := f.c.TombFor([]byte("k")); got != tt.wantTomb {
				t.Fatalf("TombFor = %q, want %q", got, tt.wantTomb)
			}
			if tt.wantTomb != "" {
				f.wall = f.wall.Add(10*time.Second + time.Nanosecond)
				if got := f.c.TombFor([]byte("k")); got != "" {
					t.Fatalf("TombFor after the hand-off timeout = %q, want none", got)
				}
			}
		})
	}
}

// A tomb of a key pulled for what this node held (a copy, stand-in hits)
// outlives ring changes: the ring says nothing about where the key's
// stand-in checks go while its puller takes them over (a ring that keeps
// changing after a kill dropped it, and this node then decided them from a
// fresh window again). It goes when its time ends or its puller leaves
// the ring.
func TestRingChangeKeepsTombsOfHeldKeys(t *testing.T) {
	ab := mustRing(t, "a", "b", "c")
	tests := []struct {
		name string
		next *ring.Ring
		wait time.Duration
		want string
	}{
		{"another member joins", mustRing(t, "a", "b", "c", "d"), 0, "c"},
		{"a member leaves, the puller stays", mustRing(t, "b", "c"), 0, "c"},
		{"the puller leaves", mustRing(t, "a", "b"), 0, ""},
		{"its time has ended", mustRing(t, "a", "b", "c", "d"), 10*time.Second + time.Nanosecond, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			held := keyWhere(t, func(k []byte) bool { return ab.Owner(k) != "b" && tt.next.Owner(k) != "b" })
			f.hit(t, string(held), 1)
			if _, _, err := f.c.GiveUp(context.Background(), string(held), "c", "", false, func() bool { return true }); err != nil {
				t.Fatal(err)
			}
			f.c.RingChanged(ab, tt.next, f.wall.Add(tt.wait))
			f.wall = f.wall.Add(tt.wait / 2) // TombFor reads the clock too: before the end
			if got := f.c.TombFor(held); got != tt.want {
				t.Errorf("tomb of a held key after the ring change: %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRingChangeDropsTombsOfKeysNoLongerOwned(t *testing.T) {
	f := newFixture(t)
	ab := mustRing(t, "a", "b")
	r2 := mustRing(t, "a", "b", "c")
	kept := keyWhere(t, func(k []byte) bool { return ab.Owner(k) == "b" && r2.Owner(k) == "b" })
	gone := keyOwnedBy(t, r2, "c")
	for _, k := range [][]byte{kept, gone} {
		f.hit(t, string(k), 1)
		if _, _, err := f.c.GiveUp(context.Background(), string(k), "c", "", true, nil); err != nil {
			t.Fatal(err)
		}
	}
	f.c.RingChanged(ab, r2, f.wall)
	if got := f.c.TombFor(kept); got != "c" {
		t.Errorf("tomb of a key still owned: %q, want c", got)
	}
	if got := f.c.TombFor(gone); got != "" {
		t.Errorf("tomb of a key no longer owned: %q, want none", got)
	}
}

func TestTakeOutSendsOnlyWhatWasCountedBeyondTheCopy(t *testing.T) {
	f := newFixture(t)
	f.hit(t, "k", 3) // the copy's 3 hits, taken over from c's process i1
	cp, _ := f.store.Get("k")
	f.c.NoteTakeover("k", Takeover{Owner: "c", Instance: "i1", State: cp})
	f.hit(t, "k", 2) // counted here beyond the copy

	b := f.c.TakeOut([]string{"k", "absent"}, "c", "i1")
	if len(b.Keys) != 1 || b.Keys[0] != "k" {
		t.Fatalf("TakeOut took %v, want [k]", b.Keys)
	}
	if got := remaining(t, b.States[0]); got != 8 {
		t.Fatalf("to the copy's own process: %d left, want 8 (only the 2 beyond the copy)", got)
	}
	if got := f.c.Stats().ReplicaReturned; got != 1 {
		t.Fatalf("ReplicaReturned = %d, want 1", got)
	}
	// The send failed: everything goes back, the takeover too.
	f.c.PutBack(b, f.clock.Now())
	f.c.End(b)
	if got := f.hit(t, "k", 0); got != 5 {
		t.Fatalf("after PutBack %d left, want 5", got)
	}
	// To another process of c: the whole state.
	b = f.c.TakeOut([]string{"k"}, "c", "i2")
	f.c.End(b)
	if got := remaining(t, b.States[0]); got != 5 {
		t.Fatalf("to another process: %d left, want 5 (the whole state)", got)
	}
}

func TestTakeoversOfItselfOrUnknownAreNotRemembered(t *testing.T) {
	for _, tk := range []Takeover{{Owner: "b", Instance: "i0"}, {Owner: "", Instance: "i1"}, {Owner: "c"}} {
		f := newFixture(t)
		f.hit(t, "k", 3)
		cp, _ := f.store.Get("k")
		tk.State = cp
		f.c.NoteTakeover("k", tk)
		b := f.c.TakeOut([]string{"k"}, tk.Owner, tk.Instance)
		f.c.End(b)
		if got := remaining(t, b.States[0]); got != 7 {
			t.Errorf("takeover %+v: %d left, want 7 (nothing subtracted)", tk, got)
		}
	}
}

func TestSweepForgetsEndedTakeovers(t *testing.T) {
	f := newFixture(t)
	f.hit(t, "k", 3)
	cp, _ := f.store.Get("k")
	f.c.NoteTakeover("k", Takeover{Owner: "c", Instance: "i1", State: cp})
	f.c.SweepTakenOver(t0.Add(time.Hour))
	b := f.c.TakeOut([]string{"k"}, "c", "i1")
	f.c.End(b)
	if got := remaining(t, b.States[0]); got != 7 || f.c.Stats().ReplicaReturned != 0 {
		t.Fatalf("after the copy's window ended: %d left (returned %d), want the whole state", got, f.c.Stats().ReplicaReturned)
	}
}

func TestGiveUpWaitsForAKeyOnItsWayOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		f.hit(t, "k", 2)
		b := f.c.TakeOut([]string{"k"}, "c", "")
		var got atomic.Bool
		go func() {
			_, ok, err := f.c.GiveUp(context.Background(), "k", "d", "", true, nil)
			got.Store(err == nil && !ok) // the key left with the push
		}()
		synctest.Wait()
		if got.Load() {
			t.Fatal("GiveUp returned while the key was on its way out")
		}
		f.c.End(b)
		synctest.Wait()
		if !got.Load() {
			t.Fatal("GiveUp did not return, or found the key, after the push ended")
		}
		// A caller that gives up first gets its context's error.
		f.hit(t, "k", 1)
		b = f.c.TakeOut([]string{"k"}, "c", "")
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, _, err := f.c.GiveUp(ctx, "k", "d", "", true, nil); errc <- err }()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("GiveUp with a cancelled ctx: %v, want context.Canceled", err)
		}
		f.c.End(b)
	})
}

// TestGiveUpWaitsForAPushThatTookTheKeyAfterItsWait: a pull that found
// the key not on its way out, but takes the gate only after a push took
// the key out (the push's TakeOut got the gate first, e.g. while a
// decision held it), waits for that push too. Answered at once, with no
// state, the puller would count the key as settled and decide it from its
// own window, before the push brought the key's count there
// (TestRollingReplacementKeepsCounts admitted 101 of 100 so).
func TestGiveUpWaitsForAPushThatTookTheKeyAfterItsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		f.hit(t, "k", 10) // used up
		waited, proceed := make(chan struct{}), make(chan struct{})
		calls := 0 // touched by the GiveUp goroutine only
		f.c.hooks.BeforeGiveUpGate = func(string) {
			if calls++; calls == 1 {
				close(waited)
				<-proceed
			}
		}
		type result struct {
			ok  bool
			err error
		}
		res := make(chan result, 1)
		go func() {
			_, ok, err := f.c.GiveUp(context.Background(), "k", "c", "", false, nil)
			res <- result{ok, err}
		}()
		<-waited // the pull found the key here, not on its way out
		b := f.c.TakeOut([]string{"k"}, "c", "")
		if len(b.Keys) != 1 || remaining(t, b.States[0]) != 0 {
			t.Fatalf("the push took %v, want k used up", b.Keys)
		}
		close(proceed)
		synctest.Wait()
		select {
		case r := <-res:
			t.Fatalf("the pull was answered (state %v, error %v) while the push carrying the key's count was on its way", r.ok, r.err)
		default:
		}
		f.c.End(b) // the push was answered: the puller has merged the count
		synctest.Wait()
		select {
		case r := <-res:
			if r.ok || r.err != nil {
				t.Fatalf("the pull after the push: state %v, error %v; want none (the push took it)", r.ok, r.err)
			}
		default:
			t.Fatal("the pull was not answered after the push ended")
		}
		if calls != 2 {
			t.Fatalf("GiveUp waited %d times, want 2 (before the push, then for it)", calls)
		}
	})
}

func TestMarkOutgoingIfSkipsKeysOnTheirWayOut(t *testing.T) {
	f := newFixture(t)
	f.hit(t, "busy", 1)
	b := f.c.TakeOut([]string{"busy"}, "c", "")
	ch := make(chan struct{})
	var asked []string
	marked := f.c.MarkOutgoingIf([]string{"busy", "x", "y"}, ch, func(k string) bool { asked = append(asked, k); return k == "x" })
	if len(marked) != 1 || marked[0] != "x" || len(asked) != 2 {
		t.Fatalf("marked %v (asked %v), want [x] (asked x and y)", marked, asked)
	}
	f.c.ClearOutgoing(marked, ch)
	close(ch)
	f.c.End(b)
	if err := f.c.WaitOutgoing(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
}

func TestMovingInUntilEveryMemberIsDone(t *testing.T) {
	f := newFixture(t)
	a := mustRing(t, "a", "c")
	abc := mustRing(t, "a", "b", "c")
	moved := keyOwnedBy(t, abc, "b")
	f.c.RingChanged(a, abc, f.wall)
	mi := f.c.Awaiting(abc, moved)
	if mi == nil || mi.Prev != a {
		t.Fatalf("Awaiting = %+v, want the keys moved from a's ring", mi)
	}
	if other := keyOwnedBy(t, abc, "a"); f.c.Awaiting(abc, other) != nil {
		t.Fatal("awaiting a key this node does not own")
	}
	if f.c.Awaiting(a, moved) != nil {
		t.Fatal("awaiting under another ring")
	}
	f.c.NoteDone("a", abc.Fingerprint())
	if f.c.Awaiting(abc, moved) == nil {
		t.Fatal("no longer awaiting after one of two members said done")
	}
	f.c.NoteDone("c", "another ring")
	if f.c.Awaiting(abc, moved) == nil {
		t.Fatal("a done for another ring counted")
	}
	f.c.NoteDone("c", abc.Fingerprint())
	if f.c.Awaiting(abc, moved) != nil {
		t.Fatal("still awaiting after every member said done")
	}
}

func TestMovingInEndsAtTheHandOffTimeout(t *testing.T) {
	f := newFixture(t)
	abc := mustRing(t, "a", "b", "c")
	f.c.RingChanged(nil, abc, f.wall) // from the bootstrap ring: everything moved in
	k := keyOwnedBy(t, abc, "b")
	f.wall = f.wall.Add(10 * time.Second)
	if f.c.Awaiting(abc, k) == nil {
		t.Fatal("not awaiting within the hand-off timeout")
	}
	f.wall = f.wall.Add(time.Nanosecond)
	if f.c.Awaiting(abc, k) != nil {
		t.Fatal("awaiting after the hand-off timeout")
	}
	if got := f.c.Stats().HandOffTimeouts; got != 1 {
		t.Fatalf("HandOffTimeouts = %d, want 1", got)
	}
}

// awaitingKeyOfB returns a fixture whose ring went to a, b, c (from
// none), a key b owns under it, and the move the key awaits.
func awaitingKeyOfB(t *testing.T) (*fixture, *MovingIn, []byte) {
	t.Helper()
	f := newFixture(t)
	abc := mustRing(t, "a", "b", "c")
	f.c.RingChanged(nil, abc, f.wall)
	k := keyOwnedBy(t, abc, "b")
	return f, f.c.Awaiting(abc, k), k
}

func TestSettlePullsOnceAndOthersWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, mi, k := awaitingKeyOfB(t)
		release := make(chan struct{})
		var pulls atomic.Int32
		var from []string
		pull := func(fr []string) bool { pulls.Add(1); from = fr; <-release; return true }
		var settled atomic.Int32
		for range 3 {
			go func() {
				if f.c.Settle(context.Background(), mi, k, pull) {
					settled.Add(1)
				}
			}()
		}
		synctest.Wait()
		if pulls.Load() != 1 || settled.Load() != 0 {
			t.Fatalf("while pulling: %d pulls, %d settled; want 1, 0", pulls.Load(), settled.Load())
		}
		if len(from) != 2 || from[0] != "a" || from[1] != "c" {
			t.Fatalf("pulled from %v, want [a c]", from)
		}
		close(release)
		synctest.Wait()
		if settled.Load() != 3 {
			t.Fatalf("%d of 3 settled after the pull", settled.Load())
		}
		f.c.Settle(context.Background(), mi, k, func([]string) bool { t.Fatal("pulled a settled key again"); return true })
	})
}

// A pull that did not get the key's state leaves it unsettled: the checks
// that waited for it are told so, and the next check pulls again.
func TestSettleAfterAFailedPullPullsAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, mi, k := awaitingKeyOfB(t)
		release := make(chan struct{})
		var pulls atomic.Int32
		fail := func([]string) bool { pulls.Add(1); <-release; return false }
		var settled, answered atomic.Int32
		for range 3 {
			go func() {
				if f.c.Settle(context.Background(), mi, k, fail) {
					settled.Add(1)
				}
				answered.Add(1)
			}()
		}
		synctest.Wait()
		close(release)
		synctest.Wait()
		if pulls.Load() != 1 || answered.Load() != 3 || settled.Load() != 0 {
			t.Fatalf("%d pulls, %d answered, %d settled; want 1, 3, 0", pulls.Load(), answered.Load(), settled.Load())
		}
		if !f.c.Settle(context.Background(), mi, k, func([]string) bool { pulls.Add(1); return true }) || pulls.Load() != 2 {
			t.Fatalf("the next check after a failed pull: %d pulls in all, want 2 and settled", pulls.Load())
		}
		f.c.Settle(context.Background(), mi, k, func([]string) bool { t.Fatal("pulled a settled key again"); return true })
	})
}

// An operator's reset replaces a key's state with a fresh one (nothing
// counted, the same algorithm and window) and forgets the copy it was
// taken over from: what it counts after goes back whole, never less the
// old copy. A key held nowhere stays absent.
func TestResetStartsTheKeyAfreshAndForgetsItsTakeover(t *testing.T) {
	f := newFixture(t)
	f.hit(t, "k", 3) // taken over from c's process i1
	cp, _ := f.store.Get("k")
	f.c.NoteTakeover("k", Takeover{Owner: "c", Instance: "i1", State: cp})
	f.hit(t, "k", 4)

	before, ok := f.c.Reset("k", f.clock.Now())
	if !ok || remaining(t, before) != 3 {
		t.Fatalf("Reset returned %v (%d left), want the state of 7 hits (3 left)", ok, remaining(t, before))
	}
	st, held := f.store.Get("k")
	if !held || st.IsZero() || st.Algorithm() != window.FixedWindow || st.Window() != time.Hour || remaining(t, st) != 10 {
		t.Fatalf("after Reset the key holds %+v (held %v), want a fresh fixed window of an hour", st.Describe(t0), held)
	}
	f.hit(t, "k", 2)
	b := f.c.TakeOut([]string{"k"}, "c", "i1")
	f.c.End(b)
	if got := remaining(t, b.States[0]); got != 8 {
		t.Fatalf("to the copy's process after a reset: %d left, want 8 (the 2 hits since, not less the old copy)", got)
	}
	if _, ok := f.c.Reset("absent", f.clock.Now()); ok {
		t.Fatal("Reset of a key held nowhere said it held one")
	}
	if _, held := f.store.Get("absent"); held {
		t.Fatal("Reset of an absent key made one")
	}
}

// Relearn (a pause): every key this node owns is awaited again from every
// other member, stale, whatever they said done before; a done for the ring
// said after it (a member whose ring went without this node and back,
// handing its keys back) ends the wait for that member; a ring change
// meanwhile keeps the stale keys awaited; RelearnTimeouts hand-off
// timeouts end it.
func TestRelearnAwaitsEveryOwnKeyFromEveryMember(t *testing.T) {
	f := newFixture(t)
	abc := mustRing(t, "a", "b", "c")
	f.c.NoteDone("a", abc.Fingerprint())
	f.c.NoteDone("c", abc.Fingerprint())
	own, other := keyOwnedBy(t, abc, "b"), keyOwnedBy(t, abc, "a")
	if f.c.Awaiting(abc, own) != nil {
		t.Fatal("awaiting before the pause")
	}
	if !f.c.Relearn(abc, f.wall) {
		t.Fatal("Relearn with two other members: nothing to learn")
	}
	mi := f.c.Awaiting(abc, own)
	if mi == nil || !mi.Stale || mi.Prev != abc {
		t.Fatalf("after Relearn, Awaiting(own key) = %+v; want a stale MovingIn of the same ring", mi)
	}
	if f.c.Awaiting(abc, other) != nil {
		t.Fatal("awaiting a key this node does not own")
	}
	var asked []string
	if f.c.Settle(context.Background(), mi, own, func(from []string) bool { asked = from; return false }); len(asked) != 2 {
		t.Fatalf("the pull asked %v, want both other members (their dones came before the pause)", asked)
	}
	f.c.NoteDone("a", abc.Fingerprint())
	if f.c.Settle(context.Background(), mi, own, func(from []string) bool { asked = from; return true }); !slices.Equal(asked, []string{"c"}) {
		t.Fatalf("after a's done, the pull asked %v, want [c]", asked)
	}
	// Settled: no pull any more.
	if !f.c.Settle(context.Background(), mi, own, func([]string) bool { t.Fatal("pulled a settled key"); return false }) {
		t.Fatal("a settled key is not settled")
	}
	// A ring change keeps the stale wait for what was awaited.
	f.c.Relearn(abc, f.wall)
	abcd := mustRing(t, "a", "b", "c", "d")
	still := keyWhere(t, func(k []byte) bool { return abc.Owner(k) == "b" && abcd.Owner(k) == "b" })
	f.c.RingChanged(abc, abcd, f.wall)
	if mi := f.c.Awaiting(abcd, still); mi == nil || !mi.Stale {
		t.Fatalf("after a ring change during a relearn: %+v, want still stale", mi)
	}
	f.wall = f.wall.Add(10 * time.Second)
	if f.c.Awaiting(abcd, still) == nil {
		t.Fatal("a relearn's wait ended at one hand-off timeout, want RelearnTimeouts")
	}
	f.wall = f.wall.Add((RelearnTimeouts-1)*10*time.Second + time.Nanosecond)
	if f.c.Awaiting(abcd, still) != nil {
		t.Fatal("awaiting after RelearnTimeouts hand-off timeouts")
	}
	if f.c.Relearn(mustRing(t, "b"), f.wall) {
		t.Fatal("Relearn alone in the ring: nothing to learn from, want false")
	}
}
