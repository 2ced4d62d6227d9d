package replica

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// fakeNode is the node around a Replicator: its view, its members (each
// call recorded) and its counters.
type fakeNode struct {
	mu       sync.Mutex
	ring     *ring.Ring
	leaving  bool
	down     map[string]bool              // members whose calls fail
	got      map[string][]string          // member -> keys received, in order
	calls    map[string]int               // member -> calls
	sender   map[string]string            // member -> the last request's sender and instance
	received map[string]map[string][]byte // member -> key -> encoded state

	replicated, behind int // the counters
}

func newFakeNode(r *ring.Ring) *fakeNode {
	return &fakeNode{ring: r, down: map[string]bool{}, got: map[string][]string{}, calls: map[string]int{},
		sender: map[string]string{}, received: map[string]map[string][]byte{}}
}

func (f *fakeNode) Current() (*ring.Ring, Sender, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ring, f, !f.leaving
}

func (f *fakeNode) Replicate(ctx context.Context, member string, req *sluicev1.ReplicateRequest) error {
	if _, ok := ctx.Deadline(); !ok {
		return errors.New("no deadline")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[member]++
	if f.down[member] {
		return errors.New("no connection")
	}
	f.sender[member] = req.Sender + "/" + req.SenderInstance
	if f.received[member] == nil {
		f.received[member] = map[string][]byte{}
	}
	for _, ks := range req.States {
		f.got[member] = append(f.got[member], string(ks.Key))
		f.received[member][string(ks.Key)] = slices.Clone(ks.State)
	}
	return nil
}

func (f *fakeNode) Replicated(n int) { f.mu.Lock(); f.replicated += n; f.mu.Unlock() }
func (f *fakeNode) Behind(n int)     { f.mu.Lock(); f.behind += n; f.mu.Unlock() }

// reset forgets what the members received.
func (f *fakeNode) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.got)
	clear(f.calls)
	f.replicated, f.behind = 0, 0
}

// sorted returns what member received, sorted.
func (f *fakeNode) sorted(member string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.got[member]))
}

type replicatorTest struct {
	node     *fakeNode
	store    *window.Store
	clock    *window.ManualClock
	dirty    *DirtySet
	copies   *Store
	swept    []time.Time
	r        *Replicator
	own      []string // keys node1 owns, holding state
	others   []string // keys node1 does not own, holding state
	instance string
}

// newReplicatorTest returns node1's Replicator in a ring of node1..node3,
// with a window store holding 3 keys of node1 and 3 of others.
func newReplicatorTest(t testing.TB, factor, batch int) *replicatorTest {
	t.Helper()
	rt := &replicatorTest{
		node:     newFakeNode(testRing(t, "node1", "node2", "node3")),
		clock:    window.NewManualClock(t0),
		dirty:    NewDirtySet(),
		copies:   NewStore(),
		instance: "i1",
	}
	rt.store = window.NewStore(window.StoreConfig{Clock: rt.clock})
	for i := range 3 {
		rt.own = append(rt.own, keyOf(t, rt.node.ring, "node1", i))
		rt.others = append(rt.others, keyOf(t, rt.node.ring, []string{"node2", "node3"}[i%2], i))
	}
	for _, k := range slices.Concat(rt.own, rt.others) {
		rt.hit(t, k)
	}
	rt.r = NewReplicator(ReplicatorConfig{
		Self:        "node1",
		Instance:    func() string { return rt.instance },
		Replication: Config{Factor: factor, Interval: time.Hour},
		Batch:       batch,
		Timeout:     time.Second,
		View:        rt.node,
		States:      rt.store,
		Counters:    rt.node,
		Dirty:       rt.dirty,
		Copies:      rt.copies,
		OnSweep:     func(now time.Time) { rt.swept = append(rt.swept, now) },
		Log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return rt
}

// hit counts a hit on key in the windows and marks it changed, as a
// decision does.
func (rt *replicatorTest) hit(t testing.TB, key string) {
	t.Helper()
	if _, err := rt.store.Apply(key, window.Check{Algorithm: window.FixedWindow, Limit: 100, Window: time.Hour, Hits: 1}, rt.clock.Now()); err != nil {
		t.Fatal(err)
	}
	rt.dirty.Add([]byte(key))
}

func sortedCopy(keys []string) []string { return slices.Sorted(slices.Values(keys)) }

// TestReplicatorSendsOwnedKeysToSuccessors: after a ring change every key
// node1 owns goes to its successors, and nothing else; then only the keys
// that changed, each with its current state.
func TestReplicatorSendsOwnedKeysToSuccessors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		factor int
	}{
		{"one copy", 1},
		{"two copies", 2},
		{"more copies than members", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newReplicatorTest(t, tc.factor, 1000)
			succs := rt.node.ring.SuccessorsOf("node1", tc.factor)
			if len(succs) != min(tc.factor, 2) {
				t.Fatalf("successors %v", succs)
			}
			ctx := context.Background()
			rt.r.tick(ctx) // the first ring: every owned key
			for _, m := range succs {
				if got := rt.node.sorted(m); !slices.Equal(got, sortedCopy(rt.own)) {
					t.Errorf("%s received %q after the first tick, want node1's keys %q", m, got, sortedCopy(rt.own))
				}
				if got := rt.node.sender[m]; got != "node1/i1" {
					t.Errorf("%s got requests from %q, want node1/i1", m, got)
				}
			}
			if rt.node.replicated != len(succs)*len(rt.own) || rt.node.behind != 0 {
				t.Errorf("replicated %d behind %d, want %d and 0", rt.node.replicated, rt.node.behind, len(succs)*len(rt.own))
			}
			rt.node.reset()
			rt.r.tick(ctx) // nothing changed
			if len(rt.node.calls) != 0 {
				t.Errorf("calls with nothing changed: %v", rt.node.calls)
			}
			rt.hit(t, rt.own[1])
			rt.hit(t, rt.others[0]) // changed, but not node1's
			rt.r.tick(ctx)
			want, _ := rt.store.Get(rt.own[1])
			wb, _ := want.MarshalBinary()
			for _, m := range succs {
				if got := rt.node.sorted(m); !slices.Equal(got, []string{rt.own[1]}) {
					t.Errorf("%s received %q, want only the changed key %q", m, got, rt.own[1])
				}
				if got := rt.node.received[m][rt.own[1]]; string(got) != string(wb) {
					t.Errorf("%s received a state other than the key's current one", m)
				}
			}
		})
	}
}

// TestReplicatorRingChangeSendsEverything: a new ring sends every owned
// key again, changed or not; a key that changed but is no longer node1's
// is not sent.
func TestReplicatorRingChangeSendsEverything(t *testing.T) {
	rt := newReplicatorTest(t, 1, 1000)
	ctx := context.Background()
	rt.r.tick(ctx)
	rt.node.reset()
	next := testRing(t, "node1", "node2", "node3", "node4")
	rt.node.mu.Lock()
	rt.node.ring = next
	rt.node.mu.Unlock()
	var want []string
	for _, k := range slices.Concat(rt.own, rt.others) {
		if next.Owner([]byte(k)) == "node1" {
			want = append(want, k)
		}
	}
	rt.r.tick(ctx)
	succ := next.SuccessorsOf("node1", 1)[0]
	if got := rt.node.sorted(succ); !slices.Equal(got, sortedCopy(want)) {
		t.Errorf("%s received %q after the ring change, want every key node1 owns under it %q", succ, got, sortedCopy(want))
	}
}

// TestReplicatorFailedSendComesAgain: a send that fails counts its keys
// behind and sends them again at the next tick.
func TestReplicatorFailedSendComesAgain(t *testing.T) {
	rt := newReplicatorTest(t, 2, 2) // batches of 2: 2 calls of node1's 3 keys per member
	succs := rt.node.ring.SuccessorsOf("node1", 2)
	down := succs[0]
	rt.node.down[down] = true
	ctx := context.Background()
	rt.r.tick(ctx)
	if rt.node.calls[down] != 2 || rt.node.calls[succs[1]] != 2 {
		t.Errorf("calls %v, want 2 to each successor (batches of 2)", rt.node.calls)
	}
	if rt.node.behind != 3 || rt.node.replicated != 3 {
		t.Errorf("behind %d replicated %d, want 3 and 3", rt.node.behind, rt.node.replicated)
	}
	rt.node.reset()
	rt.node.down[down] = false
	rt.r.tick(ctx) // the failed keys, to both successors
	for _, m := range succs {
		if got := rt.node.sorted(m); !slices.Equal(got, sortedCopy(rt.own)) {
			t.Errorf("%s received %q on the tick after the failure, want %q", m, got, sortedCopy(rt.own))
		}
	}
	rt.node.reset()
	rt.r.tick(ctx)
	if len(rt.node.calls) != 0 {
		t.Errorf("calls once delivered: %v", rt.node.calls)
	}
}

// TestReplicatorLeavingSendsNothing: a leaving node sends nothing (it
// hands its keys off itself), and its ticks do not count towards a sweep.
func TestReplicatorLeavingSendsNothing(t *testing.T) {
	rt := newReplicatorTest(t, 1, 1000)
	rt.node.leaving = true
	for range 60 {
		rt.r.tick(context.Background())
	}
	if len(rt.node.calls) != 0 || len(rt.swept) != 0 {
		t.Errorf("leaving: calls %v, sweeps %v; want none", rt.node.calls, rt.swept)
	}
	if got := rt.dirty.Drain(); len(got) != 6 {
		t.Errorf("leaving drained the dirty set: %q left", got)
	}
}

// TestReplicatorSweeps: every 50 ticks the copies are swept at the
// windows' time, and OnSweep is called with it.
func TestReplicatorSweeps(t *testing.T) {
	rt := newReplicatorTest(t, 1, 1000)
	rt.copies.Set([]byte("ended"), "node2", "", stateUntil(t, time.Minute, 1))
	rt.copies.Set([]byte("running"), "node2", "", stateUntil(t, 2*time.Hour, 1))
	rt.clock.Set(t0.Add(time.Hour))
	for range 49 {
		rt.r.tick(context.Background())
	}
	if len(rt.swept) != 0 || rt.copies.Len() != 2 {
		t.Fatalf("swept before the 50th tick: %v, %d copies", rt.swept, rt.copies.Len())
	}
	rt.r.tick(context.Background())
	if !slices.Equal(rt.swept, []time.Time{t0.Add(time.Hour)}) {
		t.Errorf("OnSweep called with %v, want [%s]", rt.swept, t0.Add(time.Hour))
	}
	if _, ok := rt.copies.Get("ended"); ok || rt.copies.Len() != 1 {
		t.Errorf("after the sweep: %d copies, the ended one held: %v", rt.copies.Len(), ok)
	}
}

// nopSender takes every request.
type nopSender struct{}

func (nopSender) Replicate(context.Context, string, *sluicev1.ReplicateRequest) error { return nil }

// TestReplicatorAllocatesNothingPerKey: a send's allocations do not grow
// with its keys (beyond its buffers' growth): each state is built once
// for every successor, its key and encoding in shared buffers.
func TestReplicatorAllocatesNothingPerKey(t *testing.T) {
	rt := newReplicatorTest(t, 2, 100_000)
	allocs := func(n int) float64 {
		keys := keysOf(t, rt.node.ring, "node1", n)
		for _, k := range keys {
			rt.hit(t, k)
		}
		return testing.AllocsPerRun(5, func() { rt.r.once(context.Background(), rt.node.ring, nopSender{}, keys) })
	}
	small, large := allocs(500), allocs(4000)
	t.Logf("allocations of a send: %.0f for 500 keys, %.0f for 4000", small, large)
	// The buffers grow by about a quarter at a time at these sizes: some
	// 20 more growths for 8 times the keys; an allocation per key would
	// be 3500 more.
	if large-small > 50 {
		t.Errorf("a send of 500 keys allocates %.0f times, of 4000 keys %.0f: it allocates per key", small, large)
	}
}

// BenchmarkReplicatorOnce is one interval's send of 6000 changed keys (what
// a node owning a third of 100,000 keys under batched load changes in 100
// ms) to one successor that takes every request.
func BenchmarkReplicatorOnce(b *testing.B) {
	rt := newReplicatorTest(b, 1, 100_000)
	keys := keysOf(b, rt.node.ring, "node1", 6000)
	for _, k := range keys {
		rt.hit(b, k)
	}
	b.ReportAllocs()
	for b.Loop() {
		rt.r.once(context.Background(), rt.node.ring, nopSender{}, keys)
	}
}
