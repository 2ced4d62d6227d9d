package scenario

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// hand is L=10 per 1s over 3 regions, one key, and 12 checks at the
// window's start entering region from.
func hand(scope, from string) *Scenario {
	return &Scenario{
		Name: "hand", Regions: []Region{{Name: "us-east"}, {Name: "eu-west"}, {Name: "ap-south"}}, RTT: 100 * time.Millisecond,
		Limit: Limit{Name: "hand", Limit: 10, Window: time.Second, Scope: scope}, Keys: Keys{Count: 1}, Windows: 1,
		Arrivals: []Arrival{{Region: from, Floods: []Flood{{Checks: 12}}}},
	}
}

// The hand-made table: 12 checks at a window's start in one
// region against L = 10 over 3 regions. Regional admits 10; global admits
// the region's slice (3 for key k0 of limit "hand": region.Share of 10
// over 3 regions gives us-east 3, eu-west 4, ap-south 3); exact admits
// 10 (at a round trip from a region that is not the home one); the
// oracle admits 10 every time.
func TestHandMadeTable(t *testing.T) {
	for _, tc := range []struct {
		scope, from               string
		admitted, under, sliceExh int64
		p99                       float64
		msgs                      int64
	}{
		{"regional", "us-east", 10, 0, 0, 0, 0},
		{"global", "us-east", 3, 7, 9, 0, 0},
		{"global", "eu-west", 4, 6, 8, 0, 0},
		{"exact", "us-east", 10, 0, 0, 0, 0},
		{"exact", "ap-south", 10, 0, 0, 100, 24},
	} {
		s := hand(tc.scope, tc.from)
		p, err := NewPlan(s)
		if err != nil {
			t.Fatal(err)
		}
		if sl, _ := p.Slice(tc.from, "k0"); tc.scope == "global" && sl != tc.admitted {
			t.Fatalf("%s's slice is %d, the table says %d", tc.from, sl, tc.admitted)
		}
		rep := runModel(t, s, tc.scope, nil, Options{})
		tt := rep.Totals
		want := Totals{
			Checks: 12, Admitted: tc.admitted, Denied: 12 - tc.admitted, OracleAdmitted: 10, Under: tc.under,
			Utilisation: float64(tc.admitted) / 10, SliceExhausted: tc.sliceExh,
			CrossRegionMessages: tc.msgs, MessagesPerCheck: float64(tc.msgs) / 12, P50Ms: tc.p99, P99Ms: tc.p99, MaxMs: tc.p99,
		}
		if tt != want {
			t.Errorf("%s from %s:\n got %+v\nwant %+v", tc.scope, tc.from, tt, want)
		}
		wantRow := WindowStats{Key: "k0", Window: 0, Checks: 12, Admitted: tc.admitted, OracleAdmitted: 10, Under: tc.under}
		if len(rep.Windows) != 1 || rep.Windows[0] != wantRow {
			t.Errorf("%s from %s: rows %+v, want %+v", tc.scope, tc.from, rep.Windows, wantRow)
		}
		if !rep.BoundOK || rep.Verify() != nil {
			t.Errorf("%s: %v", tc.scope, rep.Verify())
		}
	}
}

// results builds the results of p with every check sent at its planned
// time and answered by answer (nil: the error errNo).
func results(p *Plan, answer func(Check) *Answer) *Results {
	r := &Results{Start: time.Unix(1_000_000, 0), CutsEnforced: true, CrossRegionMessages: -1}
	for _, c := range p.Checks {
		res := Result{Check: c, Sent: c.At}
		if a := answer(c); a != nil {
			res.Answer = *a
		} else {
			res.Err = errNo
		}
		r.Checks = append(r.Checks, res)
	}
	return r
}

var errNo = errors.New("no answer")

// Report straight from results: rows by the deciding region's clock, a
// simultaneous group matched as a whole for U, errors neither admitted nor
// under-admitted, degraded admissions counted.
func TestReportFromResults(t *testing.T) {
	ms := time.Millisecond
	s := &Scenario{
		Name: "r", Regions: []Region{{Name: "a"}, {Name: "b"}}, RTT: 100 * ms,
		Limit: Limit{Name: "r", Limit: 3, Window: time.Second, Scope: "regional"}, Keys: Keys{Count: 2}, Windows: 2,
		ClockOffsets: map[string]time.Duration{"b": -50 * ms},
		Arrivals: []Arrival{
			{Region: AllRegions, Floods: []Flood{{Window: 1, Checks: 3, Keys: 1}}}, // k0: a, b, a, b, a, b at 1s
			{Region: "b", Floods: []Flood{{Offset: 20 * ms, Checks: 2, Keys: 2}}},  // k0, k1, k0, k1 at 20ms
		},
	}
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	r := results(p, func(c Check) *Answer {
		seen++
		switch {
		case c.At == 20*ms && c.Key == "k1":
			if seen == 2 {
				return nil // an error
			}
			return &Answer{Allowed: true, Degraded: true}
		case c.At == time.Second: // b admits all three, a none
			return &Answer{Allowed: c.Region == "b"}
		}
		return &Answer{Allowed: true}
	})
	rep := NewReport(p, r)
	// b's clock is 50 ms behind: its checks at 20 ms are in its window -1,
	// and at 1 s in its window 0; a's at 1 s in window 1.
	want := []WindowStats{
		{Key: "k0", Window: -1, Checks: 2, Admitted: 2, OracleAdmitted: 2},
		{Key: "k0", Window: 0, Checks: 3, Admitted: 3, OracleAdmitted: 1},
		{Key: "k0", Window: 1, Checks: 3, Admitted: 0, OracleAdmitted: 2},
		{Key: "k1", Window: -1, Checks: 2, Admitted: 1, OracleAdmitted: 2},
	}
	if len(rep.Windows) != len(want) {
		t.Fatalf("rows %+v", rep.Windows)
	}
	for i := range want {
		if rep.Windows[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, rep.Windows[i], want[i])
		}
	}
	// The oracle allowed a, b, a of the flood; the target b, b, b: the
	// group of six interchangeable checks has U = max(0, 3 − 3) = 0,
	// although a's two were denied. The error is not under-admission.
	tt := rep.Totals
	if tt.Under != 0 || tt.Errors != 1 || tt.Degraded != 1 || tt.Admitted != 6 || tt.Denied != 3 || tt.OracleAdmitted != 7 || tt.Over != 0 {
		t.Errorf("totals %+v", tt)
	}
	if rep.Regions[1].Errors != 1 || rep.Regions[1].Checks != 7 || rep.Regions[0].Checks != 3 || rep.Regions[1].ClockOffsetMs != -50 {
		t.Errorf("regions %+v", rep.Regions)
	}

	// Now b admits two and a one: the group's U is 3 − 3 = 0; with b
	// admitting one and a none, U = 3 − 1 = 2, assigned to a (the oracle
	// allowed a two, b one, and b got its one).
	for bAdmits, want := range map[int]int64{2: 0, 1: 2} {
		n := 0
		r := results(p, func(c Check) *Answer {
			if c.At != time.Second {
				return &Answer{Allowed: true}
			}
			if c.Region == "b" {
				n++
				return &Answer{Allowed: n <= bAdmits}
			}
			return &Answer{Allowed: bAdmits == 2 && n == 1}
		})
		rep := NewReport(p, r)
		if rep.Totals.Under != want || rep.Regions[0].Under != want {
			t.Errorf("b admits %d: U %d (a's %d), want %d", bAdmits, rep.Totals.Under, rep.Regions[0].Under, want)
		}
	}
}

// An exact check entering another region is counted in the window of
// the home region's clock when it arrives there, half a round trip later.
func TestReportExactTransit(t *testing.T) {
	ms := time.Millisecond
	s := &Scenario{
		Name: "x", Regions: []Region{{Name: "home"}, {Name: "far"}}, RTT: 100 * ms,
		Limit: Limit{Name: "x", Limit: 1, Window: time.Second, Scope: "exact"}, Keys: Keys{Count: 1}, Windows: 2,
		ClockOffsets: map[string]time.Duration{"far": 500 * ms}, // irrelevant: home decides
		Arrivals:     []Arrival{{Region: "far", Floods: []Flood{{Offset: 960 * ms, Checks: 1}}}, {Region: "home", Floods: []Flood{{Offset: 970 * ms, Checks: 1}}}},
	}
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReport(p, results(p, func(Check) *Answer { return &Answer{Allowed: true} }))
	if len(rep.Windows) != 2 || rep.Windows[0].Window != 0 || rep.Windows[1].Window != 1 || rep.Totals.Over != 0 {
		t.Fatalf("rows %+v", rep.Windows)
	}
	// The same with the answer naming the deciding region: the same rows.
	rep2 := NewReport(p, results(p, func(Check) *Answer { return &Answer{Allowed: true, Region: "home"} }))
	if len(rep2.Windows) != 2 || rep2.Windows[1] != rep.Windows[1] {
		t.Fatalf("rows %+v", rep2.Windows)
	}
	// Regional instead: both in window 0 of their own clocks: over by 1...
	// unless far's clock (500 ms ahead) puts its check in window 1.
	s.Limit.Scope = "regional"
	p, _ = NewPlan(s)
	rep = NewReport(p, results(p, func(Check) *Answer { return &Answer{Allowed: true} }))
	if len(rep.Windows) != 2 || rep.Windows[0].Admitted != 1 || rep.Windows[1].Window != 1 {
		t.Fatalf("regional rows %+v", rep.Windows)
	}
	delete(s.ClockOffsets, "far")
	p, _ = NewPlan(s)
	rep = NewReport(p, results(p, func(Check) *Answer { return &Answer{Allowed: true} }))
	if len(rep.Windows) != 1 || rep.Totals.Over != 1 || rep.Totals.MaxOver != 1 || rep.Bound != 1 || !rep.BoundOK {
		t.Fatalf("regional, clocks right: %+v %+v", rep.Windows, rep.Totals)
	}
}

// The bucket formula, by hand: rate 10/s, capacity 5.
func TestBucketOver(t *testing.T) {
	ms := time.Millisecond
	at := func(ts ...time.Duration) []admission {
		var out []admission
		for _, t := range ts {
			out = append(out, admission{at: t, hits: 1})
		}
		return out
	}
	five := []time.Duration{0, 0, 0, 0, 0}
	for _, tc := range []struct {
		as   []admission
		want int64
	}{
		{at(five...), 0},
		{at(append(five, 100*ms)...), 0},         // 6 in [0, 100ms]: 5 + 1
		{at(append(five, 100*ms, 100*ms)...), 1}, // 7 in [0, 100ms]
		{at(append(five, 0)...), 1},              // 6 at once
		{at(append(five, 0, 50*ms)...), 1},       // 7 in [0, 50ms]: 7 − 5.5 = 1.5, floored
		{at(append(five, 0, 0)...), 2},
		{at(0, 0, 0, 0, 0, 500*ms, 500*ms, 500*ms, 500*ms, 500*ms, 500*ms), 1}, // 6 at 500ms: 6 − 5; 11 in [0, 500]: 11 − 10
		{at(90*ms, 0, 0, 0, 0, 0, 10*ms), 1},                                   // unsorted: 7 in [0, 90ms]: 7 − 5.9 = 1.1
		{at(200*ms, 0, 0, 0, 0, 0, 100*ms), 0},                                 // 7 in [0, 200ms]: 5 + 2
		{[]admission{{at: 0, hits: 5}, {at: 500 * ms, hits: 5}, {at: time.Second, hits: 5}}, 0},
		{[]admission{{at: 0, hits: 5}, {at: 500 * ms, hits: 5}, {at: time.Second, hits: 5}, {at: time.Second, hits: 1}}, 1},
		{[]admission{{at: 0, hits: 5}, {at: time.Second, hits: 11}}, 6}, // 11 at once: 11 − 5
		{nil, 0},
	} {
		if got := bucketOver(tc.as, 10, time.Second, 5); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.as, got, tc.want)
		}
	}
}

// A run of a token bucket in the models: global slices never exceed the
// bucket, regional does under the flood, and the report catches it.
func TestBucketScenarios(t *testing.T) {
	for _, alg := range []string{"token_bucket", "leaky_bucket"} {
		p := Params{Algorithm: alg, Burst: 6, Keys: 2, Windows: 3}
		for _, s := range []*Scenario{Steady(p), FloodAll(p)} {
			g := runModel(t, s, "global", nil, Options{})
			r := runModel(t, s, "regional", nil, Options{})
			t.Logf("%s %s: global O %d U %d admitted %d/%d; regional O %d (max %d, bound %d)", alg, s.Name,
				g.Totals.Over, g.Totals.Under, g.Totals.Admitted, g.Totals.OracleAdmitted, r.Totals.Over, r.Totals.MaxOver, r.Bound)
			if g.Totals.Over != 0 || !g.BoundOK {
				t.Errorf("%s %s global: O %d", alg, s.Name, g.Totals.Over)
			}
			if !r.BoundOK {
				t.Errorf("%s %s regional: %v", alg, s.Name, r.Verify())
			}
			if s.Name == "flood" && r.Totals.MaxOver != 2*6 { // each of 3 regions admits its full burst at once
				t.Errorf("%s flood regional: max O %d, want 12", alg, r.Totals.MaxOver)
			}
		}
	}
}

// The global design never over-admits, whatever the algorithm, the
// number of regions, the RTT, the weights or the seed.
func TestGlobalNeverOverAdmits(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window", "token_bucket", "leaky_bucket"} {
		for _, regions := range []int{2, 3, 5} {
			for seed := uint64(1); seed <= 2; seed++ {
				p := Params{Algorithm: alg, Regions: regions, RTT: time.Duration(regions) * 40 * time.Millisecond, Keys: 3, Windows: 4, Seed: seed, Limit: 7}
				for _, s := range []*Scenario{Steady(p), Skew(p), ClockSkew(p)} {
					s.Regions[0].Weight = 3
					rep := runModel(t, s, "global", nil, Options{})
					if rep.Totals.Over != 0 {
						t.Errorf("%s R=%d seed %d %s: O %d", alg, regions, seed, s.Name, rep.Totals.Over)
					}
				}
			}
		}
	}
}

// The text and JSON forms carry the numbers.
func TestReportOutput(t *testing.T) {
	s := Partition(Params{Keys: 20})
	rep := runModel(t, s, "regional", nil, Options{})
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Totals != rep.Totals || len(back.Windows) != len(rep.Windows) || back.Scope != "regional" || back.Bound != 20 {
		t.Errorf("JSON round trip: %+v", back.Totals)
	}
	for _, f := range []string{`"over"`, `"under"`, `"max_over"`, `"slice_exhausted"`, `"degraded"`, `"errors"`, `"messages_per_check"`, `"p99_ms"`, `"bound_ok"`, `"window"`} {
		if !strings.Contains(b.String(), f) {
			t.Errorf("JSON lacks %s", f)
		}
	}
	b.Reset()
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, f := range []string{"scenario cut: 3 regions, fixed_window 10 per 1s, scope regional, 20 keys", "bound 20: ok", "us-east", "ap-south",
		"key  window", "rows: those with over- or under-admission first"} {
		if !strings.Contains(out, f) {
			t.Errorf("text lacks %q:\n%s", f, out)
		}
	}
	if n := strings.Count(out, "\n"); n > MaxTextRows+20 {
		t.Errorf("text has %d lines", n)
	}
	rep.BoundOK, rep.Totals.MaxOver, rep.Totals.MaxOverKey, rep.Totals.MaxOverWindow = false, 21, "k3", 2
	if err := rep.Verify(); !errors.Is(err, ErrOverBound) || !strings.Contains(err.Error(), "key k3 window 2") {
		t.Errorf("Verify: %v", err)
	}
	b.Reset()
	_ = rep.WriteText(&b)
	if !strings.Contains(b.String(), "VIOLATED (key k3 window 2)") {
		t.Errorf("text: %s", b.String())
	}
}

// The oracle is one limiter in global time order: it decides by send
// time, not by plan order.
func TestOracleOrder(t *testing.T) {
	spec := Spec{Name: "o", Algorithm: 1, Limit: 1, Window: time.Second}
	rs := []Result{
		{Check: Check{Index: 0, Key: "k", Hits: 1}, Sent: 10 * time.Millisecond},
		{Check: Check{Index: 1, Key: "k", Hits: 1}, Sent: 5 * time.Millisecond},
		{Check: Check{Index: 2, Key: "k", Hits: 1}, Sent: 1005 * time.Millisecond},
		{Check: Check{Index: 3, Key: "j", Hits: 2}, Sent: 0},
	}
	got := OracleDecisions(spec, time.Unix(0, 0), rs)
	if want := []bool{false, true, true, false}; !equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	o := NewOracle(spec)
	if !o.Decide("k", 1, time.Unix(5, 0)) || o.Decide("k", 1, time.Unix(5, 0)) {
		t.Error("Decide")
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An admitted fixed or sliding window check is placed in the window its
// decider counted it in, read from its answer's reset time: a check sent
// just before a window's end and decided just after it (a slow answer)
// is in the later window, so the earlier one is not reported over.
func TestReportPlacesAdmissionsWhereTheyWereCounted(t *testing.T) {
	ms := time.Millisecond
	for _, alg := range []string{"fixed_window", "sliding_window"} {
		s := &Scenario{
			Name: "late", Regions: []Region{{Name: "a"}}, RTT: 100 * ms,
			Limit: Limit{Name: "late", Algorithm: alg, Limit: 2, Window: time.Second, Scope: "regional"}, Keys: Keys{Count: 1}, Windows: 2,
			Arrivals: []Arrival{{Region: "a", Floods: []Flood{{Offset: 990 * ms, Checks: 4, Keys: 1}}}}, // 4 checks at 990 ms
		}
		p, err := NewPlan(s)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Unix(1_000_000, 0)
		n := 0
		r := results(p, func(c Check) *Answer {
			n++
			// The first two were decided in window 0, the last two (slow
			// answers) in window 1: each window admitted 2, the limit.
			win := int64(0)
			if n > 2 {
				win = 1
			}
			end := start.Add(time.Duration(win+1) * time.Second)
			if alg == "sliding_window" {
				end = end.Add(time.Second) // back at full capacity a window later
			}
			return &Answer{Allowed: true, ResetTime: end.UnixMilli(), Latency: 20 * ms} // in flight from 990 to 1010 ms
		})
		rep := NewReport(p, r)
		if rep.Totals.Over != 0 || len(rep.Windows) != 2 || rep.Windows[0].Admitted != 2 || rep.Windows[1].Admitted != 2 {
			t.Errorf("%s: over %d, rows %+v; want 2 admitted in each window, none over", alg, rep.Totals.Over, rep.Windows)
		}
		// Without reset times the send time places all four in window 0: over by 2.
		r = results(p, func(Check) *Answer { return &Answer{Allowed: true} })
		if rep := NewReport(p, r); rep.Totals.Over != 2 {
			t.Errorf("%s without reset times: over %d, want 2 (all sent in window 0)", alg, rep.Totals.Over)
		}
		// A target that names a window the check was not in flight during
		// (answered at 990 ms, yet counted in window 1) is not believed:
		// the check is placed by its send time, and counted as misplaced.
		n = 0
		r = results(p, func(Check) *Answer {
			n++
			end := start.Add(time.Second)
			if n > 2 {
				end = end.Add(time.Second)
			}
			if alg == "sliding_window" {
				end = end.Add(time.Second)
			}
			return &Answer{Allowed: true, ResetTime: end.UnixMilli(), Latency: ms}
		})
		if rep := NewReport(p, r); rep.Totals.Over != 2 || rep.Totals.Misplaced != 2 || rep.Verify() == nil {
			t.Errorf("%s, a lying reset time: over %d, misplaced %d; want 2 and 2, and Verify to fail", alg, rep.Totals.Over, rep.Totals.Misplaced)
		}
	}
}
