package region

import (
	"errors"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	c, err := Parse(" us-east=2, eu-west ,ap-south=1")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.String(); got != "us-east=2,eu-west=1,ap-south=1" {
		t.Errorf("String = %q", got)
	}
	if c.Home() != "us-east" || c.Len() != 3 || !c.Multi() || !c.Has("eu-west") || c.Has("local") {
		t.Errorf("Home %q Len %d Multi %v", c.Home(), c.Len(), c.Multi())
	}
	if len(c.Fingerprint()) != 16 {
		t.Errorf("Fingerprint = %q", c.Fingerprint())
	}
	same, _ := Parse("us-east=2,eu-west=1,ap-south=1")
	other, _ := Parse("eu-west=1,us-east=2,ap-south=1") // another home
	heavier, _ := Parse("us-east=3,eu-west=1,ap-south=1")
	if same.Fingerprint() != c.Fingerprint() || other.Fingerprint() == c.Fingerprint() || heavier.Fingerprint() == c.Fingerprint() {
		t.Errorf("fingerprints: same %s other %s heavier %s ours %s", same.Fingerprint(), other.Fingerprint(), heavier.Fingerprint(), c.Fingerprint())
	}
	none, err := Parse("  ")
	if none != nil || err != nil || none.Len() != 1 || none.Multi() || !none.Has("anything") || none.Fingerprint() != "" || none.Home() != "" {
		t.Errorf("empty list: %v %v", none, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"us=1,eu=x", `regions[1] "eu": weight must be a whole number 1..1000000, got "x"`},
		{"us=0", `regions[0] "us": weight must be a whole number`},
		{"us=1.5", `weight must be a whole number`},
		{"us=-1", `weight must be a whole number`},
		{"us=2000000", `weight must be a whole number 1..1000000`},
		{"us,,eu", `regions[1]: region name must be 1..64 bytes, got ""`},
		{"us,u s", `regions[1]: region name "u s": want only [A-Za-z0-9._+-]`},
		{"us,eu,us", `regions[2]: "us" is listed twice`},
		{strings.Repeat("r,", 64) + "x", `at most 64 regions`},
	} {
		_, err := Parse(tc.in)
		if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an ErrConfig containing %q", tc.in, err, tc.want)
		}
	}
}

func TestShareTable(t *testing.T) {
	three, _ := Parse("a,b,c")
	weighted, _ := Parse("a=2,b=1,c=1")
	for _, tc := range []struct {
		c     *Config
		total int64
		seed  uint64
		want  map[string]int64
	}{
		{three, 9, 0, map[string]int64{"a": 3, "b": 3, "c": 3}},
		{three, 10, 0, map[string]int64{"a": 4, "b": 3, "c": 3}}, // the remainder goes by rotation: seed 0 starts at a
		{three, 10, 1, map[string]int64{"a": 3, "b": 4, "c": 3}},
		{three, 10, 5, map[string]int64{"a": 3, "b": 3, "c": 4}},
		{three, 11, 2, map[string]int64{"a": 4, "b": 3, "c": 4}},
		{three, 1, 1, map[string]int64{"a": 0, "b": 1, "c": 0}}, // a limit smaller than the regions: one region holds it
		{three, 0, 0, map[string]int64{"a": 0, "b": 0, "c": 0}},
		// D'Hondt: the floors (5, 2, 2), then the one hit left to the highest
		// weight/(slice+1): 2/6, 1/3, 1/3 tie, and the rotation decides.
		{weighted, 10, 0, map[string]int64{"a": 6, "b": 2, "c": 2}},
		{weighted, 10, 2, map[string]int64{"a": 5, "b": 2, "c": 3}},
		// 7: floors 3, 1, 1; two left: a tie (2/4, 1/2, 1/2), then 2/5 < 1/2.
		{weighted, 7, 0, map[string]int64{"a": 4, "b": 2, "c": 1}},
		{weighted, 7, 2, map[string]int64{"a": 4, "b": 1, "c": 2}},
		{weighted, 6, 0, map[string]int64{"a": 4, "b": 1, "c": 1}},
		{weighted, 6, 1, map[string]int64{"a": 3, "b": 2, "c": 1}},
	} {
		var sum int64
		for name, want := range tc.want {
			got := tc.c.Share(tc.total, name, tc.seed)
			sum += got
			if got != want {
				t.Errorf("%s: Share(%d, %s, seed %d) = %d, want %d", tc.c, tc.total, name, tc.seed, got, want)
			}
		}
		if sum != tc.total {
			t.Errorf("%s: slices of %d (seed %d) add up to %d", tc.c, tc.total, tc.seed, sum)
		}
	}
	if got := three.Share(10, "zz", 0); got != 0 {
		t.Errorf("a region not in the list: %d", got)
	}
	var none *Config
	if got := none.Share(10, "anything", 0); got != 10 {
		t.Errorf("nil: %d", got)
	}
}

// TestSharesNeverExceedTheLimit: for any list, limit and key, the slices
// add up to exactly the limit (never more: over-admission 0), each is at
// least its floor share, raising the limit by one never lowers a slice
// (no Alabama paradox: a limit raised mid-window cannot admit more than
// the new limit), and every node computes the same.
func TestSharesNeverExceedTheLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + rng.IntN(7)
		rs := make([]Region, n)
		var total int64
		for i := range rs {
			rs[i] = Region{Name: string(rune('a' + i)), Weight: 1 + rng.Int64N(MaxWeight)}
			if rng.IntN(3) == 0 {
				rs[i].Weight = 1 + rng.Int64N(5)
			}
			total += rs[i].Weight
		}
		c, err := New(rs)
		if err != nil {
			t.Fatal(err)
		}
		limit := rng.Int64N(1000)
		if rng.IntN(4) == 0 {
			limit = rng.Int64N(1 << 53)
		}
		seed := rng.Uint64()
		var sum int64
		for _, r := range rs {
			got := c.Share(limit, r.Name, seed)
			floor := new(big.Int).Div(new(big.Int).Mul(big.NewInt(limit), big.NewInt(r.Weight)), big.NewInt(total))
			if big.NewInt(got).Cmp(floor) < 0 {
				t.Fatalf("%s: Share(%d, %s) = %d, below its floor share %s", c, limit, r.Name, got, floor)
			}
			if again := c.Share(limit, r.Name, seed); again != got {
				t.Fatalf("not deterministic: %d then %d", got, again)
			}
			if next := c.Share(limit+1, r.Name, seed); next < got {
				t.Fatalf("%s: raising the limit %d by one lowers %s's slice from %d to %d", c, limit, r.Name, got, next)
			}
			sum += got
		}
		if sum != limit {
			t.Fatalf("%s: slices of %d add up to %d", c, limit, sum)
		}
	}
}

// The attack's example: weights 6, 6, 2 and a limit raised from 10 to 11
// mid-window. Under largest remainder c's slice fell from 2 to 1 while a
// and b rose to 5: c had admitted 2, a and b then 5 each, 12 > 11.
func TestRaisedLimitNeverLowersASlice(t *testing.T) {
	c, _ := Parse("a=6,b=6,c=2")
	for seed := range uint64(3) {
		for l := int64(1); l < 200; l++ {
			for _, r := range []string{"a", "b", "c"} {
				if c.Share(l+1, r, seed) < c.Share(l, r, seed) {
					t.Fatalf("seed %d: %s's slice falls from %d to %d when the limit goes from %d to %d", seed, r, c.Share(l, r, seed), c.Share(l+1, r, seed), l, l+1)
				}
			}
		}
	}
}

func TestScope(t *testing.T) {
	for in, want := range map[string]Scope{"": Unspecified, "global": Global, "regional": Regional, "exact": Exact} {
		got, err := ParseScope(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseScope(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseScope("Global"); err == nil || !strings.Contains(err.Error(), "want global, regional or exact") {
		t.Errorf("ParseScope(Global) = %v", err)
	}
	multi, _ := Parse("a,b")
	single, _ := Parse("a")
	var none *Config
	for _, tc := range []struct {
		c        *Config
		in, want Scope
	}{
		{multi, Unspecified, Global}, {multi, Exact, Exact}, {multi, Regional, Regional},
		{single, Unspecified, Regional}, {none, Unspecified, Regional}, {none, Global, Global},
	} {
		if got := tc.c.Resolve(tc.in); got != tc.want {
			t.Errorf("%q.Resolve(%v) = %v, want %v", tc.c.String(), tc.in, got, tc.want)
		}
	}
}

func TestSeedOfMatchesTheRingKey(t *testing.T) {
	// ring.Key("api", "user:1") is uvarint(3) "api" "user:1".
	if SeedOf("api", "user:1") != Seed([]byte("\x03apiuser:1")) {
		t.Error("SeedOf differs from Seed of the ring key")
	}
	if SeedOf("ab", "c") == SeedOf("a", "bc") {
		t.Error("SeedOf collides on the name/key split")
	}
}
