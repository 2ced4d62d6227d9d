package rpc

import (
	"context"
	"time"
)

// A paused process (issue 36): a node that stopped running for a while (a
// frozen container or VM, SIGSTOP, a long pause of any kind) wakes up
// holding the windows it held before, with nothing to tell it that its
// cluster went on: the others may have declared it dead and given its keys
// to another member, which counted them, and taken it back since (same
// members, same ring: its ring never changed); or, for a shorter pause,
// the keys' stand-in holders decided their checks in its stead. Deciding
// from those windows would admit again what was admitted elsewhere.
//
// So the node watches its own run (package pause: a gap between the beats
// of a ticker, on the monotonic or the wall clock, longer than
// pauseThreshold), and every decision of a key it owns checks first. The
// first to see a gap relearns before anything is decided: every key the
// node owns is awaited again from every other member (custody.Relearn),
// and the first touch of each pulls it from all of them (what they
// counted in its stead, their stand-in hits; added to what is here: what
// a member took over from this node's copy comes back without the copy).
// Unknown means spent: until a key's pull got every member's answer, the
// key's checks are denied (degraded, counting nothing, retry after the
// forward timeout). Its leases start again as a restarted process's do
// (leases.paused). The wait ends for all keys at the hand-off timeout.

// pauseThreshold is the shortest gap in a node's run taken for a pause:
// half the forward timeout (a stand-in decides for an owner only once a
// forward to it has failed, after the forward timeout), at most 1 s and
// at least 100 ms (the ticker must not be mistaken for a pause on a busy
// machine).
func pauseThreshold(forwardTimeout time.Duration) time.Duration {
	return min(max(forwardTimeout/2, 100*time.Millisecond), time.Second)
}

// pauseLoop beats the node's pause detector every quarter of its
// threshold until ctx ends.
func (s *Server) pauseLoop(ctx context.Context) {
	t := time.NewTicker(s.pause.Threshold() / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.pause.Beat(time.Now(), s.paused)
		}
	}
}

// checkPause is what a decision of a key this node owns calls first: it
// relearns when the node did not run for longer than the threshold (see
// paused), before the decision goes on.
func (s *Server) checkPause() {
	s.pause.Check(time.Now(), s.paused)
}

// paused reacts to a gap of gap in this node's run (called once per
// pause, before any decision goes on; see pause.Detector.Check).
func (s *Server) paused(gap time.Duration) {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	v := s.view.Load()
	relearning := s.custody.Relearn(v.ring, time.Now())
	if s.leases != nil {
		s.leases.paused()
	}
	s.log.Warn("this process did not run for a while (a frozen container or VM, SIGSTOP, a long pause): "+
		"its keys may have been counted elsewhere meanwhile; each is pulled from the other members before it is decided here again",
		"gap", gap, "threshold", s.pause.Threshold(), "relearning", relearning)
}

// staleCopies reports whether this node's copies of other members' keys
// may be stale at now: a pause was seen less than two replication
// intervals and a forward timeout ago (owners send what changed while it
// was stopped again after their failed sends, within that time). A
// stand-in decision from such a copy could admit what its owner admitted
// meanwhile, so this node makes none then (see standInDecide).
func (s *Server) staleCopies(now time.Time) bool {
	since, ok := s.pause.Since(now)
	return ok && since < 2*s.replication.Interval+s.forwardTimeout
}
