// Package ring decides which member owns a key: consistent hashing with
// bounded loads (buraksezer/consistent, after Mirrokni, Thorup and
// Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2016) over an
// xxhash64 hasher.
//
// A Ring is immutable: on a membership change, build a new one from the full
// member list with [New] and swap it in (e.g. through an atomic.Pointer), so
// lookups never take a lock. Members are node names, never addresses; two
// rings built from the same names and Config give every key the same owner,
// whatever order the names came in.
//
// The package does no I/O and imports only consistent and xxhash.
package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Library is the consistent-hashing library and version the placement of
// keys depends on; it is part of the [Ring.Fingerprint], because another
// version may place keys differently.
const Library = "buraksezer/consistent@v0.10.0"

// Defaults for [Config].
const (
	DefaultPartitionCount    = 271
	DefaultReplicationFactor = 20
	DefaultLoad              = 1.25
)

// Errors returned by [New].
var (
	// ErrNoMembers: a ring needs at least one member.
	ErrNoMembers = errors.New("ring: no members")
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("ring: invalid config")
)

// Config shapes a ring. Every node of a cluster must use the same Config,
// or nodes disagree about owners (see [Ring.Fingerprint]).
type Config struct {
	// PartitionCount is the number of partitions keys hash into; each is
	// owned by one member. Default 271. It must be at least twice the
	// number of members: with fewer, the bounded loads cannot balance and a
	// join cannot take a fair share. (Optional)
	PartitionCount int
	// ReplicationFactor is the number of virtual nodes per member on the
	// hash ring. Default 20. (Optional)
	ReplicationFactor int
	// Load bounds a member's share: at most ceil(PartitionCount/members *
	// Load) partitions each. Default 1.25; must be >= 1. (Optional)
	Load float64
	// Regions identifies the cluster's region list (region.Config's
	// Fingerprint; "" for one region). It places no key, but it is part
	// of the ring's Fingerprint, so that nodes given different region
	// lists never count as agreeing about owners. (Optional)
	Regions string
}

func (c Config) withDefaults() Config {
	if c.PartitionCount == 0 {
		c.PartitionCount = DefaultPartitionCount
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.Load == 0 {
		c.Load = DefaultLoad
	}
	return c
}

// hasher adapts xxhash to consistent.Hasher.
type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

var _ consistent.Hasher = hasher{}

// member is a ring member as consistent sees it. consistent places virtual
// node i of a member at hash(String() + decimal(i)), which is ambiguous for
// plain names ("rl-1" with i = 10 and "rl-11" with i = 0 both give
// "rl-110", and the member added last wins). String therefore ends the name
// with '#': the replica digits follow the last '#', so no two (name, i) pairs
// give the same bytes.
type member string

func (m member) String() string { return string(m) + "#" }

// Ring maps keys to owners. It is immutable and safe for concurrent use.
type Ring struct {
	c           *consistent.Consistent
	cfg         Config
	members     []string // sorted
	fingerprint string
	membersHash string
	order       []string // members in the order of their names' hashes: the ring's successor order
	orderIdx    map[string]int
}

// New builds a ring over the named members (duplicates are ignored).
// It returns an error wrapping [ErrNoMembers] for an empty or all-empty
// list, or [ErrInvalidConfig] when cfg cannot place the partitions (for
// instance fewer partitions than members); it never panics.
func New(names []string, cfg Config) (r *Ring, err error) {
	cfg = cfg.withDefaults()
	sorted := make([]string, 0, len(names))
	for _, n := range names {
		if n != "" {
			sorted = append(sorted, n)
		}
	}
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	switch {
	case len(sorted) == 0:
		return nil, ErrNoMembers
	case cfg.PartitionCount < 1 || cfg.ReplicationFactor < 1 || cfg.Load < 1:
		return nil, fmt.Errorf("%w: partition count %d, replication factor %d and load %g must be >= 1",
			ErrInvalidConfig, cfg.PartitionCount, cfg.ReplicationFactor, cfg.Load)
	case cfg.PartitionCount < 2*len(sorted):
		return nil, fmt.Errorf("%w: partition count %d is too small for %d members: it must be at least %d (2 per member); raise it",
			ErrInvalidConfig, cfg.PartitionCount, len(sorted), 2*len(sorted))
	}
	// consistent panics when the bounded loads leave no room; the checks
	// above rule that out, and this turns any case they miss into an error.
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("%w: %v", ErrInvalidConfig, p)
		}
	}()
	ms := make([]consistent.Member, len(sorted))
	for i, n := range sorted {
		ms[i] = member(n)
	}
	c := consistent.New(ms, consistent.Config{
		Hasher:            hasher{},
		PartitionCount:    cfg.PartitionCount,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	r = &Ring{c: c, cfg: cfg, members: sorted}
	r.fingerprint = r.computeFingerprint()
	r.membersHash = hashNames(sorted)
	r.order = slices.Clone(sorted)
	slices.SortFunc(r.order, func(a, b string) int {
		ha, hb := xxhash.Sum64String(member(a).String()), xxhash.Sum64String(member(b).String())
		switch {
		case ha < hb:
			return -1
		case ha > hb:
			return 1
		}
		return strings.Compare(a, b)
	})
	r.orderIdx = make(map[string]int, len(r.order))
	for i, n := range r.order {
		r.orderIdx[n] = i
	}
	return r, nil
}

// Owner returns the name of the member that owns key.
func (r *Ring) Owner(key []byte) string {
	m := r.c.LocateKey(key)
	if m == nil { // cannot happen with >= 1 member
		return ""
	}
	return string(m.(member))
}

// Partition returns the partition key hashes into, in [0, PartitionCount).
func (r *Ring) Partition(key []byte) int { return r.c.FindPartitionID(key) }

// PartitionOwner returns the name of the member that owns partition id, or
// "" when id is out of range.
func (r *Ring) PartitionOwner(id int) string {
	if id < 0 || id >= r.cfg.PartitionCount {
		return ""
	}
	m := r.c.GetPartitionOwner(id)
	if m == nil {
		return ""
	}
	return string(m.(member))
}

// Successors returns up to n members that follow key's owner on the ring
// (the order of their names' hashes, as consistent's GetClosestN walks
// it), the owner excluded: the nodes that hold key's replicas. It returns
// fewer when the ring has fewer other members, and nil for n <= 0.
func (r *Ring) Successors(key []byte, n int) []string {
	return r.AppendSuccessors(nil, key, n)
}

// AppendSuccessors is [Ring.Successors] appended to dst, for a caller that
// asks for many keys and reuses one slice.
func (r *Ring) AppendSuccessors(dst []string, key []byte, n int) []string {
	return r.appendSuccessorsOf(dst, r.Owner(key), n)
}

// SuccessorsOf returns up to n members that follow member on the ring: the
// replicas of every key member owns ([Ring.Successors] of each of them).
// It returns nil when member is not in the ring or n <= 0.
func (r *Ring) SuccessorsOf(member string, n int) []string {
	if _, ok := r.orderIdx[member]; !ok {
		return nil
	}
	return r.appendSuccessorsOf(nil, member, n)
}

func (r *Ring) appendSuccessorsOf(dst []string, member string, n int) []string {
	n = min(n, len(r.order)-1)
	if n <= 0 {
		return dst
	}
	i := r.orderIdx[member]
	for j := range n {
		dst = append(dst, r.order[(i+1+j)%len(r.order)])
	}
	return dst
}

// Has reports whether name is a member of the ring.
func (r *Ring) Has(name string) bool {
	_, ok := r.orderIdx[name]
	return ok
}

// MembersHash identifies the member set alone (16 hex digits): two rings
// with equal MembersHash but different [Ring.Fingerprint] were built with
// different Configs or library versions, and disagree about owners.
func (r *Ring) MembersHash() string { return r.membersHash }

// Members returns the member names, sorted. The caller must not modify it.
func (r *Ring) Members() []string { return r.members }

// Config returns the ring's configuration, with defaults filled in.
func (r *Ring) Config() Config { return r.cfg }

// Shares returns, for each member, the fraction of partitions it owns,
// in [0, 1]; the fractions add up to 1.
func (r *Ring) Shares() map[string]float64 {
	loads := r.c.LoadDistribution()
	out := make(map[string]float64, len(loads))
	for _, n := range r.members {
		out[n] = loads[member(n).String()] / float64(r.cfg.PartitionCount)
	}
	return out
}

// Fingerprint identifies the placement of keys: a hash of the sorted member
// names, the Config (its Regions too) and [Library], as 16 hex digits. Two rings with the same
// fingerprint give every key the same owner.
func (r *Ring) Fingerprint() string { return r.fingerprint }

func (r *Ring) computeFingerprint() string {
	d := xxhash.New()
	_, _ = d.WriteString(Library)
	_, _ = fmt.Fprintf(d, "|%d|%d|%g|", r.cfg.PartitionCount, r.cfg.ReplicationFactor, r.cfg.Load)
	if r.cfg.Regions != "" {
		_, _ = fmt.Fprintf(d, "regions=%s|", r.cfg.Regions)
	}
	writeNames(d, r.members)
	return fmt.Sprintf("%016x", d.Sum64())
}

// writeNames writes each name length-prefixed, so no two lists collide.
func writeNames(d *xxhash.Digest, names []string) {
	for _, n := range names {
		var l [binary.MaxVarintLen64]byte
		_, _ = d.Write(l[:binary.PutUvarint(l[:], uint64(len(n)))])
		_, _ = d.WriteString(n)
	}
}

func hashNames(names []string) string {
	d := xxhash.New()
	writeNames(d, names)
	return fmt.Sprintf("%016x", d.Sum64())
}

// Key encodes a limit name and a key into the bytes the ring places:
// the length of name as a uvarint, name, then key. Different (name, key)
// pairs always give different bytes: ("ab", "c") and ("a", "bc") differ.
// It appends to dst and returns the extended slice.
func Key(dst []byte, name, key string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(name)))
	dst = append(dst, name...)
	return append(dst, key...)
}

// String describes the ring for logs: its member count and fingerprint.
func (r *Ring) String() string {
	return strconv.Itoa(len(r.members)) + " members, fingerprint " + r.fingerprint
}
