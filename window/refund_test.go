package window

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// sameDecision reports whether two decisions are equal in every field.
func sameDecision(a, b Decision) bool {
	return a.Allowed == b.Allowed && a.Limit == b.Limit && a.Remaining == b.Remaining &&
		a.ResetTime.Equal(b.ResetTime) && a.RetryAfter == b.RetryAfter && a.Delay == b.Delay && a.NoRoom == b.NoRoom
}

func fmtDecision(d Decision) string {
	return fmt.Sprintf("{allowed %v remaining %d reset %d retry %s delay %s}",
		d.Allowed, d.Remaining, d.ResetTime.UnixNano(), d.RetryAfter, d.Delay)
}

func mustRefund(t *testing.T, s *Store, key string, c Check, appliedAt, now time.Time) bool {
	t.Helper()
	ok, err := s.Refund([]byte(key), c, appliedAt, now)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// secs is a time from t0, which starts every window used here.
func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// A refund leaves the key as if the refunded check had never been applied
// (the following peek and check get the same decisions as on a store that
// never saw it), at the windows' edges too; where exactness is not
// promised (a bucket updated after the check), it gives back less.
func TestRefundPerAlgorithm(t *testing.T) {
	type hit struct {
		hits int64
		at   time.Duration // from t0
	}
	fixed := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Minute}
	sliding := Check{Algorithm: SlidingWindow, Limit: 10, Window: time.Minute}
	token := Check{Algorithm: TokenBucket, Limit: 10, Window: 10 * time.Second} // 1 hit a second
	leaky := Check{Algorithm: LeakyBucket, Limit: 10, Window: 10 * time.Second}
	cases := []struct {
		name     string
		c        Check
		applied  []hit
		refund   int           // index into applied
		at       time.Duration // of the refund
		then     time.Duration // of the following peek and check
		thenHits int64
		want     bool // Refund's answer
		// exact: the following decisions equal those of a store that
		// never saw the refunded check; else the peek's remaining is
		// wantRemaining, at most the exact one.
		exact         bool
		wantRemaining int64
	}{
		{name: "fixed at once", c: fixed, applied: []hit{{2, secs(10)}, {1, secs(20)}},
			refund: 1, at: secs(20), then: secs(30), thenHits: 3, want: true, exact: true},
		{name: "fixed at the window's last ns", c: fixed, applied: []hit{{2, secs(10)}, {3, secs(20)}},
			refund: 1, at: time.Minute - 1, then: time.Minute - 1, thenHits: 3, want: true, exact: true},
		{name: "fixed full window, the refund admits one", c: fixed,
			applied: []hit{{1, secs(1)}, {1, secs(2)}, {1, secs(3)}, {1, secs(4)}, {1, secs(5)}},
			refund:  2, at: secs(6), then: secs(7), thenHits: 1, want: true, exact: true},
		{name: "fixed window ended", c: fixed, applied: []hit{{3, secs(50)}},
			refund: 0, at: time.Minute, then: time.Minute, thenHits: 5, want: false, exact: true},
		{name: "fixed applied at a window's last ns, refunded at the next's first", c: fixed,
			applied: []hit{{1, secs(30)}, {2, time.Minute - 1}},
			refund:  1, at: time.Minute, then: time.Minute, thenHits: 5, want: false, exact: true},
		{name: "fixed refunded in a later window after a check", c: fixed,
			applied: []hit{{3, secs(50)}, {2, secs(70)}},
			refund:  0, at: secs(80), then: secs(90), thenHits: 3, want: false, exact: true},

		{name: "sliding current window", c: sliding, applied: []hit{{4, secs(10)}, {3, secs(20)}},
			refund: 1, at: secs(30), then: secs(40), thenHits: 6, want: true, exact: true},
		{name: "sliding previous window", c: sliding, applied: []hit{{4, secs(10)}, {3, secs(50)}},
			refund: 1, at: secs(70), then: secs(70), thenHits: 6, want: true, exact: true},
		{name: "sliding previous window, checked since", c: sliding,
			applied: []hit{{4, secs(10)}, {3, secs(50)}, {2, secs(65)}},
			refund:  1, at: secs(70), then: secs(80), thenHits: 5, want: true, exact: true},
		{name: "sliding applied at a window's last ns, refunded at the next's first", c: sliding,
			applied: []hit{{10, time.Minute - 1}},
			refund:  0, at: time.Minute, then: time.Minute, thenHits: 10, want: true, exact: true},
		{name: "sliding two windows back", c: sliding, applied: []hit{{5, secs(30)}, {5, secs(40)}},
			refund: 0, at: 2 * time.Minute, then: 2 * time.Minute, thenHits: 10, want: false, exact: true},
		{name: "sliding refunded, then the window rolls: a denial", c: sliding,
			applied: []hit{{4, secs(10)}, {3, secs(20)}},
			refund:  1, at: secs(30), then: secs(70), thenHits: 7, want: true, exact: true},

		{name: "token at once", c: token, applied: []hit{{3, secs(1)}, {2, secs(2)}},
			refund: 1, at: secs(2), then: secs(2), thenHits: 8, want: true, exact: true},
		{name: "token later, key untouched since", c: token, applied: []hit{{3, secs(1)}, {2, secs(2)}},
			refund: 1, at: secs(3.5), then: secs(3.5), thenHits: 9, want: true, exact: true},
		{name: "token full bucket at once", c: token, applied: []hit{{10, secs(1)}},
			refund: 0, at: secs(1), then: secs(1), thenHits: 10, want: true, exact: true},
		{name: "token drained before the refund", c: token, applied: []hit{{1, 0}},
			refund: 0, at: secs(5), then: secs(5), thenHits: 10, want: false, exact: true},
		// 5 at 1s, 2 (refunded) at 1.5s, 3 at 2s: 9 owed at 2s, 7 at 4s.
		// What drained between 1.5s and 2s (0.5) may have been the
		// refunded check's, so 1.5 comes back: 5.5 owed, 4 remaining (a
		// store without it owes 5; giving back 2 - 2.5 drained since 1.5s
		// would give back nothing: 3 remaining).
		{name: "token updated since: conservative", c: token,
			applied: []hit{{5, secs(1)}, {2, secs(1.5)}, {3, secs(2)}},
			refund:  1, at: secs(4), then: secs(4), thenHits: 5, want: true, wantRemaining: 4},

		{name: "leaky at once", c: leaky, applied: []hit{{3, secs(1)}, {2, secs(2)}},
			refund: 1, at: secs(2), then: secs(2), thenHits: 1, want: true, exact: true},
		{name: "leaky later, key untouched since", c: leaky, applied: []hit{{3, secs(1)}, {4, secs(2)}},
			refund: 1, at: secs(3), then: secs(3.5), thenHits: 8, want: true, exact: true},
		{name: "leaky updated since: conservative", c: leaky,
			applied: []hit{{5, secs(1)}, {2, secs(1.5)}, {3, secs(2)}},
			refund:  1, at: secs(4), then: secs(4), thenHits: 5, want: true, wantRemaining: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, model := NewStore(StoreConfig{}), NewStore(StoreConfig{})
			for i, h := range tc.applied {
				c := tc.c
				c.Hits = h.hits
				if d := mustApply(t, got, "k", c, t0.Add(h.at)); !d.Allowed {
					t.Fatalf("check %d not allowed: %+v", i, d)
				}
				if i != tc.refund {
					mustApply(t, model, "k", c, t0.Add(h.at))
				}
			}
			c := tc.c
			c.Hits = tc.applied[tc.refund].hits
			if ok := mustRefund(t, got, "k", c, t0.Add(tc.applied[tc.refund].at), t0.Add(tc.at)); ok != tc.want {
				t.Fatalf("Refund = %v, want %v", ok, tc.want)
			}
			for _, hits := range []int64{0, tc.thenHits} {
				c.Hits = hits
				dg := mustApply(t, got, "k", c, t0.Add(tc.then))
				dm := mustApply(t, model, "k", c, t0.Add(tc.then))
				switch {
				case tc.exact && !sameDecision(dg, dm):
					t.Fatalf("hits %d after the refund: %s, without the check %s", hits, fmtDecision(dg), fmtDecision(dm))
				case tc.exact:
				case dg.Allowed && !dm.Allowed, hits == 0 && dg.Remaining > dm.Remaining:
					t.Fatalf("hits %d after the refund: %s, more than without the check %s", hits, fmtDecision(dg), fmtDecision(dm))
				case hits == 0 && dg.Remaining != tc.wantRemaining:
					t.Fatalf("peek after the refund: %s, want remaining %d", fmtDecision(dg), tc.wantRemaining)
				}
			}
		})
	}
}

// Refunding more than was counted (twice, or more hits than the key
// holds) floors at zero: the key is back at full capacity, never above.
func TestRefundFloorsAtZero(t *testing.T) {
	for _, alg := range allAlgorithms {
		s := NewStore(StoreConfig{})
		c := Check{Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 2}
		now := t0.Add(time.Second)
		mustApply(t, s, "k", c, now)
		c.Hits = 3
		mustApply(t, s, "k", c, now)
		if !mustRefund(t, s, "k", c, now, now) {
			t.Fatalf("%s: first refund gave nothing back", alg)
		}
		// The second refund of the same check takes the other check's 2
		// (a misuse the store cannot tell), and no more.
		if !mustRefund(t, s, "k", c, now, now) {
			t.Fatalf("%s: second refund gave nothing back", alg)
		}
		if st, _ := s.Get("k"); st.st.a != 0 || st.st.b != 0 {
			t.Fatalf("%s: state %+v after refunding more than was counted", alg, st.st)
		}
		if mustRefund(t, s, "k", c, now, now) {
			t.Fatalf("%s: a refund of an empty key gave something back", alg)
		}
		c.Hits = 0
		if d := mustApply(t, s, "k", c, now); !d.Allowed || d.Remaining != 5 || !d.ResetTime.Equal(now) {
			t.Fatalf("%s: peek after refunds %s, want remaining 5 (the capacity), reset now", alg, fmtDecision(d))
		}
		c.Hits = 5
		if d := mustApply(t, s, "k", c, now); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: 5 hits after refunds: %s", alg, fmtDecision(d))
		}
		c.Hits = 1
		if d := mustApply(t, s, "k", c, now); d.Allowed {
			t.Fatalf("%s: a 6th hit was admitted after refunds: %s", alg, fmtDecision(d))
		}
	}
}

// A refund of a key that holds no state creates none; one of a state built
// for another algorithm or window, or of a state last updated before the
// check, changes nothing; so does one of a peek or of hits above the
// capacity (never consumed).
func TestRefundLeavesOtherStatesAlone(t *testing.T) {
	s := NewStore(StoreConfig{})
	now := t0.Add(time.Second)
	for _, alg := range allAlgorithms {
		c := Check{Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 1}
		if mustRefund(t, s, "nobody", c, now, now) || s.Len() != 0 {
			t.Fatalf("%s: refund of a key with no state: %d keys", alg, s.Len())
		}
	}
	base := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Minute, Hits: 2}
	for _, alg := range allAlgorithms {
		key := "k" + alg.String()
		c := base
		c.Algorithm = alg
		mustApply(t, s, key, c, now)
		before, _ := s.Get(key)
		others := []Check{
			{Algorithm: alg%4 + 1, Limit: 5, Window: time.Minute, Hits: 2}, // another algorithm
			{Algorithm: alg, Limit: 5, Window: 2 * time.Minute, Hits: 2},   // another window
			{Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 0},       // a peek
			{Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 6},       // above the capacity
		}
		for _, o := range others {
			if mustRefund(t, s, key, o, now, now) {
				t.Fatalf("%s: refund of %+v gave something back", alg, o)
			}
		}
		if after, _ := s.Get(key); after != before {
			t.Fatalf("%s: state %+v, was %+v", alg, after.st, before.st)
		}
	}
	// A bucket state last updated before the check: not the check's.
	c := Check{Algorithm: TokenBucket, Limit: 5, Window: time.Minute, Hits: 2}
	if mustRefund(t, s, "k"+TokenBucket.String(), c, now.Add(time.Nanosecond), now.Add(time.Second)) {
		t.Fatal("a refund of a check applied after the state's last update gave something back")
	}
	// A key taken away holds no state here.
	s.Take("k" + TokenBucket.String())
	n := s.Len()
	if mustRefund(t, s, "k"+TokenBucket.String(), c, now, now) || s.Len() != n {
		t.Fatal("a refund of a taken key gave something back")
	}
	// A change of limit keeps the key (as for a check): the hits come back.
	c.Algorithm, c.Limit = LeakyBucket, 4
	if !mustRefund(t, s, "k"+LeakyBucket.String(), c, now, now) {
		t.Fatal("a refund under a changed limit gave nothing back")
	}
}

// Refund's errors name the field, wrap ErrInvalid and change nothing.
func TestRefundErrors(t *testing.T) {
	s := NewStore(StoreConfig{})
	now := t0.Add(time.Second)
	c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Minute, Hits: 2}
	mustApply(t, s, "k", c, now)
	before, _ := s.Get("k")
	bad := c
	bad.Limit = 0
	cases := []struct {
		c              Check
		appliedAt, now time.Time
		field          string
	}{
		{bad, now, now, "limit"},
		{c, time.Time{}, now, "applied_at"},
		{c, now.Add(time.Nanosecond), now, "applied_at"},
		{c, now, time.Time{}, "now"},
	}
	for _, tc := range cases {
		ok, err := s.Refund([]byte("k"), tc.c, tc.appliedAt, tc.now)
		var fe *FieldError
		if ok || !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v at %v, %v: %v, %v; want a FieldError for %q", tc.c, tc.appliedAt, tc.now, ok, err, tc.field)
		}
	}
	if after, _ := s.Get("k"); after != before {
		t.Fatalf("state %+v after refused refunds, was %+v", after.st, before.st)
	}
}

// A key that a refund brings back to full capacity can be swept at once
// (the shard's bound on its expiries follows the refund).
func TestRefundedKeyIsSwept(t *testing.T) {
	for _, alg := range allAlgorithms {
		s := NewStore(StoreConfig{})
		c := Check{Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 2}
		now := t0.Add(time.Second)
		mustApply(t, s, "k", c, now)
		mustRefund(t, s, "k", c, now, now)
		if n := s.Sweep(now); n != 1 || s.Len() != 0 {
			t.Fatalf("%s: swept %d, %d keys left", alg, n, s.Len())
		}
	}
}

// A check applied while the clock was behind the key (counted in the
// key's later window, or at its later time) and then refunded gives back
// at most its hits: at every later time the key has no more room than a
// store that never saw the check.
func TestRefundAfterClockWentBack(t *testing.T) {
	for _, alg := range allAlgorithms {
		got, model := NewStore(StoreConfig{}), NewStore(StoreConfig{})
		c := Check{Algorithm: alg, Limit: 10, Window: time.Minute}
		for _, h := range []struct {
			hits int64
			at   time.Duration
		}{{4, secs(30)}, {5, secs(70)}} {
			c.Hits = h.hits
			mustApply(t, got, "k", c, t0.Add(h.at))
			mustApply(t, model, "k", c, t0.Add(h.at))
		}
		c.Hits = 1
		back := t0.Add(secs(50)) // the clock went back past the window's start
		if d := mustApply(t, got, "k", c, back); !d.Allowed {
			t.Fatalf("%s: %s", alg, fmtDecision(d))
		}
		mustRefund(t, got, "k", c, back, t0.Add(secs(80)))
		for _, later := range []float64{80, 100, 119, 120, 130, 150, 179, 180, 200} {
			p := c
			p.Hits = 0
			dg := mustApply(t, got, "k", p, t0.Add(secs(later)))
			dm := mustApply(t, model, "k", p, t0.Add(secs(later)))
			if (dg.Allowed && !dm.Allowed) || dg.Remaining > dm.Remaining {
				t.Fatalf("%s at %vs: %s, more room than without the check: %s", alg, later, fmtDecision(dg), fmtDecision(dm))
			}
		}
	}
}

// Checks and their refunds from several goroutines on one key: every
// admitted check given back leaves the key at full capacity, and the
// count never passes the limit meanwhile.
func TestRefundConcurrent(t *testing.T) {
	for _, alg := range allAlgorithms {
		s := NewStore(StoreConfig{})
		c := Check{Algorithm: alg, Limit: 3, Window: time.Minute, Hits: 1}
		now := t0.Add(time.Second)
		var wg sync.WaitGroup
		var mu sync.Mutex
		held, most := 0, 0
		for range 4 {
			wg.Go(func() {
				for range 300 {
					d, err := s.Apply("k", c, now)
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						continue
					}
					// held counts checks between their admission
					// and their refund: never more than the store
					// holds.
					mu.Lock()
					held++
					most = max(most, held)
					mu.Unlock()
					mu.Lock()
					held--
					mu.Unlock()
					if ok, err := s.Refund([]byte("k"), c, now, now); err != nil || !ok {
						t.Errorf("%s: refund %v, %v", alg, ok, err)
						return
					}
				}
			})
		}
		wg.Wait()
		c.Hits = 0
		if d := mustApply(t, s, "k", c, now); d.Remaining != 3 {
			t.Fatalf("%s: every check refunded, remaining %d", alg, d.Remaining)
		}
		if most > 3 {
			t.Fatalf("%s: %d checks held at once, over the limit 3", alg, most)
		}
	}
}

// Random checks at increasing times, some of the allowed ones refunded
// later, against a model store that saw every check the refunded store
// allowed except the refunded ones (i.e. the store as if they had been
// refused, every other check decided as it was):
//
//   - the refunded store never allows a check the model would deny (and
//     never shows more remaining), whichever the algorithm;
//   - for the windows, and for the buckets when each refund follows its
//     check before any other check of the key, the two answer exactly
//     alike whenever no refund of the key is pending.
//
// A check the refunded store denies while a refund is pending goes to
// neither: the model might admit it (it lacks the pending hits), and a
// model that then counts what the other store never did could not bound
// it.
func TestRefundAgainstModel(t *testing.T) {
	seeds := 24
	if testing.Short() {
		seeds = 5
	}
	for _, alg := range allAlgorithms {
		for _, atOnce := range []bool{false, true} {
			for seed := range seeds {
				refundModelRun(t, alg, atOnce, uint64(seed))
			}
		}
	}
}

type pendingRefund struct {
	hits      int64
	appliedAt time.Time
	due       int // the step at which it is refunded
}

func refundModelRun(t *testing.T, alg Algorithm, atOnce bool, seed uint64) {
	t.Helper()
	stream := uint64(alg) << 1
	if atOnce {
		stream |= 1
	}
	r := rand.New(rand.NewPCG(seed, stream))
	w := time.Duration(1+r.IntN(4)) * time.Second
	c := Check{Algorithm: alg, Limit: int64(1 + r.IntN(8)), Window: w}
	if (alg == TokenBucket || alg == LeakyBucket) && r.IntN(2) == 0 {
		c.Burst = c.Limit + int64(r.IntN(int(c.Limit)+1))
	}
	exactAlg := alg == FixedWindow || alg == SlidingWindow || atOnce
	got, model := NewStore(StoreConfig{}), NewStore(StoreConfig{})
	keys := []string{"a", "b"}
	pending := map[string][]pendingRefund{}
	now := t0.Add(time.Duration(r.Int64N(int64(w))))
	where := func(step int, key, what string) string {
		return fmt.Sprintf("%s atOnce=%v seed %d %+v step %d key %s at %s: %s",
			alg, atOnce, seed, c, step, key, now.Sub(t0), what)
	}
	// compare peeks both stores at now.
	compare := func(step int, key string) {
		p := c
		p.Hits = 0
		dg := mustApply(t, got, key, p, now)
		dm := mustApply(t, model, key, p, now)
		if exactAlg && len(pending[key]) == 0 {
			if !sameDecision(dg, dm) {
				t.Fatalf("%s", where(step, key, "peek "+fmtDecision(dg)+", model "+fmtDecision(dm)))
			}
			return
		}
		if (dg.Allowed && !dm.Allowed) || dg.Remaining > dm.Remaining || dg.ResetTime.Before(dm.ResetTime) {
			t.Fatalf("%s", where(step, key, "peek "+fmtDecision(dg)+", more room than the model "+fmtDecision(dm)))
		}
	}
	refund := func(step int, key string, p pendingRefund) {
		rc := c
		rc.Hits = p.hits
		mustRefund(t, got, key, rc, p.appliedAt, now)
		compare(step, key)
	}
	for step := range 150 {
		switch x := r.IntN(20); {
		case x < 6: // same ns
		case x < 15:
			now = now.Add(time.Duration(1 + r.Int64N(int64(w)/4)))
		case x < 17: // to a window's edge, or just before it
			start := floorDiv(now.UnixNano(), int64(w)) * int64(w)
			edge := start + int64(w) - int64(r.IntN(2))
			if edge > now.UnixNano() {
				now = time.Unix(0, edge)
			}
		default:
			now = now.Add(time.Duration(int64(w) + r.Int64N(2*int64(w))))
		}
		key := keys[r.IntN(len(keys))]
		// Refunds due.
		var keep []pendingRefund
		for _, p := range pending[key] {
			if p.due <= step {
				refund(step, key, p)
			} else {
				keep = append(keep, p)
			}
		}
		pending[key] = keep
		compare(step, key)

		ck := c
		ck.Hits = int64(r.IntN(int(c.Capacity()) + 2))
		dg := mustApply(t, got, key, ck, now)
		refundIt := dg.Allowed && ck.Hits > 0 && r.IntN(3) == 0
		switch {
		case refundIt:
			p := pendingRefund{hits: ck.Hits, appliedAt: now, due: step + 1 + r.IntN(8)}
			if atOnce {
				// Right after the check, at once or a little later.
				if r.IntN(2) == 0 {
					now = now.Add(time.Duration(1 + r.Int64N(int64(w)/2)))
				}
				refund(step, key, p)
			} else {
				pending[key] = append(pending[key], p)
			}
		case exactAlg && len(pending[key]) == 0:
			if dm := mustApply(t, model, key, ck, now); !sameDecision(dg, dm) {
				t.Fatalf("%s", where(step, key, fmt.Sprintf("%d hits: %s, model %s", ck.Hits, fmtDecision(dg), fmtDecision(dm))))
			}
		case dg.Allowed && ck.Hits > 0:
			if dm := mustApply(t, model, key, ck, now); !dm.Allowed || dm.Remaining < dg.Remaining {
				t.Fatalf("%s", where(step, key, fmt.Sprintf("%d hits allowed: %s, model %s", ck.Hits, fmtDecision(dg), fmtDecision(dm))))
			}
		}
	}
	// Whatever is still pending comes back at the end.
	now = now.Add(time.Duration(r.Int64N(int64(w))))
	for _, key := range keys {
		for _, p := range pending[key] {
			refund(150, key, p)
		}
		pending[key] = nil
		compare(150, key)
	}
}

// One check and its refund at once, on a key that holds state.
func BenchmarkRefund(b *testing.B) {
	for _, alg := range allAlgorithms {
		b.Run(alg.String(), func(b *testing.B) {
			s := NewStore(StoreConfig{})
			key := []byte(benchKeyPrefix + "1")
			c := Check{Algorithm: alg, Limit: 1000, Window: time.Minute, Hits: 1}
			now := t0.Add(time.Second)
			if _, err := s.ApplyBytes(key, c, now); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				_, _ = s.ApplyBytes(key, c, now)
				if ok, err := s.Refund(key, c, now, now); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// A bucket rerated drains at the new rate from then on: a region whose
// share of a global token bucket was lowered from 10/s to 1/s right after
// it spent its burst has 1 token a second later, not 10; and what drained
// before the rerate drained at the old rate.
func TestRerate(t *testing.T) {
	s := NewStore(StoreConfig{})
	t0 := time.Unix(1_800_000_000, 0)
	c := Check{Algorithm: TokenBucket, Limit: 10, Burst: 10, Window: time.Second, Hits: 10}
	if d, _ := s.Apply("k", c, t0); !d.Allowed {
		t.Fatal("the burst was refused")
	}
	half := t0.Add(500 * time.Millisecond) // 5 tokens back at 10/s
	low := Check{Algorithm: TokenBucket, Limit: 1, Burst: 10, Window: time.Second}
	if ok, err := s.Rerate([]byte("k"), low, half); !ok || err != nil {
		t.Fatalf("rerate: %v, %v", ok, err)
	}
	peek := low
	peek.Hits = 0
	d, _ := s.Apply("k", peek, half.Add(time.Second))
	if d.Remaining != 6 {
		t.Fatalf("remaining %d a second after the rerate, want 5 (at 10/s before it) + 1 (at 1/s after)", d.Remaining)
	}
	if ok, _ := s.Rerate([]byte("missing"), low, half); ok {
		t.Error("rerated a missing key")
	}
	if ok, _ := s.Rerate([]byte("k"), Check{Algorithm: LeakyBucket, Limit: 1, Window: time.Second}, half); ok {
		t.Error("rerated a token bucket as a leaky one")
	}
	if _, err := s.Rerate([]byte("k"), Check{Algorithm: FixedWindow, Limit: 1, Window: time.Second}, half); err == nil {
		t.Error("rerated a fixed window")
	}
}
