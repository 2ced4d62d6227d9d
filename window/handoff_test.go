package window

import (
	"fmt"
	"testing"
	"time"
)

func TestTakeAndAll(t *testing.T) {
	clk := NewManualClock(time.Unix(1_700_000_000, 0))
	s := NewStore(StoreConfig{Clock: clk})
	c := Check{Algorithm: FixedWindow, Limit: 10, Window: time.Minute, Hits: 3}
	const n = 1000
	for i := range n {
		if _, err := s.Apply(fmt.Sprint("k", i), c, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]State{}
	for k, st := range s.All() {
		if _, dup := seen[k]; dup {
			t.Fatalf("All yielded %q twice", k)
		}
		seen[k] = st
		// The body may call back into the store.
		if _, ok := s.Take(k); !ok {
			t.Fatalf("Take(%q) found nothing", k)
		}
	}
	if len(seen) != n {
		t.Fatalf("All yielded %d keys, want %d", len(seen), n)
	}
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after taking every key = %d, want 0", got)
	}
	// The taken state carries the count to another store.
	other := NewStore(StoreConfig{Clock: clk})
	other.MergeState("k7", seen["k7"], clk.Now())
	d, _ := other.Apply("k7", Check{Algorithm: FixedWindow, Limit: 10, Window: time.Minute}, clk.Now())
	if d.Remaining != 7 {
		t.Fatalf("remaining after hand-off = %d, want 7", d.Remaining)
	}
	if _, ok := s.Take("k7"); ok {
		t.Fatal("Take of a taken key found state")
	}
	// Breaking out of the loop stops the iteration.
	for i := range 10 {
		_, _ = s.Apply(fmt.Sprint("again", i), c, clk.Now())
	}
	count := 0
	for range s.All() {
		count++
		break
	}
	if count != 1 {
		t.Fatalf("loop ran %d times after break, want 1", count)
	}
}
