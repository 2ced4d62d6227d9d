package ringview

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ring"
)

var t0 = time.Unix(1_800_000_000, 0)

func members(names ...string) []Member {
	out := make([]Member, len(names))
	for i, n := range names {
		out[i] = Member{Name: n, Instance: n + "-1"}
	}
	return out
}

func newTracker(t *testing.T, self string) *Tracker {
	t.Helper()
	tr, err := New(self, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func apply(t *testing.T, tr *Tracker, ms []Member, leaving bool, now time.Time) Update {
	t.Helper()
	up, err := tr.Apply(ms, "self-1", leaving, now)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

func TestApplyBuildsTheRingOfTheList(t *testing.T) {
	tests := []struct {
		name      string
		list      []string
		departing map[string]string // member -> instance that said it leaves
		leaving   bool
		want      []string
		empty     bool
	}{
		{name: "this node added when not listed", list: []string{"b", "c"}, want: []string{"a", "b", "c"}},
		{name: "listed once", list: []string{"c", "a", "b"}, want: []string{"a", "b", "c"}},
		{name: "a departing member is out", list: []string{"a", "b", "c"}, departing: map[string]string{"b": "b-1"}, want: []string{"a", "c"}},
		{name: "an impostor of a departing member is in", list: []string{"a", "b", "c"}, departing: map[string]string{"b": "b-0"}, want: []string{"a", "b", "c"}},
		{name: "this node leaving", list: []string{"a", "b"}, leaving: true, want: []string{"b"}},
		{name: "this node leaving, alone", list: []string{"a"}, leaving: true, empty: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTracker(t, "a")
			for m, inst := range tt.departing {
				tr.Departing(m, inst)
			}
			up := apply(t, tr, members(tt.list...), tt.leaving, t0)
			if up.Empty != tt.empty {
				t.Fatalf("Empty = %v, want %v", up.Empty, tt.empty)
			}
			if tt.empty {
				return
			}
			if !slices.Equal(up.Names, tt.want) || !slices.Equal(up.Ring.Members(), tt.want) {
				t.Fatalf("names %v, ring %v; want %v", up.Names, up.Ring.Members(), tt.want)
			}
		})
	}
}

func TestEpochCountsFingerprintChangesAndTheRingIsKept(t *testing.T) {
	tr := newTracker(t, "a")
	boot, e0 := tr.Ring()
	if e0 != 0 || !tr.Bootstrap() {
		t.Fatalf("new tracker: epoch %d, bootstrap %v", e0, tr.Bootstrap())
	}
	up := apply(t, tr, members("a", "b"), false, t0)
	if !up.Changed || up.Epoch != 1 || up.Prev != nil || tr.Bootstrap() {
		t.Fatalf("first list: %+v (bootstrap %v); want changed, epoch 1, no prev (the bootstrap ring owned nothing)", up, tr.Bootstrap())
	}
	ab := up.Ring
	up = apply(t, tr, members("b", "a"), false, t0.Add(time.Second))
	if up.Changed || up.Epoch != 1 || up.Ring != ab {
		t.Fatalf("same members: changed %v epoch %d same ring %v; want the same ring and epoch", up.Changed, up.Epoch, up.Ring == ab)
	}
	up = apply(t, tr, members("a", "b", "c"), false, t0.Add(2*time.Second))
	if !up.Changed || up.Epoch != 2 || up.Prev != ab {
		t.Fatalf("a join: %+v; want changed, epoch 2, prev the a-b ring", up)
	}
	if r, e := tr.Ring(); r != up.Ring || e != 2 || r == boot {
		t.Fatalf("Ring() = %v, %d", r, e)
	}
	r, e, err := tr.Leave([]string{"b", "c"})
	if err != nil || e != 3 || slices.Contains(r.Members(), "a") {
		t.Fatalf("Leave: %v %d %v", r.Members(), e, err)
	}
}

func TestHistoryAndDepartedMembers(t *testing.T) {
	tr := newTracker(t, "a")
	abc := apply(t, tr, members("a", "b", "c"), false, t0).Ring
	if tr.Departed("c") {
		t.Fatal("c departed before it left")
	}
	ab := apply(t, tr, members("a", "b"), false, t0.Add(time.Minute)).Ring
	if !tr.Departed("c") || tr.Departed("b") {
		t.Fatal("after c left: want c departed, b not")
	}
	if got := tr.LastChange(); !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("LastChange = %v", got)
	}
	rec := tr.Recent(ab, t0.Add(2*time.Minute))
	if len(rec) != 2 || rec[0] != ab || rec[1] != abc {
		t.Fatalf("Recent = %d rings, want the current and the a-b-c ring", len(rec))
	}
	if rec := tr.Recent(ab, t0.Add(time.Minute+HistoryAge+time.Second)); len(rec) != 1 {
		t.Fatalf("Recent after HistoryAge = %d rings, want only the current", len(rec))
	}
	apply(t, tr, members("a", "b", "c"), false, t0.Add(3*time.Minute))
	if tr.Departed("c") {
		t.Fatal("c departed after it came back")
	}
	// A change while leaving keeps no history.
	before := tr.LastChange()
	apply(t, tr, members("a", "b"), true, t0.Add(4*time.Minute))
	if !tr.LastChange().Equal(before) || tr.Departed("c") {
		t.Fatal("a change while leaving was recorded")
	}
}

func TestReplacedSince(t *testing.T) {
	tr := newTracker(t, "a")
	apply(t, tr, members("a", "b", "c"), false, t0) // replaces the bootstrap ring: not kept
	if got := tr.ReplacedSince(time.Time{}); len(got) != 0 {
		t.Fatalf("ReplacedSince after the first ring = %d rings, want none (the bootstrap ring owned nothing)", len(got))
	}
	ab := apply(t, tr, members("a", "b"), false, t0.Add(time.Second)).Ring
	apply(t, tr, members("a", "b", "c"), false, t0.Add(3*time.Second))
	abc := tr.Recent(ab, t0)[2] // the a-b-c ring replaced at t0+1s
	if got := tr.ReplacedSince(t0.Add(2 * time.Second)); len(got) != 1 || got[0] != ab {
		t.Fatalf("ReplacedSince(t0+2s) = %v, want the a-b ring", got)
	}
	if got := tr.ReplacedSince(t0.Add(time.Second)); len(got) != 2 || got[0] != ab || got[1] != abc {
		t.Fatalf("ReplacedSince(t0+1s) = %v, want the a-b ring, then the a-b-c ring", got)
	}
	if got := tr.ReplacedSince(t0.Add(4 * time.Second)); len(got) != 0 {
		t.Fatalf("ReplacedSince(t0+4s) = %v, want none", got)
	}
}

func TestHistoryKeepsAtMostHistoryLenRings(t *testing.T) {
	tr := newTracker(t, "a")
	now := t0
	for i := range HistoryLen + 5 {
		names := []string{"a"}
		if i%2 == 0 {
			names = append(names, "b")
		}
		now = now.Add(time.Second)
		apply(t, tr, members(names...), false, now)
	}
	cur, _ := tr.Ring()
	if got := len(tr.Recent(cur, now)); got != HistoryLen+1 {
		t.Fatalf("Recent = %d rings, want %d past and the current", got, HistoryLen)
	}
}

func TestRestartedAndInstances(t *testing.T) {
	tr := newTracker(t, "a")
	apply(t, tr, members("a", "b"), false, t0)
	if inst, ok := tr.Instance("b"); !ok || inst != "b-1" {
		t.Fatalf("Instance(b) = %q, %v", inst, ok)
	}
	if inst, ok := tr.Instance("a"); !ok || inst != "a-1" {
		t.Fatalf("Instance(self) = %q, %v; want as listed", inst, ok)
	}
	apply(t, tr, members("b"), false, t0)
	if inst, ok := tr.Instance("a"); !ok || inst != "self-1" {
		t.Fatalf("Instance(self), not listed = %q, %v; want its own", inst, ok)
	}
	if _, ok := tr.Instance("z"); ok {
		t.Fatal("a stranger is a member")
	}
	ms := members("a", "b")
	ms[1].Instance = "b-2"
	if up := apply(t, tr, ms, false, t0); !up.Restarted || up.Changed {
		t.Fatalf("b as another process: %+v, want restarted, ring unchanged", up)
	}
	ms[1].Instance = ""
	if up := apply(t, tr, ms, false, t0); up.Restarted {
		t.Fatal("an unknown instance counted as a restart")
	}
}

func TestMismatchesReportedOnce(t *testing.T) {
	tr := newTracker(t, "a")
	apply(t, tr, members("a", "b"), false, t0)
	ms := members("a", "b", "c")
	r := apply(t, tr, ms, false, t0).Ring
	ms[1].RingMembers, ms[1].RingFingerprint = r.MembersHash(), "other"
	ms[2].RingMembers, ms[2].RingFingerprint = r.MembersHash(), r.Fingerprint()
	up := apply(t, tr, ms, false, t0)
	if len(up.Mismatches) != 1 || up.Mismatches[0].Member != "b" || up.Mismatches[0].Theirs != "other" || up.Mismatches[0].Ours != r.Fingerprint() {
		t.Fatalf("mismatches %+v, want b's once", up.Mismatches)
	}
	if up = apply(t, tr, ms, false, t0); len(up.Mismatches) != 0 {
		t.Fatalf("reported again: %+v", up.Mismatches)
	}
	ms[1].RingFingerprint = r.Fingerprint()
	apply(t, tr, ms, false, t0)
	ms[1].RingFingerprint = "other"
	if up = apply(t, tr, ms, false, t0); len(up.Mismatches) != 1 {
		t.Fatalf("after agreeing and disagreeing again: %+v, want reported", up.Mismatches)
	}
	// Another member set: not a mismatch (its ring is just behind).
	ms[1].RingMembers = "another set"
	ms[1].RingFingerprint = "third"
	if up = apply(t, tr, ms, false, t0); len(up.Mismatches) != 0 {
		t.Fatalf("a member set differing reported: %+v", up.Mismatches)
	}
}

func TestApplyKeepsTheOldRingWhenItCannotBuild(t *testing.T) {
	tr, err := New("a", ring.Config{PartitionCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	before, e := tr.Ring()
	if _, err := tr.Apply(members("a", "b", "c"), "", false, t0); err == nil {
		t.Fatal("3 members on 2 partitions built")
	}
	if r, e2 := tr.Ring(); r != before || e2 != e {
		t.Fatal("the ring changed on an error")
	}
}
