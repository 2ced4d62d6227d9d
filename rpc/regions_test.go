package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// startRegions starts perRegion in-process nodes in each region of list
// (named <region>-<i>), all given list, and joins them; it returns them
// by region.
func startRegions(t testing.TB, list string, perRegion int, cfg NodeConfig) map[string][]*inprocNode {
	t.Helper()
	regions, err := region.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []NodeConfig
	for _, r := range regions.Regions() {
		for i := range perRegion {
			c := cfg
			c.Name, c.Region, c.Regions = fmt.Sprintf("%s-%d", r.Name, i+1), r.Name, regions
			cfgs = append(cfgs, c)
		}
	}
	nodes := startInproc(t, cfgs...)
	out := map[string][]*inprocNode{}
	for _, n := range nodes {
		out[n.region] = append(out[n.region], n)
	}
	return out
}

// countAllowed sends n checks of rc to each node of nodes in turn and
// returns how many were allowed (every allowed answer: degraded ones too)
// and the decisions.
func countAllowed(t *testing.T, nodes []*inprocNode, rc *sluicev1.RateLimitCheck, n int) (int, []*sluicev1.Decision) {
	t.Helper()
	allowed := 0
	var ds []*sluicev1.Decision
	for i := range n {
		d := check(t, nodes[i%len(nodes)].client, rc)
		if d.Allowed {
			allowed++
		}
		ds = append(ds, d)
	}
	return allowed, ds
}

// With leases off (LeaseBase 1: the bases are the whole limit; by
// default slices follow demand, see leases_test.go), a global limit is
// split into fixed slices: each region admits its slice of a key
// (region.Share), decided by the key's owner in the region, and the
// regions together admit exactly the limit, never more. Answers say the
// scope, the region, the slice, the full limit, and slice_exhausted on a
// denial.
func TestGlobalLimitSplitsIntoSlices(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a=2,b=1,c=1", 2, NodeConfig{Clock: clock, LeaseBase: 1})
	regions, _ := region.Parse("a=2,b=1,c=1")
	for _, key := range []string{"user:1", "user:2", "user:3"} {
		rc := &sluicev1.RateLimitCheck{Name: "api", Key: key, Limit: 10, WindowMs: 60_000, Algorithm: sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW}
		total := 0
		for _, r := range []string{"a", "b", "c"} {
			slice := regions.Share(10, r, region.SeedOf("api", key))
			got, ds := countAllowed(t, byRegion[r], rc, 15)
			if int64(got) != slice {
				t.Errorf("%s in %s: %d allowed, want the slice %d", key, r, got, slice)
			}
			total += got
			for i, d := range ds {
				if d.Scope != sluicev1.Scope_SCOPE_GLOBAL || d.Region != r || d.Limit != 10 || d.Slice != slice || d.Degraded {
					t.Fatalf("%s in %s, answer %d: %v", key, r, i, d)
				}
				if !strings.HasPrefix(d.Owner, r+"-") {
					t.Errorf("%s in %s decided by %s, not a node of its region", key, r, d.Owner)
				}
				if want := int64(i) >= slice; d.SliceExhausted != want || d.Allowed == want {
					t.Errorf("%s in %s, answer %d: allowed %v slice_exhausted %v", key, r, i, d.Allowed, d.SliceExhausted)
				}
				if d.Allowed && d.Remaining != slice-int64(i)-1 {
					t.Errorf("%s in %s, answer %d: remaining %d, want %d of the slice", key, r, i, d.Remaining, slice-int64(i)-1)
				}
			}
		}
		if total != 10 {
			t.Errorf("%s: the regions admitted %d in all, want the limit 10", key, total)
		}
	}
}

// regional: each region enforces the whole limit on its own; exact: the
// key's owner in the home region decides every check, wherever it entered.
func TestRegionalAndExactScopes(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b,c", 2, NodeConfig{Clock: clock})

	regional := &sluicev1.RateLimitCheck{Name: "api", Key: "k", Limit: 4, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_REGIONAL}
	for _, r := range []string{"a", "b", "c"} {
		got, ds := countAllowed(t, byRegion[r], regional, 6)
		if got != 4 {
			t.Errorf("regional in %s: %d allowed, want 4", r, got)
		}
		if d := ds[5]; d.Scope != sluicev1.Scope_SCOPE_REGIONAL || d.Region != r || d.Slice != 0 || d.SliceExhausted || d.Limit != 4 {
			t.Errorf("regional in %s: %v", r, d)
		}
	}

	exact := &sluicev1.RateLimitCheck{Name: "api", Key: "e", Limit: 5, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_EXACT}
	total := 0
	for _, r := range []string{"b", "c", "a"} {
		got, ds := countAllowed(t, byRegion[r], exact, 3)
		total += got
		for _, d := range ds {
			if d.Scope != sluicev1.Scope_SCOPE_EXACT || d.Region != "a" || !strings.HasPrefix(d.Owner, "a-") || d.Degraded || d.SliceExhausted {
				t.Errorf("exact from %s: %v", r, d)
			}
		}
	}
	if total != 5 {
		t.Errorf("exact: %d allowed from three regions, want 5", total)
	}
	// Cross-region calls: exactly the exact checks that entered b and c
	// (one call each, unbatched here), and none of the regional ones.
	var cross int64
	for _, r := range []string{"b", "c"} {
		for _, n := range byRegion[r] {
			for peer, ps := range n.srv.Stats().Peers {
				if strings.HasPrefix(peer, "a-") {
					cross += ps.Checks
				} else if !strings.HasPrefix(peer, r+"-") && ps.Batches > 0 {
					t.Errorf("%s called %s, a node of a third region", n.name, peer)
				}
			}
		}
	}
	if cross != 6 {
		t.Errorf("regions b and c sent %d checks to region a, want the 6 exact ones", cross)
	}
}

// The scope comes from the limit's configuration when the check gives
// none; a check's own scope wins.
func TestScopeFromLimitsFile(t *testing.T) {
	clock := windowClock()
	lim := mustParseLimits(t, `
limits:
  login:
    limit: 3
    window: 1m
    scope: exact
  api:
    limit: 3
    window: 1m
`)
	byRegion := startRegions(t, "a,b", 1, NodeConfig{Clock: clock, Limits: lim})
	b := byRegion["b"][0]
	if d := check(t, b.client, named("login", "u")); d.Scope != sluicev1.Scope_SCOPE_EXACT || d.Region != "a" {
		t.Errorf("login from b: %v", d)
	}
	// (A fixed window: its slice follows leases, 0 in the window the
	// node started in until a grant.)
	if d := check(t, b.client, named("api", "u")); d.Scope != sluicev1.Scope_SCOPE_GLOBAL || d.Region != "b" || d.Limit != 3 {
		t.Errorf("api from b: %v", d)
	}
	own := named("login", "v")
	own.Scope = sluicev1.Scope_SCOPE_REGIONAL
	if d := check(t, b.client, own); d.Scope != sluicev1.Scope_SCOPE_REGIONAL || d.Region != "b" {
		t.Errorf("login with its own scope from b: %v", d)
	}
}

// With leases off, a limit smaller than the regions it is split among leaves some regions
// a slice of 0: their checks are denied at once, never allowed there
// (retry_after -1), slice_exhausted; the regions together still admit the
// limit, no more.
func TestZeroSliceIsDeniedAtOnce(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock, LeaseBase: 1})
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "tiny", Limit: 1, WindowMs: 60_000, Algorithm: sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW}
	total, zero := 0, 0
	for _, r := range []string{"a", "b", "c"} {
		got, ds := countAllowed(t, byRegion[r], rc, 3)
		total += got
		if ds[0].Slice == 0 {
			zero++
			for _, d := range ds {
				if d.Allowed || !d.SliceExhausted || d.RetryAfter != -1 || d.Limit != 1 {
					t.Errorf("zero slice in %s: %v", r, d)
				}
			}
		}
	}
	if total != 1 || zero != 2 {
		t.Errorf("limit 1 in 3 regions: %d admitted, %d regions with a zero slice; want 1 and 2", total, zero)
	}
	// A peek (hits 0) in a zero-slice region says one more hit would not pass.
	for _, r := range []string{"a", "b", "c"} {
		p := proto.CloneOf(rc)
		p.Hits = proto.Int64(0)
		if d := check(t, byRegion[r][0].client, p); d.Slice == 0 && d.Allowed {
			t.Errorf("peek in zero-slice region %s allowed", r)
		}
	}
}

// A region with no live member is a region down: an exact check entering
// another region is answered there per its policy (degraded), never routed
// to a third region.
func TestExactWithHomeRegionDown(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b", 1, NodeConfig{Clock: clock})
	a, b := byRegion["a"][0], byRegion["b"][0]
	a.Kill()
	if err := b.srv.SetMembers(b.c.members()); err != nil { // gossip would say a is gone
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy  sluicev1.OwnerUnavailablePolicy
		allowed bool
	}{
		{sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED, true}, // local: this node's fallback window
		{sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY, false},
	} {
		rc := &sluicev1.RateLimitCheck{Name: "api", Key: "e" + tc.policy.String(), Limit: 5, WindowMs: 60_000,
			Scope: sluicev1.Scope_SCOPE_EXACT, OnOwnerUnavailable: tc.policy}
		d := check(t, b.client, rc)
		if d.Allowed != tc.allowed || !d.Degraded || d.Owner != b.name || d.Region != "b" {
			t.Errorf("policy %v with the home region down: %v", tc.policy, d)
		}
	}
	// Under local, b's own window of the key holds the limit while the
	// home region is away, across b's stand-in flushes (its stand-in loop
	// runs one every replication interval; they once handed such a window
	// to the key's owner in b's region, b itself, and started it afresh:
	// every check was allowed), and the key's regional window in b is
	// untouched.
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "away", Limit: 3, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_EXACT}
	allowed := 0
	for range 10 {
		if d := check(t, b.client, rc); d.Allowed {
			allowed++
		}
		b.srv.flushStandIns(context.Background()) // what the stand-in loop does every interval
	}
	if allowed != 3 {
		t.Errorf("exact, limit 3, home region down: b allowed %d of 10 checks, want 3", allowed)
	}
	peek := &sluicev1.RateLimitCheck{Name: "api", Key: "away", Hits: proto.Int64(0), Limit: 3, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_REGIONAL}
	if d := check(t, b.client, peek); !d.Allowed || d.Remaining != 3 {
		t.Errorf("the key's regional window in b after the exact checks: %v, want untouched (remaining 3)", d)
	}
}

// The region list is validated: a node's region must be in it, and the
// list must parse (region.Parse's errors name the entry).
func TestRegionMustBeInTheList(t *testing.T) {
	regions, _ := region.Parse("a,b")
	_, err := NodeConfig{Name: "n", Regions: regions, Region: "c"}.withDefaults()
	if err == nil || !strings.Contains(err.Error(), `region: "c" is not in the region list "a=1,b=1"`) {
		t.Errorf("region not in the list: %v", err)
	}
	_, err = NodeConfig{Name: "n", Regions: regions}.withDefaults()
	if err == nil || !strings.Contains(err.Error(), `region: "local" is not in the region list`) {
		t.Errorf("no region with a list: %v", err)
	}
	if _, err := NewServer(ServerConfig{Name: "n", Store: window.NewStore(window.StoreConfig{}), Regions: regions, Region: "z"}); err == nil || !strings.Contains(err.Error(), `"z" is not in the region list`) {
		t.Errorf("NewServer: %v", err)
	}
}

// The region list is part of the ring's fingerprint.
func TestRegionsInRingFingerprint(t *testing.T) {
	ab, _ := region.Parse("a,b")
	ba, _ := region.Parse("b,a")
	fp := func(r *region.Config) string {
		s, err := NewServer(ServerConfig{Name: "a-1", Store: window.NewStore(window.StoreConfig{}), Regions: r, Region: "a"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return s.RingFingerprint()
	}
	if fp(ab) == fp(ba) || fp(ab) == fp(nil) {
		t.Error("rings built with different region lists have the same fingerprint")
	}
}

// Nodes given different region lists refuse each other: the newcomer's
// join fails with cluster.ErrRegions naming both lists' fingerprints, it
// stops (Failed), and the cluster keeps its members.
func TestDifferentRegionListsAreRefused(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	ab, _ := region.Parse("a,b")
	abc, _ := region.Parse("a,b,c")
	first, err := StartNode(NodeConfig{Name: "a-1", Region: "a", Regions: ab, GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Profile: "local", Clock: clock, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(context.Background())
	other, err := StartNode(NodeConfig{Name: "b-1", Region: "b", Regions: abc, GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Join: []string{first.GossipAddr()}, Profile: "local", Clock: clock, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	select {
	case err := <-other.Failed():
		if !errors.Is(err, cluster.ErrRegions) || !strings.Contains(err.Error(), ab.Fingerprint()) || !strings.Contains(err.Error(), abc.Fingerprint()) {
			t.Fatalf("failed with %v, want ErrRegions naming %s and %s", err, ab.Fingerprint(), abc.Fingerprint())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a node with another region list was not refused")
	}
	if ms := first.cluster.Members(); len(ms) != 1 {
		t.Errorf("the first node's members after the refusal: %v", ms)
	}
}

// With TLS and regions, every node turns ready: the other regions'
// members are verified members, though never in this node's ring (a node
// waited for them to enter its ring, and never served).
func TestRegionsWithTLSBecomeReady(t *testing.T) {
	p := newPKI(t)
	regions, _ := region.Parse("a,b")
	a := startTLSNode(t, p, "a-1", NodeConfig{ForwardTimeout: 2 * time.Second, Region: "a", Regions: regions})
	b := startTLSNode(t, p, "b-1", NodeConfig{ForwardTimeout: 2 * time.Second, Region: "b", Regions: regions}, a.GossipAddr())
	eventually(t, "both nodes to be ready", func() bool { return a.Ready() == nil && b.Ready() == nil })
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "k", Limit: 4, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_EXACT}
	eventually(t, "b to know the home region", func() bool { return b.Server().view.Load().home != nil })
	if d := check(t, b.client, rc); !d.Allowed || d.Owner != "a-1" || d.Region != "a" || d.Degraded {
		t.Errorf("exact via b over TLS: %v", d)
	}
}

// A window algorithm's burst (which it ignores) is not split: a sliding
// window with fixed slices (leases off) with burst 1 in three regions
// admits the whole limit in all (it once split the burst into 1, 0, 0 and
// denied two regions every check).
func TestWindowBurstIsNotSliced(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock, LeaseBase: 1})
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "k", Limit: 90, Burst: 1, WindowMs: 60_000, Algorithm: sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW}
	total := 0
	for _, r := range []string{"a", "b", "c"} {
		got, _ := countAllowed(t, byRegion[r], rc, 40)
		if got != 30 {
			t.Errorf("sliding window, limit 90, burst 1, region %s: %d allowed, want its slice 30", r, got)
		}
		total += got
	}
	if total != 90 {
		t.Errorf("%d allowed in all, want 90", total)
	}
}

// When the key's owner in the home region dies, an exact check entering
// another region is decided by the owner's stand-in holder in the home
// region, from its copy (degraded, as for a region's own keys): a limit
// spent before the death stays spent. (It was decided from a fresh window
// of the entering node: a spent limit admitted again.)
func TestExactWithHomeOwnerDownGoesToItsHomeStandIn(t *testing.T) {
	clock := windowClock()
	regions, _ := region.Parse("a,b")
	cfg := NodeConfig{Clock: clock, Regions: regions, Replication: ReplicationConfig{Interval: 20 * time.Millisecond}}
	a1, a2, b1 := cfg, cfg, cfg
	a1.Name, a1.Region = "a-1", "a"
	a2.Name, a2.Region = "a-2", "a"
	b1.Name, b1.Region = "b-1", "b"
	nodes := startInproc(t, a1, a2, b1)
	b := nodes[2]
	k := keyOwnedBy(t, nodes[0], "api", "a-1")
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: k, Limit: 5, WindowMs: 60_000, Scope: sluicev1.Scope_SCOPE_EXACT}
	if got, _ := countAllowed(t, []*inprocNode{b}, rc, 5); got != 5 {
		t.Fatalf("before the death: %d of 5 allowed", got)
	}
	storeKey := string(ring.Key(nil, "api", k))
	// The copy of all five hits: an earlier one (the replication interval
	// after the first hits) is what a crash loses, not what is under test.
	eventually(t, "a-2 to hold a-1's copy of the key's five hits", func() bool {
		st, ok := nodes[1].srv.replicas.Get(storeKey)
		if !ok {
			return false
		}
		s := window.NewStore(window.StoreConfig{Clock: clock})
		s.MergeState("k", st, clock.Now())
		d, err := s.Apply("k", window.Check{Algorithm: window.FixedWindow, Limit: 5, Window: time.Minute}, clock.Now())
		return err == nil && d.Remaining == 0
	})
	nodes[0].Kill()
	allowed, ds := countAllowed(t, []*inprocNode{b}, rc, 5)
	if allowed != 0 {
		t.Errorf("exact, limit 5 spent, its home owner dead: %d more allowed via b, want 0", allowed)
	}
	for _, d := range ds {
		if !d.Degraded || d.Owner != "a-2" || d.Region != "a" {
			t.Errorf("decision %v, want degraded, by a-2 in a", d)
		}
	}
}
