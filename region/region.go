// Package region holds a cluster's regions as static configuration and
// divides a global limit into per-region slices.
//
// Every node of a cluster is given the same region list (serve --regions,
// e.g. "us-east=2,eu-west=1,ap-south=1"): names and integer weights. It is
// never learned from gossip, so that a partition between regions cannot
// change how a limit is divided; nodes whose lists differ refuse each other
// (the list's [Config.Fingerprint] travels in their gossiped metadata).
//
// A limit's [Scope] says where it is enforced. For [Global], the limit L
// is split into one slice per region, a smaller limit of the same
// algorithm: region i's slice is its weighted share of L, apportioned by
// the D'Hondt divisor method (see [Config.Share]) so that the slices add
// up to exactly L, never more, and raising L never lowers a slice. Each region's owner of a key enforces the
// region's slice on its own clock, so a check never waits on another
// region and the regions together never admit more than L per window
// (over-admission 0 by construction). The cost is under-admission: a
// region that needs more than its share while another idles is denied
// (Decision.slice_exhausted); leases between regions (the design's next
// step) close that gap. The design is the
// demarcation protocol's "lines drawn in the sand" (Barbará and
// Garcia-Molina, "The Demarcation Protocol", EDBT 1992) with static lines,
// and DRL's flow-proportional share (Raghavan et al., "Cloud Control with
// Distributed Rate Limiting", SIGCOMM 2007) with fixed weights.
//
// The package is pure: no network, no clock.
package region

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Bounds on a region list.
const (
	// MaxRegions is the most regions a list may name.
	MaxRegions = 64
	// MaxWeight is the largest weight of a region.
	MaxWeight = 1_000_000
	// maxName is the longest region name, as for the gossiped metadata.
	maxName = 64
)

// ErrConfig wraps every error that refuses a region list.
var ErrConfig = errors.New("bad region list")

// Region is one region of the list.
type Region struct {
	// Name is the region's name, e.g. "eu-west-1": 1..64 bytes of
	// [A-Za-z0-9._+-], as a node's --region.
	Name string
	// Weight is the region's share of a global limit relative to the
	// others', 1..1000000.
	Weight int64
}

// Config is a cluster's region list. It is immutable; the nil *Config is
// the cluster of one region (no list given) and every method works on it.
type Config struct {
	regions []Region
	total   int64 // sum of weights
	fp      string
}

// Parse reads a region list: comma-separated "name" or "name=weight"
// entries (weight default 1), in the order that makes the first the home
// region of exact limits. Spaces around entries are ignored. The empty
// string gives nil: one region. It returns an error wrapping [ErrConfig]
// that names the bad entry: an empty or invalid name, a weight that is not
// a whole number in 1..1000000, a name listed twice, more than 64 regions.
func Parse(s string) (*Config, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var rs []Region
	for i, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		name, w, hasW := strings.Cut(e, "=")
		name = strings.TrimSpace(name)
		r := Region{Name: name, Weight: 1}
		if hasW {
			n, err := strconv.ParseInt(strings.TrimSpace(w), 10, 64)
			if err != nil || n < 1 || n > MaxWeight {
				return nil, fmt.Errorf("%w: regions[%d] %q: weight must be a whole number 1..%d, got %q", ErrConfig, i, name, MaxWeight, w)
			}
			r.Weight = n
		}
		rs = append(rs, r)
	}
	return New(rs)
}

// New returns the Config of rs (in that order: rs[0] is the home region).
// It returns an error wrapping [ErrConfig] naming the bad region for an
// empty list, an invalid name, a weight outside 1..1000000 or a name
// listed twice.
func New(rs []Region) (*Config, error) {
	switch {
	case len(rs) == 0:
		return nil, fmt.Errorf("%w: regions: at least one region is required", ErrConfig)
	case len(rs) > MaxRegions:
		return nil, fmt.Errorf("%w: regions: at most %d regions, got %d", ErrConfig, MaxRegions, len(rs))
	}
	c := &Config{regions: slices.Clone(rs)}
	for i, r := range rs {
		if err := CheckName(r.Name); err != nil {
			return nil, fmt.Errorf("%w: regions[%d]: %v", ErrConfig, i, err)
		}
		if r.Weight < 1 || r.Weight > MaxWeight {
			return nil, fmt.Errorf("%w: regions[%d] %q: weight must be 1..%d, got %d", ErrConfig, i, r.Name, MaxWeight, r.Weight)
		}
		if slices.IndexFunc(rs[:i], func(o Region) bool { return o.Name == r.Name }) >= 0 {
			return nil, fmt.Errorf("%w: regions[%d]: %q is listed twice", ErrConfig, i, r.Name)
		}
		c.total += r.Weight
	}
	d := xxhash.New()
	_, _ = d.WriteString(c.String())
	c.fp = fmt.Sprintf("%016x", d.Sum64())
	return c, nil
}

// CheckName returns an error naming the problem when name is not a valid
// region name (1..64 bytes of [A-Za-z0-9._+-]).
func CheckName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("region name must be 1..%d bytes, got %q", maxName, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._+-", r)) {
			return fmt.Errorf("region name %q: want only [A-Za-z0-9._+-]", name)
		}
	}
	return nil
}

// Regions returns the list, in its order (nil for one region).
func (c *Config) Regions() []Region {
	if c == nil {
		return nil
	}
	return slices.Clone(c.regions)
}

// Len returns the number of regions (1 for nil).
func (c *Config) Len() int {
	if c == nil {
		return 1
	}
	return len(c.regions)
}

// Multi reports whether the list has more than one region: only then do
// scopes differ and global limits have slices.
func (c *Config) Multi() bool { return c.Len() > 1 }

// Has reports whether name is in the list (nil: any name is).
func (c *Config) Has(name string) bool {
	if c == nil {
		return true
	}
	return slices.ContainsFunc(c.regions, func(r Region) bool { return r.Name == name })
}

// Home returns the home region: the first of the list, whose owner of a
// key decides the key's exact-scope checks ("" for nil).
func (c *Config) Home() string {
	if c == nil {
		return ""
	}
	return c.regions[0].Name
}

// Fingerprint identifies the list (names, weights and order) as 16 hex
// digits; "" for nil. Nodes compare it before they admit each other.
func (c *Config) Fingerprint() string {
	if c == nil {
		return ""
	}
	return c.fp
}

// String returns the list in the form Parse reads, every weight written
// ("us-east=2,eu-west=1"); "" for nil.
func (c *Config) String() string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	for i, r := range c.regions {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.Name)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(r.Weight, 10))
	}
	return b.String()
}

// Seed returns the seed of a key for [Config.Share]: the xxhash64 of its
// ring key (ring.Key(name, key)), so that every node computes the same
// slices for the key and the regions that get a limit's remainder vary
// from key to key.
func Seed(ringKey []byte) uint64 { return xxhash.Sum64(ringKey) }

// Share returns region's slice of total (hits, >= 0) for the key of seed,
// by the D'Hondt (Jefferson) divisor method: each region first gets
// floor(total × weight / Σweights), then the k = total − Σ floors < number
// of regions hits left go one at a time to the region of the highest
// weight / (slice + 1) (ties to the first in a rotation of the list that
// seed picks, so that which regions get a limit's remainder varies from
// key to key). The slices of all regions add up to exactly total, each is
// at least its floor share (a heavier region may get a little more than
// its exact share), and raising total never lowers any region's slice
// (the method is house-monotone, unlike largest remainder: its Alabama
// paradox would let a limit raised mid-window admit more than the new
// limit). It returns total for nil or a single region (0 if region is
// not that one), and 0 for a region not in the list or a total <= 0. No
// overflow for total up to 2^63−1 (products are computed in 128 bits).
// See M. L. Balinski and H. P. Young, "Fair Representation", 1982.
func (c *Config) Share(total int64, region string, seed uint64) int64 {
	if total <= 0 {
		return 0
	}
	if c == nil || len(c.regions) == 1 {
		if c == nil || c.regions[0].Name == region {
			return total
		}
		return 0
	}
	me := slices.IndexFunc(c.regions, func(r Region) bool { return r.Name == region })
	if me < 0 {
		return 0
	}
	n := len(c.regions)
	var buf [MaxRegions]uint64
	s := buf[:n]
	var sum uint64
	for i, r := range c.regions {
		hi, lo := bits.Mul64(uint64(total), uint64(r.Weight))
		s[i], _ = bits.Div64(hi, lo, uint64(c.total)) // hi < total weight: the quotient fits
		sum += s[i]
	}
	rot := int(seed % uint64(n))
	for k := uint64(total) - sum; k > 0; k-- {
		best := -1
		for j := range n {
			i := (rot + j) % n
			if best < 0 || c.higher(i, s[i], best, s[best]) {
				best = i
			}
		}
		s[best]++
	}
	return int64(s[me])
}

// higher reports whether region i with slice si has a strictly higher
// D'Hondt priority, weight / (slice + 1), than region j with slice sj.
func (c *Config) higher(i int, si uint64, j int, sj uint64) bool {
	ah, al := bits.Mul64(uint64(c.regions[i].Weight), sj+1)
	bh, bl := bits.Mul64(uint64(c.regions[j].Weight), si+1)
	return ah > bh || ah == bh && al > bl
}

// Scope says where a limit is enforced in a cluster of several regions.
// Its values are those of the API's Scope enum.
type Scope int

// The scopes.
const (
	// Unspecified: the limit's configured scope, else Global with several
	// regions.
	Unspecified Scope = iota
	// Global splits the limit into per-region slices that add up to at
	// most the limit (see [Config.Share]); decided in the region.
	Global
	// Regional enforces the whole limit in each region on its own: at
	// most regions × limit admitted per window in all.
	Regional
	// Exact has the key's owner in the home region decide every check, at
	// a cross-region round trip from the other regions.
	Exact
)

// ParseScope reads a scope as written in limits.yaml: "global",
// "regional" or "exact"; "" is Unspecified. Another word is an error
// naming the words it wants.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "":
		return Unspecified, nil
	case "global":
		return Global, nil
	case "regional":
		return Regional, nil
	case "exact":
		return Exact, nil
	}
	return Unspecified, fmt.Errorf("unknown scope %q (want global, regional or exact)", s)
}

// String returns the scope's word ("" for Unspecified).
func (s Scope) String() string {
	switch s {
	case Global:
		return "global"
	case Regional:
		return "regional"
	case Exact:
		return "exact"
	}
	return ""
}

// Resolve returns the scope that applies to a check: s when specified,
// else Global with several regions and Regional with one.
func (c *Config) Resolve(s Scope) Scope {
	if s != Unspecified {
		return s
	}
	if c.Multi() {
		return Global
	}
	return Regional
}

// SeedOf is Seed of ring.Key(name, key) without the ring package: the
// length of name as a uvarint, name, then key.
func SeedOf(name, key string) uint64 {
	d := xxhash.New()
	var l [binary.MaxVarintLen64]byte
	_, _ = d.Write(l[:binary.PutUvarint(l[:], uint64(len(name)))])
	_, _ = d.WriteString(name)
	_, _ = d.WriteString(key)
	return d.Sum64()
}
