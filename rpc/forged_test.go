package rpc

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// encodeState encodes a state by hand (see window.State.AppendBinary), to
// send what no honest owner would.
func encodeState(alg window.Algorithm, w time.Duration, at time.Time, a, b, rate uint64) []byte {
	out := []byte{1}
	out = binary.AppendUvarint(out, uint64(w)<<8|uint64(alg))
	out = binary.AppendVarint(out, at.UnixNano())
	out = binary.AppendUvarint(out, a)
	out = binary.AppendUvarint(out, b)
	return binary.AppendUvarint(out, rate)
}

// handOff sends one HandOff request over a real stream and returns the
// answer.
func handOff(t *testing.T, c sluicev1.PeerServiceClient, req *sluicev1.HandOffRequest) *sluicev1.HandOffResponse {
	t.Helper()
	st, err := c.HandOff(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	return resp
}

// Forged hand-offs sent to a running node over real RPCs are refused and
// counted, and a peek afterwards shows the victim key's count untouched:
// a sender that is not a member, a member pushing a key the receiver does
// not own or that it never owned while leaving, an old ring, times far in
// the future, counts no limit allows, windows of 0 or over 366 days, bad
// encodings, and a state that would replace the key's count.
func TestForgedHandOffsRefused(t *testing.T) {
	clock := windowClock()
	nodes := startInprocCluster(t, 2, clock)
	n1, n2 := nodes[0], nodes[1]
	victim := keyOwnedBy(t, n1, "api", "node1")
	other := keyOwnedBy(t, n1, "api", "node2")
	limit := &sluicev1.RateLimitCheck{Name: "api", Key: victim, Limit: 5, WindowMs: 3_600_000}
	for range 4 {
		check(t, n1.client, limit)
	}
	peek := func() int64 {
		zero := int64(0)
		pk := &sluicev1.RateLimitCheck{Name: "api", Key: victim, Limit: 5, WindowMs: 3_600_000, Hits: &zero}
		return check(t, n1.client, pk).Remaining
	}
	if r := peek(); r != 1 {
		t.Fatalf("remaining %d after 4 of 5, want 1", r)
	}
	vk, ok := ring.Key(nil, "api", victim), ring.Key(nil, "api", other)
	now := clock.Now()
	fp := n1.Server().RingFingerprint()
	hour := time.Hour
	// An honest-looking state that would lower the victim's count if it
	// replaced it: a newer state (a second ahead, within the clock slack)
	// of another algorithm and window, with nothing consumed.
	fresh := encodeState(window.TokenBucket, time.Minute, now.Add(time.Second), 0, 0, 5)
	peer := n1.peer(t)
	for _, tc := range []struct {
		what    string
		req     *sluicev1.HandOffRequest
		wantErr string // the whole request refused; "": keys refused one by one
	}{
		{"a sender that is not a member", &sluicev1.HandOffRequest{Sender: "mallory", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: fresh}}}, "not a member"},
		{"the receiver's own name", &sluicev1.HandOffRequest{Sender: "node1", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: fresh}}}, "receiver itself"},
		{"an old ring", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: "0123456789abcdef",
			States: []*sluicev1.KeyState{{Key: vk, State: fresh}}}, "ring_fingerprint"},
		{"a key the receiver does not own", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: ok, State: encodeState(window.FixedWindow, hour, now, 3, 0, 0)}}}, ""},
		{"a leaving member that never owned the key", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: "whatever", SenderLeaving: true,
			States: []*sluicev1.KeyState{{Key: vk, State: fresh}}}, ""},
		{"a time an hour ahead", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: encodeState(window.TokenBucket, hour, now.Add(2*hour), 0, 0, 5)}}}, ""},
		{"a count above limit*N", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: encodeState(window.FixedWindow, hour, now, 1<<62, 0, 0)}}}, ""},
		{"a window of 0", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: encodeState(window.FixedWindow, 0, now, 1, 0, 0)}}}, ""},
		{"a window of 367 days", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: encodeState(window.FixedWindow, 367*24*hour, now, 1, 0, 0)}}}, ""},
		{"a bad encoding", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: []byte{1, 0xff}}}}, ""},
		{"a state that would replace the count", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{Key: vk, State: fresh}}}, ""},
		{"an empty key", &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
			States: []*sluicev1.KeyState{{State: fresh}}}, ""},
	} {
		before := n1.Server().Stats().HandOffRefused
		resp := handOff(t, peer, tc.req)
		if resp.Merged != 0 || (tc.wantErr == "") != (resp.Error == "") || !strings.Contains(resp.Error, tc.wantErr) {
			t.Errorf("%s: merged %d, error %q; want nothing merged and error %q", tc.what, resp.Merged, resp.Error, tc.wantErr)
		}
		if got := n1.Server().Stats().HandOffRefused - before; got != 1 {
			t.Errorf("%s: %d refusals counted, want 1", tc.what, got)
		}
		if r := peek(); r != 1 {
			t.Fatalf("%s: the victim's remaining went from 1 to %d", tc.what, r)
		}
	}
	st := n1.Server().Stats()
	if st.ReceivedHandOff != 0 {
		t.Fatalf("%d keys merged from forged hand-offs", st.ReceivedHandOff)
	}
	if _, held := n1.Store().Get(string(ok)); held {
		t.Fatal("a key owned by node2 was pushed into node1's windows")
	}
	// An honest hand-off of the same key still merges: it adds.
	resp := handOff(t, peer, &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: fp,
		States: []*sluicev1.KeyState{{Key: vk, State: encodeState(window.FixedWindow, hour, now, 1, 0, 0)}}})
	if resp.Merged != 1 || resp.Error != "" || peek() != 0 {
		t.Fatalf("an honest hand-off: %+v, remaining %d, want merged and 0 left", resp, peek())
	}
	// A pull from a non-member would take the victim's state away: it
	// is refused, and the count stays.
	_, err := peer.Pull(context.Background(), &sluicev1.PullRequest{Sender: "mallory", RingFingerprint: fp, Keys: [][]byte{vk}})
	if status.Code(err) != codes.PermissionDenied || peek() != 0 {
		t.Fatalf("a pull from a non-member: %v, remaining %d, want PERMISSION_DENIED and 0", err, peek())
	}
	_ = n2
}

// The place the TLS identity plugs in: when the transport proves who the
// caller is, a hand-off naming another sender is refused whole.
func TestHandOffSenderMustBeCaller(t *testing.T) {
	clock := windowClock()
	n := startNodeCfg(t, NodeConfig{Name: "node1", Clock: clock,
		PeerIdentity: func(context.Context) (string, bool) { return "node7", true }})
	req := &sluicev1.HandOffRequest{Sender: "node2", RingFingerprint: n.Server().RingFingerprint(),
		States: []*sluicev1.KeyState{{Key: ring.Key(nil, "api", "k"), State: encodeState(window.FixedWindow, time.Hour, clock.Now(), 1, 0, 0)}}}
	resp := handOff(t, dialPeer(t, n.GRPCAddr()), req)
	if resp.Merged != 0 || !strings.Contains(resp.Error, "not the caller's identity") || n.Server().Stats().HandOffRefused != 1 {
		t.Fatalf("a sender other than the caller: %+v, stats %+v", resp, n.Server().Stats())
	}
}
