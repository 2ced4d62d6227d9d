// Package handoff moves key state between sluice nodes: the push loop that
// hands the keys a node holds but no longer owns to their owners (and the
// copies of departed owners to the keys' new owners), a leaving node's
// hand-off of everything, the pull a new owner makes on a key's first
// touch, and the receiving side of both (HandOff and Pull, with the
// vetting of who may send or take what). What it moves in and out of the
// node's windows goes through custody (package custody), which owns the
// keys; the copies through the replica store; the ring history and the
// departed members come from ringview.
//
// rpc keeps the gRPC faces (Server.HandOff and Server.Pull decode, call
// Receive and GiveUp, and encode) and the composition: the routing view
// (Node), the stand-in windows (StandIns).
//
// # Locks
//
// A Mover's one lock of its own (partialMu) is a leaf. It takes custody's
// locks through custody (see its lock order) and calls Node and StandIns
// with none held.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/replica"
	"github.com/sluicehq/sluice/rpc/internal/ringview"
	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Batch is the most key states one HandOff request or Pull carries.
const Batch = 1000

// ClockSlack is how far ahead of this node's clock a handed-off state's
// time may be (the owners' clocks differ a little).
const ClockSlack = time.Minute

// ErrLeaving refuses what a leaving node no longer takes.
var ErrLeaving = errors.New("node is leaving the cluster")

// ErrNoneToTake says why a leaving node's keys were not handed off: every
// other member of its ring is leaving too (as when a whole cluster stops at
// once), so no member can take them.
var ErrNoneToTake = errors.New("every other member is leaving too: none can take the keys")

// ErrNotMember refuses a peer call whose sender is not in the receiver's
// ring, now or lately (VetSender); a pull waits a moment on it.
var ErrNotMember = errors.New("not a member of the receiver's ring")

// View is one routing view of the node: its ring, and the PeerService
// client of each other member (nil: no connection to it).
type View struct {
	Ring *ring.Ring
	Peer func(member string) sluicev1.PeerServiceClient
}

// Node is what the hand-off needs of the node it runs in.
type Node interface {
	// View returns the node's current routing view.
	View() View
	// Leaving reports whether the node is leaving (its Leave was called).
	Leaving() bool
	// MemberLeaving takes member out of the ring: it said, as process
	// instance, that it handed off everything and leaves.
	MemberLeaving(member, instance string)
}

// StandIns are the node's stand-in windows: what it admitted in
// unreachable owners' stead.
type StandIns interface {
	// Take removes key's stand-in window and returns the hits it admitted
	// beyond its base, and whether any are left to count.
	Take(key string) (window.State, bool)
	// Flush hands every key's stand-in hits on to its owner (one try),
	// and returns the error of each owner whose hits did not go.
	Flush(ctx context.Context) map[string]error
	// Pending returns how many keys have stand-in windows.
	Pending() int64
}

// Config configures a Mover.
type Config struct {
	// Self is this node's member name; Instance returns its gossiped
	// instance id ("" unknown). (Required)
	Self     string
	Instance func() string
	// Store holds the node's windows (read: which keys it holds);
	// Custody takes keys in and out of it; Replicas are the copies it
	// holds; Rings its ring history. (Required)
	Store    *window.Store
	Custody  *custody.Custody
	Replicas *replica.Store
	Rings    *ringview.Tracker
	// Node and StandIns: see their types. (Required)
	Node     Node
	StandIns StandIns
	// Timeout bounds one hand-off to one peer; PullTimeout one pull (half
	// the forward timeout: the check that waits for it must still be
	// answered in time). (Required, > 0)
	Timeout, PullTimeout time.Duration
	// ReplicationFactor is the number of successors holding copies (a
	// leaving member may hand off copies it held as one of them).
	ReplicationFactor int
	// MaxKeyBytes is the longest store key a hand-off may carry.
	// (Required)
	MaxKeyBytes int
	// PeerIdentity returns the member name a peer call's caller proved
	// (its verified certificate), or false; nil: none. (Optional)
	PeerIdentity func(ctx context.Context) (string, bool)
	// Logger. Default slog.Default(). (Optional)
	Logger *slog.Logger
	// Recopy, when set, is called with each key pulled under a Stale
	// MovingIn (custody.Relearn): the pull took the copies of it off the
	// members that held them, so it must be copied to them again.
	// (Optional)
	Recopy func(key []byte)
}

// Counters count hand-off events; the node reports them in its stats.
type Counters struct {
	// HandedOff: keys sent to a new owner (pushed or pulled); Received:
	// keys merged from peers' hand-offs; Errors: hand-offs to a peer that
	// failed; Pulls: keys pulled on first touch; Takeovers: keys whose
	// copy stood in for a lost owner; MovedWithoutState, OwnerLost: keys
	// that may start afresh (see rpc.Stats); Refused: key states refused
	// in peers' hand-offs and pulls; StandInReturned: keys whose stand-in
	// hits a puller took.
	HandedOff, Received, Errors, Pulls, Takeovers, MovedWithoutState, OwnerLost, Refused, StandInReturned atomic.Int64
}

// Mover moves key state in and out of one node. Create it with [New].
type Mover struct {
	cfg    Config
	log    *slog.Logger
	signal chan struct{}
	// partial holds the keys whose last pull failed after merging stand-in
	// hits only (not the key's state: a copy may still stand in for it);
	// guarded by partialMu, a leaf lock.
	partialMu sync.Mutex
	partial   map[string]bool
	// Counters are the Mover's event counts.
	Counters Counters
}

// New returns a Mover. Start its push loop with Run.
func New(cfg Config) *Mover {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Instance == nil {
		cfg.Instance = func() string { return "" }
	}
	return &Mover{cfg: cfg, log: cfg.Logger, signal: make(chan struct{}, 1), partial: map[string]bool{}}
}

// Signal asks the push loop to hand off the keys this node holds but does
// not own; signals coalesce.
func (m *Mover) Signal() {
	select {
	case m.signal <- struct{}{}:
	default:
	}
}

// Run hands off after each Signal until ctx ends; a hand-off that fails is
// tried again after a pause (100 ms, doubling up to 2 s) until it
// succeeds. While the node is leaving it does nothing (Leave pushes on its
// own).
func (m *Mover) Run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.signal:
		case <-retry.C:
		}
		if m.cfg.Node.Leaving() {
			continue
		}
		_, err := m.Push(ctx, m.cfg.Node.View())
		if err == nil || ctx.Err() != nil {
			retry.Stop()
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 2*time.Second)
		if backoff >= 2*time.Second {
			m.log.Warn("hand-off incomplete; keys not handed off stay here until the next try", "error", err)
		} else {
			m.log.Debug("hand-off incomplete; trying again", "in", backoff, "error", err)
		}
		retry.Reset(backoff)
	}
}

// Push hands every key this node holds but does not own under v to its
// owner under v, then tells every member it is done. Copies of members
// that left v go to their new owners too (or are taken over here), and so
// do the hits this node admitted in unreachable owners' stead (StandIns):
// a member hears done only once its keys' stand-in hits went too, or it
// would decide them from a count without those hits. A batch that fails
// goes back into this node's windows (its owner pulls its keys on first
// touch); it returns the error of each member the hand-off to failed, and
// an error naming the first failure.
func (m *Mover) Push(ctx context.Context, v View) (map[string]error, error) {
	self := m.cfg.Self
	fp := v.Ring.Fingerprint()
	byOwner := map[string][]string{}
	for k := range m.cfg.Store.All() {
		if o := v.Ring.Owner([]byte(k)); o != self {
			byOwner[o] = append(byOwner[o], k)
		}
	}
	replicasByOwner := m.cfg.Replicas.Orphans(v.Ring, m.cfg.Rings.Departed, m.memberInstance)
	now := m.cfg.Store.Now()
	for k, e := range replicasByOwner[self] { // this node is the new owner: take over
		m.cfg.Custody.TakeOver(k, takeoverOf(e), now)
		m.Counters.Takeovers.Add(1)
	}
	delete(replicasByOwner, self)
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
		// Marked whether or not a push or pull has them already: the
		// latest mark wins and is the one cleared.
		orphanKeys[o] = ks
		m.cfg.Custody.MarkOutgoing(ks, ch)
	}
	defer func() {
		for o, ks := range orphanKeys {
			m.cfg.Custody.ClearOutgoing(ks, orphanDone[o])
		}
		for _, ch := range orphanDone {
			close(ch)
		}
	}()

	var firstErr error
	failed := map[string]error{}
	for _, member := range v.Ring.Members() {
		if member == self {
			continue
		}
		if m.cfg.Node.View().Ring.Fingerprint() != fp && !m.cfg.Node.Leaving() {
			m.restoreReplicas(replicasByOwner[member])
			if firstErr == nil {
				firstErr = errors.New("ring changed during the hand-off")
			}
			continue
		}
		p := v.Peer(member)
		if p == nil {
			m.restoreReplicas(replicasByOwner[member])
			failed[member] = errors.New("no connection")
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: no connection", member)
			}
			continue
		}
		if err := m.pushTo(ctx, p, member, fp, byOwner[member], replicasByOwner[member], false); err != nil {
			m.Counters.Errors.Add(1)
			failed[member] = err
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", member, err)
			}
			continue
		}
		if ks := orphanKeys[member]; len(ks) > 0 {
			// The copies are member's now: stand-in checks of their keys
			// go there (a window here would start without them), and
			// their stand-in hits go with the flush below.
			m.cfg.Custody.HandedOver(ks, member)
			m.cfg.Custody.ClearOutgoing(ks, orphanDone[member])
			close(orphanDone[member])
			delete(orphanDone, member)
			delete(orphanKeys, member)
		}
	}
	// Stand-in hits go before done (after the copies, whose keys' checks
	// no longer add to them here). A leaving node's hand-off loop
	// (LeaveAll) flushes and retries its stand-in hits on its own.
	var standInFailed map[string]error
	if !m.cfg.Node.Leaving() {
		standInFailed = m.cfg.StandIns.Flush(ctx)
	}
	// Done goes to every member only once everything went everywhere: a
	// member that hears done (of a leaving node: that takes it out of its
	// ring) must not route a key to a member that has not got it yet.
	if firstErr == nil {
		for _, member := range v.Ring.Members() {
			if member == self {
				continue
			}
			if err := standInFailed[member]; err != nil {
				// Its stand-in hits are still here: no done yet (the
				// push is tried again).
				failed[member] = err
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: stand-in hits: %w", member, err)
				}
				continue
			}
			if err := m.pushTo(ctx, v.Peer(member), member, fp, nil, nil, true); err != nil {
				m.Counters.Errors.Add(1)
				failed[member] = err
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", member, err)
				}
			}
		}
	}
	if firstErr == nil {
		m.cfg.Custody.PushDone(fp)
	}
	return failed, firstErr
}

// TakeOverOwn takes over, under the ring r, the copies of departed
// members' keys that r gives to this node (each stands in for its lost
// state, as Push does), and leaves every other copy for the push. Called
// before a new ring routes checks here: a check of such a key must not be
// decided before its copy is in this node's window.
func (m *Mover) TakeOverOwn(r *ring.Ring) {
	now := m.cfg.Store.Now()
	for k, e := range m.cfg.Replicas.OrphansOf(r, m.cfg.Rings.Departed, m.cfg.Self) {
		m.cfg.Custody.TakeOver(k, takeoverOf(e), now)
		m.Counters.Takeovers.Add(1)
	}
}

// pushTo streams keys (taken from this node's windows batch by batch) and
// replicas to member over p, then (if done) done for fp.
func (m *Mover) pushTo(ctx context.Context, p sluicev1.PeerServiceClient, member, fp string, keys []string, replicas map[string]replica.Entry, done bool) error {
	if len(keys) == 0 && len(replicas) == 0 && !done {
		return nil
	}
	if p == nil {
		m.restoreReplicas(replicas)
		return errors.New("no connection")
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	st, err := p.HandOff(ctx)
	if err != nil {
		m.restoreReplicas(replicas)
		return err
	}
	defer func() { _ = st.CloseSend() }()
	send := func(req *sluicev1.HandOffRequest) error { return Send(st, req) }
	for len(keys) > 0 {
		n := min(len(keys), Batch)
		batch := keys[:n]
		keys = keys[n:]
		if err := m.pushBatch(member, fp, batch, send); err != nil {
			m.restoreReplicas(replicas)
			return err
		}
	}
	if len(replicas) > 0 {
		req := &sluicev1.HandOffRequest{Sender: m.cfg.Self, RingFingerprint: fp, FromReplica: true, SenderLeaving: m.cfg.Node.Leaving()}
		for k, e := range replicas {
			b, _ := e.State.AppendBinary(nil)
			req.States = append(req.States, &sluicev1.KeyState{Key: []byte(k), State: b, Owner: e.Owner, OwnerInstance: e.Instance})
		}
		if err := send(req); err != nil {
			m.restoreReplicas(replicas)
			return err
		}
	}
	if done {
		if err := send(&sluicev1.HandOffRequest{Sender: m.cfg.Self, RingFingerprint: fp, Done: true, SenderLeaving: m.cfg.Node.Leaving(),
			SenderInstance: m.cfg.Instance()}); err != nil {
			return err
		}
	}
	return End(st)
}

// pushBatch takes keys out of this node's windows (custody marks them
// outgoing: a Pull of one waits for the batch's answer), sends them to
// member, and puts them back if the send fails.
func (m *Mover) pushBatch(member, fp string, keys []string, send func(*sluicev1.HandOffRequest) error) error {
	req := &sluicev1.HandOffRequest{Sender: m.cfg.Self, RingFingerprint: fp, SenderLeaving: m.cfg.Node.Leaving()}
	b := m.cfg.Custody.TakeOut(keys, member, m.memberInstance(member))
	defer m.cfg.Custody.End(b)
	for i, k := range b.Keys {
		bs, _ := b.States[i].AppendBinary(nil)
		req.States = append(req.States, &sluicev1.KeyState{Key: []byte(k), State: bs})
	}
	if len(req.States) == 0 {
		return nil
	}
	if err := send(req); err != nil {
		m.cfg.Custody.PutBack(b, m.cfg.Store.Now())
		return err
	}
	m.Counters.HandedOff.Add(int64(len(req.States)))
	return nil
}

func (m *Mover) restoreReplicas(rs map[string]replica.Entry) {
	for k, e := range rs {
		m.cfg.Replicas.PutBack(k, e)
	}
}

func (m *Mover) memberInstance(member string) string {
	inst, _ := m.cfg.Rings.Instance(member)
	return inst
}

// Send sends one HandOff request on st and waits for its answer; it
// returns the stream's error, or the receiver's refusal (ErrLeaving when
// the receiver is leaving).
func Send(st sluicev1.PeerService_HandOffClient, req *sluicev1.HandOffRequest) error {
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
// (HandOffResponse.error): the sentinel it names (ErrLeaving), so that
// callers match it with errors.Is, or the text.
func refusal(text string) error {
	if text == ErrLeaving.Error() {
		return ErrLeaving
	}
	return errors.New(text)
}

// End closes st's sending side and waits for the receiver to end the
// stream; it returns any error but the stream's end.
func End(st sluicev1.PeerService_HandOffClient) error {
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// Settle makes sure key's state has arrived before this node, its new
// owner under v, decides it: its first touch pulls it from the members
// that have not finished their hand-off (see custody.Custody.Settle). It
// returns false when the key is not settled: a pull from a member failed
// and no state came (the next check pulls again).
func (m *Mover) Settle(ctx context.Context, v View, mi *custody.MovingIn, key []byte) bool {
	return m.cfg.Custody.Settle(ctx, mi, key, func(from []string) bool {
		ok := m.pull(ctx, v, mi, string(key), from)
		if ok && mi.Stale && m.cfg.Recopy != nil {
			m.cfg.Recopy(key)
		}
		return ok
	})
}

// OnlyStandIns reports whether what this node holds of key is only
// stand-in hits merged by a pull that failed (not the key's state).
func (m *Mover) OnlyStandIns(key string) bool {
	m.partialMu.Lock()
	defer m.partialMu.Unlock()
	return m.partial[key]
}

// pull asks each member of from for key's state in parallel and merges
// what they give up; a copy stands in for the state when none came (see
// CopyStandsIn). It returns false when a member could not be asked (or did
// not answer) and no state came: what that member holds of the key is
// still there; under a Stale MovingIn, when any member could not be asked
// (any of them may have counted the key while this node was not running).
func (m *Mover) pull(ctx context.Context, v View, mi *custody.MovingIn, key string, from []string) bool {
	m.Counters.Pulls.Add(1)
	self := m.cfg.Self
	var (
		mu            sync.Mutex
		found, failed bool
		wg            sync.WaitGroup
		replicas      []replica.Entry
		now           = m.cfg.Store.Now()
		req           = &sluicev1.PullRequest{Sender: self, RingFingerprint: v.Ring.Fingerprint(), Keys: [][]byte{[]byte(key)}, Relearn: mi.Stale}
		// The check that waits for the pull (and the checks behind it on
		// a peer's stream) must still be answered within the forward
		// timeout.
		cctx, cancel     = context.WithTimeout(ctx, m.cfg.PullTimeout)
		prevOwner        = self
		prevOwnerPresent = true
	)
	if mi.Prev != nil {
		prevOwner = mi.Prev.Owner([]byte(key))
		prevOwnerPresent = v.Ring.Has(prevOwner)
	}
	defer cancel()
	if e, ok := m.cfg.Replicas.Take(key); ok { // this node held a copy
		replicas = append(replicas, e)
	}
	_, hadState := m.cfg.Store.Get(key) // e.g. handed off before this first touch
	m.partialMu.Lock()
	if m.partial[key] { // only stand-in hits an earlier pull that failed merged
		hadState = false
		delete(m.partial, key)
	}
	m.partialMu.Unlock()
	for _, member := range from {
		p := v.Peer(member)
		if p == nil {
			failed = true
			continue
		}
		wg.Go(func() {
			resp, err := p.Pull(cctx, req)
			// With TLS a member takes this node's peer calls only once it
			// has verified this node's certificate, a moment after it
			// hears of it (a restart, a join): until then it refuses them
			// as from a stranger. Try again within the pull's time.
			for status.Code(err) == codes.PermissionDenied && cctx.Err() == nil {
				select {
				case <-cctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				resp, err = p.Pull(cctx, req)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = true
				m.log.Warn("pull failed", "peer", member, "error", err)
				return
			}
			for _, ks := range resp.States {
				var st window.State
				if err := st.UnmarshalBinary(ks.State); err != nil || string(ks.Key) != key {
					continue
				}
				m.cfg.Custody.MergeIn(key, st, now)
				found = true
			}
			for _, ks := range resp.StandIn {
				// Hits the member admitted in the stead of the key's
				// owner: they count whatever else came.
				var st window.State
				if err := st.UnmarshalBinary(ks.State); err == nil && string(ks.Key) == key && m.Plausible(st, v.Ring, now) == nil {
					m.cfg.Custody.MergeIn(key, st, now)
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
	// and CopyStandsIn says so; several copies of one key are copies, so
	// the latest wins.
	var best *replica.Entry
	for i, r := range replicas {
		if m.CopyStandsIn(v.Ring, r) && (best == nil || r.State.Expires().After(best.State.Expires())) {
			best = &replicas[i]
		}
	}
	if best != nil && !found && !hadState {
		m.cfg.Custody.TakeOver(key, takeoverOf(*best), now)
		m.Counters.Takeovers.Add(1)
		found = true
	}
	switch {
	case found && !(failed && mi.Stale):
	case failed:
		m.Counters.MovedWithoutState.Add(1)
		// The copies that came go back here (the latest), for the next
		// pull; what it merged (stand-in hits) is not the key's state.
		var latest *replica.Entry
		for i, r := range replicas {
			if latest == nil || r.State.Expires().After(latest.State.Expires()) {
				latest = &replicas[i]
			}
		}
		if latest != nil {
			m.cfg.Replicas.PutBack(key, *latest)
		}
		if _, ok := m.cfg.Store.Get(key); ok && !hadState {
			m.partialMu.Lock()
			m.partial[key] = true
			m.partialMu.Unlock()
		}
		return false
	case !prevOwnerPresent && prevOwner != self:
		if _, ok := m.cfg.Store.Get(key); !ok {
			m.Counters.OwnerLost.Add(1)
		}
	}
	return true
}

// CopyStandsIn reports whether the copy r may stand in for its key's lost
// state under the ring cur: its owner has departed (was in this node's
// ring and left it), or is an earlier process of this node (its instance
// id differs, or is unknown: an older peer). A copy this very process sent
// is of state it has handed off since, which comes back by itself: using
// it would count it twice.
func (m *Mover) CopyStandsIn(cur *ring.Ring, r replica.Entry) bool {
	if r.Owner == m.cfg.Self {
		return r.Instance == "" || r.Instance != m.cfg.Instance()
	}
	return !cur.Has(r.Owner) && m.cfg.Rings.Departed(r.Owner)
}

// takeoverOf is the copy e as custody remembers a takeover of it.
func takeoverOf(e replica.Entry) custody.Takeover {
	return custody.Takeover{Owner: e.Owner, Instance: e.Instance, State: e.State}
}

// LeaveAll is a leaving node's hand-off loop: it hands on its stand-in
// hits and pushes every key and copy to its owner under the node's view
// (which no longer has this node) until none is left, ctx ends or no
// member can take them. Members found gone or leaving too are left out of
// the ring it pushes by (gossip may tell of them late). It returns an
// error saying how many keys were not handed off (counted in
// MovedWithoutState), wrapping ErrNoneToTake when every other member
// refused them as leaving too. A try that failed only because members
// were leaving is logged at debug (the next goes without them), any other
// at warn.
func (m *Mover) LeaveAll(ctx context.Context) error {
	var (
		lastErr error
		skip    = map[string]bool{} // members that cannot take keys: gone or leaving too
		gone    = false             // a member in skip was unreachable, not leaving
	)
	for attempt := 0; ; attempt++ {
		v := m.cfg.Node.View()
		if len(skip) > 0 {
			r, err := m.cfg.Rings.Without(v.Ring, skip)
			if err != nil {
				lastErr = err
				if errors.Is(err, ring.ErrNoMembers) && !gone {
					lastErr = fmt.Errorf("%w (%w)", ErrNoneToTake, err)
				}
				break
			}
			v.Ring = r
		}
		// What this node admitted in unreachable owners' stead goes to
		// the keys' owners too (tried again on the next attempt; Push
		// flushes again before it says done).
		m.cfg.StandIns.Flush(ctx)
		var failed map[string]error
		failed, lastErr = m.Push(ctx, v)
		if ctx.Err() != nil {
			break
		}
		if lastErr == nil {
			// Stand-in hits get a few tries: once the others have taken
			// this node out of their rings they refuse its hand-offs.
			if m.cfg.Store.Len() == 0 && (m.cfg.StandIns.Pending() == 0 || attempt >= 3) {
				break
			}
			if m.cfg.Store.Len() == 0 {
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
		onlyLeaving := len(failed) > 0 // every failure a member leaving too
		for member, err := range failed {
			switch c := status.Code(err); {
			case errors.Is(err, ErrLeaving):
				skip[member] = true
			case c == codes.Unavailable || c == codes.Canceled:
				skip[member], gone, onlyLeaving = true, true, false
			default:
				onlyLeaving = false
			}
		}
		if onlyLeaving {
			m.log.Debug("hand-off before leaving: members leaving too; retrying without them", "keys", m.cfg.Store.Len(), "error", lastErr)
		} else if attempt%20 == 0 {
			m.log.Warn("hand-off before leaving incomplete, retrying", "keys", m.cfg.Store.Len(), "error", lastErr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := m.cfg.Store.Len(); n > 0 {
		m.Counters.MovedWithoutState.Add(int64(n))
		if lastErr == nil {
			lastErr = ctx.Err()
		}
		return fmt.Errorf("rpc: leave: %d keys not handed off: %w", n, lastErr)
	}
	return nil
}

// Receive handles one HandOff request from a peer under this node's
// current view, and returns its answer: it merges the states a member
// may hand this node (see vetKeyState) and refuses the rest, naming the
// field; a refusal of the whole request is in the answer's error. A
// sender this node has not heard of is waited for up to MemberWait (it
// may have just joined) before it is refused. A leaving node refuses (it
// hands everything off itself). A request marked stand_in goes to
// standIn, which merges it into the stand-in windows.
func (m *Mover) Receive(ctx context.Context, req *sluicev1.HandOffRequest, standIn func(ctx context.Context, v View, req *sluicev1.HandOffRequest) (int64, string)) *sluicev1.HandOffResponse {
	resp := &sluicev1.HandOffResponse{}
	if req.Sender != "" && !req.StandIn && len(req.States) <= Batch && !m.cfg.Node.Leaving() {
		// A member that just joined says done to every member it knows,
		// some of which have not heard of it yet: wait a moment for
		// gossip to bring it (and the ring it pushes by) rather than
		// refuse it. A stranger is refused below, after MemberWait.
		_ = m.awaitMember(ctx, req.Sender)
	}
	// One view for the ring check and the states' vetting: a ring that
	// changed in between would refuse honest states silently.
	v := m.cfg.Node.View()
	switch {
	case m.cfg.Node.Leaving():
		resp.Error = ErrLeaving.Error()
	case len(req.States) > Batch:
		resp.Error = fmt.Sprintf("states: at most %d per request, got %d", Batch, len(req.States))
	case req.Sender == "":
		resp.Error = "sender: must not be empty"
	case req.StandIn:
		resp.Merged, resp.Error = standIn(ctx, v, req)
	case len(req.States) > 0 && !req.SenderLeaving && req.RingFingerprint != v.Ring.Fingerprint():
		// One of the two rings is behind: the keys may not be this
		// node's. The sender keeps them and tries again.
		m.Counters.Refused.Add(int64(len(req.States)))
		resp.Error = fmt.Sprintf("ring_fingerprint: %s differs from the receiver's %s; retry when the rings agree",
			req.RingFingerprint, v.Ring.Fingerprint())
	default:
		if err := m.VetSender(ctx, req.Sender); err != nil {
			m.Counters.Refused.Add(int64(len(req.States)))
			m.log.Warn("hand-off refused", "sender", req.Sender, "keys", len(req.States), "reason", err)
			resp.Error = err.Error()
			break
		}
		type merge struct {
			ks *sluicev1.KeyState
			st window.State
		}
		merges := make([]merge, 0, len(req.States))
		now := m.cfg.Store.Now()
		hist := m.cfg.Rings.Recent(v.Ring, time.Now())
		for i, ks := range req.States {
			st, reason := m.DecodeKeyState(i, ks)
			if reason == "" {
				reason = m.vetKeyState(v, hist, req, ks.Key, st, now)
			}
			if reason != "" {
				// Nothing of a refused state is merged; the sender is
				// told of none (an honest one keeps going), and the log
				// names the key by a fingerprint only.
				m.Counters.Refused.Add(1)
				m.log.Warn("hand-off state refused", "sender", req.Sender, "key", security.KeyFingerprint(ks.Key), "reason", reason)
				continue
			}
			merges = append(merges, merge{ks, st})
		}
		for _, mg := range merges {
			k := string(mg.ks.Key)
			m.cfg.Custody.MergeIn(k, mg.st, now)
			if req.FromReplica {
				m.cfg.Custody.NoteTakeover(k, custody.Takeover{Owner: mg.ks.Owner, Instance: mg.ks.OwnerInstance, State: mg.st})
			}
		}
		resp.Merged = int64(len(merges))
		m.Counters.Received.Add(int64(len(merges)))
		if req.FromReplica {
			m.Counters.Takeovers.Add(int64(len(merges)))
		}
		if req.Done {
			m.cfg.Custody.NoteDone(req.Sender, req.RingFingerprint)
		}
		if req.Done && req.SenderLeaving {
			// It handed off its keys itself: the copies of them here are
			// stale, and must not stand in for it once it is gone; and it
			// is out of the ring from now on.
			m.cfg.Replicas.DropOwner(req.Sender)
			m.cfg.Node.MemberLeaving(req.Sender, req.SenderInstance)
		}
	}
	return resp
}

// GiveUp answers a Pull of keys from sender (validated by the caller: a
// sender, 1..Batch non-empty keys, VetPuller) under the ring of
// fingerprint fp: it
// gives up the state of each key sender may pull (see waitPullerOwns),
// waiting first for a push that carries the key to be answered, with any
// copy of it (the puller uses one only if the key's previous owner has
// left its ring) and any stand-in hits. When this node still owns a key
// under its own ring, custody leaves a tomb so that its checks go to the
// puller. It returns ctx's error if ctx ends while a key is on its way
// out.
func (m *Mover) GiveUp(ctx context.Context, sender, fp string, keys [][]byte, relearn bool) (*sluicev1.PullResponse, error) {
	// A pull takes a key's state away, so only the key's owner may pull
	// it: a member that pulled a key it does not own would erase its
	// count (a fresh budget at the owner). The puller owns its keys under
	// the ring it names (its fingerprint); see waitPullerOwns for when
	// this node has not built that ring.
	v, owned, err := m.waitPullerOwns(ctx, sender, fp, keys, relearn)
	if err != nil {
		return nil, err
	}
	if refused := len(keys) - len(owned); refused > 0 {
		m.Counters.Refused.Add(int64(refused))
		m.log.Warn("pull refused for keys the sender does not own", "sender", sender, "keys", refused)
	}
	resp := &sluicev1.PullResponse{}
	for _, kb := range owned {
		k := string(kb)
		// A decision of the key made here ends before it is taken; a
		// later one sees the tomb and goes to the puller. This node may
		// also be deciding the key in its dead owner's stead (stand-in
		// checks of entry nodes whose rings are behind): from now on
		// those go to the puller too (one being decided right now lands
		// in a new fallback window, handed on later).
		var (
			e                   replica.Entry
			d                   window.State
			hadCopy, hadStandIn bool
		)
		st, ok, err := m.cfg.Custody.GiveUp(ctx, k, sender, m.memberInstance(sender), v.Ring.Owner(kb) == m.cfg.Self, func() bool {
			e, hadCopy = m.cfg.Replicas.Take(k)
			d, hadStandIn = m.cfg.StandIns.Take(k)
			return hadCopy || hadStandIn
		})
		if err != nil {
			return nil, err
		}
		if ok {
			b, _ := st.AppendBinary(nil)
			resp.States = append(resp.States, &sluicev1.KeyState{Key: kb, State: b})
			m.Counters.HandedOff.Add(1)
		}
		if hadCopy {
			b, _ := e.State.AppendBinary(nil)
			resp.Replicas = append(resp.Replicas, &sluicev1.KeyState{Key: kb, State: b, Owner: e.Owner, OwnerInstance: e.Instance})
		}
		if hadStandIn {
			b, _ := d.AppendBinary(nil)
			resp.StandIn = append(resp.StandIn, &sluicev1.KeyState{Key: kb, State: b})
			m.Counters.StandInReturned.Add(1)
		}
	}
	return resp, nil
}

// VetSender returns why a hand-off from the member named sender is
// refused whole (ErrNotMember, wrapped, for a stranger), or nil to go on:
// the name must be another member of this node's ring, now or within
// ringview.HistoryAge, and, when the transport proves the caller's
// identity (Config.PeerIdentity; with TLS, the verified certificate's
// member name), it must be that name. This is the one place a hand-off's
// claimed sender is bound to its caller.
func (m *Mover) VetSender(ctx context.Context, sender string) error {
	if m.cfg.PeerIdentity != nil {
		if proved, ok := m.cfg.PeerIdentity(ctx); ok && proved != sender {
			return fmt.Errorf("sender: %q is not the caller's identity", sender)
		}
	}
	if sender == m.cfg.Self {
		return errors.New("sender: names the receiver itself")
	}
	for _, r := range m.cfg.Rings.Recent(m.cfg.Node.View().Ring, time.Now()) {
		if r.Has(sender) {
			return nil
		}
	}
	return fmt.Errorf("sender: %q is %w", sender, ErrNotMember)
}

// MemberWait bounds how long a Pull or a HandOff from a member this node
// has not heard of yet waits for gossip to bring it: a new member may pull,
// or say done to every member it knows, before the news of its join has
// reached every node (make run's third node, a few hundred milliseconds
// before the second hears of it).
const MemberWait = 500 * time.Millisecond

// awaitMember returns VetSender's answer for sender, asked again every
// 10 ms while it is ErrNotMember, for up to MemberWait or until ctx ends.
func (m *Mover) awaitMember(ctx context.Context, sender string) error {
	deadline := time.Now().Add(MemberWait)
	for {
		err := m.VetSender(ctx, sender)
		if err == nil || !errors.Is(err, ErrNotMember) || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// PullOwnerWait bounds how long a Pull waits for this node to build the
// ring the puller pulled under (the puller saw the ring change first). The
// puller gives a pull half the forward timeout (its ctx here), the
// MemberWait included.
const PullOwnerWait = 900 * time.Millisecond

// PullChurnWindow is how long after its ring changed a node takes a pull
// under a ring it never built (another node's view of the same changes,
// e.g. one join applied before the next, while this node applied both at
// once): a new owner touches its moved keys over the seconds after a
// change, and refusing such a pull loses or double-counts a count.
const PullChurnWindow = 10 * time.Second

// waitPullerOwns decides which of keys sender may pull. Under the ring the
// puller names (fingerprint fp), when this node has built it too (now or
// in the last ringview.HistoryAge): the keys sender owns there. When this
// node has not, the puller may be ahead (a join this node has not applied)
// or on a ring this node skipped: if this node's ring changed in the last
// PullChurnWindow, or changes within PullOwnerWait, the cluster is
// changing and all keys go (a new owner must not lose a count to a
// lagging ring); if it stays as it was, none (a stable cluster gives no
// reason to pull a key one does not own). It returns the current view too.
//
// A relearn pull (the puller paused, see custody.Relearn) from a puller
// that is not in this node's current ring although this node built the
// ring it names comes from a node this node took for dead and has not
// taken back yet: giving it the keys now would leave this node, their
// owner under its own ring, deciding them from nothing. It is refused at
// once with ErrPullerOutOfRing: the puller denies the keys and pulls again
// at its next check of each, and this node pushes them to it when it takes
// it back. (It does not wait for that: state given up after a wait may
// reach a puller that gave up meanwhile, and be lost. Any other pull under
// a ring this node built goes on: a puller whose ring is ahead of this
// node's may take its keys.)
func (m *Mover) waitPullerOwns(ctx context.Context, sender, fp string, keys [][]byte, relearn bool) (View, [][]byte, error) {
	arrived := time.Now()
	deadline := arrived.Add(PullOwnerWait)
	for {
		v := m.cfg.Node.View()
		for _, r := range m.cfg.Rings.Recent(v.Ring, time.Now()) {
			if r.Fingerprint() != fp {
				continue
			}
			if relearn && !v.Ring.Has(sender) {
				return v, nil, ErrPullerOutOfRing
			}
			owned := make([][]byte, 0, len(keys))
			for _, kb := range keys {
				if r.Owner(kb) == sender {
					owned = append(owned, kb)
				}
			}
			return v, owned, nil
		}
		if changed := m.cfg.Rings.LastChange(); !changed.IsZero() && changed.After(arrived.Add(-PullChurnWindow)) {
			return v, keys, nil
		}
		if time.Now().After(deadline) {
			return v, nil, nil
		}
		select {
		case <-ctx.Done():
			return v, nil, nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ErrPullerOutOfRing refuses a Pull whose sender this node took out of
// its ring (see waitPullerOwns); it is a gRPC Unavailable status, so the
// puller tries again.
var ErrPullerOutOfRing = status.Error(codes.Unavailable, "pull: the sender is not in this node's ring (taken for dead, not taken back yet); try again")

// VetPuller returns nil when a Pull from sender may go on, else a gRPC
// PermissionDenied status saying why (counting the keys refused): a pull
// takes keys' state away, so it must come from a member (see VetSender),
// waiting up to MemberWait for one that is not in this node's ring yet
// (while the refusal is ErrNotMember).
func (m *Mover) VetPuller(ctx context.Context, sender string, keys int) error {
	err := m.awaitMember(ctx, sender)
	if err == nil {
		return nil
	}
	m.Counters.Refused.Add(int64(keys))
	m.log.Warn("pull refused", "sender", sender, "keys", keys, "reason", err)
	return status.Error(codes.PermissionDenied, "sluice: pull refused: "+err.Error())
}

// vetKeyState returns why the handed-off state st of key from req's
// sender is refused, or "" to merge it.
//
// Who may hand key off: when the sender stays, its ring is this node's
// (the fingerprints match, checked before), and under it this node must
// own key: a member cannot push keys into another's windows. When the
// sender is leaving, it must have owned key (or, for replicas, held its
// copy as one of the next members) under this node's ring or one it used
// in the last ringview.HistoryAge: a leaving member hands off only what it
// had. (A staying sender's previous ownership cannot be checked in
// general: a member that just joined never built the rings under which its
// new keys were owned.)
//
// What: the state must be plausible (see window.State.Plausible: no time
// after now plus a minute's clock slack, no more hits than the largest
// limit from every member), and it must not replace this node's state of
// the key: a merge adds to what was consumed, but a state of another
// algorithm or window that is newer would win over it (see window.Merge),
// lowering what the key has consumed.
func (m *Mover) vetKeyState(v View, hist []*ring.Ring, req *sluicev1.HandOffRequest, key []byte, st window.State, now time.Time) string {
	if !req.SenderLeaving {
		if o := v.Ring.Owner(key); o != m.cfg.Self {
			return "key: owned by another member under the ring both nodes hold"
		}
	} else {
		owned := false
		for _, r := range hist {
			if r.Owner(key) == req.Sender ||
				(req.FromReplica && slices.Contains(r.Successors(key, max(m.cfg.ReplicationFactor, 3)), req.Sender)) {
				owned = true
				break
			}
		}
		if !owned {
			return "sender: was not the key's owner under any recent ring of the receiver"
		}
	}
	if err := m.Plausible(st, v.Ring, now); err != nil {
		return "state: " + err.Error()
	}
	if cur, ok := m.cfg.Store.Get(string(key)); ok && !cur.IsZero() && !st.IsZero() &&
		(cur.Algorithm() != st.Algorithm() || cur.Window() != st.Window()) && window.Merge(cur, st) != cur {
		return "state: of another algorithm or window than the receiver's, it would replace the key's count"
	}
	return ""
}

// Plausible returns why st cannot be a state a member of the ring r sent
// at now (window.State.Plausible: no time after now plus ClockSlack, no
// more hits than the largest limit from every member), or nil.
func (m *Mover) Plausible(st window.State, r *ring.Ring, now time.Time) error {
	members := int64(len(r.Members()) + 1)
	return st.Plausible(now, ClockSlack, window.MaxLimit*min(members, 1<<9))
}

// DecodeKeyState decodes states[i] of a hand-off, or says why it is
// refused, naming the field: an empty or too long key (over
// Config.MaxKeyBytes), or a state that does not decode.
func (m *Mover) DecodeKeyState(i int, ks *sluicev1.KeyState) (window.State, string) {
	var st window.State
	switch {
	case len(ks.GetKey()) == 0:
		return st, fmt.Sprintf("states[%d].key: must not be empty", i)
	case len(ks.GetKey()) > m.cfg.MaxKeyBytes:
		return st, fmt.Sprintf("states[%d].key: at most %d bytes, got %d", i, m.cfg.MaxKeyBytes, len(ks.GetKey()))
	}
	if err := st.UnmarshalBinary(ks.GetState()); err != nil {
		return st, fmt.Sprintf("states[%d].state: %v", i, err)
	}
	return st, ""
}
