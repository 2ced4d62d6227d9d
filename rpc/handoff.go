package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/replica"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// DefaultHandOffTimeout bounds how long a new owner waits for the keys
// that moved to it (pulling each on first touch meanwhile), and a graceful
// leave's hand-off, when ServerConfig.HandOffTimeout is 0.
const DefaultHandOffTimeout = 10 * time.Second

// handOffBatch is the most keys one HandOff request or Pull carries.
const handOffBatch = 1000

// errLeaving refuses what a leaving node no longer takes.
var errLeaving = errors.New("node is leaving the cluster")

// settle makes sure key's state has arrived before this node, its new
// owner under v, decides it: its first touch pulls it from the members
// that have not finished their hand-off (see custody.Custody.Settle).
func (s *Server) settle(ctx context.Context, v *view, mi *custody.MovingIn, key []byte) {
	s.custody.Settle(ctx, mi, key, func(from []string) { s.pull(ctx, v, mi, string(key), from) })
}

// pull asks each member of from for key's state in parallel and merges
// what they give up.
func (s *Server) pull(ctx context.Context, v *view, mi *custody.MovingIn, key string, from []string) {
	s.stats.pulls.Add(1)
	var (
		mu            sync.Mutex
		found, failed bool
		wg            sync.WaitGroup
		replicas      []replica.Entry
		now           = s.store.Now()
		req           = &sluicev1.PullRequest{Sender: s.name, RingFingerprint: v.ring.Fingerprint(), Keys: [][]byte{[]byte(key)}}
		// Half the forward timeout: the check that waits for the pull
		// (and the checks behind it on a peer's stream) must still be
		// answered within the forward timeout.
		cctx, cancel     = context.WithTimeout(ctx, s.forwardTimeout/2)
		prevOwner        = s.name
		prevOwnerPresent = true
	)
	if mi.Prev != nil {
		prevOwner = mi.Prev.Owner([]byte(key))
		prevOwnerPresent = v.ring.Has(prevOwner)
	}
	defer cancel()
	if e, ok := s.replicas.Take(key); ok { // this node held a copy
		replicas = append(replicas, e)
	}
	_, hadState := s.store.Get(key) // e.g. handed off before this first touch
	for _, m := range from {
		p := v.peers[m]
		if p == nil {
			failed = true
			continue
		}
		wg.Go(func() {
			resp, err := p.client.Pull(cctx, req)
			// With TLS a member takes this node's peer calls only once it
			// has verified this node's certificate, a moment after it
			// hears of it (a restart, a join): until then it refuses them
			// as from a stranger. Try again within the pull's time.
			for status.Code(err) == codes.PermissionDenied && cctx.Err() == nil {
				select {
				case <-cctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				resp, err = p.client.Pull(cctx, req)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = true
				s.log.Warn("pull failed", "peer", m, "error", err)
				return
			}
			for _, ks := range resp.States {
				var st window.State
				if err := st.UnmarshalBinary(ks.State); err != nil || string(ks.Key) != key {
					continue
				}
				s.custody.MergeIn(key, st, now)
				found = true
			}
			for _, ks := range resp.StandIn {
				// Hits the member admitted in the stead of the key's
				// owner: they count whatever else came.
				var st window.State
				if err := st.UnmarshalBinary(ks.State); err == nil && string(ks.Key) == key &&
					st.Plausible(now, handOffClockSlack, window.MaxLimit*min(int64(len(v.ring.Members())+1), 1<<9)) == nil {
					s.custody.MergeIn(key, st, now)
				}
			}
			for _, ks := range resp.Replicas {
				var st window.State
				if err := st.UnmarshalBinary(ks.State); err == nil && string(ks.Key) == key {
					replicas = append(replicas, replica.Entry{State: st, Owner: ks.Owner, Instance: ks.OwnerInstance})
				}
			}
		})
	}
	wg.Wait()
	// A replica stands in for its owner's state only when no state came
	// and copyStandsIn says so; several copies of one key are copies, so
	// the latest wins.
	var best *replica.Entry
	for i, r := range replicas {
		if s.copyStandsIn(v, r) && (best == nil || r.State.Expires().After(best.State.Expires())) {
			best = &replicas[i]
		}
	}
	if best != nil && !found && !hadState {
		s.custody.TakeOver(key, takeoverOf(*best), now)
		s.stats.replicaTakeovers.Add(1)
		found = true
	}
	switch {
	case found:
	case failed:
		s.stats.movedWithoutState.Add(1)
	case !prevOwnerPresent && prevOwner != s.name:
		if _, ok := s.store.Get(key); !ok {
			s.stats.ownerLost.Add(1)
		}
	}
}

// copyStandsIn reports whether the copy r may stand in for its key's lost
// state under v: its owner has departed (was in this node's ring and left
// it), or is an earlier process of this node (its instance id differs, or
// is unknown: an older peer). A copy this very process sent is of state it
// has handed off since, which comes back by itself: using it would count
// it twice.
func (s *Server) copyStandsIn(v *view, r replica.Entry) bool {
	if r.Owner == s.name {
		return r.Instance == "" || r.Instance != s.instanceID()
	}
	return !v.ring.Has(r.Owner) && s.departed(r.Owner)
}

// departed reports whether member was in this node's ring and has left
// it (within the last 10 minutes) without coming back.
func (s *Server) departed(member string) bool { return s.rings.Departed(member) }

// instanceID returns this node's gossiped instance id ("" if unknown).
func (s *Server) instanceID() string {
	if p := s.instance.Load(); p != nil {
		return *p
	}
	return ""
}

// signalPush asks the push loop to hand off the keys this node holds but
// does not own; signals coalesce.
func (s *Server) signalPush() {
	select {
	case s.pushSignal <- struct{}{}:
	default:
	}
}

// pushLoop runs a hand-off after each signal until ctx ends; one that
// fails is tried again after a pause (100 ms, doubling up to 2 s) until it
// succeeds.
func (s *Server) pushLoop(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.pushSignal:
		case <-retry.C:
		}
		if s.leaving.Load() {
			continue // Leave pushes on its own
		}
		err := s.pushOnce(ctx, s.view.Load())
		if err == nil || ctx.Err() != nil {
			retry.Stop()
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 2*time.Second)
		if backoff >= 2*time.Second {
			s.log.Warn("hand-off incomplete; keys not handed off stay here until the next try", "error", err)
		} else {
			s.log.Debug("hand-off incomplete; trying again", "in", backoff, "error", err)
		}
		retry.Reset(backoff)
	}
}

// pushOnce hands every key this node holds but does not own under v to
// its owner under v, then tells every member it is done. Replicas of
// members that left v go to their new owners too. A batch that fails goes
// back into this node's windows (and its owner will pull its keys on first
// touch); the error names the first failure.
func (s *Server) pushOnce(ctx context.Context, v *view) error {
	_, err := s.pushTargets(ctx, v)
	return err
}

// pushTargets is pushOnce that also returns the error of each member the
// hand-off to failed.
func (s *Server) pushTargets(ctx context.Context, v *view) (map[string]error, error) {
	fp := v.ring.Fingerprint()
	byOwner := map[string][]string{}
	for k := range s.store.All() {
		if o := v.ring.Owner([]byte(k)); o != s.name {
			byOwner[o] = append(byOwner[o], k)
		}
	}
	replicasByOwner := s.replicas.Orphans(v.ring, s.departed, s.memberInstance)
	now := s.store.Now()
	for k, e := range replicasByOwner[s.name] { // this node is the new owner: take over
		s.custody.TakeOver(k, takeoverOf(e), now)
		s.stats.replicaTakeovers.Add(1)
	}
	delete(replicasByOwner, s.name)
	// Copies on their way to a new owner are outgoing: a Pull of one of
	// them waits until its push is answered (or put back).
	orphanDone := map[string]chan struct{}{}
	orphanKeys := map[string][]string{}
	for o, rs := range replicasByOwner {
		ch := make(chan struct{})
		orphanDone[o] = ch
		ks := make([]string, 0, len(rs))
		for k := range rs {
			ks = append(ks, k)
		}
		// Marked whether or not a push or pull has them already: as
		// before, the latest mark wins and is the one cleared.
		orphanKeys[o] = ks
		s.custody.MarkOutgoing(ks, ch)
	}
	defer func() {
		for o, ks := range orphanKeys {
			s.custody.ClearOutgoing(ks, orphanDone[o])
		}
		for _, ch := range orphanDone {
			close(ch)
		}
	}()

	var firstErr error
	failed := map[string]error{}
	for _, m := range v.ring.Members() {
		if m == s.name {
			continue
		}
		if s.view.Load().ring.Fingerprint() != fp && !s.leaving.Load() {
			s.restoreReplicas(replicasByOwner[m])
			if firstErr == nil {
				firstErr = errors.New("ring changed during the hand-off")
			}
			continue
		}
		p := v.peers[m]
		if p == nil {
			s.restoreReplicas(replicasByOwner[m])
			failed[m] = errors.New("no connection")
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: no connection", m)
			}
			continue
		}
		if err := s.pushTo(ctx, p, fp, byOwner[m], replicasByOwner[m], false); err != nil {
			s.stats.handOffErrors.Add(1)
			failed[m] = err
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", m, err)
			}
		}
	}
	// Done goes to every member only once everything went everywhere: a
	// member that hears done (of a leaving node: that takes it out of its
	// ring) must not route a key to a member that has not got it yet.
	if firstErr == nil {
		for _, m := range v.ring.Members() {
			if m == s.name {
				continue
			}
			if err := s.pushTo(ctx, v.peers[m], fp, nil, nil, true); err != nil {
				s.stats.handOffErrors.Add(1)
				failed[m] = err
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", m, err)
				}
			}
		}
	}
	if firstErr == nil {
		s.custody.PushDone(fp)
	}
	return failed, firstErr
}

// pushTo streams keys (taken from this node's windows batch by batch) and
// replicas to p, then (if done) done for fp.
func (s *Server) pushTo(ctx context.Context, p *peer, fp string, keys []string, replicas map[string]replica.Entry, done bool) error {
	if len(keys) == 0 && len(replicas) == 0 && !done {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.handOffTimeout)
	defer cancel()
	st, err := p.client.HandOff(ctx)
	if err != nil {
		s.restoreReplicas(replicas)
		return err
	}
	defer func() { _ = st.CloseSend() }()
	send := func(req *sluicev1.HandOffRequest) error { return handOffSend(st, req) }
	for len(keys) > 0 {
		n := min(len(keys), handOffBatch)
		batch := keys[:n]
		keys = keys[n:]
		if err := s.pushBatch(p, fp, batch, send); err != nil {
			s.restoreReplicas(replicas)
			return err
		}
	}
	if len(replicas) > 0 {
		req := &sluicev1.HandOffRequest{Sender: s.name, RingFingerprint: fp, FromReplica: true, SenderLeaving: s.leaving.Load()}
		for k, e := range replicas {
			b, _ := e.State.AppendBinary(nil)
			req.States = append(req.States, &sluicev1.KeyState{Key: []byte(k), State: b, Owner: e.Owner, OwnerInstance: e.Instance})
		}
		if err := send(req); err != nil {
			s.restoreReplicas(replicas)
			return err
		}
	}
	if done {
		if err := send(&sluicev1.HandOffRequest{Sender: s.name, RingFingerprint: fp, Done: true, SenderLeaving: s.leaving.Load(),
			SenderInstance: s.instanceID()}); err != nil {
			return err
		}
	}
	return handOffEnd(st)
}

// handOffSend sends one HandOff request on st and waits for its answer;
// it returns the stream's error, or the receiver's refusal.
func handOffSend(st sluicev1.PeerService_HandOffClient, req *sluicev1.HandOffRequest) error {
	if err := st.Send(req); err != nil {
		return err
	}
	resp, err := st.Recv()
	switch {
	case err != nil:
		return err
	case resp.Error != "":
		return refusal(resp.Error)
	}
	return nil
}

// refusal is the error of a receiver's refusal, which comes as text
// (HandOffResponse.error): the sentinel of this package that it names
// (errLeaving), so that callers match it with errors.Is, or the text.
func refusal(text string) error {
	if text == errLeaving.Error() {
		return errLeaving
	}
	return errors.New(text)
}

// handOffEnd closes st's sending side and waits for the receiver to end
// the stream; it returns any error but the stream's end.
func handOffEnd(st sluicev1.PeerService_HandOffClient) error {
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// pushBatch takes keys out of this node's windows (custody marks them
// outgoing: a Pull of one waits for the batch's answer), sends them, and
// puts them back if the send fails.
func (s *Server) pushBatch(p *peer, fp string, keys []string, send func(*sluicev1.HandOffRequest) error) error {
	req := &sluicev1.HandOffRequest{Sender: s.name, RingFingerprint: fp, SenderLeaving: s.leaving.Load()}
	b := s.custody.TakeOut(keys, p.name, s.memberInstance(p.name))
	defer s.custody.End(b)
	for i, k := range b.Keys {
		bs, _ := b.States[i].AppendBinary(nil)
		req.States = append(req.States, &sluicev1.KeyState{Key: []byte(k), State: bs})
	}
	if len(req.States) == 0 {
		return nil
	}
	if err := send(req); err != nil {
		s.custody.PutBack(b, s.store.Now())
		return err
	}
	s.stats.handedOff.Add(int64(len(req.States)))
	return nil
}

func (s *Server) restoreReplicas(rs map[string]replica.Entry) {
	for k, e := range rs {
		s.replicas.PutBack(k, e)
	}
}

// HandOff implements PeerService.HandOff: it merges each batch of states
// into this node's windows and answers each request in order. A leaving
// node refuses (it hands everything off itself).
func (s *Server) HandOff(stream sluicev1.PeerService_HandOffServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &sluicev1.HandOffResponse{}
		// One view for the ring check and the states' vetting: a ring
		// that changed in between would refuse honest states silently.
		v := s.view.Load()
		switch {
		case s.leaving.Load():
			resp.Error = errLeaving.Error()
		case len(req.States) > handOffBatch:
			resp.Error = fmt.Sprintf("states: at most %d per request, got %d", handOffBatch, len(req.States))
		case req.Sender == "":
			resp.Error = "sender: must not be empty"
		case req.StandIn:
			resp.Merged, resp.Error = s.mergeStandIns(stream.Context(), v, req)
		case len(req.States) > 0 && !req.SenderLeaving && req.RingFingerprint != v.ring.Fingerprint():
			// One of the two rings is behind: the keys may not be this
			// node's. The sender keeps them and tries again.
			s.stats.handOffRefused.Add(int64(len(req.States)))
			resp.Error = fmt.Sprintf("ring_fingerprint: %s differs from the receiver's %s; retry when the rings agree",
				req.RingFingerprint, v.ring.Fingerprint())
		default:
			if err := s.vetSender(stream.Context(), req.Sender); err != nil {
				s.stats.handOffRefused.Add(int64(len(req.States)))
				s.log.Warn("hand-off refused", "sender", req.Sender, "keys", len(req.States), "reason", err)
				resp.Error = err.Error()
				break
			}
			type merge struct {
				ks *sluicev1.KeyState
				st window.State
			}
			merges := make([]merge, 0, len(req.States))
			now := s.store.Now()
			hist := s.recentRings(v)
			for i, ks := range req.States {
				st, reason := decodeKeyState(i, ks)
				if reason == "" {
					reason = s.vetKeyState(v, hist, req, ks.Key, st, now)
				}
				if reason != "" {
					// Nothing of a refused state is merged; the sender
					// is told of none (an honest one keeps going), and
					// the log names the key by a fingerprint only.
					s.stats.handOffRefused.Add(1)
					s.log.Warn("hand-off state refused", "sender", req.Sender, "key", KeyFingerprint(ks.Key), "reason", reason)
					continue
				}
				merges = append(merges, merge{ks, st})
			}
			for _, m := range merges {
				k := string(m.ks.Key)
				s.custody.MergeIn(k, m.st, now)
				if req.FromReplica {
					s.custody.NoteTakeover(k, custody.Takeover{Owner: m.ks.Owner, Instance: m.ks.OwnerInstance, State: m.st})
				}
			}
			resp.Merged = int64(len(merges))
			s.stats.receivedHandOff.Add(int64(len(merges)))
			if req.FromReplica {
				s.stats.replicaTakeovers.Add(int64(len(merges)))
			}
			if req.Done {
				s.custody.NoteDone(req.Sender, req.RingFingerprint)
			}
			if req.Done && req.SenderLeaving {
				// It handed off its keys itself: the copies of them here
				// are stale, and must not stand in for it once it is gone;
				// and it is out of the ring from now on.
				s.replicas.DropOwner(req.Sender)
				s.memberLeaving(req.Sender, req.SenderInstance)
			}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// Pull implements PeerService.Pull: it gives up the state of each key it
// holds (waiting first for a HandOff batch that carries the key to be
// answered), with any replica of it (the sender uses one only if the
// key's previous owner has left its ring). When this
// node still owns a key under its own ring, it records that the key went
// to the sender, so that it forwards the key's checks there.
func (s *Server) Pull(ctx context.Context, req *sluicev1.PullRequest) (*sluicev1.PullResponse, error) {
	switch {
	case req.Sender == "":
		return nil, invalidArgument(&fieldError{"sender", "must not be empty"})
	case len(req.Keys) == 0 || len(req.Keys) > handOffBatch:
		return nil, invalidArgument(&fieldError{"keys", fmt.Sprintf("must hold 1..%d keys, got %d", handOffBatch, len(req.Keys))})
	}
	if err := s.vetPuller(ctx, req.Sender); err != nil {
		s.stats.handOffRefused.Add(int64(len(req.Keys)))
		s.log.Warn("pull refused", "sender", req.Sender, "keys", len(req.Keys), "reason", err)
		return nil, status.Error(codes.PermissionDenied, "sluice: pull refused: "+err.Error())
	}
	for i, kb := range req.Keys {
		if len(kb) == 0 {
			return nil, invalidArgument(&fieldError{fmt.Sprintf("keys[%d]", i), "must not be empty"})
		}
	}
	// A pull takes a key's state away, so only the key's owner may pull
	// it: a member that pulled a key it does not own would erase its
	// count (a fresh budget at the owner). The puller owns its keys under
	// the ring it names (its fingerprint); see waitPullerOwns for when
	// this node has not built that ring.
	v, owned := s.waitPullerOwns(ctx, req.Sender, req.RingFingerprint, req.Keys)
	if refused := len(req.Keys) - len(owned); refused > 0 {
		s.stats.handOffRefused.Add(int64(refused))
		s.log.Warn("pull refused for keys the sender does not own", "sender", req.Sender, "keys", refused)
	}
	resp := &sluicev1.PullResponse{}
	for _, kb := range owned {
		k := string(kb)
		// A decision of the key made here ends before it is taken; a
		// later one sees the tomb and goes to the puller (decideOwned).
		// This node may also be deciding the key in its dead owner's
		// stead (stand-in checks of entry nodes whose rings are behind):
		// from now on those go to the puller too (one being decided right
		// now lands in a new fallback window, handed on later).
		var (
			e                   replica.Entry
			d                   window.State
			hadCopy, hadStandIn bool
		)
		st, ok, err := s.custody.GiveUp(ctx, k, req.Sender, s.memberInstance(req.Sender), v.ring.Owner(kb) == s.name, func() bool {
			e, hadCopy = s.replicas.Take(k)
			d, hadStandIn = s.takeStandIn(k)
			return hadCopy || hadStandIn
		})
		if err != nil {
			return nil, err
		}
		if ok {
			b, _ := st.AppendBinary(nil)
			resp.States = append(resp.States, &sluicev1.KeyState{Key: kb, State: b})
			s.stats.handedOff.Add(1)
		}
		if hadCopy {
			b, _ := e.State.AppendBinary(nil)
			resp.Replicas = append(resp.Replicas, &sluicev1.KeyState{Key: kb, State: b, Owner: e.Owner, OwnerInstance: e.Instance})
		}
		if hadStandIn {
			b, _ := d.AppendBinary(nil)
			resp.StandIn = append(resp.StandIn, &sluicev1.KeyState{Key: kb, State: b})
			s.stats.standInReturned.Add(1)
		}
	}
	return resp, nil
}

// Leave hands this node's keys to their next owners before it leaves: it
// stops taking checks (Check answers UNAVAILABLE), routes what peers still
// forward to it to the keys' next owners, and pushes all its state there.
// It returns when everything was handed off or ctx ends (the error then
// says what was not). Call it once, before leaving the gossip.
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
			s.log.Warn("last member leaving: its keys' state is lost", "keys", n)
		}
		return nil
	}
	r, epoch, err := s.rings.Leave(others)
	if err != nil {
		s.setMu.Unlock()
		close(handing)
		return fmt.Errorf("rpc: leave: %w", err)
	}
	v := &view{ring: r, members: old.members, peers: old.peers, epoch: epoch}
	s.view.Store(v)
	s.setMu.Unlock()
	s.log.Info("handing off before leaving", "keys", s.store.Len(), "fingerprint", r.Fingerprint())
	defer close(handing)
	return s.handOffAll(ctx)
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
	return s.handOffAll(ctx)
}

// handOffAll is Leave's hand-off loop: it pushes every key and replica to
// its owner under the view (without this node) until none is left, the
// ctx ends or no member can take them.
func (s *Server) handOffAll(ctx context.Context) error {
	var (
		lastErr error
		skip    = map[string]bool{} // members that cannot take keys: gone or leaving too
	)
	for attempt := 0; ; attempt++ {
		// The view is rebuilt without this node on each membership change
		// meanwhile; members found gone or leaving are left out of it, so
		// their keys go to the next owner (gossip may tell late of them).
		v := s.view.Load()
		if len(skip) > 0 {
			r, err := s.rings.Without(v.ring, skip)
			if err != nil {
				lastErr = err
				break
			}
			v = &view{ring: r, members: v.members, peers: v.peers, epoch: v.epoch}
		}
		// What this node admitted in unreachable owners' stead goes to
		// the keys' owners too (tried again on the next attempt).
		s.flushStandIns(ctx)
		var failed map[string]error
		failed, lastErr = s.pushTargets(ctx, v)
		if ctx.Err() != nil {
			break
		}
		if lastErr == nil {
			// Stand-in hits get a few tries: once the others have taken
			// this node out of their rings they refuse its hand-offs.
			if s.store.Len() == 0 && (s.fbKeys.Load() == 0 || attempt >= 3) {
				break
			}
			if s.store.Len() == 0 {
				// Stand-in hits not handed on yet: try again shortly.
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			// A check that was being decided as the ring switched landed
			// after its key was handed off: hand it off too.
			continue
		}
		for m, err := range failed {
			if c := status.Code(err); c == codes.Unavailable || c == codes.Canceled || errors.Is(err, errLeaving) {
				skip[m] = true
			}
		}
		if attempt%20 == 0 {
			s.log.Warn("hand-off before leaving incomplete, retrying", "keys", s.store.Len(), "error", lastErr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := s.store.Len(); n > 0 {
		s.stats.movedWithoutState.Add(int64(n))
		return fmt.Errorf("rpc: leave: %d keys not handed off: %v", n, lastErr)
	}
	return nil
}

// Bounds on what a hand-off may carry (see vetKeyState).
const (
	// handOffClockSlack is how far ahead of this node's clock a handed-off
	// state's time may be (the owners' clocks differ a little).
	handOffClockSlack = time.Minute
	// maxStoreKeyBytes is the longest store key: a name and a key at
	// their bounds, with the name's length prefix.
	maxStoreKeyBytes = MaxNameBytes + MaxKeyBytes + 2
)

// recentRings returns v's ring and the rings this node used in the last
// ringview.HistoryAge, newest first.
func (s *Server) recentRings(v *view) []*ring.Ring { return s.rings.Recent(v.ring, time.Now()) }

// vetSender returns why a hand-off from the member named sender is
// refused whole (errNotMember, wrapped, for a stranger), or nil to go on: the name must be another member of this
// node's ring, now or within ringview.HistoryAge, and, when the transport
// proves the caller's identity (ServerConfig.PeerIdentity; with TLS, the
// verified certificate's member name), it must be that name. This is the
// one place a hand-off's claimed sender is bound to its caller.
func (s *Server) vetSender(ctx context.Context, sender string) error {
	if s.peerIdentity != nil {
		if proved, ok := s.peerIdentity(ctx); ok && proved != sender {
			return fmt.Errorf("sender: %q is not the caller's identity", sender)
		}
	}
	if sender == s.name {
		return errors.New("sender: names the receiver itself")
	}
	for _, r := range s.recentRings(s.view.Load()) {
		if r.Has(sender) {
			return nil
		}
	}
	return fmt.Errorf("sender: %q is %w", sender, errNotMember)
}

// errNotMember refuses a peer call whose sender is not in the receiver's
// ring, now or lately (vetSender); a pull waits a moment on it.
var errNotMember = errors.New("not a member of the receiver's ring")

// pullerWait bounds how long a Pull from a member this node has not heard
// of yet waits for gossip to bring it (a new member may pull before the
// news of its join has reached every node).
const pullerWait = 500 * time.Millisecond

// pullOwnerWait bounds how long a Pull waits for this node to build the
// ring the puller pulled under (the puller saw the ring change first). The
// puller gives a pull half the forward timeout (its ctx here), vetPuller's
// wait included.
const pullOwnerWait = 900 * time.Millisecond

// pullChurnWindow is how long after its ring changed a node takes a pull
// under a ring it never built (another node's view of the same changes,
// e.g. one join applied before the next, while this node applied both at
// once): a new owner touches its moved keys over the seconds after a
// change, and refusing such a pull loses or double-counts a count.
const pullChurnWindow = 10 * time.Second

// waitPullerOwns decides which of keys sender may pull. Under the ring the
// puller names (fingerprint fp), when this node has built it too (now or
// in the last ringview.HistoryAge): the keys sender owns there. When this node
// has not, the puller may be ahead (a join this node has not applied) or
// on a ring this node skipped: if this node's ring changed in the last
// pullChurnWindow, or changes within pullOwnerWait, the cluster is
// changing and all keys go (a new owner must not lose a count to a
// lagging ring); if it stays as it was, none (a stable cluster gives no
// reason to pull a key one does not own). It returns the current view too.
func (s *Server) waitPullerOwns(ctx context.Context, sender, fp string, keys [][]byte) (*view, [][]byte) {
	arrived := time.Now()
	deadline := arrived.Add(pullOwnerWait)
	for {
		v := s.view.Load()
		for _, r := range s.recentRings(v) {
			if r.Fingerprint() != fp {
				continue
			}
			owned := make([][]byte, 0, len(keys))
			for _, kb := range keys {
				if r.Owner(kb) == sender {
					owned = append(owned, kb)
				}
			}
			return v, owned
		}
		if changed := s.lastRingChange(); !changed.IsZero() && changed.After(arrived.Add(-pullChurnWindow)) {
			return v, keys
		}
		if time.Now().After(deadline) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lastRingChange returns when this node last replaced its ring (zero if
// never).
func (s *Server) lastRingChange() time.Time { return s.rings.LastChange() }

// vetPuller returns why a Pull from sender is refused, or nil: a pull
// takes keys' state away, so it must come from a member (see vetSender),
// waiting up to pullerWait for one that is not in this node's ring yet
// (while the refusal is errNotMember).
func (s *Server) vetPuller(ctx context.Context, sender string) error {
	deadline := time.Now().Add(pullerWait)
	for {
		err := s.vetSender(ctx, sender)
		if err == nil || !errors.Is(err, errNotMember) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// vetKeyState returns why the handed-off state st of key from req's
// sender is refused, or "" to merge it.
//
// Who may hand key off: when the sender stays, its ring is this node's
// (the fingerprints match, checked before), and under it this node must
// own key: a member cannot push keys into another's windows. When the
// sender is leaving, it must have owned key (or, for replicas, held its
// copy as one of the next members) under this node's ring or one it used
// in the last ringview.HistoryAge: a leaving member hands off only what it had.
// (A staying sender's previous ownership cannot be checked in general: a
// member that just joined never built the rings under which its new keys
// were owned.)
//
// What: the state must be plausible (see window.State.Plausible: no time
// after now plus a minute's clock slack, no more hits than the largest
// limit from every member), and it must not replace this node's state of
// the key: a merge adds to what was consumed, but a state of another
// algorithm or window that is newer would win over it (see window.Merge),
// lowering what the key has consumed.
func (s *Server) vetKeyState(v *view, hist []*ring.Ring, req *sluicev1.HandOffRequest, key []byte, st window.State, now time.Time) string {
	if !req.SenderLeaving {
		if o := v.ring.Owner(key); o != s.name {
			return "key: owned by another member under the ring both nodes hold"
		}
	} else {
		owned := false
		for _, r := range hist {
			if r.Owner(key) == req.Sender ||
				(req.FromReplica && slices.Contains(r.Successors(key, max(s.replication.Factor, 3)), req.Sender)) {
				owned = true
				break
			}
		}
		if !owned {
			return "sender: was not the key's owner under any recent ring of the receiver"
		}
	}
	members := int64(len(v.ring.Members()) + 1)
	if err := st.Plausible(now, handOffClockSlack, window.MaxLimit*min(members, 1<<9)); err != nil {
		return "state: " + err.Error()
	}
	if cur, ok := s.store.Get(string(key)); ok && !cur.IsZero() && !st.IsZero() &&
		(cur.Algorithm() != st.Algorithm() || cur.Window() != st.Window()) && window.Merge(cur, st) != cur {
		return "state: of another algorithm or window than the receiver's, it would replace the key's count"
	}
	return ""
}

// decodeKeyState decodes states[i] of a hand-off, or says why it is
// refused, naming the field: an empty or too long key, or a state that
// does not decode.
func decodeKeyState(i int, ks *sluicev1.KeyState) (window.State, string) {
	var st window.State
	switch {
	case len(ks.GetKey()) == 0:
		return st, fmt.Sprintf("states[%d].key: must not be empty", i)
	case len(ks.GetKey()) > maxStoreKeyBytes:
		return st, fmt.Sprintf("states[%d].key: at most %d bytes, got %d", i, maxStoreKeyBytes, len(ks.GetKey()))
	}
	if err := st.UnmarshalBinary(ks.GetState()); err != nil {
		return st, fmt.Sprintf("states[%d].state: %v", i, err)
	}
	return st, ""
}

// takeoverOf is the copy e as custody remembers a takeover of it.
func takeoverOf(e replica.Entry) custody.Takeover {
	return custody.Takeover{Owner: e.Owner, Instance: e.Instance, State: e.State}
}
