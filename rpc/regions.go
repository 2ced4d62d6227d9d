package rpc

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Regions (docs/regions.md). With a region list (ServerConfig.Regions)
// this node's ring holds only the members of its own region: a check that
// enters the region is decided by the key's owner in the region and never
// waits on another region, except for a limit of scope exact, whose key's
// owner in the home region (the list's first) decides. A global limit is
// split into slices (region.Config.Share): each region's owner enforces its
// region's slice, so the regions together never admit more than the limit.
// The slice is computed by every node of the region alike, from the check
// (name, key, limit, burst) and the static list, so checks carry no slice:
// they carry the scope the node the client called resolved.

// checkRegions returns an error naming the field when region is not in
// the list regions (nil: any region).
func checkRegions(regions *region.Config, name string) error {
	if regions == nil || regions.Has(name) {
		return nil
	}
	return fmt.Errorf("region: %q is not in the region list %q (every node's region must be one of regions)", name, regions.String())
}

// applyScopes resolves each check's scope and, for a global limit with
// several regions, puts this region's slice of it in the window check.
// From a client, a check that gives no scope takes its configured limit's
// (limits.yaml scope), else the default (global with several regions), and
// is forwarded with the scope set; from a peer, the sender resolved it.
// A check whose slice here is 0 (a limit smaller than the regions share
// it by) is marked noSlice: it is denied without touching a window. It
// does nothing without a region list.
func (s *Server) applyScopes(reqs []request, fromPeer bool) {
	if s.regions == nil {
		return
	}
	for i := range reqs {
		r := &reqs[i]
		sc := region.Scope(r.pb.Scope) // in range: parseCheck refuses the others
		if sc == region.Unspecified && !fromPeer {
			sc = r.cfgScope
		}
		sc = s.regions.Resolve(sc)
		r.scope = sc
		if !fromPeer && region.Scope(r.pb.Scope) != sc {
			r.pb = proto.CloneOf(r.pb) // never change the caller's message
			r.pb.Scope = sluicev1.Scope(sc)
		}
		if sc != region.Global || !s.regions.Multi() {
			continue
		}
		seed := region.SeedOf(r.name, r.key)
		r.full = r.check.Limit
		if s.leased(r) {
			// The slice follows demand (leases.go); the base is what a
			// stand-in holder may admit in the owner's stead.
			r.leased = true
			r.fullBurst = r.check.Capacity() // before the limit becomes the base
			r.check.Limit = s.leases.baseOf(r.full, s.region, seed)
			if isBucket(r.check.Algorithm) {
				r.check.Burst = burstShare(r.check.Limit, r.full, r.fullBurst)
				r.zeroBase = r.check.Burst == 0
				if r.zeroBase {
					r.check.Burst = 1 // never applied (zeroBase)
				}
			}
			if r.check.Limit == 0 {
				r.zeroBase = true
				r.check.Limit = 1 // never applied (zeroBase); keeps the check valid
			}
			continue
		}
		r.check.Limit = s.regions.Share(r.check.Limit, s.region, seed)
		if r.check.Burst > 0 && isBucket(r.check.Algorithm) {
			// The buckets' capacity is split too (the windows ignore it).
			r.check.Burst = s.regions.Share(r.check.Burst, s.region, seed)
			r.noSlice = r.check.Burst == 0
		}
		if r.check.Limit == 0 {
			r.noSlice = true
			r.check.Limit = 1 // never applied (noSlice); keeps the check valid
		}
	}
}

// crossRegion reports whether r is decided in another region: an exact
// check that entered a region other than the home region.
func (s *Server) crossRegion(r *request) bool {
	return r.scope == region.Exact && s.regions.Multi() && s.region != s.regions.Home()
}

// sliceDenial answers a check whose region's slice is 0: over limit, never
// allowed in this region (retry_after -1), nothing counted.
func (s *Server) sliceDenial(r *request) *sluicev1.Decision {
	return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, RetryAfter: -1,
		ResetTime: unixMsCeil(s.store.Now())}
}

// regionAnswer fills in what a Check answer says of regions: the scope
// that applied, the region that decided, and for a global limit the full
// limit, the region's slice and whether the slice ran out. Without a
// region list it does nothing.
func (s *Server) regionAnswer(r *request, d *sluicev1.Decision) {
	if s.regions == nil {
		return
	}
	d.Scope = sluicev1.Scope(r.scope)
	d.Region = s.region
	if s.crossRegion(r) && d.Owner != s.name {
		d.Region = s.regions.Home() // by the key's owner there, or its stand-in holder
	}
	if r.full == 0 { // not sliced
		return
	}
	switch {
	case r.leased: // the deciding node set the slice
	case r.noSlice:
		d.Slice = 0
	default:
		d.Slice = r.check.Limit
	}
	d.Limit = r.full
	d.SliceExhausted = !d.Allowed && d.Error == "" && !d.Refunded && d.Slice < r.full
	d.SlicePending = d.SliceExhausted && d.SlicePending
}

// regionStamp returns the ring stamp of forwards to region reg's members:
// their region's ring's fingerprint, so that they count no mismatch, and
// epoch 0 (this node does not know theirs).
func (s *Server) regionStamp(reg string) func() (string, uint64) {
	return func() (string, uint64) {
		if r := s.view.Load().rings[reg]; r != nil {
			return r.Fingerprint(), 0
		}
		return "", 0
	}
}

// membersOf returns every member of ms, sorted by name, for Members: nil
// without a region list (Members then lists the ring's members, as
// before). self is listed when ms does not hold it.
func (s *Server) membersOf(ms []cluster.Member) []cluster.Member {
	if s.regions == nil {
		return nil
	}
	out := slices.Clone(ms)
	if !slices.ContainsFunc(out, func(m cluster.Member) bool { return m.Name == s.name }) {
		out = append(out, cluster.Member{Name: s.name, Region: s.region, State: cluster.Alive})
	}
	slices.SortFunc(out, func(a, b cluster.Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// awayDecide decides, degraded, an exact check that entered this node (in
// a region other than the home region) while the home region could not be
// reached, under policy local: from this node's own window of the key
// (awayWindows), which counts what this node admits while the home region
// is away. Those windows are never handed on (the stand-in windows of the
// region's own keys are flushed to their owner in the region, which would
// count an exact key in the region and start this window afresh), so the
// key admits at most its limit per window here while the home region is
// away; the home region's count does not include them.
func (s *Server) awayDecide(key []byte, r request) *sluicev1.Decision {
	if s.awayWindows == nil { // cannot happen: a cross-region check has them
		return s.standInDecide(key, r, "")
	}
	d, err := s.awayWindows.ApplyBytes(key, r.check, s.store.Now())
	if err != nil { // cannot happen: checks are validated on entry
		return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: err.Error(), Degraded: true}
	}
	pd := toProto(d, s.name)
	pd.Degraded = true
	return pd
}

// homeStandIn returns the stand-in holder of owner, an unreachable member
// of the home region, for an exact check of a node in another region: the
// next member of the home ring, which holds owner's copies (replication
// on); "" when there is none (no replicas, no home ring, owner not in it,
// or no connection to the holder).
func (s *Server) homeStandIn(v *view, owner string) string {
	if s.replication.Factor <= 0 || v.home == nil || !v.home.Has(owner) {
		return ""
	}
	succ := v.home.SuccessorsOf(owner, 1)
	if len(succ) == 0 || succ[0] == owner || v.peers[succ[0]] == nil {
		return ""
	}
	return succ[0]
}
