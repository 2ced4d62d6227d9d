package handoff

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// What the hand-off logs when nothing is wrong (a member that just
// joined, a whole cluster stopping) and when something is.

// records is a slog handler keeping every record.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// atLeast returns the messages of the records at level or above.
func (r *records) atLeast(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.list {
		if rec.Level >= level {
			out = append(out, rec.Message)
		}
	}
	return out
}

// logTo makes f's Mover log into a fresh records.
func (f *fixture) logTo() *records {
	r := &records{}
	f.m.log = slog.New(r)
	return r
}

// joiningNode is f's node whose ring gains member after its View was
// read after calls times: gossip bringing news of a join.
type joiningNode struct {
	*fakeNode
	calls atomic.Int64
	after int64
	then  *ring.Ring
}

func (n *joiningNode) View() View {
	if n.calls.Add(1) > n.after {
		return View{Ring: n.then}
	}
	return n.fakeNode.View()
}

// A member that just joined says done to every member it knows; one that
// has not heard of it yet waits for gossip (here, its third look at its
// ring) and takes the done, with nothing logged at warn. make run's third
// node logged "hand-off refused ... is not a member of the receiver's
// ring" at warn on every start.
func TestReceiveWaitsForAJoiningMember(t *testing.T) {
	f := newFixture(t, t0)
	logs := f.logTo()
	withD, err := ring.New([]string{"a", "b", "c", "d"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.m.cfg.Node = &joiningNode{fakeNode: f.node, after: 3, then: withD}
	resp := f.m.Receive(context.Background(), &sluicev1.HandOffRequest{Sender: "d", RingFingerprint: withD.Fingerprint(), Done: true}, nil)
	if resp.Error != "" || f.m.Counters.Refused.Load() != 0 {
		t.Fatalf("a joining member's done: %+v (refused %d), want taken", resp, f.m.Counters.Refused.Load())
	}
	if w := logs.atLeast(slog.LevelWarn); len(w) != 0 {
		t.Fatalf("logged at warn or above: %q", w)
	}
}

// A stranger is still refused, after MemberWait, and at warn.
func TestReceiveRefusesAStrangerAtWarn(t *testing.T) {
	f := newFixture(t, t0)
	logs := f.logTo()
	resp := f.m.Receive(context.Background(), &sluicev1.HandOffRequest{Sender: "z", RingFingerprint: f.node.ring.Fingerprint(), Done: true}, nil)
	if !strings.Contains(resp.Error, `"z" is not a member`) {
		t.Fatalf("a stranger's done: %+v, want refused", resp)
	}
	if w := logs.atLeast(slog.LevelWarn); len(w) != 1 || w[0] != "hand-off refused" {
		t.Fatalf("logged at warn or above: %q, want one hand-off refused", w)
	}
}

// peerAnswering is a peer whose HandOff fails with err, or whose streams
// answer every request with the refusal refusal.
type peerAnswering struct {
	sluicev1.PeerServiceClient // nil: other calls panic
	err                        error
	refusal                    string
}

func (p peerAnswering) HandOff(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[sluicev1.HandOffRequest, sluicev1.HandOffResponse], error) {
	if p.err != nil {
		return nil, p.err
	}
	return &refusingStream{refusal: p.refusal}, nil
}

type refusingStream struct {
	grpc.ClientStream // nil: unused
	refusal           string
}

func (s *refusingStream) Send(*sluicev1.HandOffRequest) error { return nil }
func (s *refusingStream) Recv() (*sluicev1.HandOffResponse, error) {
	return &sluicev1.HandOffResponse{Error: s.refusal}, nil
}
func (s *refusingStream) CloseSend() error { return nil }

// leavingB makes f's node b leave with a key of a and a key of c (under
// the ring a-b-c) in its windows, under the ring a-c, with peers for a and
// c; it returns the number of keys.
func leavingB(t *testing.T, f *fixture, a, c sluicev1.PeerServiceClient) int {
	t.Helper()
	ka, kc := f.keyOwnedBy(t, "a"), f.keyOwnedBy(t, "c")
	for _, k := range [][]byte{ka, kc} {
		f.store.MergeState(string(k), mustState(t, state(t, 2, t0)), t0)
	}
	ac, err := ring.New([]string{"a", "c"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.node.ring, f.node.leaving = ac, true
	f.node.peers = map[string]sluicev1.PeerServiceClient{"a": a, "c": c}
	return f.store.Len()
}

// When every other member is leaving too (a whole cluster stopping at
// once), no one can take the keys: LeaveAll says so (ErrNoneToTake), with
// nothing at warn, and counts the keys it could not hand off. make run's
// Ctrl-C logged three warnings and three errors.
func TestLeaveAllWhenEveryoneLeaves(t *testing.T) {
	f := newFixture(t, t0)
	logs := f.logTo()
	leaving := peerAnswering{refusal: ErrLeaving.Error()}
	n := leavingB(t, f, leaving, leaving)
	err := f.m.LeaveAll(context.Background())
	// ring.ErrNoMembers stays in the chain: a node with a state dir keeps
	// the keys on it (rpc's noneCouldTake).
	if !errors.Is(err, ErrNoneToTake) || !errors.Is(err, ring.ErrNoMembers) || !strings.Contains(err.Error(), "2 keys not handed off") {
		t.Fatalf("LeaveAll = %v, want 2 keys not handed off, ErrNoneToTake and ring.ErrNoMembers", err)
	}
	if got := f.m.Counters.MovedWithoutState.Load(); got != int64(n) || n != 2 {
		t.Fatalf("MovedWithoutState = %d, want the %d keys", got, n)
	}
	if w := logs.atLeast(slog.LevelWarn); len(w) != 0 {
		t.Fatalf("logged at warn or above: %q", w)
	}
}

// When a member could not be reached, the keys are lost for a real
// reason: the error is not ErrNoneToTake and the retry is logged at warn.
func TestLeaveAllWithAnUnreachableMemberWarns(t *testing.T) {
	f := newFixture(t, t0)
	logs := f.logTo()
	leavingB(t, f, peerAnswering{refusal: ErrLeaving.Error()}, peerAnswering{err: status.Error(codes.Unavailable, "connection refused")})
	err := f.m.LeaveAll(context.Background())
	if err == nil || errors.Is(err, ErrNoneToTake) || !errors.Is(err, ring.ErrNoMembers) {
		t.Fatalf("LeaveAll = %v, want ring.ErrNoMembers and not ErrNoneToTake", err)
	}
	if w := logs.atLeast(slog.LevelWarn); len(w) != 1 || w[0] != "hand-off before leaving incomplete, retrying" {
		t.Fatalf("logged at warn or above: %q, want the retry once", w)
	}
}
