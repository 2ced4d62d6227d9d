package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// freezer holds a node's incoming gRPC messages while frozen, as a
// stopped process's kernel holds them in its sockets: calls and stream
// messages wait, and go on when it thaws (its callers may have given up
// by then). It stands in for SIGSTOP in one process: the node's own
// loops still run (a real pause stops them too), but nobody hears from
// it, and it hears nothing.
type freezer struct {
	mu sync.Mutex
	ch chan struct{} // nil: thawed
	// lost is closed with ch when the messages held are lost at the thaw
	// (their callers gave up long before: the node reads only their
	// cancellations).
	lost bool
}

func (f *freezer) freeze() {
	f.mu.Lock()
	f.ch, f.lost = make(chan struct{}), false
	f.mu.Unlock()
}

// thaw lets the node read on; with lose, what was held during the freeze
// fails instead of going on.
func (f *freezer) thaw(lose bool) {
	f.mu.Lock()
	if f.ch != nil {
		f.lost = lose
		close(f.ch)
		f.ch = nil
	}
	f.mu.Unlock()
}

var errLostInFreeze = errors.New("held while the node was frozen; its caller gave up")

// wait returns once thawed (an error if what it held was lost), or ctx's
// error when the caller gave up meanwhile (its cancellation comes before
// the node reads on).
func (f *freezer) wait(ctx context.Context) error {
	f.mu.Lock()
	ch := f.ch
	f.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.lost {
			return errLostInFreeze
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type frozenStream struct {
	grpc.ServerStream
	f *freezer
}

func (s frozenStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		err = s.f.wait(s.Context())
	}
	return err
}

func (f *freezer) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, frozenStream{ss, f})
		}),
	}
}

// A paused owner never decides from the state it had before the pause
// (issue 36: on ef79677, a node frozen with SIGSTOP while the others
// counted its keys to their limit admitted again from what it held, 41
// of 40). Three nodes; a key of n3's at 40 per hour with 10 spent and
// copied; n3 frozen. Long: the others declare it dead, its key's new
// owner takes the copy over and the checks through them admit the other
// 30. Short: it stays in their rings, and its stand-in holder admits them
// from the copy. Then n3 resumes (its detector sees the gap) and checks
// go straight to it, then, once it is back in every ring, through every
// node: every allowed answer, degraded ones too, adds up to at most 40,
// in each of 25 repetitions of each kind.
func TestPausedOwnerNeverDecidesFromStaleState(t *testing.T) {
	for _, long := range []bool{true, false} {
		for rep := range 25 { // issue 36: 50 repetitions
			t.Run(fmt.Sprintf("declared-dead=%v/%d", long, rep), func(t *testing.T) {
				pausedOwner(t, long, rep)
			})
		}
	}
}

func pausedOwner(t *testing.T, long bool, rep int) {
	clock := windowClock()
	f := &freezer{}
	cfg := func(name string) NodeConfig {
		c := NodeConfig{Name: name, Clock: clock, ForwardTimeout: 400 * time.Millisecond, HandOffTimeout: time.Second,
			Replication: ReplicationConfig{Interval: 500 * time.Millisecond}}
		if name == "n3" {
			c.ServerOptions = f.options()
		}
		return c
	}
	nodes := startInproc(t, cfg("n1"), cfg("n2"), cfg("n3"))
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	const limit = 40
	rc := &sluicev1.RateLimitCheck{Name: "pause", Limit: limit, WindowMs: 3_600_000}
	for i := 0; rc.Key == ""; i++ {
		if k := fmt.Sprintf("paused-%d-%d", rep, i); n1.srv.view.Load().ring.Owner(ring.Key(nil, "pause", k)) == "n3" {
			rc.Key = k
		}
	}
	storeKey := string(ring.Key(nil, "pause", rc.Key))
	admitted := 0
	for range 10 {
		if d := check(t, n1.client, rc); d.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("%d of the first 10 allowed", admitted)
	}
	// The copy reaches n3's successor.
	succ := n3.srv.standInHolder(n3.srv.view.Load(), "n3")
	var holder *inprocNode
	for _, n := range nodes {
		if n.name == succ {
			holder = n
		}
	}
	// The copy is current: the crash bound is 0 (what is tested is the
	// pause, not what a crash can lose).
	deadline := time.Now().Add(10 * time.Second)
	for {
		own, _ := n3.store.Get(storeKey)
		if st, ok := holder.srv.replicas.Get(storeKey); ok && st == own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no current copy of %s at %s", rc.Key, succ)
		}
		time.Sleep(20 * time.Millisecond)
	}

	f.freeze()
	others := []*inprocNode{n1, n2}
	if long {
		// The others declare n3 dead: its key's new owner takes the copy.
		for _, n := range others {
			var ms = n.c.members()
			alive := ms[:0]
			for _, m := range ms {
				if m.Name != "n3" {
					alive = append(alive, m)
				}
			}
			if err := n.srv.SetMembers(alive); err != nil {
				t.Fatal(err)
			}
		}
	}
	// 40 more checks through n1 and n2, 8 at a time (a forward to the
	// frozen n3 waits for the forward timeout).
	var during atomic.Int64
	var wg sync.WaitGroup
	jobs := make(chan *inprocNode)
	for range 8 {
		wg.Go(func() {
			for n := range jobs {
				if d := check(t, n.client, rc); d.Allowed {
					during.Add(1)
				}
			}
		})
	}
	for i := range 40 {
		jobs <- others[i%2]
	}
	close(jobs)
	wg.Wait()
	admitted += int(during.Load())

	// n3 resumes: its detector sees the gap first.
	n3.srv.pause.Backdate(2 * time.Second)
	// What its callers sent while it was frozen is lost (they gave up):
	// the stand-in holder hands its hits on at its next flush.
	f.thaw(true)
	direct := 0
	var over []*sluicev1.Decision
	for i := range 20 {
		if long && i == 3 {
			// The others take n3 back (it refuted its death); until
			// then they give it nothing (handoff.ErrPullerOutOfRing),
			// and it denies.
			n3.c.join()
		}
		d := check(t, n3.client, rc)
		if d.Allowed {
			direct++
			if admitted+direct > limit {
				over = append(over, d)
			}
		}
	}
	admitted += direct
	after := 0
	for i := range 30 {
		if d := check(t, nodes[i%3].client, rc); d.Allowed {
			after++
			if admitted+after > limit {
				over = append(over, d)
			}
		}
	}
	admitted += after
	st := n3.srv.Stats()
	t.Logf("%d during the pause, %d straight to n3 after it, %d through every node: %d of %d; n3: %d pauses, %d denied while relearning",
		during.Load(), direct, after, admitted, limit, st.Pauses, st.PausedDenied)
	if admitted > limit {
		t.Errorf("%d admitted of %d; over the limit: %v", admitted, limit, over)
	}
	if st.Pauses != 1 {
		t.Errorf("n3 saw %d pauses, want 1", st.Pauses)
	}
	if during.Load() < 20 {
		t.Errorf("only %d admitted while n3 was frozen: the scenario did not count the key elsewhere", during.Load())
	}
}

// A pause nothing happened in costs nothing: the relearn's pulls find
// nothing elsewhere, and the key goes on from what its owner counted,
// exactly (nothing counted twice, nothing lost). While a member cannot
// answer the pull, the key's checks are denied (degraded, nothing
// counted: unknown means spent); once the hand-off timeout has passed,
// the owner decides from what it has.
func TestPauseRelearnIsExactAndDeniesWhileAMemberIsSilent(t *testing.T) {
	clock := windowClock()
	cfg := func(name string) NodeConfig {
		return NodeConfig{Name: name, Clock: clock, ForwardTimeout: 400 * time.Millisecond, HandOffTimeout: time.Second}
	}
	nodes := startInproc(t, cfg("n1"), cfg("n2"), cfg("n3"))
	n1, n3 := nodes[0], nodes[2]
	const limit = 40
	keyOf := func(prefix string) *sluicev1.RateLimitCheck {
		rc := &sluicev1.RateLimitCheck{Name: "pause", Limit: limit, WindowMs: 3_600_000}
		for i := 0; rc.Key == ""; i++ {
			if k := fmt.Sprintf("%s-%d", prefix, i); n1.srv.view.Load().ring.Owner(ring.Key(nil, "pause", k)) == "n3" {
				rc.Key = k
			}
		}
		return rc
	}
	quiet, silent := keyOf("quiet"), keyOf("silent")
	for range 10 {
		check(t, n1.client, quiet)
		check(t, n1.client, silent)
	}
	n3.srv.pause.Backdate(2 * time.Second)
	more := 0
	for i := range 40 {
		if d := check(t, nodes[i%3].client, quiet); d.Allowed {
			more++
		}
	}
	if more != limit-10 {
		t.Fatalf("after a pause nothing happened in: %d more allowed, want exactly %d", more, limit-10)
	}
	// A second pause, with n1 gone silent (killed: not yet declared dead).
	n1.Kill()
	n3.srv.pause.Backdate(2 * time.Second)
	d := check(t, n3.client, silent)
	if d.Allowed || !d.Degraded || d.RetryAfter <= 0 {
		t.Fatalf("a check of a key whose pull cannot reach n1, after a pause: %v; want denied, degraded, with a retry_after", d)
	}
	if st := n3.srv.Stats(); st.Pauses != 2 || st.PausedDenied == 0 {
		t.Errorf("n3: %d pauses, %d denied while relearning; want 2 and some", st.Pauses, st.PausedDenied)
	}
	// Past the hand-off timeout the wait ends: n3 decides from what it
	// holds (10 of 40).
	deadline := time.Now().Add(5 * time.Second)
	for {
		d = check(t, n3.client, silent)
		if d.Allowed || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !d.Allowed || d.Degraded || d.Remaining != limit-11 {
		t.Errorf("after the hand-off timeout: %v; want allowed by n3 from its 10, remaining 29 (the denied checks counted nothing)", d)
	}
}

// A paused region's only node comes back to leases that went on without
// it: the others declared it dead, the key's allocation moved to another
// region (which learnt what the regions held) and back. Its allocators'
// records and its holders' slices are stale; after the pause it starts
// its leases again as a restarted process does (keeping its windows), so
// the regions together never pass the limit in the window, with the
// key's allocator in the paused region or in another.
func TestPausedRegionNodeNeverAdmitsFromStaleLeases(t *testing.T) {
	for _, allocInA := range []bool{true, false} {
		t.Run(fmt.Sprintf("allocator-in-a=%v", allocInA), func(t *testing.T) {
			clock := windowClock()
			regions, _ := region.Parse("a,b,c")
			f := &freezer{}
			var cfgs []NodeConfig
			for _, r := range []string{"a", "b", "c"} {
				c := NodeConfig{Name: r + "-1", Region: r, Regions: regions, Clock: clock}
				if r == "a" {
					c.ServerOptions = f.options()
				}
				cfgs = append(cfgs, c)
			}
			nodes := startInproc(t, cfgs...)
			a, b, c := nodes[0], nodes[1], nodes[2]
			clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour) // past the start's window
			const limit = 30
			rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 3_600_000}
			for i := 0; rc.Key == ""; i++ {
				if k := fmt.Sprintf("pause-%d", i); (a.srv.leases.order(region.SeedOf("api", k))[0] == "a") == allocInA {
					rc.Key = k
				}
			}
			before := leaseCheckUntil(t, []*inprocNode{a}, rc, 12, 10*time.Second)
			f.freeze()
			for _, n := range []*inprocNode{b, c} {
				alive := slices.DeleteFunc(n.c.members(), func(m cluster.Member) bool { return m.Name == a.name })
				if err := n.srv.SetMembers(alive); err != nil {
					t.Fatal(err)
				}
			}
			during := leaseFlood(t, []*inprocNode{b, c}, rc, 2*time.Second)
			a.srv.pause.Backdate(5 * time.Second)
			f.thaw(true)
			a.c.join()
			after := leaseFlood(t, []*inprocNode{a, b, c}, rc, 2*time.Second)
			total := before + during + after
			t.Logf("%d in a, %d in b and c while a was paused, %d after: %d of %d", before, during, after, total, limit)
			if total > limit {
				t.Errorf("%d of %d admitted in the hour", total, limit)
			}
			if st := a.srv.Stats(); st.Pauses != 1 {
				t.Errorf("a saw %d pauses, want 1", st.Pauses)
			}
		})
	}
}

// In a region of two nodes, the paused one held a key's holder: while it
// was out, the other member took the key, asked the allocator for the
// region's slice and acknowledged a lower as another region wanted more.
// The paused node's holder still had the slice from before: it must not
// admit from it (it starts again, at 0, and asks).
func TestPausedMemberOfARegionDropsItsStaleSlice(t *testing.T) {
	clock := windowClock()
	regions, _ := region.Parse("a,b,c")
	f := &freezer{}
	var cfgs []NodeConfig
	for _, name := range []string{"a-1", "a-2", "b-1", "c-1"} {
		c := NodeConfig{Name: name, Region: name[:1], Regions: regions, Clock: clock}
		if name == "a-2" {
			c.ServerOptions = f.options()
		}
		cfgs = append(cfgs, c)
	}
	nodes := startInproc(t, cfgs...)
	a1, a2, b, c := nodes[0], nodes[1], nodes[2], nodes[3]
	clock.Advance(time.Duration(standReach(time.Hour)+3) * time.Hour)
	const limit = 30
	rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 3_600_000}
	for i := 0; rc.Key == ""; i++ {
		k := fmt.Sprintf("member-%d", i)
		if a1.srv.view.Load().ring.Owner(ring.Key(nil, "api", k)) == a2.name && a1.srv.leases.order(region.SeedOf("api", k))[0] != "a" {
			rc.Key = k
		}
	}
	// a asks for much, uses 6: its slice is well above its count.
	before := leaseCheckUntil(t, []*inprocNode{a1}, rc, 6, 10*time.Second)
	// The copy at a-1 is current (the crash bound is 0: what is tested
	// is the pause, not what a crash can lose).
	storeKey := string(ring.Key(nil, "api", rc.Key))
	deadline := time.Now().Add(10 * time.Second)
	for {
		own, _ := a2.store.Get(storeKey)
		if cp, ok := a1.srv.replicas.Get(storeKey); ok && cp == own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a-1's copy of the key never caught up with a-2's state")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.freeze()
	for _, n := range []*inprocNode{a1, b, c} {
		alive := slices.DeleteFunc(n.c.members(), func(m cluster.Member) bool { return m.Name == a2.name })
		if err := n.srv.SetMembers(alive); err != nil {
			t.Fatal(err)
		}
	}
	during := leaseCheckUntil(t, []*inprocNode{a1}, rc, 1, 10*time.Second)
	during += leaseFlood(t, []*inprocNode{b, c}, rc, 2*time.Second)
	a2.srv.pause.Backdate(5 * time.Second)
	f.thaw(true)
	a2.c.join()
	direct := leaseFlood(t, []*inprocNode{a2}, rc, time.Second)
	after := leaseFlood(t, nodes, rc, time.Second)
	total := before + during + direct + after
	t.Logf("%d in a, %d while a-2 was paused, %d straight to a-2 after, %d through every node: %d of %d", before, during, direct, after, total, limit)
	if total > limit {
		t.Errorf("%d of %d admitted in the hour", total, limit)
	}
}

// Right after a pause a node's copies of other members' keys may be
// stale (their owners admitted while it was stopped, and their sends
// failed): it decides nothing in an unreachable owner's stead until two
// replication intervals and a forward timeout have passed; then it
// decides from its copy again.
func TestNoStandInFromCopiesRightAfterAPause(t *testing.T) {
	clock := windowClock()
	cfg := func(name string) NodeConfig {
		return NodeConfig{Name: name, Clock: clock, ForwardTimeout: 400 * time.Millisecond,
			Replication: ReplicationConfig{Interval: 100 * time.Millisecond}}
	}
	nodes := startInproc(t, cfg("n1"), cfg("n2"), cfg("n3"))
	n1 := nodes[0]
	rc := &sluicev1.RateLimitCheck{Name: "pause", Limit: 40, WindowMs: 3_600_000}
	for i := 0; rc.Key == ""; i++ {
		if k := fmt.Sprintf("copy-%d", i); n1.srv.view.Load().ring.Owner(ring.Key(nil, "pause", k)) == "n1" {
			rc.Key = k
		}
	}
	storeKey := string(ring.Key(nil, "pause", rc.Key))
	holderName := n1.srv.standInHolder(n1.srv.view.Load(), "n1")
	var holder, entry *inprocNode
	for _, n := range nodes[1:] {
		if n.name == holderName {
			holder = n
		} else {
			entry = n
		}
	}
	for range 10 {
		check(t, n1.client, rc)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, ok := holder.srv.replicas.Get(storeKey); ok && !st.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no copy of %s at %s", rc.Key, holderName)
		}
		time.Sleep(20 * time.Millisecond)
	}
	n1.Kill()
	holder.srv.pause.Backdate(2 * time.Second)
	d := check(t, entry.client, rc)
	if d.Allowed || !d.Degraded {
		t.Fatalf("a stand-in check right after the holder's pause: %v; want denied, degraded", d)
	}
	holder.srv.pause.Age(2*100*time.Millisecond + 400*time.Millisecond)
	d = check(t, entry.client, rc)
	if !d.Allowed || !d.Degraded || d.Remaining != 29 {
		t.Fatalf("a stand-in check once the copies may be current again: %v; want allowed, degraded, from the copy (29 left)", d)
	}
	if st := holder.srv.Stats(); st.Pauses != 1 || st.PausedDenied != 1 {
		t.Errorf("the holder: %d pauses, %d denied after it; want 1 and 1", st.Pauses, st.PausedDenied)
	}
}
