package security

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeMembers is a gossip member list and a verification whose answers
// the test sets, with a clock the test moves.
type fakeMembers struct {
	mu      sync.Mutex
	members []Member
	bad     map[Member]bool // these fail to verify
	dialed  []string        // names verified, in order
	now     time.Time
}

func (f *fakeMembers) list() []Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Member(nil), f.members...)
}

func (f *fakeMembers) verify(ctx context.Context, name, addr string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > verifyTimeout {
		return errors.New("no deadline of at most verifyTimeout")
	}
	f.dialed = append(f.dialed, name)
	for m := range f.bad {
		if m.Name == name && m.Addr == addr {
			return errors.New("certificate names someone else")
		}
	}
	return nil
}

func (f *fakeMembers) takeDialed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.dialed
	f.dialed = nil
	return d
}

func newFakeVerifier(f *fakeMembers, onAdmit func()) *Verifier {
	v := NewVerifier(VerifierConfig{Self: "node1", Members: f.list, Verify: f.verify, OnAdmit: onAdmit, Logger: quietLogger()})
	v.now = func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
	return v
}

// Members enter only once verified, per incarnation; failures back off
// 1 s doubling to 30 s; a new incarnation is tried at once; members that
// leave are forgotten.
func TestVerifierAdmitsVerifiedIncarnations(t *testing.T) {
	self := Member{"node1", "10.0.0.1:7070", "a"}
	good := Member{"node2", "10.0.0.2:7070", "a"}
	bad := Member{"node3", "10.0.0.3:7070", "a"}
	f := &fakeMembers{members: []Member{self, good, bad}, bad: map[Member]bool{bad: true}, now: time.Unix(1000, 0)}
	v := newFakeVerifier(f, nil)
	ctx := context.Background()

	if got := v.Admit(f.list()); !slices.Equal(got, []bool{true, false, false}) {
		t.Fatalf("before any verification: %v, want only this node", got)
	}
	if !v.Verifying([]Member{good, bad}) {
		t.Fatal("nothing verified yet: Verifying false")
	}
	if !v.pass(ctx) {
		t.Fatal("a pass admitting node2 said it admitted none")
	}
	if d := f.takeDialed(); !slices.Equal(d, []string{"node2", "node3"}) {
		t.Fatalf("dialed %v, want node2 and node3 (never this node)", d)
	}
	if got := v.Admit(f.list()); !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("after a pass: %v, want node1 and node2", got)
	}
	if got := v.Failures(); !maps.Equal(got, map[string]int{"node3": 1}) {
		t.Fatalf("failures %v, want node3 once", got)
	}
	if v.Verifying([]Member{bad}) {
		t.Fatal("node3 failed for its incarnation: Verifying true")
	}

	// Backoff: 1 s, 2 s, 4 s, 8 s, 16 s, then 30 s.
	for fails, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		f.now = f.now.Add(wait - time.Millisecond)
		if v.pass(ctx) || len(f.takeDialed()) != 0 {
			t.Fatalf("after %d failures, node3 retried %s early", fails+1, time.Millisecond)
		}
		f.now = f.now.Add(time.Millisecond)
		v.pass(ctx)
		if d := f.takeDialed(); !slices.Equal(d, []string{"node3"}) {
			t.Fatalf("after %d failures and %s: dialed %v, want node3", fails+1, wait, d)
		}
	}
	if got := v.Failures()["node3"]; got != 8 {
		t.Fatalf("node3 failed %d times, want 8", got)
	}

	// node3 restarts with a good certificate: tried at once, admitted.
	restarted := Member{"node3", "10.0.0.3:7070", "b"}
	f.members = []Member{self, good, restarted}
	f.bad = nil
	if !v.Verifying([]Member{restarted}) {
		t.Fatal("a new incarnation of node3: Verifying false")
	}
	if !v.pass(ctx) {
		t.Fatal("the restarted node3 was not admitted")
	}
	if got := v.Admit(f.list()); !slices.Equal(got, []bool{true, true, true}) || len(v.Failures()) != 0 {
		t.Fatalf("after node3's restart: %v, failures %v", got, v.Failures())
	}

	// node2 moves: its new address is verified afresh; node3 leaves and
	// is forgotten.
	moved := Member{"node2", "10.0.0.9:7070", "a"}
	f.members = []Member{self, moved}
	if got := v.Admit(f.list()); !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("node2 at a new address: %v, want not admitted", got)
	}
	f.members = []Member{self, moved, restarted}
	if got := v.Admit(f.list()); got[2] {
		t.Fatal("node3 came back after it was forgotten: admitted without a verification")
	}

	// A pass cut short by its context counts no failure.
	f.bad = map[Member]bool{moved: true}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	v.pass(cctx)
	if got := v.Failures(); len(got) != 0 {
		t.Fatalf("a canceled pass counted failures: %v", got)
	}
}

// Run verifies soon after Admit meets a member it has not admitted, calls
// OnAdmit after a pass that admitted one, and returns when its context
// ends.
func TestVerifierRun(t *testing.T) {
	f := &fakeMembers{members: []Member{{"node1", "a1", "a"}}, now: time.Unix(1000, 0)}
	admitted := make(chan struct{}, 1)
	v := newFakeVerifier(f, func() {
		select {
		case admitted <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()

	f.mu.Lock()
	f.members = append(f.members, Member{"node2", "a2", "a"})
	f.mu.Unlock()
	v.Admit(f.list())
	select {
	case <-admitted:
	case <-time.After(10 * time.Second):
		t.Fatal("OnAdmit not called")
	}
	if got := v.Admit(f.list()); !slices.Equal(got, []bool{true, true}) {
		t.Fatalf("after Run: %v", got)
	}
	cancel()
	<-done
}
