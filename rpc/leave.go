package rpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/rpc/internal/handoff"
)

// ErrNoneToTake says a leaving node's keys were not handed off because no
// member could take them: the node was the last member, or every other
// member was leaving too (a whole cluster stopping at once). It is what
// such a stop is expected to do: [Node.Close] drops the keys, or saves them
// in its StateDir, and returns no error.
var ErrNoneToTake = errors.New("rpc: leave: no member can take the keys")

// Leave hands this node's keys to their next owners before it leaves: it
// stops taking checks (Check answers UNAVAILABLE), routes what peers still
// forward to it to the keys' next owners, and pushes all its state there.
// It returns when everything was handed off or ctx ends (the error then
// says what was not). When no member can take the keys (this node is the
// last, or every other member is leaving too), it returns an error
// wrapping ErrNoneToTake. Call it once, before leaving the gossip.
func (s *Server) Leave(ctx context.Context) error {
	s.setMu.Lock()
	handing := make(chan struct{})
	if !s.handingOff.CompareAndSwap(nil, &handing) {
		handing = make(chan struct{}) // called twice: the first pass's channel stays
	}
	s.leaving.Store(true)
	old := s.view.Load()
	var others []string
	for _, m := range old.members {
		if m.Name != s.name {
			others = append(others, m.Name)
		}
	}
	if len(others) == 0 {
		s.setMu.Unlock()
		close(handing)
		if n := s.store.Len(); n > 0 {
			return fmt.Errorf("%w: %d keys (the last member)", ErrNoneToTake, n)
		}
		return nil
	}
	r, epoch, err := s.rings.Leave(others)
	if err != nil {
		s.setMu.Unlock()
		close(handing)
		return fmt.Errorf("rpc: leave: %w", err)
	}
	v := &view{ring: r, members: old.members, peers: old.peers, epoch: epoch, home: old.home, all: old.all, rings: old.rings}
	s.view.Store(v)
	s.setMu.Unlock()
	s.log.Info("handing off before leaving", "keys", s.store.Len(), "fingerprint", r.Fingerprint())
	defer close(handing)
	err = s.handoff.LeaveAll(ctx)
	if errors.Is(err, handoff.ErrNoneToTake) {
		return fmt.Errorf("%w: %w", ErrNoneToTake, err)
	}
	return err
}

// FinishLeave hands off the keys decided here after Leave returned: a
// check whose call took this node's view just before Leave switched it
// is decided here all the same, and may land after Leave's last pass. Call
// it once the gRPC server has stopped (no call is in flight any more), so
// that nothing counted here is lost. It returns at once when no key is
// left, and otherwise as Leave does. Receivers take it from a member that
// left their ring within the ring history (10 minutes).
func (s *Server) FinishLeave(ctx context.Context) error {
	if !s.leaving.Load() {
		return errors.New("rpc: finish leave: Leave was not called")
	}
	n := s.store.Len()
	if (n == 0 && s.fbKeys.Load() == 0) || s.view.Load().ring.Has(s.name) {
		return nil // nothing late, or this node was the last member: none to take them
	}
	s.log.Warn("keys decided after the hand-off; handing them off", "keys", n)
	return s.handoff.LeaveAll(ctx)
}
