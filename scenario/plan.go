package scenario

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/region"
)

// Check is one planned check: Hits hits of Key entering Region at offset
// At of the run.
type Check struct {
	// Index is the check's position in [Plan.Checks] (0-based).
	Index int
	// At is when the check is sent, as an offset from the run's start.
	At time.Duration
	// Region is the region the check enters.
	Region string
	// Key is the key, one of [Plan.Keys].
	Key string
	// Hits is the hits the check consumes, >= 1.
	Hits int64
}

// Plan is a validated scenario expanded into timed checks. It is
// immutable once made and safe for concurrent use.
type Plan struct {
	// Scenario is the scenario the plan was made from (a copy).
	Scenario Scenario
	// Regions is the scenario's region list (weights included).
	Regions *region.Config
	// Limit is the scenario's limit, typed.
	Limit Spec
	// Keys are the keys, in order: Keys.Prefix followed by 0..Count-1.
	Keys []string
	// Duration is the run's length.
	Duration time.Duration
	// Checks are the checks, sorted by At; checks at the same instant
	// alternate between the regions (the first of each region in region
	// order, then the second, ...), so that a central limiter fed them in
	// this order shares a simultaneous flood between the regions.
	Checks []Check
	// Cuts are the scenario's cuts, sorted by From.
	Cuts []Cut
	// Restarts are the scenario's restarts, sorted by At (the order they
	// are applied in).
	Restarts []Restart

	keyIndex map[string]int
}

// NewPlan validates s and expands it into a plan. The same scenario (and
// seed) always gives the same plan. Errors: s's validation error, or a
// FieldError for "arrivals" when the arrivals draw more than MaxChecks
// checks.
func NewPlan(s *Scenario) (*Plan, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	cfg, _ := s.regionConfig()
	spec, _ := s.spec()
	d, _ := s.duration(spec.Window)
	p := &Plan{Scenario: *s, Regions: cfg, Limit: spec, Duration: d, keyIndex: map[string]int{}}
	p.Scenario.Regions = slices.Clone(s.Regions)
	p.Scenario.RTTPairs = slices.Clone(s.RTTPairs)
	p.Scenario.Arrivals = slices.Clone(s.Arrivals)
	p.Scenario.Cuts = slices.Clone(s.Cuts)
	p.Scenario.Restarts = slices.Clone(s.Restarts)
	if s.ClockOffsets != nil {
		p.Scenario.ClockOffsets = make(map[string]time.Duration, len(s.ClockOffsets))
		for r, o := range s.ClockOffsets {
			p.Scenario.ClockOffsets[r] = o
		}
	}
	prefix := s.Keys.Prefix
	if prefix == "" {
		prefix = "k"
	}
	p.Keys = make([]string, s.Keys.Count)
	for i := range p.Keys {
		p.Keys[i] = prefix + strconv.Itoa(i)
		p.keyIndex[p.Keys[i]] = i
	}
	seed := s.Seed
	if seed == 0 {
		seed = 1
	}
	names := p.RegionNames()
	type planned struct {
		Check
		rank, region int
	}
	var all []planned
	for ri, r := range names {
		var mine []Check
		for ai, a := range s.Arrivals {
			if a.Region != r && a.Region != AllRegions {
				continue
			}
			// Each (arrival, region) has its own stream, so adding a
			// region or an arrival leaves the others' checks as they were.
			rng := rand.New(rand.NewPCG(seed, uint64(ai)<<32|uint64(ri)))
			var err error
			if mine, err = p.expand(mine, a, r, rng, MaxChecks-len(all)); err != nil {
				return nil, err
			}
		}
		slices.SortStableFunc(mine, func(a, b Check) int { return cmp.Compare(a.At, b.At) })
		for i, c := range mine {
			rank := 0
			if i > 0 && all[len(all)-1].At == c.At {
				rank = all[len(all)-1].rank + 1
			}
			all = append(all, planned{Check: c, rank: rank, region: ri})
		}
		if len(all) > MaxChecks {
			return nil, bad("arrivals", "drew more than %d checks", MaxChecks)
		}
	}
	slices.SortStableFunc(all, func(a, b planned) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.rank, b.rank), cmp.Compare(a.region, b.region))
	})
	p.Checks = make([]Check, len(all))
	for i, c := range all {
		c.Index = i
		p.Checks[i] = c.Check
	}
	p.Cuts = slices.Clone(s.Cuts)
	slices.SortStableFunc(p.Cuts, func(a, b Cut) int { return cmp.Compare(a.From, b.From) })
	p.Restarts = slices.Clone(s.Restarts)
	slices.SortStableFunc(p.Restarts, func(a, b Restart) int { return cmp.Compare(a.At, b.At) })
	return p, nil
}

// expand appends arrival a's checks in region r to out: at most room more.
func (p *Plan) expand(out []Check, a Arrival, r string, rng *rand.Rand, room int) ([]Check, error) {
	hits := max(a.Hits, 1)
	to := a.To
	if to == 0 {
		to = p.Duration
	}
	add := func(at time.Duration, key string) error {
		if room--; room < 0 {
			return bad("arrivals", "drew more than %d checks", MaxChecks)
		}
		out = append(out, Check{At: at, Region: r, Key: key, Hits: hits})
		return nil
	}
	if a.Rate > 0 {
		gap := float64(time.Second) / a.Rate // ns
		t := float64(a.From)
		if a.Spacing != "even" {
			t += rng.ExpFloat64() * gap
		}
		for n := 0; t < float64(to); n++ {
			if err := add(time.Duration(t), p.Keys[rng.IntN(len(p.Keys))]); err != nil {
				return nil, err
			}
			if a.Spacing == "even" {
				t = float64(a.From) + float64(n+1)*gap
			} else {
				t += rng.ExpFloat64() * gap
			}
		}
	}
	for _, f := range a.Floods {
		keys := f.Keys
		if keys == 0 {
			keys = len(p.Keys)
		}
		at := time.Duration(f.Window)*p.Limit.Window + f.Offset
		total := f.Checks * keys
		for i := range total {
			t := at
			if f.Spread > 0 && total > 1 {
				t += time.Duration(float64(f.Spread) * float64(i) / float64(total))
			}
			if err := add(t, p.Keys[i%keys]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// RegionNames returns the region names in the scenario's order.
func (p *Plan) RegionNames() []string {
	rs := p.Regions.Regions()
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	if len(out) == 0 { // one region: region.Config keeps none
		out = append(out, p.Scenario.Regions[0].Name)
	}
	return out
}

// Home returns the home region: the first, whose owner of a key decides
// the key's exact-scope checks.
func (p *Plan) Home() string { return p.Scenario.Regions[0].Name }

// RTT returns the round-trip time between regions a and b: 0 for a region
// and itself, else the pair's override or the scenario's RTT.
func (p *Plan) RTT(a, b string) time.Duration {
	if a == b {
		return 0
	}
	k := pairKey(a, b)
	for _, pr := range p.Scenario.RTTPairs {
		if pairKey(pr.A, pr.B) == k {
			return pr.RTT
		}
	}
	return p.Scenario.RTT
}

// ClockOffset returns region's clock minus the true time (0 when the
// scenario gives none).
func (p *Plan) ClockOffset(region string) time.Duration { return p.Scenario.ClockOffsets[region] }

// KeyIndex returns key's position in Keys, or -1.
func (p *Plan) KeyIndex(key string) int {
	if i, ok := p.keyIndex[key]; ok {
		return i
	}
	return -1
}

// Slice returns region's slice of the limit for key under global scope:
// the slice of Limit (hits per window, or the bucket's rate) and of the
// capacity (Burst, or Limit when 0), each as region.Config.Share divides
// them with the key's seed (region.SeedOf of the limit's name and key).
// With one region they are the whole limit.
func (p *Plan) Slice(region, key string) (limit, capacity int64) {
	seed := regionSeed(p.Limit.Name, key)
	return p.Regions.Share(p.Limit.Limit, region, seed), p.Regions.Share(p.Limit.Capacity(), region, seed)
}

func regionSeed(name, key string) uint64 { return region.SeedOf(name, key) }

// String returns a one-line summary, e.g. "steady: 3 regions, 750
// checks over 5s".
func (p *Plan) String() string {
	return fmt.Sprintf("%s: %d regions, %d checks over %s", p.Scenario.Name, len(p.RegionNames()), len(p.Checks), p.Duration)
}

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
