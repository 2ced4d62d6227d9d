package scenario

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The files under testdata/ are the built-in scenarios for the default
// parameters (3 regions, 100 ms), field for field.
func TestTestdataMatchesBuilders(t *testing.T) {
	for _, want := range DoneWhen(DefaultParams()) {
		got, err := Load(filepath.Join("testdata", want.Name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("testdata/%s.yaml:\n%+v\nwant (builder):\n%+v", want.Name, got, want)
		}
	}
}

// Marshal writes what Parse reads back, for every built-in scenario and
// other region counts and round-trip times.
func TestMarshalRoundTrip(t *testing.T) {
	for _, p := range []Params{{}, {Regions: 2, RTT: 50 * time.Millisecond}, {Regions: 5, RTT: 200 * time.Millisecond, Algorithm: "token_bucket", Burst: 5}} {
		for _, s := range DoneWhen(p) {
			b, err := s.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("%s: %v\n%s", s.Name, err, b)
			}
			if !reflect.DeepEqual(got, s) {
				t.Errorf("%s: round trip\n%s\ngave %+v", s.Name, b, got)
			}
		}
	}
}

// Every refusal names the field, as a *FieldError wrapping ErrInvalid.
func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*Scenario)
	}{
		{"name", func(s *Scenario) { s.Name = "" }},
		{"regions", func(s *Scenario) { s.Regions = nil }},
		{"regions[1].name", func(s *Scenario) { s.Regions[1].Name = "eu west" }},
		{"regions[2].weight", func(s *Scenario) { s.Regions[2].Weight = -1 }},
		{"regions", func(s *Scenario) { s.Regions[2].Name = "us-east" }},
		{"rtt", func(s *Scenario) { s.RTT = -time.Millisecond }},
		{"rtt_pairs[0].b", func(s *Scenario) { s.RTTPairs = []PairRTT{{A: "us-east", B: "mars", RTT: time.Second}} }},
		{"rtt_pairs[0]", func(s *Scenario) { s.RTTPairs = []PairRTT{{A: "us-east", B: "us-east"}} }},
		{"rtt_pairs[1]", func(s *Scenario) {
			s.RTTPairs = []PairRTT{{A: "us-east", B: "eu-west"}, {A: "eu-west", B: "us-east"}}
		}},
		{"limit.name", func(s *Scenario) { s.Limit.Name = "" }},
		{"limit.algorithm", func(s *Scenario) { s.Limit.Algorithm = "gcra" }},
		{"limit.limit", func(s *Scenario) { s.Limit.Limit = 0 }},
		{"limit.window", func(s *Scenario) { s.Limit.Window = 0 }},
		{"limit.window", func(s *Scenario) { s.Limit.Window = 1500 * time.Microsecond }},
		{"limit.burst", func(s *Scenario) { s.Limit.Burst = 5 }},
		{"limit.scope", func(s *Scenario) { s.Limit.Scope = "planet" }},
		{"keys.count", func(s *Scenario) { s.Keys.Count = 0 }},
		{"duration", func(s *Scenario) { s.Duration = time.Second }},
		{"duration", func(s *Scenario) { s.Windows = 0 }},
		{"windows", func(s *Scenario) { s.Windows = -2 }},
		{"arrivals", func(s *Scenario) { s.Arrivals = nil }},
		{"arrivals[0].region", func(s *Scenario) { s.Arrivals[0].Region = "mars" }},
		{"arrivals[0].rate", func(s *Scenario) { s.Arrivals[0].Rate = -1 }},
		{"arrivals[0].spacing", func(s *Scenario) { s.Arrivals[0].Spacing = "bursty" }},
		{"arrivals[0].to", func(s *Scenario) { s.Arrivals[0].To = time.Hour }},
		{"arrivals[0].hits", func(s *Scenario) { s.Arrivals[0].Hits = 11 }},
		{"arrivals[0]", func(s *Scenario) { s.Arrivals[0].Rate = 0 }},
		{"arrivals[0].floods[0].checks", func(s *Scenario) { s.Arrivals[0].Floods = []Flood{{Window: 1}} }},
		{"arrivals[0].floods[0].window", func(s *Scenario) { s.Arrivals[0].Floods = []Flood{{Window: 5, Checks: 1}} }},
		{"arrivals[0].floods[0].offset", func(s *Scenario) { s.Arrivals[0].Floods = []Flood{{Offset: time.Second, Checks: 1}} }},
		{"arrivals[0].floods[0].keys", func(s *Scenario) { s.Arrivals[0].Floods = []Flood{{Keys: 6, Checks: 1}} }},
		{"arrivals", func(s *Scenario) { s.Arrivals[0].Floods = []Flood{{Checks: 1_000_000}} }},
		{"cuts[0].region", func(s *Scenario) { s.Cuts = []Cut{{Region: "mars", To: time.Second}} }},
		{"cuts[0].to", func(s *Scenario) { s.Cuts = []Cut{{Region: "eu-west", From: time.Second, To: time.Second}} }},
		{"cuts[1]", func(s *Scenario) {
			s.Cuts = []Cut{{Region: "eu-west", To: 2 * time.Second}, {Region: "eu-west", From: time.Second, To: 3 * time.Second}}
		}},
		{"restarts[0].region", func(s *Scenario) { s.Restarts = []Restart{{Region: "mars", At: time.Second}} }},
		{"restarts[0].node", func(s *Scenario) { s.Restarts = []Restart{{Region: "eu-west", Node: -1}} }},
		{"restarts[0].at", func(s *Scenario) { s.Restarts = []Restart{{Region: "eu-west", At: 5 * time.Second}} }},
		{"restarts[0].how", func(s *Scenario) { s.Restarts = []Restart{{Region: "eu-west", How: "reboot"}} }},
		{"restarts[0].down", func(s *Scenario) {
			s.Restarts = []Restart{{Region: "eu-west", At: 3 * time.Second, Down: 3 * time.Second}}
		}},
		{"restarts[0].down", func(s *Scenario) { s.Restarts = []Restart{{Region: "eu-west", Down: -time.Second}} }},
		{"restarts[1]", func(s *Scenario) {
			s.Restarts = []Restart{{Region: "eu-west", At: time.Second, Down: time.Second}, {Region: "eu-west", At: 2 * time.Second, How: RestartKill}}
		}},
		{"clock_offsets.mars", func(s *Scenario) { s.ClockOffsets = map[string]time.Duration{"mars": 0} }},
		{"clock_offsets.eu-west", func(s *Scenario) { s.ClockOffsets = map[string]time.Duration{"eu-west": 2 * time.Hour} }},
		{"loss", func(s *Scenario) { s.Loss = 0.6 }},
		{"loss", func(s *Scenario) { s.Loss = -0.1 }},
	} {
		s := Steady(DefaultParams())
		tc.edit(s)
		err := s.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Field != tc.field {
			t.Errorf("want a FieldError for %s, got %v", tc.field, err)
		}
		if _, err := NewPlan(s); err == nil {
			t.Errorf("%s: NewPlan accepted it", tc.field)
		}
	}
	if err := Steady(DefaultParams()).Validate(); err != nil {
		t.Fatalf("the unedited scenario: %v", err)
	}
}

// testdata/deploy.yaml, issue 35's rolling deploy, loads with its three
// graceful restarts, and writes back to itself; restarts of different
// nodes (or one node at other times) may follow each other closely.
func TestDeployTestdata(t *testing.T) {
	s, err := Load(filepath.Join("testdata", "deploy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Restart{
		{Region: "ra", At: 5 * time.Second, How: RestartGraceful, Down: time.Second},
		{Region: "rb", At: 11 * time.Second, How: RestartGraceful, Down: time.Second},
		{Region: "rc", At: 17 * time.Second, How: RestartGraceful, Down: time.Second},
	}
	if !reflect.DeepEqual(s.Restarts, want) || s.Limit.Window != time.Hour || s.Keys.Count != 12 || s.RTT != 60*time.Millisecond {
		t.Fatalf("deploy.yaml: %+v", s)
	}
	s.Restarts = append(s.Restarts, Restart{Region: "ra", Node: 1, At: 5 * time.Second, How: RestartKill},
		Restart{Region: "ra", At: 6*time.Second + time.Millisecond})
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip: %v\n%s", err, b)
	}
	p, err := NewPlan(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Restarts) != 5 || p.Restarts[1].Node != 1 || p.Restarts[2].At != 6*time.Second+time.Millisecond || p.Restarts[4].Region != "rc" {
		t.Errorf("plan's restarts, by At: %+v", p.Restarts)
	}
	if !got.Restarts[3].Kill() || got.Restarts[0].Kill() {
		t.Error("Kill")
	}
}

// Parse refuses unknown fields (with the line), durations without a unit,
// several documents and an empty one.
func TestParseRefuses(t *testing.T) {
	valid, err := Steady(DefaultParams()).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ doc, want string }{
		{strings.Replace(string(valid), "windows: 5", "windows: 5\nwindos: 6", 1), "field windos not found"},
		{strings.Replace(string(valid), "rtt: 100ms", "rtt: 100", 1), "into time.Duration"},
		{string(valid) + "---\n" + string(valid), "more than one document"},
		{"", "empty document"},
		{strings.Replace(string(valid), "limit: 10", "limit: 0", 1), "limit.limit"},
	} {
		_, err := Parse([]byte(tc.doc))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte("name: x\nregions: [{name: a}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "limit.name") {
		t.Errorf("Load: %v", err)
	}
}

// The builders take their parameters: regions, RTT, the limit.
func TestBuildersParametrized(t *testing.T) {
	p := Params{Regions: 10, RTT: 200 * time.Millisecond, Algorithm: "sliding_window", Limit: 600, Window: time.Minute, Keys: 2, Windows: 4}
	for _, s := range DoneWhen(p) {
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if len(s.Regions) != 10 || s.Regions[9].Name != "r10" || s.RTT != 200*time.Millisecond || s.Limit.Limit != 600 || s.Windows != 4 {
			t.Fatalf("%s: %+v", s.Name, s)
		}
	}
	if c := Partition(p).Cuts[0]; c.Region != "r10" || c.From != time.Minute || c.To != 3*time.Minute {
		t.Errorf("cut %+v", c)
	}
	if o := ClockSkew(p).ClockOffsets; len(o) != 9 || o["eu-west"] != 50*time.Millisecond || o["ap-south"] != -50*time.Millisecond {
		t.Errorf("offsets %v", o)
	}
	sk := Skew(p).Arrivals
	if sk[0].Rate != 3*600*2/60.0*0.9 || sk[1].Rate != 3*600*2/60.0*0.1/9 {
		t.Errorf("skew rates %+v", sk)
	}
}
