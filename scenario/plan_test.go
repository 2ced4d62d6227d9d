package scenario

import (
	"math"
	"reflect"
	"testing"
	"time"
)

// A plan is a function of the scenario and its seed.
func TestPlanDeterministic(t *testing.T) {
	s := Steady(DefaultParams())
	a, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewPlan(s)
	if !reflect.DeepEqual(a.Checks, b.Checks) {
		t.Fatal("the same scenario gave two plans")
	}
	s.Seed = 2
	c, _ := NewPlan(s)
	if reflect.DeepEqual(a.Checks, c.Checks) {
		t.Fatal("another seed gave the same plan")
	}
	// Sorted by time, indexed, every key and region one of the plan's.
	for i, ch := range a.Checks {
		if ch.Index != i || (i > 0 && ch.At < a.Checks[i-1].At) || a.KeyIndex(ch.Key) < 0 || ch.Hits != 1 ||
			ch.At < 0 || ch.At >= a.Duration || !a.Regions.Has(ch.Region) {
			t.Fatalf("check %d: %+v", i, ch)
		}
	}
}

// A Poisson rate draws about rate × duration checks per region, on keys
// uniformly.
func TestPlanPoissonRate(t *testing.T) {
	s := Steady(Params{Windows: 200})
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	want := 50.0 * 200 // per region
	perRegion, perKey := map[string]int{}, map[string]int{}
	for _, c := range p.Checks {
		perRegion[c.Region]++
		perKey[c.Key]++
	}
	for r, n := range perRegion {
		if math.Abs(float64(n)-want) > 4*math.Sqrt(want) {
			t.Errorf("%s: %d checks, want about %.0f", r, n, want)
		}
	}
	for k, n := range perKey {
		if w := 3 * want / 5; math.Abs(float64(n)-w) > 4*math.Sqrt(w) {
			t.Errorf("%s: %d checks, want about %.0f", k, n, w)
		}
	}
}

// Even spacing and floods place checks exactly; simultaneous checks
// alternate between the regions, and floods alternate between the keys.
func TestPlanEvenAndFloods(t *testing.T) {
	s := &Scenario{
		Name: "hand", Regions: []Region{{Name: "a"}, {Name: "b"}},
		Limit: Limit{Name: "x", Limit: 10, Window: time.Second}, Keys: Keys{Count: 3, Prefix: "u"}, Windows: 2,
		Arrivals: []Arrival{
			{Region: "a", Rate: 4, Spacing: "even", From: 500 * time.Millisecond, To: time.Second, Hits: 2},
			{Region: AllRegions, Floods: []Flood{{Window: 1, Offset: 100 * time.Millisecond, Checks: 2, Keys: 2}}},
			{Region: "b", Floods: []Flood{{Checks: 1, Spread: 300 * time.Millisecond, Keys: 3}}},
		},
	}
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	type c = struct {
		at     time.Duration
		region string
		key    string
		hits   int64
	}
	var got []c
	for _, ch := range p.Checks {
		got = append(got, c{ch.At, ch.Region, ch.Key, ch.Hits})
	}
	ms := time.Millisecond
	want := []c{
		{0, "b", "u0", 1}, {100 * ms, "b", "u1", 1}, {200 * ms, "b", "u2", 1},
		{500 * ms, "a", "u0", 2}, {750 * ms, "a", "u2", 2}, // even: every 250 ms from 500 ms; keys drawn
		{1100 * ms, "a", "u0", 1}, {1100 * ms, "b", "u0", 1}, {1100 * ms, "a", "u1", 1}, {1100 * ms, "b", "u1", 1},
		{1100 * ms, "a", "u0", 1}, {1100 * ms, "b", "u0", 1}, {1100 * ms, "a", "u1", 1}, {1100 * ms, "b", "u1", 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d checks %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		w := want[i]
		if i == 3 || i == 4 { // the even arrival's keys are random
			w.key = got[i].key
		}
		if got[i] != w {
			t.Errorf("check %d: %+v, want %+v", i, got[i], w)
		}
	}
	if p.Duration != 2*time.Second || p.Home() != "a" || p.RTT("a", "b") != 0 || p.ClockOffset("a") != 0 {
		t.Errorf("plan %s", p)
	}
}

// RTT overrides per pair, either order; Slice divides the limit and the
// burst with region.Share, adding up to the whole.
func TestPlanRTTAndSlices(t *testing.T) {
	s := Steady(Params{Algorithm: "token_bucket", Burst: 7})
	s.RTTPairs = []PairRTT{{A: "ap-south", B: "us-east", RTT: 250 * time.Millisecond}}
	s.Regions[0].Weight = 2
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.RTT("us-east", "ap-south") != 250*time.Millisecond || p.RTT("eu-west", "ap-south") != 100*time.Millisecond || p.RTT("eu-west", "eu-west") != 0 {
		t.Error("rtt")
	}
	for _, k := range p.Keys {
		var l, b int64
		for _, r := range p.RegionNames() {
			sl, sb := p.Slice(r, k)
			if sl != p.Regions.Share(10, r, regionSeed(p.Limit.Name, k)) {
				t.Fatal("slice is not region.Share")
			}
			l, b = l+sl, b+sb
		}
		if l != 10 || b != 7 {
			t.Errorf("key %s: slices add up to %d and %d, want 10 and 7", k, l, b)
		}
		if sl, _ := p.Slice("us-east", k); sl != 5 && sl != 6 {
			t.Errorf("us-east (weight 2 of 4) slice %d, want 5, or 6 when the hit left over goes to it (D'Hondt)", sl)
		}
	}
}

// A plan never holds more than MaxChecks checks.
func TestPlanBounded(t *testing.T) {
	s := Steady(Params{Windows: 1000})
	s.Arrivals[0].Rate = 900 // 2.7M expected
	if _, err := NewPlan(s); err == nil {
		t.Fatal("accepted a plan of 2.7M checks")
	}
}
