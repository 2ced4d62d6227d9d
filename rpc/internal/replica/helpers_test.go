package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/window"
)

// t0 is the tests' time.
var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// stateUntil returns a fixed window of limit 10 per w, started at t0 with
// hits of it counted: it is back at full capacity at t0+w.
func stateUntil(t testing.TB, w time.Duration, hits int64) window.State {
	t.Helper()
	s := window.NewStore(window.StoreConfig{Clock: window.NewManualClock(t0)})
	if _, err := s.Apply("k", window.Check{Algorithm: window.FixedWindow, Limit: 10, Window: w, Hits: hits}, t0); err != nil {
		t.Fatal(err)
	}
	st, ok := s.Get("k")
	if !ok {
		t.Fatal("no state")
	}
	if !st.Expires().Equal(t0.Add(w)) {
		t.Fatalf("state expires at %s, want %s", st.Expires(), t0.Add(w))
	}
	return st
}

// testRing returns a ring of members.
func testRing(t testing.TB, members ...string) *ring.Ring {
	t.Helper()
	r, err := ring.New(members, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// keyOf returns the n-th key (n from 0) that owner owns under r.
func keyOf(t testing.TB, r *ring.Ring, owner string, n int) string {
	t.Helper()
	return keysOf(t, r, owner, n+1)[n]
}

// keysOf returns the first n keys that owner owns under r.
func keysOf(t testing.TB, r *ring.Ring, owner string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if i == 1_000_000 {
			t.Fatalf("fewer than %d keys of %s", n, owner)
		}
		if k := fmt.Sprintf("key:%d", i); r.Owner([]byte(k)) == owner {
			keys = append(keys, k)
		}
	}
	return keys
}

// sameState reports whether a and b encode alike.
func sameState(a, b window.State) bool {
	ab, _ := a.MarshalBinary()
	bb, _ := b.MarshalBinary()
	return string(ab) == string(bb)
}
