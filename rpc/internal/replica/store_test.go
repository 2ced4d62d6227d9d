package replica

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/window"
)

func TestStoreSetGet(t *testing.T) {
	a, b := stateUntil(t, time.Hour, 1), stateUntil(t, time.Hour, 5)
	for _, tc := range []struct {
		name    string
		sets    []Entry // set in order, all of key "k"
		get     string
		want    window.State
		wantOK  bool
		wantLen int
	}{
		{"empty", nil, "k", window.State{}, false, 0},
		{"one copy", []Entry{{a, "node1", "i1"}}, "k", a, true, 1},
		{"a newer copy replaces it", []Entry{{a, "node1", "i1"}, {b, "node1", "i1"}}, "k", b, true, 1},
		{"another key", []Entry{{a, "node1", "i1"}}, "other", window.State{}, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			for _, e := range tc.sets {
				s.Set([]byte("k"), e.Owner, e.Instance, e.State)
			}
			got, ok := s.Get(tc.get)
			if ok != tc.wantOK || !sameState(got, tc.want) {
				t.Errorf("Get(%q) = %v, %v; want %v, %v", tc.get, got, ok, tc.want, tc.wantOK)
			}
			if n := s.Len(); n != tc.wantLen {
				t.Errorf("Len = %d, want %d", n, tc.wantLen)
			}
		})
	}
}

func TestStoreSetReplacesOwner(t *testing.T) {
	s := NewStore()
	st := stateUntil(t, time.Hour, 1)
	s.Set([]byte("k"), "node1", "i1", st)
	s.Set([]byte("k"), "node2", "", st)
	e, ok := s.Take("k")
	if !ok || e.Owner != "node2" || e.Instance != "" {
		t.Fatalf("Take = %+v, %v; want node2's copy with no instance", e, ok)
	}
}

func TestStoreTakePutBack(t *testing.T) {
	old, newer := stateUntil(t, time.Hour, 1), stateUntil(t, time.Hour, 7)
	for _, tc := range []struct {
		name      string
		held      *Entry // held before the Take, nil: none
		arrived   *Entry // set between the Take and the PutBack
		wantTake  bool
		wantAfter window.State // held after the PutBack
	}{
		{"nothing held", nil, nil, false, window.State{}},
		{"taken and put back", &Entry{old, "node1", "i1"}, nil, true, old},
		{"a newer copy came meanwhile: it stays", &Entry{old, "node1", "i1"}, &Entry{newer, "node1", "i1"}, true, newer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			if tc.held != nil {
				s.Set([]byte("k"), tc.held.Owner, tc.held.Instance, tc.held.State)
			}
			e, ok := s.Take("k")
			if ok != tc.wantTake {
				t.Fatalf("Take ok = %v, want %v", ok, tc.wantTake)
			}
			if !ok {
				return
			}
			if e != *tc.held {
				t.Errorf("Take = %+v, want %+v", e, *tc.held)
			}
			if _, held := s.Get("k"); held {
				t.Error("the copy is still held after Take")
			}
			if tc.arrived != nil {
				s.Set([]byte("k"), tc.arrived.Owner, tc.arrived.Instance, tc.arrived.State)
			}
			s.PutBack("k", e)
			if got, _ := s.Get("k"); !sameState(got, tc.wantAfter) {
				t.Errorf("after PutBack: %v, want %v", got, tc.wantAfter)
			}
		})
	}
}

func TestStoreDropOwner(t *testing.T) {
	st := stateUntil(t, time.Hour, 1)
	s := NewStore()
	for k, o := range map[string]string{"a": "node1", "b": "node2", "c": "node1", "d": ""} {
		s.Set([]byte(k), o, "", st)
	}
	s.DropOwner("node1")
	for k, want := range map[string]bool{"a": false, "b": true, "c": false, "d": true} {
		if _, ok := s.Get(k); ok != want {
			t.Errorf("%s held %v after DropOwner(node1), want %v", k, ok, want)
		}
	}
}

func TestStoreSweep(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    time.Duration // the copy's window, started at t0
		now  time.Duration // after t0
		keep bool
	}{
		{"inside its window", time.Minute, 30 * time.Second, true},
		{"just before its end", time.Minute, time.Minute - time.Nanosecond, true},
		{"at its end", time.Minute, time.Minute, false},
		{"after its end", time.Minute, time.Hour, false},
		{"the clock behind", time.Minute, -time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			s.Set([]byte("k"), "node1", "", stateUntil(t, tc.w, 1))
			s.Sweep(t0.Add(tc.now))
			if _, ok := s.Get("k"); ok != tc.keep {
				t.Errorf("held after Sweep: %v, want %v", ok, tc.keep)
			}
		})
	}
}

// TestStoreOrphans: the copies of departed owners go to their keys' new
// owners, stale copies are dropped, an earlier process's copies go back
// to its new process, and the rest stay.
func TestStoreOrphans(t *testing.T) {
	// node2 departed (not in rg), node4 was never met, node3 restarted
	// (its instance is now i3b).
	rg := testRing(t, "node1", "node3")
	full := testRing(t, "node1", "node2", "node3")
	st := stateUntil(t, time.Hour, 1)
	departed := func(m string) bool { return m == "node2" }
	instance := func(m string) string {
		return map[string]string{"node1": "i1", "node3": "i3b"}[m]
	}
	k1 := keyOf(t, rg, "node1", 0)
	k3 := keyOf(t, rg, "node3", 0)
	// a key node2 owned, owned under rg by ...
	k2 := keyOf(t, full, "node2", 0)
	to2 := rg.Owner([]byte(k2))
	for _, tc := range []struct {
		name   string
		key    string
		e      Entry
		stays  bool
		wantTo string // the owner it is returned under, "" if none
	}{
		{"a live owner's copy of its key", k1, Entry{st, "node1", "i1"}, true, ""},
		{"a live owner's copy, instance unknown", k1, Entry{st, "node1", ""}, true, ""},
		{"a live owner's copy of a key it no longer owns: stale", k3, Entry{st, "node1", "i1"}, false, ""},
		{"an earlier process of a restarted owner", k3, Entry{st, "node3", "i3a"}, false, "node3"},
		{"the restarted owner's current process", k3, Entry{st, "node3", "i3b"}, true, ""},
		{"an earlier process, its instance unknown", k3, Entry{st, "node3", ""}, true, ""},
		{"a departed owner", k2, Entry{st, "node2", "i2"}, false, to2},
		{"an owner never met (gossip spreading)", k2, Entry{st, "node4", "i4"}, true, ""},
		{"no owner", k2, Entry{st, "", ""}, false, to2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			s.Set([]byte(tc.key), tc.e.Owner, tc.e.Instance, tc.e.State)
			got := s.Orphans(rg, departed, instance)
			if _, ok := s.Get(tc.key); ok != tc.stays {
				t.Errorf("held after Orphans: %v, want %v", ok, tc.stays)
			}
			var want map[string]map[string]Entry
			if tc.wantTo != "" {
				want = map[string]map[string]Entry{tc.wantTo: {tc.key: tc.e}}
			}
			if len(got) != len(want) || (want != nil && !maps.Equal(got[tc.wantTo], want[tc.wantTo])) {
				t.Errorf("Orphans = %v, want %v", got, want)
			}
		})
	}
}

// TestStoreOrphansOf: OrphansOf takes only the departed owners' copies
// (and those of no owner) whose key goes to the member asked about, and
// leaves every other copy, stale or not, to Orphans.
func TestStoreOrphansOf(t *testing.T) {
	rg := testRing(t, "node1", "node3")
	full := testRing(t, "node1", "node2", "node3")
	st := stateUntil(t, time.Hour, 1)
	departed := func(m string) bool { return m == "node2" }
	k2 := keyOf(t, full, "node2", 0)
	to2 := rg.Owner([]byte(k2))
	other := "node1"
	if to2 == "node1" {
		other = "node3"
	}
	k3 := keyOf(t, rg, "node3", 0)
	for _, tc := range []struct {
		name  string
		key   string
		e     Entry
		to    string
		taken bool
	}{
		{"a departed owner's copy of a key of to", k2, Entry{st, "node2", "i2"}, to2, true},
		{"no owner, a key of to", k2, Entry{st, "", ""}, to2, true},
		{"a departed owner's copy of another member's key", k2, Entry{st, "node2", "i2"}, other, false},
		{"a live owner's stale copy", k3, Entry{st, "node1", "i1"}, "node3", false},
		{"an earlier process of a restarted owner", k3, Entry{st, "node3", "i3a"}, "node3", false},
		{"an owner never met", k2, Entry{st, "node4", "i4"}, to2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			s.Set([]byte(tc.key), tc.e.Owner, tc.e.Instance, tc.e.State)
			got := s.OrphansOf(rg, departed, tc.to)
			if _, held := s.Get(tc.key); held == tc.taken {
				t.Errorf("held after OrphansOf: %v, want %v", held, !tc.taken)
			}
			if e, ok := got[tc.key]; ok != tc.taken || len(got) > 1 || (ok && e != tc.e) {
				t.Errorf("OrphansOf = %v, want the copy: %v", got, tc.taken)
			}
		})
	}
}

// TestOrphansCallsBackWithNoLockHeld: the callbacks may use the store
// (they take no shard lock of it here, but a callback that waited for one
// held across it would hang), and each is asked once per owner.
func TestOrphansCallsBackWithNoLockHeld(t *testing.T) {
	rg := testRing(t, "node1", "node3")
	st := stateUntil(t, time.Hour, 1)
	s := NewStore()
	for i, k := range keysOf(t, rg, "node1", 200) {
		s.Set([]byte(k), []string{"node1", "node2", "node9"}[i%3], "i", st)
	}
	extra := keyOf(t, rg, "node1", 500) // set by a callback
	var departedAsked, instanceAsked []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Orphans(rg,
			func(m string) bool {
				departedAsked = append(departedAsked, m)
				// Each takes shard locks.
				s.Len()
				s.Set([]byte(extra), "node1", "i", st)
				return m == "node2"
			},
			func(m string) string {
				instanceAsked = append(instanceAsked, m)
				s.Len()
				return "i"
			})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Orphans hung: a callback waited for a shard lock held across it")
	}
	slices.Sort(departedAsked)
	if !slices.Equal(departedAsked, []string{"node2", "node9"}) || !slices.Equal(instanceAsked, []string{"node1"}) {
		t.Errorf("departed asked of %v, instance of %v; want each owner once", departedAsked, instanceAsked)
	}
	// node2's copies went; node1's (of its own keys), node9's and the
	// callback's stayed.
	if n := s.Len(); n != 200-67+1 {
		t.Errorf("%d copies left, want %d", n, 200-67+1)
	}
}

// SetAll leaves the store as Set called for each key in order does: a key
// given twice keeps its later state, a key held already takes the new
// owner.
func TestStoreSetAllIsSetInOrder(t *testing.T) {
	var keys [][]byte
	var states []window.State
	for i := range 300 {
		keys = append(keys, []byte("k"+strconv.Itoa(i%250))) // keys 0..49 twice
		states = append(states, stateUntil(t, time.Hour, int64(1+i%9)))
	}
	want, got := NewStore(), NewStore()
	for _, s := range []*Store{want, got} {
		s.Set([]byte("k7"), "node9", "old", stateUntil(t, time.Hour, 3))
		s.Set([]byte("held"), "node9", "old", stateUntil(t, time.Hour, 3))
	}
	for i, k := range keys {
		want.Set(k, "node1", "i1", states[i])
	}
	got.SetAll(keys, "node1", "i1", states)
	if got.Len() != want.Len() || got.Len() != 251 {
		t.Fatalf("Len = %d, want %d (251)", got.Len(), want.Len())
	}
	for i := range 250 {
		k := "k" + strconv.Itoa(i)
		g, _ := got.Take(k)
		w, _ := want.Take(k)
		if g.Owner != "node1" || g.Instance != "i1" || !sameState(g.State, w.State) {
			t.Fatalf("%s: SetAll left %+v, Set %+v", k, g, w)
		}
	}
	if e, ok := got.Take("held"); !ok || e.Owner != "node9" {
		t.Fatalf("a key not in the request: %+v, %v; want node9's copy", e, ok)
	}
}

// BenchmarkStoreSetAll stores one replication request's 1000 copies into
// a store that holds them already (the steady state), with SetAll and
// with Set per key (as Replicate did before).
func BenchmarkStoreSetAll(b *testing.B) {
	st := stateUntil(b, time.Hour, 1)
	var keys [][]byte
	var states []window.State
	for i := range 1000 {
		keys = append(keys, []byte("\x03apik"+strconv.Itoa(i*31)))
		states = append(states, st)
	}
	s := NewStore()
	for i := range 50000 {
		s.Set([]byte("\x03apik"+strconv.Itoa(i)), "node1", "", st)
	}
	b.Run("SetAll", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.SetAll(keys, "node1", "i1", states)
		}
	})
	b.Run("Set", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i, k := range keys {
				s.Set(k, "node1", "i1", states[i])
			}
		}
	})
}
