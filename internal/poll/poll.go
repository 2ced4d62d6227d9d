// Package poll waits in tests for a condition that other goroutines or
// processes make true on their own timers (gossip, file events, a
// cluster's ring), never for time to pass.
package poll

import (
	"testing"
	"time"
)

// Every is how often Until checks its condition.
const Every = 10 * time.Millisecond

// Until checks cond every 10 ms until it holds, and fails t (Fatalf,
// naming what) if it still does not after within.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(Every)
	}
}
