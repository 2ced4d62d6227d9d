package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/forward"
	"github.com/sluicehq/sluice/rpc/internal/handoff"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Stand-in decisions: what a node admits for a key while the key's owner
// cannot be reached counts.
//
// A check whose owner does not answer (policy local, the default) goes to
// the owner's replica holder, the member after it on the ring, which holds
// the owner's copy of the key: it decides the check in the owner's stead,
// from that copy plus what it admitted so far in the owner's stead (its
// fallback window of the key). Every entry node sends such checks to the
// same member, so one window decides them, starting from the owner's last
// copy: a crashed owner costs a key at most what it admitted after its last
// replication send that reached the holder. When the holder cannot be
// reached either (or replication is off), the entry node decides from its
// own fallback window the same way.
//
// A fallback window starts from the copy this node holds of the key (none:
// from this node's own state of the key, which it holds when it owned the
// key until its ring changed and has not handed it off yet; neither: from
// zero) and counts what it admits on top. Those hits (the window
// minus its base, window.Subtract) go to the key's owner once it can be
// reached, or to whoever owns the key after the ring changed (a HandOff
// marked stand_in, merged there: counts add), every replication interval
// and at once on a ring change; a member that pulls the key gets them with
// the pull (PullResponse.stand_in); and when this node is the owner by
// then, it adds them to its own window before it decides the key again
// (foldStandIn). Hits handed on stay in the window (they join its base):
// it goes on deciding with them until a newer copy of the key comes, which
// has them (a window that forgot them would admit them again, every time
// it handed them on).

// standInEntry is the bookkeeping of one key's fallback window: the copy
// it started from or last followed (zero: none), its base (that copy plus
// the hits handed on since: what the window counts but has not to hand
// on), and a generation (a window taken and started again is another one).
type standInEntry struct {
	copy, base window.State
	gen        uint64
}

// newEntryLocked starts key's bookkeeping from the copy cp. Requires fbMu
// held.
func (s *Server) newEntryLocked(k string, cp window.State) *standInEntry {
	s.fbGen++
	e := &standInEntry{copy: cp, base: cp, gen: s.fbGen}
	s.fbBase[k] = e
	s.fbKeys.Store(int64(len(s.fbBase)))
	return e
}

// dropEntryLocked forgets key's fallback window. Requires fbMu held.
func (s *Server) dropEntryLocked(k string) {
	delete(s.fbBase, k)
	s.fallback.Take(k)
	s.fbKeys.Store(int64(len(s.fbBase)))
}

// standInDecide decides r (key is its store key) from this node's fallback
// window of the key in the stead of its owner (owner: the member that
// could not be reached; "" when it is not known, or when the key's state
// may start afresh here, see unsettledDecide), and counts what it admits
// there. The window follows this node's copy of the key: when a newer copy
// came since the window started, the window becomes that copy plus what it
// admitted and has not handed on yet (the hits handed on reached the
// key's owner, whose copy it is). The decision is marked degraded. A
// window that would start from nothing for a key that moved to owner with
// a recent ring change is not started: the check is denied (see
// blindStandIn).
func (s *Server) standInDecide(key []byte, r request, owner string) *sluicev1.Decision {
	if r.noSlice || r.zeroBase {
		d := s.sliceDenial(&r)
		d.Degraded = true
		return d
	}
	if s.checkPause(); s.staleCopies(time.Now()) {
		// This node stopped running a moment ago: its copies may be
		// behind what their owners admitted meanwhile.
		s.stats.pausedDenied.Add(1)
		return s.unknownDenial(r, s.store.Now())
	}
	if r.leased {
		// Unknown means spent: the region's slice of a leased global key
		// is its owner's lease, which a stand-in does not hold. The
		// allocator may have lowered the region below its base (what it
		// gave away is spent elsewhere), so any admission here may be
		// beyond the limit. Denied, counting nothing, until the owner
		// answers again or its successor takes the key (and asks the
		// allocator what the region holds: a blind holder, blindWin).
		s.stats.standInLeased.Add(1)
		return s.unknownDenial(r, s.store.Now())
	}
	k := string(key)
	s.fbMu.Lock()
	now := s.store.Now()
	rep, hasRep := s.replicas.Get(k)
	e, ok := s.fbBase[k]
	if ok && !e.base.IsZero() {
		if _, held := s.fallback.Get(k); !held {
			ok = false // evicted at the fallback store's key cap: start again
		}
	}
	switch {
	case !ok && !hasRep:
		// No copy here, but this node may hold the key's state itself:
		// it owned the key until its ring changed, and the key's new
		// owner, which cannot be reached, has not taken it yet (a
		// restarted member that does not answer yet, or refuses the
		// push). The window starts from that state (a fresh one would
		// admit the key's budget again); the state goes to the owner
		// with the push, and only the hits admitted here beyond it with
		// the stand-in hits.
		st, held := s.store.Get(k)
		if (!held || st.IsZero()) && s.movedTo(key, owner) {
			s.fbMu.Unlock()
			return s.blindStandIn(r, now)
		}
		s.fallback.Take(k)
		e = s.newEntryLocked(k, window.State{})
		if held && !st.IsZero() {
			s.fallback.MergeState(k, st, now)
			e.base = st
		}
	case !ok:
		s.fallback.Take(k)
		s.fallback.MergeState(k, rep, now)
		s.newEntryLocked(k, rep)
	case hasRep && rep != e.copy:
		cur, _ := s.fallback.Take(k)
		s.fallback.MergeState(k, window.Merge(rep, window.Subtract(cur, e.base)), now)
		e.copy, e.base = rep, rep
	}
	d, err := s.fallback.ApplyBytes(key, r.check, now)
	s.fbMu.Unlock()
	if err != nil { // cannot happen: checks are validated on entry
		return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: err.Error(), Degraded: true}
	}
	if d.Allowed && r.check.Hits > 0 {
		s.stats.standInAdmitted.Add(r.check.Hits)
	}
	pd := toProto(d, s.name)
	pd.Degraded = true
	return pd
}

// unknownDenial is the answer to r when this node cannot know what its
// key's count is (unknown means spent): denied, degraded, counting
// nothing, retry after the forward timeout (by when the owner should
// answer again, or the cluster have moved the key), resetting then too.
// Its callers: a stand-in of a leased global key (a stand-in holds none of
// the region's lease, and the allocator may have lowered the region below
// its base), a stand-in right after this node paused (its copies may be
// stale, staleCopies), and a key this node owns but may hold stale state
// of after a pause whose pull did not reach every member (pause.go).
func (s *Server) unknownDenial(r request, now time.Time) *sluicev1.Decision {
	return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Degraded: true,
		RetryAfter: msCeil(s.forwardTimeout), ResetTime: unixMsCeil(now.Add(s.forwardTimeout))}
}

// movedTo reports whether key (a store key) moved to owner, a member of
// this node's ring, with a change of this node's ring in the last
// hand-off timeout: a ring this node replaced since gave the key to
// another member. The key's count is then
// with that member, or on its way to owner, until owner has it: a node
// that holds neither the key's state nor a copy of it knows nothing of
// that count (e.g. owner's stand-in holder: its copies are of owner's
// keys, and owner has not had this one long enough to send one; the copy
// of the member that had it went as stale when the ring changed).
func (s *Server) movedTo(key []byte, owner string) bool {
	if owner == "" || !s.view.Load().ring.Has(owner) {
		return false // (an owner that left the ring: its copy or nothing stands in, see unsettledDecide)
	}
	for _, r := range s.rings.ReplacedSince(time.Now().Add(-s.handOffTimeout)) {
		if r.Owner(key) != owner {
			return true
		}
	}
	return false
}

// blindStandIn is the answer to r, a check of a key that moved to its
// unreachable owner lately (movedTo), by a node that holds neither the
// key's state nor a copy of it: denied, degraded, counting nothing. A
// window started here from zero would admit the key's budget again (its
// hits handed on to the owner after, beyond the limit); a denial costs at
// most this one hit, while the owner cannot be reached (and only for the
// hand-off timeout after the ring change). retry_after is the forward
// timeout: the owner is expected back by then.
func (s *Server) blindStandIn(r request, now time.Time) *sluicev1.Decision {
	s.log.Debug("stand-in without the state or a copy of a key that moved to its owner lately; denied")
	return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Degraded: true,
		RetryAfter: msCeil(s.forwardTimeout), ResetTime: unixMsCeil(now.Add(r.check.Window))}
}

// standInHits returns the hits key's fallback window admitted beyond its
// base (window.Subtract) that are still to be handed on, with the window's
// generation; false when there are none. A window with nothing left to
// hand on is dropped when it has ended, or when a newer copy of the key
// came (it has the hits handed on: a later stand-in decision starts from
// it); until then it goes on deciding with every hit it counted.
func (s *Server) standInHits(k string, now time.Time) (window.State, uint64, bool) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	e, ok := s.fbBase[k]
	if !ok {
		return window.State{}, 0, false
	}
	cur, held := s.fallback.Get(k)
	if !held || !cur.Expires().After(now) {
		s.dropEntryLocked(k)
		return window.State{}, 0, false
	}
	d := window.Subtract(cur, e.base)
	if !d.Expires().After(now) {
		if rep, ok := s.replicas.Get(k); ok && rep != e.copy {
			s.dropEntryLocked(k)
		}
		return window.State{}, 0, false
	}
	return d, e.gen, true
}

// sentStandIn records that the hits d of key's fallback window of
// generation gen went to the key's owner (a window taken meanwhile, by a
// pull or a fold, and started again is left alone): they join the window's
// base, so they are not handed on again, and the window goes on counting
// them.
func (s *Server) sentStandIn(k string, d window.State, gen uint64) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	e, ok := s.fbBase[k]
	if !ok || e.gen != gen {
		return
	}
	e.base = window.Merge(e.base, d)
}

// takeStandIn removes key's fallback window and returns the hits it
// admitted beyond its base, and whether any are left to count.
func (s *Server) takeStandIn(k string) (window.State, bool) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	e, ok := s.fbBase[k]
	if !ok {
		return window.State{}, false
	}
	st, held := s.fallback.Get(k)
	s.dropEntryLocked(k)
	if !held { // evicted from the fallback store (at its key cap)
		return window.State{}, false
	}
	d := window.Subtract(st, e.base)
	return d, d.Expires().After(s.store.Now())
}

// foldStandIn adds what this node admitted for key in its owner's stead to
// its own window of key, which it now owns. It costs an atomic load when
// this node has no fallback windows.
func (s *Server) foldStandIn(key []byte) {
	if s.fbKeys.Load() == 0 {
		return
	}
	d, ok := s.takeStandIn(string(key))
	if !ok {
		return
	}
	s.store.MergeState(string(key), d, s.store.Now())
	s.stats.standInReturned.Add(1)
	if s.replication.Factor > 0 {
		s.dirty.Add(key)
	}
}

// signalStandIn asks the stand-in loop to hand on what this node admitted
// in unreachable owners' stead; signals coalesce.
func (s *Server) signalStandIn() {
	select {
	case s.standInSignal <- struct{}{}:
	default:
	}
}

// standInLoop hands on this node's stand-in hits every replication
// interval while it has any, and at once on a signal (a ring change).
func (s *Server) standInLoop(ctx context.Context) {
	t := time.NewTicker(s.replication.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.standInSignal:
		}
		if s.fbKeys.Load() == 0 {
			continue
		}
		s.flushStandIns(ctx)
	}
}

// standInKeys returns the keys that hold stand-in hits now (a copy, in
// no order), taken under fbMu.
func (s *Server) standInKeys() []string {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	keys := make([]string, 0, len(s.fbBase))
	for k := range s.fbBase {
		keys = append(keys, k)
	}
	return keys
}

// flushStandIns hands each key's stand-in hits to the key's owner under
// this node's current ring (adding them to its own window when that is
// this node). The window keeps deciding with them until the owner has
// them; a send that fails is tried again next time. While a key's hits are
// on their way it is marked outgoing, so that a Pull of it waits for the
// send's end instead of taking the same hits again. One flush runs at a
// time. It returns the error of each owner whose hits did not go (none:
// nil).
func (s *Server) flushStandIns(ctx context.Context) map[string]error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	v := s.view.Load()
	keys := s.standInKeys()
	byOwner := map[string][]string{}
	for _, k := range keys {
		o := v.ring.Owner([]byte(k))
		if o == s.name {
			// Not while the key's state may still be on its way here:
			// its next check folds them in once it has settled.
			if !s.leaving.Load() && s.custody.Awaiting(v.ring, []byte(k)) == nil {
				s.foldStandIn([]byte(k))
			}
			continue
		}
		byOwner[o] = append(byOwner[o], k)
	}
	var (
		wg     sync.WaitGroup
		errMu  sync.Mutex
		failed map[string]error
	)
	fail := func(o string, err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if failed == nil {
			failed = map[string]error{}
		}
		failed[o] = err
	}
	for o, ks := range byOwner {
		p := v.peers[o]
		if p == nil {
			fail(o, errors.New("no connection"))
			continue
		}
		// In parallel: a silent owner holds its send up to the forward
		// timeout, and must not hold the others'.
		wg.Go(func() {
			done := make(chan struct{})
			defer close(done)
			type hit struct {
				d   window.State
				gen uint64
			}
			hits := map[string]hit{}
			now := s.store.Now()
			// Keys in a hand-off or a pull now are left for next time.
			marked := s.custody.MarkOutgoingIf(ks, done, func(k string) bool {
				d, gen, ok := s.standInHits(k, now)
				if ok {
					hits[k] = hit{d, gen}
				}
				return ok
			})
			defer s.custody.ClearOutgoing(marked, done)
			if len(hits) == 0 {
				return
			}
			states := make(map[string]window.State, len(hits))
			for k, h := range hits {
				states[k] = h.d
			}
			if err := s.sendStandIns(ctx, p, states); err != nil {
				s.log.Debug("stand-in hits not handed on yet; trying again", "owner", o, "keys", len(hits), "error", err)
				fail(o, err)
				return
			}
			for k, h := range hits {
				s.sentStandIn(k, h.d, h.gen)
			}
			s.stats.standInReturned.Add(int64(len(hits)))
		})
	}
	wg.Wait()
	return failed
}

// sendStandIns hands states to p in HandOff requests marked stand_in,
// bounded by the forward timeout.
func (s *Server) sendStandIns(ctx context.Context, p *forward.Peer, states map[string]window.State) error {
	ctx, cancel := context.WithTimeout(ctx, s.forwardTimeout)
	defer cancel()
	st, err := p.Client().HandOff(ctx)
	if err != nil {
		return err
	}
	req := &sluicev1.HandOffRequest{Sender: s.name, StandIn: true, RingFingerprint: s.view.Load().ring.Fingerprint()}
	flush := func() error {
		if len(req.States) == 0 {
			return nil
		}
		// The receiver merges the hits only within half the time this
		// node waits for its answer: a request held up on its way and
		// merged after this node gave up (and will send them again)
		// would count them twice.
		now := time.Now()
		req.DeadlineUnixNs, req.SentUnixNs = now.Add(s.forwardTimeout/2).UnixNano(), now.UnixNano()
		if err := handoff.Send(st, req); err != nil {
			return err
		}
		req.States = req.States[:0]
		return nil
	}
	for k, d := range states {
		b, _ := d.AppendBinary(nil)
		req.States = append(req.States, &sluicev1.KeyState{Key: []byte(k), State: b})
		if len(req.States) == handOffBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return handoff.End(st)
}

// standInHolder returns the member that decides the keys of owner in its
// stead under v (the member after it on the ring, which holds its
// copies), or "" when there is none (replication off, or no other member).
func (s *Server) standInHolder(v *view, owner string) string {
	if s.replication.Factor <= 0 {
		return ""
	}
	succ := v.ring.SuccessorsOf(owner, 1)
	if len(succ) == 0 || succ[0] == owner {
		return ""
	}
	return succ[0]
}

// unsettledDecide decides r (key is its store key), a check of a key this
// node owns under v whose state has not come (the pull of it failed,
// mi), when the key's previous owner has left v: its state is the copy
// its stand-in holder (the member after it on the previous ring) holds,
// with what it admitted in the owner's stead; a fresh window here would
// admit the key's budget again. The check goes to that holder as a
// stand-in check (marked reforwarded: it decides it whatever its tombs
// say, so it never comes back here), and is decided here from this
// node's fallback window when the holder does not answer; the answer is
// degraded. It returns nil when the previous owner is still a member (or
// there was none), when the key's state is here all the same (a push
// brought the copy: the holder has handed the key over), or for a leased
// global key: the caller decides the key itself.
func (s *Server) unsettledDecide(ctx context.Context, v *view, mi *custody.MovingIn, key []byte, r request) *sluicev1.Decision {
	if mi.Prev == nil || r.isRefund() || r.leased || (s.regions != nil && s.crossRegion(&r)) {
		// (A leased global key is decided here: a stand-in would deny it,
		// and this node's holder of it, with no state of the key from a
		// gone owner, is blind: it admits only what the allocator says
		// its region has not spent, see leases.orphan.)
		return nil
	}
	if _, ok := s.store.Get(string(key)); ok && !s.handoff.OnlyStandIns(string(key)) {
		return nil
	}
	prev := mi.Prev.Owner(key)
	if prev == s.name || v.ring.Has(prev) {
		return nil
	}
	s.stats.degraded.Add(1)
	h := s.standInHolder(&view{ring: mi.Prev}, prev)
	if h == "" || h == s.name || v.peers[h] == nil {
		return s.standInDecide(key, r, "")
	}
	s.stats.standInForwarded.Add(1)
	ds, err := s.peerForward(ctx, v.peers[h], forward.Request{Checks: checksOf([]request{r}, []int{0}), By: firstDeadline([]request{r}, []int{0}),
		Reforwarded: true, StandIn: true, UnreachableOwner: prev})
	if err == nil && ds[0].Error == "" {
		ds[0].Degraded = true
		return ds[0]
	}
	if ctx.Err() != nil || (r.deadline != 0 && time.Now().UnixNano() > r.deadline) {
		return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: "state not here yet, its holder unavailable, and the caller gave up"}
	}
	return s.standInDecide(key, r, "")
}

// answerUnavailable answers the checks fs, whose owners could not be
// reached, per each one's on_owner_unavailable policy, writing into out.
// Under local (the default) the checks of each unreachable owner go, in
// one call, to its stand-in holder (standInHolder), which decides them in
// the owner's stead; those that cannot go there, or whose holder is this
// node, are decided here (standInDecide).
func (s *Server) answerUnavailable(ctx context.Context, reqs []request, fs []failure, out []*sluicev1.Decision) {
	v := s.view.Load()
	byHolder, byTomb, byOwner, byHomeHolder := map[string][]int{}, map[string][]int{}, map[string][]int{}, map[string][]int{}
	var buf []byte
	now := time.Now().UnixNano()
	for _, f := range fs {
		r := reqs[f.index]
		switch {
		case r.isRefund(): // a refund is the owner's to apply, or nobody's
			out[f.index] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: "refund not delivered: " + f.err}
			continue
		case ctx.Err() != nil:
			// Nobody waits for this answer any more: count nothing.
			out[f.index] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: "owner unavailable and the caller gave up: " + f.err}
			continue
		case r.deadline != 0 && now > r.deadline: // the peer that sent it gave up
			s.stats.expired.Add(1)
			out[f.index] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: errExpired}
			continue
		}
		buf = ring.Key(buf[:0], r.name, r.key)
		cross := s.regions != nil && s.crossRegion(&r)
		if !cross && !v.ring.Has(f.owner) {
			// The owner left the ring meanwhile (it left or was declared
			// dead): the key has a new owner, which decides it.
			// (A plain forward: its receiver, whose ring may still hold
			// the old owner, must not decide it from a fresh window.)
			if o := v.ring.Owner(buf); o == s.name {
				out[f.index] = s.decideOwned(ctx, v, buf, r, true)
				continue
			} else if v.peers[o] != nil {
				byOwner[o] = append(byOwner[o], f.index)
				continue
			}
		}
		s.stats.degraded.Add(1)
		s.log.Debug("owner unavailable; degraded answer", "owner", f.owner, "error", f.err, "policy", r.pb.OnOwnerUnavailable)
		switch r.pb.OnOwnerUnavailable {
		case sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW:
			out[f.index] = &sluicev1.Decision{Allowed: true, Limit: r.check.Limit, Owner: s.name, Degraded: true}
			continue
		case sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY:
			out[f.index] = &sluicev1.Decision{Allowed: false, Limit: r.check.Limit, Owner: s.name, Degraded: true}
			continue
		}
		if cross {
			// The key's owner in the home region cannot be reached: its
			// stand-in holder there (the home ring's next member, which
			// holds its copy) decides, as for a key of this region's;
			// when the home region cannot be reached at all, this node
			// decides from a window of its own (degraded).
			if h := s.homeStandIn(v, f.owner); h != "" {
				byHomeHolder[h] = append(byHomeHolder[h], f.index)
				continue
			}
			out[f.index] = s.awayDecide(buf, r)
			continue
		}
		if to := s.custody.TombFor(buf); to != "" && to != f.owner && v.peers[to] != nil {
			// The key's new owner pulled it from here (copy and stand-in
			// hits): it decides the key now, although this node's ring
			// still names the old owner.
			byTomb[to] = append(byTomb[to], f.index)
			continue
		}
		h := s.standInHolder(v, f.owner)
		if h == "" || h == s.name || v.peers[h] == nil {
			out[f.index] = s.standInDecide(buf, r, f.owner)
			continue
		}
		byHolder[h] = append(byHolder[h], f.index)
	}
	for h, is := range byHolder {
		s.standInForward(ctx, v, h, reqs, is, fs, out, s.standInDecide)
	}
	for h, is := range byHomeHolder {
		s.standInForward(ctx, v, h, reqs, is, fs, out, func(key []byte, r request, _ string) *sluicev1.Decision { return s.awayDecide(key, r) })
	}
	for to, is := range byTomb {
		s.reforward(ctx, v, to, reqs, is, out)
	}
	for o, is := range byOwner {
		if fs := s.forward(ctx, v.peers[o], o, reqs, is, out); len(fs) > 0 {
			s.answerUnavailable(ctx, reqs, fs, out)
		}
	}
}

// standInForward sends the checks reqs[i], i in is, to the stand-in holder
// h of their unreachable owner; whatever h does not answer is decided here
// (here: the key, the check and its unreachable owner).
func (s *Server) standInForward(ctx context.Context, v *view, h string, reqs []request, is []int, fs []failure, out []*sluicev1.Decision, here func([]byte, request, string) *sluicev1.Decision) {
	owner := ""
	for _, f := range fs {
		if f.index == is[0] {
			owner = f.owner
		}
	}
	s.stats.standInForwarded.Add(int64(len(is)))
	ds, err := s.peerForward(ctx, v.peers[h], forward.Request{Checks: checksOf(reqs, is), By: firstDeadline(reqs, is),
		StandIn: true, UnreachableOwner: owner})
	var buf []byte
	for j, i := range is {
		if err == nil && ds[j].Error == "" {
			d := ds[j]
			d.Degraded = true
			out[i] = d
			continue
		}
		if ctx.Err() != nil || (reqs[i].deadline != 0 && time.Now().UnixNano() > reqs[i].deadline) {
			// Nobody waits for this answer any more: count nothing.
			out[i] = &sluicev1.Decision{Limit: reqs[i].check.Limit, Owner: s.name, Error: "owner and stand-in unavailable, and the caller gave up"}
			continue
		}
		// The holder did not decide it (or its answer was lost: then
		// both count it, and the key denies early): decide here.
		buf = ring.Key(buf[:0], reqs[i].name, reqs[i].key)
		out[i] = here(buf, reqs[i], owner)
	}
	if err != nil {
		s.log.Debug("stand-in holder unavailable too; decided here", "holder", h, "owner", owner, "error", err)
	}
}

// mergeStandIns merges the states of a HandOff request marked stand_in:
// hits its sender admitted while the keys' owner was unreachable. They add
// to this node's count of each key, whatever its ring says (a key it does
// not own goes on to its owner with the next hand-off), so the sender must
// be a member and each state plausible; nothing of a refused state is
// merged. It returns the states merged and, when the whole request is
// refused, why.
func (s *Server) mergeStandIns(ctx context.Context, r *ring.Ring, req *sluicev1.HandOffRequest) (int64, string) {
	if err := s.vetSender(ctx, req.Sender); err != nil {
		s.handoff.Counters.Refused.Add(int64(len(req.States)))
		return 0, err.Error()
	}
	if dl := s.deadlineHere(req.Sender, req.DeadlineUnixNs, req.SentUnixNs, time.Now()); dl > 0 && time.Now().UnixNano() > dl {
		s.stats.expired.Add(int64(len(req.States)))
		return 0, "deadline_unix_ns: the request came after its sender's deadline; nothing merged (the sender sends the hits again)"
	}
	now := s.store.Now()
	var merged int64
	for i, ks := range req.States {
		st, reason := s.handoff.DecodeKeyState(i, ks)
		if reason == "" {
			if err := s.handoff.Plausible(st, r, now); err != nil {
				reason = fmt.Sprintf("states[%d].state: %v", i, err)
			}
		}
		if reason != "" {
			s.handoff.Counters.Refused.Add(1)
			s.log.Warn("stand-in state refused", "sender", req.Sender, "key", KeyFingerprint(ks.GetKey()), "reason", reason)
			continue
		}
		s.addStandIn(string(ks.Key), st)
		merged++
	}
	s.handoff.Counters.Received.Add(merged)
	if merged > 0 {
		s.signalStandIn()
	}
	return merged, ""
}

// addStandIn adds hits admitted elsewhere in an owner's stead to key's
// fallback window here, beyond its base: they count in this node's
// stand-in decisions of the key, and go on with its own stand-in hits (to
// the key's owner, or into this node's window once it owns the key and
// its state has settled: a key that moved here must not look as if its
// state had come, or its replica could not stand in for it).
func (s *Server) addStandIn(k string, st window.State) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	if _, ok := s.fbBase[k]; !ok {
		s.fallback.Take(k)
		s.newEntryLocked(k, window.State{})
	}
	s.fallback.MergeState(k, st, s.store.Now())
}
