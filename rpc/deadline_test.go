package rpc

import (
	"testing"
	"time"
)

// The receiver reads a sender's deadline on the sender's clock, as
// estimated from the least delay its requests showed lately: a skew of
// the two clocks either way cancels out, and a request held up on its way
// comes past its deadline by as much as it was held up.
func TestSenderClockReadsDeadlinesOnTheSendersClock(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	for _, skew := range []time.Duration{0, 3 * time.Second, -3 * time.Second, 90 * time.Second} {
		var c senderClock
		transit := 2 * time.Millisecond
		// The receiver's clock is the sender's plus skew.
		recv := func(sentAt time.Time, delay time.Duration) (sent int64, at time.Time) {
			return sentAt.UnixNano(), sentAt.Add(skew + delay)
		}
		// A quick request: the estimate is skew + transit.
		sent, at := recv(base, transit)
		if got := time.Duration(c.sample(sent, at)); got != skew+transit {
			t.Fatalf("skew %s: first estimate %s, want %s", skew, got, skew+transit)
		}
		// A slower one does not move the estimate.
		sent, at = recv(base.Add(time.Second), 40*time.Millisecond)
		if got := time.Duration(c.sample(sent, at)); got != skew+transit {
			t.Fatalf("skew %s: estimate after a slow request %s, want %s", skew, got, skew+transit)
		}
		// A request with 50 ms to go, held up 1 s on its way: past its
		// deadline here by about 1 s, whatever the skew.
		sentAt := base.Add(2 * time.Second)
		sent, at = recv(sentAt, time.Second)
		deadline := sentAt.Add(50 * time.Millisecond).UnixNano()
		here := deadline + c.sample(sent, at)
		if late := at.UnixNano() - here; late < int64(900*time.Millisecond) || late > int64(time.Second) {
			t.Fatalf("skew %s: a request held up 1 s is %s past its deadline here, want about 950 ms", skew, time.Duration(late))
		}
		// One on time, 50 ms to go, quick: 50 ms before its deadline here
		// (the deadline is read a quickest transit late: one-way delays
		// cannot be told from the skew).
		sentAt = base.Add(3 * time.Second)
		sent, at = recv(sentAt, transit)
		here = sentAt.Add(50*time.Millisecond).UnixNano() + c.sample(sent, at)
		if early := here - at.UnixNano(); early != int64(50*time.Millisecond) {
			t.Fatalf("skew %s: a quick request is %s before its deadline here, want 50ms", skew, time.Duration(early))
		}
	}
}

// The estimate follows a drift of the clocks: after two windows only the
// delays of the last two windows count.
func TestSenderClockFollowsADrift(t *testing.T) {
	var c senderClock
	t0 := time.Unix(1_800_000_000, 0)
	c.sample(t0.UnixNano(), t0.Add(time.Millisecond)) // offset 1 ms
	// The receiver's clock slewed 20 ms ahead since.
	t1 := t0.Add(senderClockWindow)
	c.sample(t1.UnixNano(), t1.Add(21*time.Millisecond))
	t2 := t1.Add(senderClockWindow)
	if got := time.Duration(c.sample(t2.UnixNano(), t2.Add(21*time.Millisecond))); got != 21*time.Millisecond {
		t.Fatalf("estimate after two windows %s, want 21ms", got)
	}
}
