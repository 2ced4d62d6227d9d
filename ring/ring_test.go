package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// C04: members whose names are prefixes of each other plus replica digits
// ("rl-1" + "10" = "rl-11" + "0") are placed the same whatever order they
// are added in.
func TestOwnerAgreesWhateverTheOrder(t *testing.T) {
	orders := [][]string{
		{"rl-1", "rl-10", "rl-11", "member", "member1"},
		{"member1", "rl-11", "member", "rl-10", "rl-1"},
		{"rl-10", "member", "rl-1", "member1", "rl-11"},
	}
	rings := make([]*Ring, len(orders))
	for i, o := range orders {
		r, err := New(o, Config{})
		if err != nil {
			t.Fatal(err)
		}
		rings[i] = r
	}
	if rings[0].Fingerprint() != rings[1].Fingerprint() || rings[0].Fingerprint() != rings[2].Fingerprint() {
		t.Fatalf("fingerprints differ: %s %s %s", rings[0].Fingerprint(), rings[1].Fingerprint(), rings[2].Fingerprint())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	owners := map[string]int{}
	var key []byte
	for i := 0; i < 100000; i++ {
		key = Key(key[:0], "api", fmt.Sprintf("user:%d", rng.Uint64()))
		o := rings[0].Owner(key)
		owners[o]++
		for j := 1; j < len(rings); j++ {
			if got := rings[j].Owner(key); got != o {
				t.Fatalf("key %q: ring 0 says %q, ring %d says %q", key, o, j, got)
			}
		}
	}
	if len(owners) != 5 {
		t.Fatalf("keys landed on %d members, want all 5: %v", len(owners), owners)
	}
}

// The virtual-node collision that C04 guards against is real for plain
// names: show that our member encoding gives distinct replica keys.
func TestMemberEncodingIsUnambiguous(t *testing.T) {
	plain := func(name string, i int) string { return fmt.Sprintf("%s%d", name, i) }
	ours := func(name string, i int) string { return fmt.Sprintf("%s%d", member(name).String(), i) }
	if plain("rl-1", 10) != plain("rl-11", 0) {
		t.Fatal("expected the plain encoding to collide")
	}
	if ours("rl-1", 10) == ours("rl-11", 0) {
		t.Fatal("our encoding collides")
	}
	seen := map[string]string{}
	for _, n := range []string{"rl-1", "rl-10", "rl-11", "rl-110", "a#1", "a#", "a", "member", "member1"} {
		for i := 0; i < DefaultReplicationFactor; i++ {
			k := ours(n, i)
			if prev, ok := seen[k]; ok {
				t.Fatalf("%q replica %d collides with %s", n, i, prev)
			}
			seen[k] = fmt.Sprintf("%q replica %d", n, i)
		}
	}
}

func TestKeyIsUnambiguous(t *testing.T) {
	a := Key(nil, "ab", "c")
	b := Key(nil, "a", "bc")
	if bytes.Equal(a, b) {
		t.Fatalf("(ab,c) and (a,bc) encode the same: %q", a)
	}
	if got, want := Key(nil, "api", "user:42"), append([]byte{3}, "apiuser:42"...); !bytes.Equal(got, want) {
		t.Fatalf("Key = %q, want %q", got, want)
	}
	long := string(make([]byte, 300))
	if got := Key(nil, long, "k"); len(got) != 2+300+1 {
		t.Fatalf("300-byte name: len %d, want a 2-byte uvarint prefix", len(got))
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	cases := []struct {
		names []string
		cfg   Config
		want  error
	}{
		{nil, Config{}, ErrNoMembers},
		{[]string{"", ""}, Config{}, ErrNoMembers},
		{[]string{"a", "b", "c"}, Config{PartitionCount: 2}, ErrInvalidConfig},
		{[]string{"a", "b"}, Config{PartitionCount: 2}, ErrInvalidConfig}, // C05
		{[]string{"a", "b"}, Config{PartitionCount: 3}, ErrInvalidConfig},
		{[]string{"a"}, Config{PartitionCount: -1}, ErrInvalidConfig},
		{[]string{"a"}, Config{Load: 0.5}, ErrInvalidConfig},
		{[]string{"a", "b", "c"}, Config{PartitionCount: 7, Load: 1}, ErrInvalidConfig}, // consistent would panic: no room
	}
	for _, c := range cases {
		r, err := New(c.names, c.cfg)
		if !errors.Is(err, c.want) || r != nil {
			t.Errorf("New(%q, %+v) = %v, %v; want error %v", c.names, c.cfg, r, err, c.want)
		}
	}
}

func TestSharesAndBalance(t *testing.T) {
	r, err := New([]string{"n1", "n2", "n3"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for n, s := range r.Shares() {
		if s < 0.20 || s > 0.45 {
			t.Errorf("%s owns %.3f of the partitions, want 0.20..0.45", n, s)
		}
		sum += s
	}
	if sum < 0.999 || sum > 1.001 {
		t.Errorf("shares add up to %f", sum)
	}
	// C05: after removing a member, each survivor owns 35-65 %.
	r2m, err := New([]string{"n1", "n3"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for n, s := range r2m.Shares() {
		if s < 0.35 || s > 0.65 {
			t.Errorf("after a removal %s owns %.3f, want 0.35..0.65", n, s)
		}
	}
	// Duplicates are ignored.
	r2, err := New([]string{"n3", "n1", "n2", "n1"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Fingerprint() != r.Fingerprint() || len(r2.Members()) != 3 {
		t.Fatalf("duplicate member changed the ring: %v vs %v", r2, r)
	}
}

// Adding a fourth member moves keys only to the new member, and not many
// more than its fair share.
func TestJoinMovesBoundedShare(t *testing.T) {
	r3, _ := New([]string{"n1", "n2", "n3"}, Config{})
	r4, _ := New([]string{"n1", "n2", "n3", "n4"}, Config{})
	moved, toNew := 0, 0
	const n = 50000
	var key []byte
	for i := 0; i < n; i++ {
		key = Key(key[:0], "api", fmt.Sprint(i))
		a, b := r3.Owner(key), r4.Owner(key)
		if a != b {
			moved++
			if b == "n4" {
				toNew++
			}
		}
	}
	frac := float64(moved) / n
	t.Logf("moved %.3f of keys, %d of %d to the new member", frac, toNew, moved)
	if frac > 0.5 {
		t.Fatalf("a join moved %.2f of all keys", frac)
	}
	if toNew < moved/2 {
		t.Fatalf("most moved keys (%d of %d) went between old members", moved-toNew, moved)
	}
}

// Successors follow the owner in the order consistent's GetClosestN walks,
// so they agree with it for every key, and never name the owner.
func TestSuccessorsMatchClosestN(t *testing.T) {
	r, err := New([]string{"a", "b", "c", "d", "e"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		k := Key(nil, "api", strconv.Itoa(i))
		want, err := r.c.GetClosestN(k, 3)
		if err != nil {
			t.Fatal(err)
		}
		got := r.Successors(k, 2)
		if len(got) != 2 || got[0] != string(want[1].(member)) || got[1] != string(want[2].(member)) {
			t.Fatalf("key %d: successors %v, closest %v", i, got, want)
		}
		// AppendSuccessors keeps what dst held and adds the same names.
		if app := r.AppendSuccessors([]string{"x"}, k, 2); len(app) != 3 || app[0] != "x" || app[1] != got[0] || app[2] != got[1] {
			t.Fatalf("key %d: AppendSuccessors gave %v, Successors %v", i, app, got)
		}
		// Every key of one owner has the owner's successors.
		if of := r.SuccessorsOf(r.Owner(k), 2); !slices.Equal(of, got) {
			t.Fatalf("key %d: SuccessorsOf its owner %s gave %v, Successors %v", i, r.Owner(k), of, got)
		}
		if string(want[0].(member)) != r.Owner(k) || r.PartitionOwner(r.Partition(k)) != r.Owner(k) {
			t.Fatalf("key %d: owner disagrees", i)
		}
	}
	if got := r.Successors([]byte("x"), 10); len(got) != 4 {
		t.Fatalf("successors of 5 members, n=10: %v", got)
	}
	one, _ := New([]string{"a"}, Config{})
	if got := one.Successors([]byte("x"), 1); got != nil {
		t.Fatalf("a lone member has successors %v", got)
	}
	if got := r.SuccessorsOf("z", 2); got != nil {
		t.Fatalf("a name not in the ring has successors %v", got)
	}
	other, _ := New([]string{"e", "d", "c", "b", "a"}, Config{PartitionCount: 101})
	if other.MembersHash() != r.MembersHash() || other.Fingerprint() == r.Fingerprint() {
		t.Fatal("members hash must depend on the names only, the fingerprint on the config too")
	}
}
