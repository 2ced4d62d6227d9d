package poll

import (
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records a Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	failed atomic.Bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Fatalf(string, ...any) { f.failed.Store(true); panic(f) }

func TestUntil(t *testing.T) {
	var n atomic.Int64
	Until(t, 5*time.Second, "three checks", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("cond checked %d times, want 3 (it holds on the third)", got)
	}

	f := &fakeTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		Until(f, 30*time.Millisecond, "never", func() bool { return false })
	}()
	if !f.failed.Load() {
		t.Fatal("Until did not fail on a condition that never holds")
	}
}
