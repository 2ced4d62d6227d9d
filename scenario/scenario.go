package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Bounds that keep every scenario finite.
const (
	// MaxChecks is the most checks a plan may hold (all regions).
	MaxChecks = 2_000_000
	// MaxDuration is the longest run.
	MaxDuration = 24 * time.Hour
	// MaxKeys is the most keys a scenario may use.
	MaxKeys = 1_000_000
	// MaxRTT is the longest round-trip time between two regions.
	MaxRTT = time.Minute
	// MaxClockOffset is the largest clock offset of a region, either way.
	MaxClockOffset = time.Hour
	// MaxLoss is the highest packet loss between two regions.
	MaxLoss = 0.5
	// MaxRate is the highest arrival rate of one arrival, checks/s.
	MaxRate = 1_000_000
	// MaxHits is the most hits one check may consume.
	MaxHits = 1_000_000
)

// AllRegions is the Arrival.Region that gives every region the arrival
// (each region draws its own times and keys).
const AllRegions = "*"

// ErrInvalid is wrapped by every error that refuses a scenario.
var ErrInvalid = errors.New("scenario: invalid")

// FieldError refuses one field of a scenario. It wraps [ErrInvalid].
type FieldError struct {
	// Field is the field's path as in the YAML, e.g. "arrivals[1].rate",
	// "limit.window" or "clock_offsets.eu-west".
	Field string
	// Reason says what is wrong, e.g. "must be > 0, got -1".
	Reason string
}

// Error returns "scenario: field: reason".
func (e *FieldError) Error() string { return "scenario: " + e.Field + ": " + e.Reason }

// Unwrap returns [ErrInvalid].
func (e *FieldError) Unwrap() error { return ErrInvalid }

func bad(field, format string, a ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, a...)}
}

// Scenario is one run to measure: regions, network, limit, keys, load,
// partitions, clocks and restarts of nodes (deploys). The zero value is invalid; see [Scenario.Validate]
// for what each field accepts. A Scenario is plain data: copy it, change a
// field (e.g. Limit.Scope) and validate again.
type Scenario struct {
	// Name names the scenario in reports, e.g. "steady". (Required)
	Name string `yaml:"name" json:"name"`
	// Seed seeds the plan's arrival times and keys: the same scenario and
	// seed give the same plan. 0 means 1. (Optional)
	Seed uint64 `yaml:"seed,omitempty" json:"seed,omitempty"`
	// Regions are the regions, in the order of serve --regions (the first
	// is the home region of exact limits), 1..64. (Required)
	Regions []Region `yaml:"regions" json:"regions"`
	// RTT is the round-trip time between any two regions, 0..1m, unless
	// RTTPairs says otherwise for a pair. (Optional)
	RTT time.Duration `yaml:"rtt,omitempty" json:"rtt,omitempty"`
	// RTTPairs overrides RTT for pairs of regions (either order).
	// (Optional)
	RTTPairs []PairRTT `yaml:"rtt_pairs,omitempty" json:"rtt_pairs,omitempty"`
	// Limit is the one limit every check asks for. (Required)
	Limit Limit `yaml:"limit" json:"limit"`
	// Keys are the keys the checks spread over. (Required)
	Keys Keys `yaml:"keys" json:"keys"`
	// Duration is how long the run lasts, (0, 24h]. Exactly one of
	// Duration and Windows is given.
	Duration time.Duration `yaml:"duration,omitempty" json:"duration,omitempty"`
	// Windows is how long the run lasts in windows of the limit (the run
	// starts at a window's start). Exactly one of Duration and Windows is
	// given.
	Windows int `yaml:"windows,omitempty" json:"windows,omitempty"`
	// Arrivals say what arrives in each region: at least one. (Required)
	Arrivals []Arrival `yaml:"arrivals" json:"arrivals"`
	// Cuts cut regions off from the others for a while. (Optional)
	Cuts []Cut `yaml:"cuts,omitempty" json:"cuts,omitempty"`
	// Restarts stop a region's node and start it again under its name (a
	// deploy; several in turn make a rolling deploy). (Optional)
	Restarts []Restart `yaml:"restarts,omitempty" json:"restarts,omitempty"`
	// Loss is the probability that a packet between two regions is lost,
	// 0..0.5, on every pair: on gRPC (TCP) a lost packet is retransmitted
	// (the call is late: later calls overtake it, and a sender that gives
	// up sends again), on gossip (UDP) it is dropped. Applied by --simulate
	// only; against real nodes make the loss yourself (tc netem). (Optional)
	Loss float64 `yaml:"loss,omitempty" json:"loss,omitempty"`
	// ClockOffsets is each region's clock minus the true time, within
	// ±1h; a region left out is 0. (Optional)
	ClockOffsets map[string]time.Duration `yaml:"clock_offsets,omitempty" json:"clock_offsets,omitempty"`
}

// Region is one region of a scenario.
type Region struct {
	// Name is the region's name as in serve --regions ([A-Za-z0-9._+-],
	// 1..64 bytes). (Required)
	Name string `yaml:"name" json:"name"`
	// Weight is the region's weight for global slices, 1..1000000; 0 means
	// 1. (Optional)
	Weight int64 `yaml:"weight,omitempty" json:"weight,omitempty"`
}

// PairRTT is the round-trip time between two regions.
type PairRTT struct {
	// A is one region of the pair. (Required)
	A string `yaml:"a" json:"a"`
	// B is the other, not A. (Required)
	B string `yaml:"b" json:"b"`
	// RTT is their round-trip time, 0..1m.
	RTT time.Duration `yaml:"rtt" json:"rtt"`
}

// Limit is a scenario's limit, as in limits.yaml plus its scope.
type Limit struct {
	// Name is the limit's name, 1..256 bytes of UTF-8. (Required)
	Name string `yaml:"name" json:"name"`
	// Algorithm is fixed_window (default), sliding_window, token_bucket
	// or leaky_bucket. (Optional)
	Algorithm string `yaml:"algorithm,omitempty" json:"algorithm,omitempty"`
	// Limit is the hits allowed per Window, 1..2^53 (for the buckets the
	// rate: Limit per Window). (Required)
	Limit int64 `yaml:"limit" json:"limit"`
	// Window is the limit's window: whole milliseconds, up to 366 days.
	// (Required)
	Window time.Duration `yaml:"window" json:"window"`
	// Burst is the bucket capacity in hits for the bucket algorithms;
	// 0 means Limit. (Optional)
	Burst int64 `yaml:"burst,omitempty" json:"burst,omitempty"`
	// Scope is global (default), regional or exact. (Optional)
	Scope string `yaml:"scope,omitempty" json:"scope,omitempty"`
}

// Keys are the keys of a scenario: Prefix followed by 0..Count-1.
type Keys struct {
	// Count is the number of keys, 1..1000000. (Required)
	Count int `yaml:"count" json:"count"`
	// Prefix starts every key; empty means "k" (keys k0, k1, ...).
	// (Optional)
	Prefix string `yaml:"prefix,omitempty" json:"prefix,omitempty"`
}

// Arrival is what arrives in a region: a steady rate of checks and floods.
type Arrival struct {
	// Region is the region the checks enter, or "*" for every region
	// (each drawing its own times and keys). (Required)
	Region string `yaml:"region" json:"region"`
	// Rate is the checks per second entering the region over all keys,
	// each check on a key drawn uniformly at random, 0..1000000. (Optional)
	Rate float64 `yaml:"rate,omitempty" json:"rate,omitempty"`
	// Spacing is how Rate's checks are spaced: "poisson" (default:
	// exponential gaps, a Poisson process) or "even" (every 1/Rate s).
	// (Optional)
	Spacing string `yaml:"spacing,omitempty" json:"spacing,omitempty"`
	// From is when Rate's checks start arriving, an offset of the run in
	// [0, duration). (Optional)
	From time.Duration `yaml:"from,omitempty" json:"from,omitempty"`
	// To is when they stop, an offset of the run in (From, duration]; 0
	// means the run's end. (Optional)
	To time.Duration `yaml:"to,omitempty" json:"to,omitempty"`
	// Hits is the hits of each check, 1..1000000; 0 means 1. (Optional)
	Hits int64 `yaml:"hits,omitempty" json:"hits,omitempty"`
	// Floods are bursts of checks at a window's start. (Optional)
	Floods []Flood `yaml:"floods,omitempty" json:"floods,omitempty"`
}

// Flood is a burst of checks entering a region: Checks checks on each of
// the first Keys keys (interleaved: one on each key, then again), at
// Offset after the start of the run's window number Window.
type Flood struct {
	// Window is the window of the run the flood starts in: 0 is the
	// first. (Optional)
	Window int `yaml:"window,omitempty" json:"window,omitempty"`
	// Offset is when, after that window's start, 0 <= Offset < the
	// limit's window. (Optional)
	Offset time.Duration `yaml:"offset,omitempty" json:"offset,omitempty"`
	// Checks is the checks on each key, >= 1. (Required)
	Checks int `yaml:"checks" json:"checks"`
	// Keys is how many keys are flooded (the first ones); 0 means all.
	// (Optional)
	Keys int `yaml:"keys,omitempty" json:"keys,omitempty"`
	// Spread spaces the checks evenly over this long; 0 sends them all
	// at the same instant. (Optional)
	Spread time.Duration `yaml:"spread,omitempty" json:"spread,omitempty"`
}

// Cut cuts Region off from every other region from From to To (offsets of
// the run): the region's own checks still arrive, but nothing crosses to
// or from it. Cuts of one region must not overlap.
type Cut struct {
	// Region is the region cut off. (Required)
	Region string `yaml:"region" json:"region"`
	// From is when the cut starts, an offset of the run in [0, duration).
	From time.Duration `yaml:"from" json:"from"`
	// To is when it heals, in (From, duration].
	To time.Duration `yaml:"to" json:"to"`
}

// How a [Restart] stops its node.
const (
	// RestartGraceful stops the node as SIGTERM does: it hands its keys
	// off and leaves the cluster (the default).
	RestartGraceful = "graceful"
	// RestartKill stops it as kill -9 does: no hand-off, no leave; what
	// it held is lost, and the others learn of it by gossip.
	RestartKill = "kill"
)

// Restart stops node Node of Region at At (an offset of the run), keeps it
// down for Down, then starts it again under the same name and region (new
// process, no state of the old one) and waits until it serves again. The
// target applies it ([Restarter]); restarts run one at a time, in the order
// of At: one due while the one before is still under way waits for it, as
// a rolling deploy waits for each node to be back. Restarts of one node
// must not overlap.
type Restart struct {
	// Region is the region of the node. (Required)
	Region string `yaml:"region" json:"region"`
	// Node is the node's index among its region's nodes (in start order),
	// >= 0; the target refuses an index it has no node for. (Optional)
	Node int `yaml:"node,omitempty" json:"node,omitempty"`
	// At is when the node is stopped, an offset of the run in [0, duration).
	At time.Duration `yaml:"at" json:"at"`
	// How is how the node stops: graceful (default: a SIGTERM's leave) or
	// kill (a crash: state lost, no leave). (Optional)
	How string `yaml:"how,omitempty" json:"how,omitempty"`
	// Down is how long the node stays stopped before it starts again,
	// >= 0, ending by the run's end; 0 starts it again at once. (Optional)
	Down time.Duration `yaml:"down,omitempty" json:"down,omitempty"`
}

// Kill reports whether r stops its node as a crash (How is kill).
func (r Restart) Kill() bool { return r.How == RestartKill }

// Load reads and validates the scenario in the YAML file at path. Errors
// name the file and the line (a YAML error, an unknown field) or the
// field ([FieldError]).
func Load(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse reads and validates a scenario from YAML. Unknown fields are
// refused (a misspelt field would otherwise silently take its default);
// a document with more than one scenario is refused.
func Parse(b []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalid)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one document (one scenario per file)", ErrInvalid)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Marshal returns s as YAML that [Parse] reads back to s.
func (s *Scenario) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Validate returns the first problem of s as a *[FieldError] (wrapping
// [ErrInvalid]), or nil. It does not change s.
func (s *Scenario) Validate() error {
	if s.Name == "" {
		return bad("name", "required")
	}
	cfg, err := s.regionConfig()
	if err != nil {
		return err
	}
	if s.RTT < 0 || s.RTT > MaxRTT {
		return bad("rtt", "must be in 0..%s, got %s", MaxRTT, s.RTT)
	}
	seen := map[[2]string]bool{}
	for i, p := range s.RTTPairs {
		f := fmt.Sprintf("rtt_pairs[%d]", i)
		switch {
		case !cfg.Has(p.A):
			return bad(f+".a", "%s", notRegion(p.A, s.Regions))
		case !cfg.Has(p.B):
			return bad(f+".b", "%s", notRegion(p.B, s.Regions))
		case p.A == p.B:
			return bad(f, "a and b are the same region %q", p.A)
		case p.RTT < 0 || p.RTT > MaxRTT:
			return bad(f+".rtt", "must be in 0..%s, got %s", MaxRTT, p.RTT)
		case seen[pairKey(p.A, p.B)]:
			return bad(f, "the pair %s, %s is listed twice", p.A, p.B)
		}
		seen[pairKey(p.A, p.B)] = true
	}
	spec, err := s.spec()
	if err != nil {
		return err
	}
	switch {
	case s.Keys.Count < 1 || s.Keys.Count > MaxKeys:
		return bad("keys.count", "must be in 1..%d, got %d", MaxKeys, s.Keys.Count)
	case !utf8.ValidString(s.Keys.Prefix):
		return bad("keys.prefix", "must be valid UTF-8")
	case len(s.Keys.Prefix) > 256:
		return bad("keys.prefix", "at most 256 bytes, got %d", len(s.Keys.Prefix))
	}
	d, err := s.duration(spec.Window)
	if err != nil {
		return err
	}
	if len(s.Arrivals) == 0 {
		return bad("arrivals", "at least one arrival is required")
	}
	var expect float64 // expected checks, for the bound
	for i, a := range s.Arrivals {
		n, err := a.validate(fmt.Sprintf("arrivals[%d]", i), s, cfg, spec, d)
		if err != nil {
			return err
		}
		expect += n
	}
	if expect > MaxChecks {
		return bad("arrivals", "about %.0f checks in all, more than %d", expect, MaxChecks)
	}
	for i, c := range s.Cuts {
		f := fmt.Sprintf("cuts[%d]", i)
		switch {
		case !cfg.Has(c.Region):
			return bad(f+".region", "%s", notRegion(c.Region, s.Regions))
		case c.From < 0 || c.From >= d:
			return bad(f+".from", "must be in [0, %s) (the run's duration), got %s", d, c.From)
		case c.To <= c.From || c.To > d:
			return bad(f+".to", "must be in (from %s, %s], got %s", c.From, d, c.To)
		}
		for j, o := range s.Cuts[:i] {
			if o.Region == c.Region && c.From < o.To && o.From < c.To {
				return bad(f, "overlaps cuts[%d] of region %q", j, c.Region)
			}
		}
	}
	for i, r := range s.Restarts {
		f := fmt.Sprintf("restarts[%d]", i)
		switch {
		case !cfg.Has(r.Region):
			return bad(f+".region", "%s", notRegion(r.Region, s.Regions))
		case r.Node < 0:
			return bad(f+".node", "must be >= 0 (the node's index in its region), got %d", r.Node)
		case r.At < 0 || r.At >= d:
			return bad(f+".at", "must be in [0, %s) (the run's duration), got %s", d, r.At)
		case r.How != "" && r.How != RestartGraceful && r.How != RestartKill:
			return bad(f+".how", "want %s or %s, got %q", RestartGraceful, RestartKill, r.How)
		case r.Down < 0 || r.At+r.Down > d:
			return bad(f+".down", "must be >= 0 and end by the run's end %s, got %s from %s", d, r.Down, r.At)
		}
		for j, o := range s.Restarts[:i] {
			if o.Region == r.Region && o.Node == r.Node && r.At <= o.At+o.Down && o.At <= r.At+r.Down {
				return bad(f, "overlaps restarts[%d] of node %d of region %q", j, r.Node, r.Region)
			}
		}
	}
	if !(s.Loss >= 0 && s.Loss <= MaxLoss) {
		return bad("loss", "must be in 0..%v, got %v", MaxLoss, s.Loss)
	}
	names := make([]string, 0, len(s.ClockOffsets))
	for r := range s.ClockOffsets {
		names = append(names, r)
	}
	slices.Sort(names)
	for _, r := range names {
		f := "clock_offsets." + r
		if !cfg.Has(r) {
			return bad(f, "%s", notRegion(r, s.Regions))
		}
		if o := s.ClockOffsets[r]; o < -MaxClockOffset || o > MaxClockOffset {
			return bad(f, "must be within ±%s, got %s", MaxClockOffset, o)
		}
	}
	return nil
}

// validate checks a and returns the checks it expects to add.
func (a Arrival) validate(f string, s *Scenario, cfg *region.Config, spec Spec, d time.Duration) (float64, error) {
	regions := 1.0
	switch {
	case a.Region == AllRegions:
		regions = float64(cfg.Len())
	case !cfg.Has(a.Region):
		return 0, bad(f+".region", "%s (or %q for every region)", notRegion(a.Region, s.Regions), AllRegions)
	}
	switch {
	case math.IsNaN(a.Rate) || a.Rate < 0 || a.Rate > MaxRate:
		return 0, bad(f+".rate", "must be in 0..%d checks/s, got %v", MaxRate, a.Rate)
	case a.Spacing != "" && a.Spacing != "poisson" && a.Spacing != "even":
		return 0, bad(f+".spacing", "want poisson or even, got %q", a.Spacing)
	case a.From < 0 || a.From >= d:
		return 0, bad(f+".from", "must be in [0, %s) (the run's duration), got %s", d, a.From)
	case a.To != 0 && (a.To <= a.From || a.To > d):
		return 0, bad(f+".to", "must be 0 (the run's end) or in (from %s, %s], got %s", a.From, d, a.To)
	case a.Hits < 0 || a.Hits > MaxHits:
		return 0, bad(f+".hits", "must be in 1..%d (0: 1), got %d", MaxHits, a.Hits)
	case a.Hits > spec.Capacity():
		return 0, bad(f+".hits", "%d is above the limit's capacity %d: never allowed", a.Hits, spec.Capacity())
	case a.Rate == 0 && len(a.Floods) == 0:
		return 0, bad(f, "neither a rate nor floods: nothing arrives")
	}
	to := a.To
	if to == 0 {
		to = d
	}
	n := a.Rate * (to - a.From).Seconds()
	for j, fl := range a.Floods {
		g := fmt.Sprintf("%s.floods[%d]", f, j)
		switch {
		case fl.Window < 0 || fl.Window > int(d/spec.Window):
			return 0, bad(g+".window", "must be in 0..%d (the run has %s of %s windows), got %d", d/spec.Window, d, spec.Window, fl.Window)
		case fl.Offset < 0 || fl.Offset >= spec.Window:
			return 0, bad(g+".offset", "must be in [0, %s) (the limit's window), got %s", spec.Window, fl.Offset)
		}
		at := time.Duration(fl.Window)*spec.Window + fl.Offset
		switch {
		case at >= d:
			return 0, bad(g+".window", "window %d at offset %s starts at %s, not before the run's end %s", fl.Window, fl.Offset, at, d)
		case fl.Checks < 1 || fl.Checks > MaxChecks:
			return 0, bad(g+".checks", "must be in 1..%d, got %d", MaxChecks, fl.Checks)
		case fl.Keys < 0 || fl.Keys > s.Keys.Count:
			return 0, bad(g+".keys", "must be in 0..%d (keys.count; 0: all), got %d", s.Keys.Count, fl.Keys)
		case fl.Spread < 0 || at+fl.Spread > d:
			return 0, bad(g+".spread", "must be >= 0 and end by the run's end %s, got %s from %s", d, fl.Spread, at)
		}
		keys := fl.Keys
		if keys == 0 {
			keys = s.Keys.Count
		}
		n += float64(fl.Checks) * float64(keys)
	}
	return n * regions, nil
}

// regionConfig validates the regions and returns their region.Config.
func (s *Scenario) regionConfig() (*region.Config, error) {
	if len(s.Regions) == 0 {
		return nil, bad("regions", "at least one region is required")
	}
	rs := make([]region.Region, len(s.Regions))
	for i, r := range s.Regions {
		f := fmt.Sprintf("regions[%d]", i)
		if err := region.CheckName(r.Name); err != nil {
			return nil, bad(f+".name", "%v", err)
		}
		w := r.Weight
		if w == 0 {
			w = 1
		}
		if w < 1 || w > region.MaxWeight {
			return nil, bad(f+".weight", "must be in 1..%d (0: 1), got %d", region.MaxWeight, r.Weight)
		}
		rs[i] = region.Region{Name: r.Name, Weight: w}
	}
	cfg, err := region.New(rs)
	if err != nil {
		return nil, bad("regions", "%v", strings.TrimPrefix(err.Error(), region.ErrConfig.Error()+": "))
	}
	return cfg, nil
}

// spec validates the limit and returns it typed.
func (s *Scenario) spec() (Spec, error) {
	l := s.Limit
	switch {
	case l.Name == "" || len(l.Name) > 256:
		return Spec{}, bad("limit.name", "must be 1..256 bytes, got %d", len(l.Name))
	case !utf8.ValidString(l.Name):
		return Spec{}, bad("limit.name", "must be valid UTF-8")
	case l.Window%time.Millisecond != 0:
		return Spec{}, bad("limit.window", "must be a whole number of milliseconds, got %s", l.Window)
	}
	alg := window.FixedWindow
	if l.Algorithm != "" {
		a, err := window.ParseAlgorithm(l.Algorithm)
		if err != nil {
			return Spec{}, bad("limit.algorithm", "%s", strings.TrimPrefix(err.Error(), "algorithm: "))
		}
		alg = a
	}
	sc := region.Global
	if l.Scope != "" {
		v, err := region.ParseScope(l.Scope)
		if err != nil {
			return Spec{}, bad("limit.scope", "%v", err)
		}
		sc = v
	}
	spec := Spec{Name: l.Name, Algorithm: alg, Limit: l.Limit, Window: l.Window, Burst: l.Burst, Scope: sc}
	if err := spec.Check(1).Validate(); err != nil {
		var fe *window.FieldError
		if errors.As(err, &fe) {
			return Spec{}, bad("limit."+fe.Field, "%s", fe.Reason)
		}
		return Spec{}, bad("limit", "%v", err)
	}
	if l.Burst != 0 && alg != window.TokenBucket && alg != window.LeakyBucket {
		return Spec{}, bad("limit.burst", "applies to token_bucket and leaky_bucket only, not %s", alg)
	}
	return spec, nil
}

// duration validates Duration and Windows and returns the run's length.
func (s *Scenario) duration(w time.Duration) (time.Duration, error) {
	switch {
	case s.Duration != 0 && s.Windows != 0:
		return 0, bad("duration", "give duration or windows, not both")
	case s.Duration == 0 && s.Windows == 0:
		return 0, bad("duration", "required (or windows)")
	case s.Windows < 0:
		return 0, bad("windows", "must be >= 1, got %d", s.Windows)
	case s.Windows > 0 && time.Duration(s.Windows) > MaxDuration/w:
		return 0, bad("windows", "%d windows of %s last more than %s", s.Windows, w, MaxDuration)
	case s.Windows > 0:
		return time.Duration(s.Windows) * w, nil
	case s.Duration < 0 || s.Duration > MaxDuration:
		return 0, bad("duration", "must be in (0, %s], got %s", MaxDuration, s.Duration)
	}
	return s.Duration, nil
}

func notRegion(name string, rs []Region) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return fmt.Sprintf("%q is not a region of the scenario (want one of %s)", name, strings.Join(names, ", "))
}

func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Spec is a scenario's limit, typed: what a check asks for.
type Spec struct {
	// Name is the limit's name.
	Name string
	// Algorithm is never window.Unspecified.
	Algorithm window.Algorithm
	// Limit is the hits per Window (the buckets' rate).
	Limit int64
	// Window is the limit's window.
	Window time.Duration
	// Burst is the bucket capacity in hits; 0 means Limit.
	Burst int64
	// Scope is region.Global, region.Regional or region.Exact.
	Scope region.Scope
}

// Check returns the window.Check of hits hits against the whole limit.
func (s Spec) Check(hits int64) window.Check {
	return window.Check{Algorithm: s.Algorithm, Limit: s.Limit, Window: s.Window, Burst: s.Burst, Hits: hits}
}

// Capacity returns the most hits the limit can hold at once: Burst (or
// Limit when 0) for the buckets, Limit for the windows.
func (s Spec) Capacity() int64 { return s.Check(0).Capacity() }

// Bucket reports whether the algorithm is a bucket (token or leaky).
func (s Spec) Bucket() bool {
	return s.Algorithm == window.TokenBucket || s.Algorithm == window.LeakyBucket
}
