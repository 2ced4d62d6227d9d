package scenario

import (
	"strconv"
	"time"
)

// Params parametrize the built-in scenarios of issue 19. The zero value of
// a field means its default; [DefaultParams] has them all.
type Params struct {
	// Regions is the number of regions, 1..64 (default 3), named by
	// [RegionNames].
	Regions int
	// RTT is the round-trip time between any two regions (default 100ms).
	RTT time.Duration
	// Algorithm is the limit's algorithm (default fixed_window).
	Algorithm string
	// Limit is the limit's hits per window (default 10).
	Limit int64
	// Window is the limit's window (default 1s).
	Window time.Duration
	// Burst is the buckets' capacity (default 0: Limit).
	Burst int64
	// Scope is the limit's scope (default global).
	Scope string
	// Keys is the number of keys (default 5).
	Keys int
	// Windows is the run's length in windows (default 5; Partition needs
	// at least 4, FloodAll at least 2).
	Windows int
	// Seed seeds the plan (default 1).
	Seed uint64
	// ClockOffset is how far ClockSkew sets the regions' clocks apart
	// (default 50ms).
	ClockOffset time.Duration
}

// DefaultParams returns the parameters of issue 19's done-when runs: 3
// regions 100 ms apart, fixed window 10 per 1s, scope global, 5 keys, 5
// windows, clocks ±50 ms.
func DefaultParams() Params { return Params{}.withDefaults() }

func (p Params) withDefaults() Params {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.Regions, 3)
	def(&p.Keys, 5)
	def(&p.Windows, 5)
	if p.RTT == 0 {
		p.RTT = 100 * time.Millisecond
	}
	if p.Algorithm == "" {
		p.Algorithm = "fixed_window"
	}
	if p.Limit == 0 {
		p.Limit = 10
	}
	if p.Window == 0 {
		p.Window = time.Second
	}
	if p.Scope == "" {
		p.Scope = "global"
	}
	if p.Seed == 0 {
		p.Seed = 1
	}
	if p.ClockOffset == 0 {
		p.ClockOffset = 50 * time.Millisecond
	}
	return p
}

// regionNames are the names RegionNames hands out first.
var regionNames = []string{"us-east", "eu-west", "ap-south", "sa-east", "af-south", "ca-central", "me-central", "au-east"}

// RegionNames returns n region names: us-east, eu-west, ap-south,
// sa-east, af-south, ca-central, me-central, au-east, then r9, r10, ...
func RegionNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		if i < len(regionNames) {
			out[i] = regionNames[i]
		} else {
			out[i] = "r" + strconv.Itoa(i+1)
		}
	}
	return out
}

// base returns a scenario of p with no arrivals yet.
func base(name string, p Params) *Scenario {
	p = p.withDefaults()
	s := &Scenario{
		Name: name, Seed: p.Seed, RTT: p.RTT, Windows: p.Windows,
		Limit: Limit{Name: "scenario." + name, Algorithm: p.Algorithm, Limit: p.Limit, Window: p.Window, Burst: p.Burst, Scope: p.Scope},
		Keys:  Keys{Count: p.Keys},
	}
	for _, r := range RegionNames(p.Regions) {
		s.Regions = append(s.Regions, Region{Name: r, Weight: 1})
	}
	return s
}

// steadyRate returns the checks/s of all regions together that make the
// demand per key times× the limit per window.
func steadyRate(p Params, times float64) float64 {
	p = p.withDefaults()
	return times * float64(p.Limit) * float64(p.Keys) / p.Window.Seconds()
}

// Steady is "steady 3× the limit": every key gets 3× the limit per window
// in all, spread evenly over the regions, Poisson arrivals on random keys.
func Steady(p Params) *Scenario {
	s := base("steady", p)
	s.Arrivals = []Arrival{{Region: AllRegions, Rate: steadyRate(p, 3) / float64(len(s.Regions))}}
	return s
}

// Skew is "90/10 skew": the load of Steady, 90 % of it entering the first
// region and 10 % spread over the others (all of it in the first when
// there is one region).
func Skew(p Params) *Scenario {
	s := base("skew", p)
	total := steadyRate(p, 3)
	if len(s.Regions) == 1 {
		s.Arrivals = []Arrival{{Region: s.Regions[0].Name, Rate: total}}
		return s
	}
	s.Arrivals = []Arrival{{Region: s.Regions[0].Name, Rate: total * 9 / 10}}
	for _, r := range s.Regions[1:] {
		s.Arrivals = append(s.Arrivals, Arrival{Region: r.Name, Rate: total / 10 / float64(len(s.Regions)-1)})
	}
	return s
}

// FloodAll is "a flood of 100× the limit in every region at a window start":
// at the start of the run's second window every region sends 100× the
// limit on every key at one instant; nothing else arrives.
func FloodAll(p Params) *Scenario {
	s := base("flood", p)
	s.Arrivals = []Arrival{{Region: AllRegions, Floods: []Flood{{Window: 1, Checks: int(100 * s.Limit.Limit)}}}}
	return s
}

// Partition is "one region cut off for two windows": the load of Steady,
// and the last region cut off from the others from the start of the
// run's second window to the start of its fourth.
func Partition(p Params) *Scenario {
	s := Steady(p)
	s.Name, s.Limit.Name = "cut", "scenario.cut"
	w := s.Limit.Window
	s.Cuts = []Cut{{Region: s.Regions[len(s.Regions)-1].Name, From: w, To: 3 * w}}
	return s
}

// ClockSkew is "clocks ±50 ms apart": the load of Steady, the first
// region's clock right, the second's ClockOffset ahead, the third's
// ClockOffset behind, and so on alternating.
func ClockSkew(p Params) *Scenario {
	s := Steady(p)
	s.Name, s.Limit.Name = "clocks", "scenario.clocks"
	off := p.withDefaults().ClockOffset
	s.ClockOffsets = map[string]time.Duration{}
	for i, r := range s.Regions[1:] {
		if i%2 == 0 {
			s.ClockOffsets[r.Name] = off
		} else {
			s.ClockOffsets[r.Name] = -off
		}
	}
	return s
}

// OneRegion is "a key used in one region": the load of Steady, all of it
// entering the first region (issue 20: from its second window on, nearly
// all of the limit should be admitted there).
func OneRegion(p Params) *Scenario {
	s := base("oneregion", p)
	s.Arrivals = []Arrival{{Region: s.Regions[0].Name, Rate: steadyRate(p, 3)}}
	return s
}

// Move is "demand that moves": the load of Steady entering the first
// region for the first half of the run (rounded down to whole windows),
// then the second region (the first again when there is one) for the
// rest (issue 20: followed within two windows).
func Move(p Params) *Scenario {
	s := base("move", p)
	half := time.Duration(max(s.Windows/2, 1)) * s.Limit.Window
	to := s.Regions[min(1, len(s.Regions)-1)].Name
	s.Arrivals = []Arrival{{Region: s.Regions[0].Name, Rate: steadyRate(p, 3), To: half},
		{Region: to, Rate: steadyRate(p, 3), From: half}}
	return s
}

// Leases returns the scenarios of issue 20's done-when for p: those of
// DoneWhen, OneRegion, Move and Lossy.
func Leases(p Params) []*Scenario {
	return append(DoneWhen(p), OneRegion(p), Move(p), Lossy(p))
}

// Lossy is "1 % loss": the load of Steady with 1 % of the packets
// between any two regions lost (retransmitted on gRPC: late, overtaken
// calls; dropped on gossip).
func Lossy(p Params) *Scenario {
	s := Steady(p)
	s.Name, s.Limit.Name, s.Loss = "lossy", "scenario.lossy", 0.01
	return s
}

// DoneWhen returns the five scenarios of issue 19's done-when for p:
// Steady, Skew, FloodAll, Partition and ClockSkew.
func DoneWhen(p Params) []*Scenario {
	return []*Scenario{Steady(p), Skew(p), FloodAll(p), Partition(p), ClockSkew(p)}
}
