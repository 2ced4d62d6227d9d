package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writes from many goroutines all arrive, whole, and String reads them
// while writers run (the race detector checks the locking).
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if n, err := b.Write([]byte("line\n")); n != 5 || err != nil {
					t.Errorf("Write: %d, %v", n, err)
				}
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 800 || len(b.String()) != 800*5 {
		t.Fatalf("%d whole lines in %d bytes, want 800 in 4000", got, len(b.String()))
	}
}
