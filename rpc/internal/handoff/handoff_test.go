package handoff

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/replica"
	"github.com/sluicehq/sluice/rpc/internal/ringview"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// The receiving side's logic, on a node "b" of the ring a-b-c with no
// network: what Receive merges and refuses, and what GiveUp gives.

var t0 = time.Unix(3600*500_000, 0)

type fakeNode struct {
	ring     *ring.Ring
	leaving  bool
	departed []string                              // MemberLeaving calls, "member/instance"
	peers    map[string]sluicev1.PeerServiceClient // nil: no connection to any
}

func (n *fakeNode) View() View {
	return View{Ring: n.ring, Peer: func(m string) sluicev1.PeerServiceClient { return n.peers[m] }}
}
func (n *fakeNode) Leaving() bool { return n.leaving }
func (n *fakeNode) MemberLeaving(member, instance string) {
	n.departed = append(n.departed, member+"/"+instance)
}

type noStandIns struct{}

func (noStandIns) Take(string) (window.State, bool)       { return window.State{}, false }
func (noStandIns) Flush(context.Context) map[string]error { return nil }
func (noStandIns) Pending() int64                         { return 0 }

type fixture struct {
	m        *Mover
	node     *fakeNode
	store    *window.Store
	custody  *custody.Custody
	replicas *replica.Store
	rings    *ringview.Tracker
	proved   string // the caller's proven identity ("" none)
}

func newFixture(t *testing.T, lastChange time.Time) *fixture {
	t.Helper()
	f := &fixture{store: window.NewStore(window.StoreConfig{Clock: window.NewManualClock(t0)}), replicas: replica.NewStore()}
	f.custody = custody.New(custody.Config{Self: "b", Store: f.store, HandOffTimeout: 10 * time.Second})
	var err error
	if f.rings, err = ringview.New("b", ring.Config{}); err != nil {
		t.Fatal(err)
	}
	up, err := f.rings.Apply([]ringview.Member{{Name: "a", Instance: "a1"}, {Name: "b"}, {Name: "c", Instance: "c1"}}, "b1", false, lastChange)
	if err != nil {
		t.Fatal(err)
	}
	f.node = &fakeNode{ring: up.Ring}
	f.m = New(Config{Self: "b", Instance: func() string { return "b1" }, Store: f.store, Custody: f.custody,
		Replicas: f.replicas, Rings: f.rings, Node: f.node, StandIns: noStandIns{},
		Timeout: time.Second, PullTimeout: time.Second, ReplicationFactor: 1, MaxKeyBytes: 64,
		PeerIdentity: func(context.Context) (string, bool) { return f.proved, f.proved != "" },
		Logger:       slog.New(slog.DiscardHandler)})
	return f
}

// keyOwnedBy returns a store key the fixture's ring gives to owner.
func (f *fixture) keyOwnedBy(t *testing.T, owner string) []byte {
	t.Helper()
	return f.keyWhere(t, func(k []byte) bool { return f.node.ring.Owner(k) == owner })
}

// keyWhere returns the first store key of a fixed sequence that ok takes.
func (f *fixture) keyWhere(t *testing.T, ok func([]byte) bool) []byte {
	t.Helper()
	for i := range 10000 {
		k := ring.Key(nil, "n", "user:"+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)))
		if ok(k) {
			return k
		}
	}
	t.Fatal("no such key")
	return nil
}

// state returns the encoded state of hits hits of 10 an hour at at.
func state(t *testing.T, hits int64, at time.Time) []byte {
	t.Helper()
	s := window.NewStore(window.StoreConfig{Clock: window.NewManualClock(at)})
	if _, err := s.Apply("k", window.Check{Algorithm: window.FixedWindow, Limit: 10, Window: time.Hour, Hits: hits}, at); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Get("k")
	b, err := st.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReceiveRefusesWholeRequests(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *fixture, req *sluicev1.HandOffRequest)
		wantErr string
		refused int64
	}{
		{name: "receiver leaving", setup: func(f *fixture, _ *sluicev1.HandOffRequest) { f.node.leaving = true }, wantErr: ErrLeaving.Error()},
		{name: "too many states", setup: func(_ *fixture, req *sluicev1.HandOffRequest) {
			req.States = make([]*sluicev1.KeyState, Batch+1)
		}, wantErr: "states: at most 1000 per request, got 1001"},
		{name: "no sender", setup: func(_ *fixture, req *sluicev1.HandOffRequest) { req.Sender = "" }, wantErr: "sender: must not be empty"},
		{name: "rings differ", setup: func(_ *fixture, req *sluicev1.HandOffRequest) { req.RingFingerprint = "0123" },
			wantErr: "ring_fingerprint: 0123 differs from the receiver's", refused: 1},
		{name: "a stranger", setup: func(_ *fixture, req *sluicev1.HandOffRequest) { req.Sender = "z" },
			wantErr: `sender: "z" is not a member of the receiver's ring`, refused: 1},
		{name: "itself", setup: func(_ *fixture, req *sluicev1.HandOffRequest) { req.Sender = "b" },
			wantErr: "sender: names the receiver itself", refused: 1},
		{name: "not the caller", setup: func(f *fixture, _ *sluicev1.HandOffRequest) { f.proved = "c" },
			wantErr: `sender: "a" is not the caller's identity`, refused: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, t0)
			k := f.keyOwnedBy(t, "b")
			req := &sluicev1.HandOffRequest{Sender: "a", RingFingerprint: f.node.ring.Fingerprint(),
				States: []*sluicev1.KeyState{{Key: k, State: state(t, 3, t0)}}}
			tt.setup(f, req)
			resp := f.m.Receive(context.Background(), req, nil)
			if !strings.HasPrefix(resp.Error, tt.wantErr) || resp.Merged != 0 {
				t.Fatalf("answer %+v, want error %q and nothing merged", resp, tt.wantErr)
			}
			if got := f.m.Counters.Refused.Load(); got != tt.refused {
				t.Fatalf("Refused = %d, want %d", got, tt.refused)
			}
			if _, ok := f.store.Get(string(k)); ok {
				t.Fatal("a refused request's state was merged")
			}
		})
	}
}

func TestReceiveVetsEachState(t *testing.T) {
	tests := []struct {
		name      string
		owner     string // of the key under the ring both hold
		leaving   bool   // the sender
		replica   bool
		hits      int64
		at        time.Time
		key       []byte // instead of a key of owner
		wantMerge bool
	}{
		{name: "a key of the receiver", owner: "b", hits: 3, at: t0, wantMerge: true},
		{name: "a key of another member", owner: "c", hits: 3, at: t0},
		{name: "a leaving sender's own key", owner: "a", leaving: true, hits: 3, at: t0, wantMerge: true},
		{name: "a leaving sender's copy as one of the next members (at least 3 looked at)", owner: "c", leaving: true, replica: true, hits: 3, at: t0, wantMerge: true},
		{name: "a leaving sender, a key it never had", owner: "c", leaving: true, hits: 3, at: t0},
		{name: "from the future", owner: "b", hits: 3, at: t0.Add(2 * time.Hour)},
		{name: "an empty key", key: []byte{}, hits: 1, at: t0},
		{name: "a too long key", key: make([]byte, 65), hits: 1, at: t0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, t0)
			k := tt.key
			if k == nil {
				k = f.keyOwnedBy(t, tt.owner)
			}
			req := &sluicev1.HandOffRequest{Sender: "a", RingFingerprint: f.node.ring.Fingerprint(), SenderLeaving: tt.leaving,
				FromReplica: tt.replica, States: []*sluicev1.KeyState{{Key: k, State: state(t, tt.hits, tt.at)}}}
			resp := f.m.Receive(context.Background(), req, nil)
			if resp.Error != "" {
				t.Fatalf("request refused whole: %s", resp.Error)
			}
			_, held := f.store.Get(string(k))
			if merged := resp.Merged == 1; merged != tt.wantMerge || held != tt.wantMerge {
				t.Fatalf("merged %d (held %v), want merged %v", resp.Merged, held, tt.wantMerge)
			}
			if !tt.wantMerge && f.m.Counters.Refused.Load() != 1 {
				t.Fatalf("Refused = %d, want 1", f.m.Counters.Refused.Load())
			}
		})
	}
}

func TestReceiveDoneOfALeavingMember(t *testing.T) {
	f := newFixture(t, t0)
	k := f.keyOwnedBy(t, "b")
	f.replicas.Set(k, "a", "a1", window.State{})
	resp := f.m.Receive(context.Background(), &sluicev1.HandOffRequest{Sender: "a", RingFingerprint: f.node.ring.Fingerprint(),
		Done: true, SenderLeaving: true, SenderInstance: "a1"}, nil)
	if resp.Error != "" {
		t.Fatal(resp.Error)
	}
	if len(f.node.departed) != 1 || f.node.departed[0] != "a/a1" {
		t.Fatalf("MemberLeaving calls %v, want [a/a1]", f.node.departed)
	}
	if _, ok := f.replicas.Get(string(k)); ok {
		t.Fatal("the leaving member's copies were kept")
	}
}

func TestReceiveStandInGoesToItsMerger(t *testing.T) {
	f := newFixture(t, t0)
	var got *sluicev1.HandOffRequest
	resp := f.m.Receive(context.Background(), &sluicev1.HandOffRequest{Sender: "a", StandIn: true},
		func(_ context.Context, v View, req *sluicev1.HandOffRequest) (int64, string) {
			got = req
			return 7, "why"
		})
	if got == nil || resp.Merged != 7 || resp.Error != "why" {
		t.Fatalf("answer %+v (merger called %v)", resp, got != nil)
	}
}

func TestGiveUpDuringChurnLeavesATomb(t *testing.T) {
	f := newFixture(t, time.Now()) // the ring changed just now
	k := f.keyOwnedBy(t, "b")
	f.store.MergeState(string(k), mustState(t, state(t, 4, t0)), t0)
	resp, err := f.m.GiveUp(context.Background(), "c", "a ring b never built", [][]byte{k}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.States) != 1 || f.m.Counters.HandedOff.Load() != 1 {
		t.Fatalf("gave %d states (handed off %d), want 1", len(resp.States), f.m.Counters.HandedOff.Load())
	}
	if to := f.custody.TombFor(k); to != "c" {
		t.Fatalf("tomb %q, want c", to)
	}
}

func TestGiveUpOnAStableRingOnlyWhatThePullerOwns(t *testing.T) {
	f := newFixture(t, time.Now().Add(-time.Hour)) // stable for an hour
	mine, cs := f.keyOwnedBy(t, "b"), f.keyOwnedBy(t, "c")
	for _, k := range [][]byte{mine, cs} {
		f.store.MergeState(string(k), mustState(t, state(t, 2, t0)), t0)
	}
	resp, err := f.m.GiveUp(context.Background(), "c", f.node.ring.Fingerprint(), [][]byte{mine, cs}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.States) != 1 || string(resp.States[0].Key) != string(cs) || f.m.Counters.Refused.Load() != 1 {
		t.Fatalf("gave %d states, refused %d; want c's key only", len(resp.States), f.m.Counters.Refused.Load())
	}
	if _, ok := f.store.Get(string(mine)); !ok {
		t.Fatal("b lost its own key to the pull")
	}
	// Under a ring b never built, on a stable ring: none (after
	// PullOwnerWait, or when the caller gives up).
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	resp, err = f.m.GiveUp(ctx, "c", "a ring b never built", [][]byte{mine}, false)
	if err != nil || len(resp.States) != 0 {
		t.Fatalf("under an unknown ring: %d states, %v; want none", len(resp.States), err)
	}
}

func TestVetPullerRefusesAStranger(t *testing.T) {
	f := newFixture(t, t0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no wait for gossip to bring it
	err := f.m.VetPuller(ctx, "z", 3)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `sender: "z" is not a member`) {
		t.Fatalf("VetPuller(stranger) = %v, want PermissionDenied naming the sender", err)
	}
	if f.m.Counters.Refused.Load() != 3 {
		t.Fatalf("Refused = %d, want 3", f.m.Counters.Refused.Load())
	}
	if err := f.m.VetPuller(context.Background(), "c", 1); err != nil {
		t.Fatalf("VetPuller(member) = %v", err)
	}
}

func mustState(t *testing.T, b []byte) window.State {
	t.Helper()
	var st window.State
	if err := st.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	return st
}

// recordingPeer is a peer whose HandOff streams answer every request and
// record it (in *log, "member:done" for a done, "member:states" else).
type recordingPeer struct {
	sluicev1.PeerServiceClient // nil: other calls panic
	member                     string
	log                        *[]string
}

func (p recordingPeer) HandOff(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[sluicev1.HandOffRequest, sluicev1.HandOffResponse], error) {
	return &recordingStream{p: p}, nil
}

type recordingStream struct {
	grpc.ClientStream // nil: unused
	p                 recordingPeer
	pending           int
	closed            bool
}

func (s *recordingStream) Send(req *sluicev1.HandOffRequest) error {
	what := "states"
	if req.Done {
		what = "done"
	}
	*s.p.log = append(*s.p.log, s.p.member+":"+what)
	s.pending++
	return nil
}

func (s *recordingStream) Recv() (*sluicev1.HandOffResponse, error) {
	if s.pending == 0 {
		return nil, io.EOF
	}
	s.pending--
	return &sluicev1.HandOffResponse{}, nil
}

func (s *recordingStream) CloseSend() error { s.closed = true; return nil }

// failingStandIns are stand-in windows whose flush leaves the hits of the
// owners in failed behind, noting each flush in *log.
type failingStandIns struct {
	noStandIns
	failed map[string]error
	log    *[]string
}

func (f failingStandIns) Flush(context.Context) map[string]error {
	*f.log = append(*f.log, "flush")
	return f.failed
}

// A member hears a push's done only once the stand-in hits of its keys
// went: it decides the keys moved to it from what it has once every other
// member said done, so hits still held elsewhere would be admitted again.
// Here the stand-in hits for c did not go: a and c both get no done before
// the flush, c none at all, and the push fails (it is tried again).
func TestPushSaysDoneOnlyAfterTheStandInHits(t *testing.T) {
	f := newFixture(t, t0)
	var log []string
	f.node.peers = map[string]sluicev1.PeerServiceClient{
		"a": recordingPeer{member: "a", log: &log},
		"c": recordingPeer{member: "c", log: &log},
	}
	f.m.cfg.StandIns = failingStandIns{failed: map[string]error{"c": errors.New("c unreachable")}, log: &log}
	failed, err := f.m.Push(context.Background(), f.node.View())
	if err == nil || failed["c"] == nil || failed["a"] != nil {
		t.Fatalf("push: failed %v, error %v; want c failed for its stand-in hits", failed, err)
	}
	if len(log) != 2 || log[0] != "flush" || log[1] != "a:done" {
		t.Fatalf("events %v, want [flush a:done]", log)
	}
	if f.custody.LastPush() == f.node.ring.Fingerprint() {
		t.Fatal("a push that left stand-in hits behind was recorded as complete")
	}
}

// A relearn pull (the puller paused) from a member this node took out of
// its ring is refused (at once) until this node takes it back: the keys it would
// give up are its own to decide under its ring, and it would decide them
// from nothing after. A relearn pull once the puller is back in the ring
// goes on. (A plain pull under a ring this node built goes on whatever
// its ring is now: TestPullWaitsForAPushThatTookTheKeyAfterItsWait.)
func TestRelearnPullRefusedUntilThePullerIsBackInTheRing(t *testing.T) {
	f := newFixture(t, time.Now().Add(-time.Hour))
	abc := f.node.ring
	k := f.keyOwnedBy(t, "c")
	// c taken for dead: b's ring is a and b.
	up, err := f.rings.Apply([]ringview.Member{{Name: "a", Instance: "a1"}, {Name: "b"}}, "b1", false, time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	f.node.ring = up.Ring
	f.store.MergeState(string(k), mustState(t, state(t, 3, t0)), t0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.m.GiveUp(ctx, "c", abc.Fingerprint(), [][]byte{k}, true); status.Code(err) != codes.Unavailable {
		t.Fatalf("a relearn pull from c, out of b's ring: %v, want Unavailable (ErrPullerOutOfRing)", err)
	}
	if _, ok := f.store.Get(string(k)); !ok {
		t.Fatal("the refused pull took the key")
	}
	// c is taken back: the relearn pull gets the key.
	up, err = f.rings.Apply([]ringview.Member{{Name: "a", Instance: "a1"}, {Name: "b"}, {Name: "c", Instance: "c1"}}, "b1", false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.node.ring = up.Ring
	resp, err := f.m.GiveUp(context.Background(), "c", abc.Fingerprint(), [][]byte{k}, true)
	if err != nil || len(resp.States) != 1 {
		t.Fatalf("a relearn pull from c, back in b's ring: %d states, %v; want the key", len(resp.States), err)
	}
}
