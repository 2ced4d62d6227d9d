package window

import (
	"testing"
	"time"
)

// A state expires when its window ends (fixed window: start + W).
func TestStateExpires(t *testing.T) {
	clock := NewManualClock(time.Unix(3600, 0))
	s := NewStore(StoreConfig{Clock: clock})
	c := Check{Algorithm: FixedWindow, Limit: 10, Window: time.Hour, Hits: 1}
	if _, err := s.Apply("k", c, clock.Now()); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Get("k")
	if got, want := st.Expires(), time.Unix(7200, 0); !got.Equal(want) {
		t.Fatalf("expires %v, want %v", got, want)
	}
	if got := (State{}).Expires(); got.UnixNano() != 0 {
		t.Fatalf("zero state expires %v", got)
	}
}
