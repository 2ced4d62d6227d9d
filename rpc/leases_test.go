package rpc

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/region/lease"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// startLeaseRegions starts one node in each of the regions a, b and c on
// clock and moves the clock to a minute window after those whose holders
// start at 0 (unsure: in the windows a stand set before the node started
// may still cover, an earlier process of it may have held less than its
// base), and these tests are about the windows after.
func startLeaseRegions(t *testing.T, clock *window.ManualClock) map[string][]*inprocNode {
	t.Helper()
	byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
	clock.Advance(time.Duration(standReach(time.Minute)+3) * time.Minute)
	return byRegion
}

// In the window a node starts in, its region's holders start at 0 and
// ask: the first check of a key is denied (slice_exhausted), a check
// after the grant is allowed.
func TestLeasesStartAtZeroAfterAStart(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b,c", 1, NodeConfig{Clock: clock})
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "fresh", Limit: 30, WindowMs: 60_000}
	if d := check(t, byRegion["a"][0].client, rc); d.Allowed || !d.SliceExhausted || d.Slice != 0 {
		t.Fatalf("first check in the start's window: %v, want denied on a slice of 0", d)
	}
	if got := leaseCheckUntil(t, byRegion["a"], rc, 1, 5*time.Second); got != 1 {
		t.Fatalf("no check allowed after the first one's request")
	}
}

// leaseCheckUntil sends rc to nodes in turn until want were allowed or
// the deadline (wall time: leases travel between real gRPC servers)
// passes, pausing between denials so that requests and grants can move;
// it returns how many were allowed.
func leaseCheckUntil(t *testing.T, nodes []*inprocNode, rc *sluicev1.RateLimitCheck, want int, within time.Duration) int {
	t.Helper()
	allowed := 0
	deadline := time.Now().Add(within)
	for i := 0; allowed < want && time.Now().Before(deadline); i++ {
		d := check(t, nodes[i%len(nodes)].client, rc)
		if d.Error != "" {
			t.Fatalf("check: %v", d)
		}
		if d.Allowed {
			allowed++
			continue
		}
		if !d.SliceExhausted {
			if d.Slice != d.Limit {
				t.Fatalf("denied without slice_exhausted on a slice smaller than the limit: %v", d)
			}
			break // the region holds the whole limit, and spent it
		}
		time.Sleep(5 * time.Millisecond)
	}
	return allowed
}

// A global fixed-window key used in one region gets nearly all of the
// limit in its first window: that region's owner asks the key's
// allocator for more before its base runs out, the allocator grants the
// pool and takes the idle regions' bases back lower-first. The regions
// together never admit more than the limit: once the key's region has
// had its fill, every region is flooded and nothing more is admitted.
func TestLeasesFollowDemand(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 30
	regions, _ := region.Parse("a,b,c")
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "one-region", Limit: limit, WindowMs: 60_000}
	base := regions.Share(limit/2, "a", region.SeedOf("api", "one-region"))
	first := check(t, byRegion["a"][0].client, rc)
	if !first.Allowed || first.Limit != limit || first.Slice < base || first.Scope != sluicev1.Scope_SCOPE_GLOBAL {
		t.Fatalf("first check: %v; want allowed, limit %d, a slice of at least the base %d", first, limit, base)
	}
	got := 1 + leaseCheckUntil(t, byRegion["a"], rc, limit-1, 10*time.Second)
	if got < limit {
		t.Errorf("region a admitted %d of a limit of %d used only there; want all of it", got, limit)
	}
	more := 0
	for _, r := range []string{"a", "b", "c"} {
		n, _ := countAllowed(t, byRegion[r], rc, 10)
		more += n
	}
	time.Sleep(200 * time.Millisecond) // any grant in flight lands
	for _, r := range []string{"a", "b", "c"} {
		n, _ := countAllowed(t, byRegion[r], rc, 10)
		more += n
	}
	if got+more > limit {
		t.Errorf("the regions admitted %d in all, over the limit %d", got+more, limit)
	}
	st := byRegion["a"][0].srv.Stats()
	if st.LeaseRequests == 0 || st.LeaseGrantedHits == 0 {
		t.Errorf("region a's node: %d requests, %d hits granted; want some", st.LeaseRequests, st.LeaseGrantedHits)
	}
	t.Logf("a admitted %d, then %d more anywhere; a's node: %d requests, %d granted hits, %d lease calls", got, more,
		st.LeaseRequests, st.LeaseGrantedHits, st.LeaseCalls)
	// Two windows on, the window is swept: the pool figures (by name
	// label; "api" is not a configured limit) count every admission, and
	// the slices held and the pool left add up to at most the limit.
	clock.Advance(2 * time.Minute)
	var pool PoolStats
	for _, r := range []string{"a", "b", "c"} {
		srv := byRegion[r][0].srv
		srv.leases.sweep(clock.Now())
		p := srv.Stats().LeasePools[InlineName]
		pool.SliceHits, pool.UsedHits, pool.FreeHits = pool.SliceHits+p.SliceHits, pool.UsedHits+p.UsedHits, pool.FreeHits+p.FreeHits
	}
	if pool.UsedHits != int64(got+more) || pool.SliceHits < pool.UsedHits || pool.SliceHits+pool.FreeHits > limit {
		t.Errorf("pool figures %+v; want %d used, slices at least that, slices and free at most %d", pool, got+more, limit)
	}
}

// Standing slices: a key used in one region, once a window of it ended,
// gets a standing slice of nearly all of the limit there (the allocator's
// Stands, acknowledged), so that in the windows the stand covers the
// region admits the whole limit with no lease message at all; the other
// regions stand at 0 and deny (slice_exhausted) until a grant comes, and
// the regions together never admit more than the limit.
func TestStandingSlicesFollowASteadyKey(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 30
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "steady", Limit: limit, WindowMs: 60_000}
	alloc := standInRegionA(t, byRegion, clock, rc)
	st := alloc.srv.Stats()
	if st.LeaseStands < 1 {
		t.Errorf("the allocator counted %d stands", st.LeaseStands)
	}
	// The stands start two windows after the one they were set in.
	clock.Advance(2 * time.Minute)
	before := byRegion["a"][0].srv.Stats().LeaseRequests
	a, ds := countAllowed(t, byRegion["a"], rc, limit+5)
	if a != limit || ds[0].Slice != limit {
		t.Errorf("a admitted %d on its standing slice (first answer %v), want the limit %d", a, ds[0], limit)
	}
	if got := byRegion["a"][0].srv.Stats().LeaseRequests - before; got != 0 {
		t.Errorf("region a's node sent %d lease requests in a window its standing slice covered, want none", got)
	}
	time.Sleep(300 * time.Millisecond) // a request of a's, if any, is answered
	more := 0
	for _, r := range []string{"a", "b", "c"} {
		n, _ := countAllowed(t, byRegion[r], rc, 10)
		more += n
	}
	if a+more > limit {
		t.Errorf("the regions admitted %d in all (%d in a, then %d), over the limit %d", a+more, a, more, limit)
	}
	t.Logf("a admitted %d on its stand, then %d more anywhere; %d stands set", a, more, st.LeaseStands)
}

// A holder that does not know its standing slice (its node restarted
// within a stand's reach: its holders start at 0) says so in its first
// request, and the allocator states the region's standing slice again:
// from two windows on, the region's windows start at it, not at 0.
func TestStandingSliceStatedAgainAfterARestart(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 30
	// A key whose allocator region is not a (the restart would lose the
	// stands too).
	a := byRegion["a"][0]
	rc := &sluicev1.RateLimitCheck{Name: "api", Limit: limit, WindowMs: 60_000}
	for i := 0; rc.Key == ""; i++ {
		if k := fmt.Sprintf("restart-%d", i); a.srv.leases.order(region.SeedOf("api", k))[0] != "a" {
			rc.Key = k
		}
	}
	if alloc := standInRegionA(t, byRegion, clock, rc); alloc == a {
		t.Fatalf("key %s: region a's node is its allocator", rc.Key)
	}
	// As after a restart of a's node: its lease state gone, its start now.
	l := a.srv.leases
	for i := range l.shards {
		l.shards[i].mu.Lock()
		l.shards[i].m = map[string]*holderEntry{}
		l.shards[i].mu.Unlock()
	}
	h := *l.hist.Load()
	h.started = clock.Now().UnixNano()
	l.hist.Store(&h)
	if d := check(t, a.client, rc); d.Allowed || !d.SliceExhausted || d.Slice != 0 {
		t.Fatalf("first check after the restart: %v, want denied on a slice of 0", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		e := l.entry(ring.Key(nil, rc.Name, rc.Key), rc.Name, rc.Key, time.Minute, limit, false)
		e.mu.Lock()
		sure := e.SureFrom
		e.mu.Unlock()
		if sure != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	clock.Advance(2 * time.Minute)
	if d := check(t, a.client, rc); !d.Allowed || d.Slice != limit {
		t.Errorf("first check two windows after the restart: %v, want allowed on the standing slice %d", d, limit)
	}
}

// standInRegionA spends rc's limit in region a in the current window, ends
// it, and waits until the key's allocator set region a a standing slice
// of more than half the limit, acknowledged; it returns the allocator's
// node. The stands start two windows after the clock's.
func standInRegionA(t *testing.T, byRegion map[string][]*inprocNode, clock *window.ManualClock, rc *sluicev1.RateLimitCheck) *inprocNode {
	t.Helper()
	limit := int(rc.Limit)
	if got := leaseCheckUntil(t, byRegion["a"], rc, limit, 10*time.Second); got != limit {
		t.Fatalf("first window: a admitted %d, want the limit %d", got, limit)
	}
	// The window ends; the sweep feeds its demand to the allocator's
	// stands, which it plans at its next round (every 200 ms).
	clock.Advance(2 * time.Minute)
	var alloc *inprocNode
	for _, r := range []string{"a", "b", "c"} {
		byRegion[r][0].srv.leases.sweep(clock.Now())
	}
	deadline := time.Now().Add(10 * time.Second)
	for alloc == nil && time.Now().Before(deadline) {
		for _, r := range []string{"a", "b", "c"} {
			n := byRegion[r][0]
			l := n.srv.leases
			l.amu.Lock()
			done := false
			for _, se := range l.stands {
				th, slice := se.St.Through("a")
				done = len(se.St.Pending()) == 0 && slice > int64(limit/2) && th > windowID(clock.Now(), time.Minute)
			}
			l.amu.Unlock()
			if done {
				alloc = n
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if alloc == nil {
		t.Fatal("no allocator set a standing slice for region a")
	}
	return alloc
}

// Demand in every region over the limit: each region gets about its fair
// share, and the regions together admit exactly the limit.
func TestLeasesUnderContention(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 60
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "everywhere", Limit: limit, WindowMs: 60_000}
	got := floodRegions(t, byRegion, rc, 2*time.Second)
	total := got["a"] + got["b"] + got["c"]
	if total != limit {
		t.Errorf("the regions admitted %d in all (%v); want exactly the limit %d", total, got, limit)
	}
	for r, n := range got {
		if n < limit/3-limit/6 {
			t.Errorf("%s admitted %d, far below a fair %d (%v)", r, n, limit/3, got)
		}
	}
	t.Logf("admitted %v", got)
}

// floodRegions sends rc to regions a, b and c in turn, every 2 ms, for d
// (wall time: leases move between real gRPC servers), and returns the
// checks allowed in each.
func floodRegions(t *testing.T, byRegion map[string][]*inprocNode, rc *sluicev1.RateLimitCheck, d time.Duration) map[string]int {
	t.Helper()
	got := map[string]int{}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, r := range []string{"a", "b", "c"} {
			if c := check(t, byRegion[r][0].client, rc); c.Allowed {
				got[r]++
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return got
}

// A peek in a region whose slice is spent says no, and peeks count
// nothing.
func TestLeasedPeek(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "peek", Limit: 3, WindowMs: 60_000}
	p := proto.CloneOf(rc)
	p.Hits = proto.Int64(0)
	for _, r := range []string{"a", "b", "c"} {
		for range 5 {
			check(t, byRegion[r][0].client, p)
		}
	}
	got := leaseCheckUntil(t, byRegion["b"], rc, 3, 5*time.Second)
	if got != 3 {
		t.Errorf("b admitted %d after peeks everywhere, want the limit 3", got)
	}
	if d := check(t, byRegion["b"][0].client, p); d.Allowed {
		t.Errorf("a peek after the limit was spent: %v", d)
	}
}

// A global token bucket's share follows demand too: a bucket used in one
// region gets nearly all of the burst there (its share of the rate and,
// in proportion, of the burst), and the regions together never admit
// more than the burst while no time passes (the clock is held; the rate
// adds nothing).
func TestLeasedBucket(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 30
	for _, alg := range []sluicev1.Algorithm{sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET} {
		rc := &sluicev1.RateLimitCheck{Name: "api", Key: "bucket-" + alg.String(), Limit: limit, WindowMs: 60_000, Algorithm: alg}
		got := leaseCheckUntil(t, byRegion["a"], rc, limit-3, 10*time.Second)
		if got < limit-3 {
			t.Errorf("%s: region a admitted %d of a burst of %d used only there; want nearly all of it", alg, got, limit)
		}
		more := 0
		for range 3 {
			for _, r := range []string{"a", "b", "c"} {
				n, _ := countAllowed(t, byRegion[r], rc, 10)
				more += n
			}
			time.Sleep(100 * time.Millisecond) // grants in flight land
		}
		if got+more > limit {
			t.Errorf("%s: the regions admitted %d in all, over the burst %d with no time passing", alg, got+more, limit)
		}
		t.Logf("%s: a admitted %d, then %d more anywhere", alg, got, more)
	}
}

// A peer's lease messages are input too: out-of-range numbers, unknown
// regions, negative and huge values and unknown kinds are dropped or
// applied within bounds, never a panic, and a node without regions
// refuses the call.
func TestLeaseRefusesBadMessages(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	s := byRegion["a"][0].srv
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...int64) int64 { return vs[rng.IntN(len(vs))] }
	for range 2000 {
		m := &sluicev1.LeaseMessage{
			Kind:      sluicev1.LeaseKind(rng.IntN(8)),
			Name:      []string{"", "api", strings.Repeat("n", 300)}[rng.IntN(3)],
			Key:       []string{"k", strings.Repeat("k", 5000)}[rng.IntN(2)],
			WindowId:  pick(-2, -1, 0, 1<<40, -1<<62),
			WindowMs:  pick(-1, 0, 1, 60_000, 1<<62),
			Limit:     pick(-5, 0, 1, 10, 1<<62),
			Region:    []string{"a", "b", "zz", ""}[rng.IntN(4)],
			Allocator: uint64(rng.IntN(3)),
			Seq:       uint64(rng.IntN(3)),
			Slice:     pick(-1, 0, 5, 1<<62),
			Target:    pick(-7, -1, 0, 3),
			Want:      pick(-1<<62, -3, 0, 7, 1<<62),
			Consumed:  pick(-3, 0, 4, 1<<62),
			Through:   pick(-1, 0, 1<<40, 1<<62),
			// Stands' and their acks' hints (thousandths of a hit).
			DemandMilli: pick(-1<<62, -1, 0, 2500, 1<<62),
			Wanted:      pick(-1<<62, -1, 0, 3, 1<<62),
		}
		if rng.IntN(2) == 0 {
			m.WindowId = windowID(clock.Now(), time.Minute) + pick(-1, 0, 1, 1000)
		}
		if _, err := s.Lease(context.Background(), &sluicev1.LeaseRequest{Sender: "b-1", Messages: []*sluicev1.LeaseMessage{m}}); err != nil {
			t.Fatalf("a call of one message refused: %v", err)
		}
	}
	// Requests and give-backs for a window far ahead, of keys some of
	// which this node allocates, make no allocator state (it would never
	// be swept).
	far := windowID(clock.Now(), time.Minute) + 1000
	for i := range 30 {
		for _, kind := range []sluicev1.LeaseKind{sluicev1.LeaseKind_LEASE_KIND_REQUEST, sluicev1.LeaseKind_LEASE_KIND_GIVE_BACK} {
			m := &sluicev1.LeaseMessage{Kind: kind, Name: "api", Key: fmt.Sprintf("far-%d", i), WindowId: far, WindowMs: 60_000,
				Limit: 10, Region: "b", Want: 3, Slice: 1}
			if _, err := s.Lease(context.Background(), &sluicev1.LeaseRequest{Sender: "b-1", Messages: []*sluicev1.LeaseMessage{m}}); err != nil {
				t.Fatalf("a far window's message refused with an error: %v", err)
			}
		}
	}
	// No window's allocator state lies beyond the windows a message may
	// name.
	s.leases.amu.Lock()
	for k, ae := range s.leases.allocs {
		if k.window > s.leases.latestWindow(ae.window) {
			t.Errorf("an allocator state for window %d, beyond %d", k.window, s.leases.latestWindow(ae.window))
		}
	}
	s.leases.amu.Unlock()
	many := make([]*sluicev1.LeaseMessage, maxLeaseBatch+1)
	for i := range many {
		many[i] = &sluicev1.LeaseMessage{}
	}
	if _, err := s.Lease(context.Background(), &sluicev1.LeaseRequest{Messages: many}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d messages in a call: %v, want INVALID_ARGUMENT", len(many), err)
	}
	// The node still answers, and the key's regions still admit at most
	// the limit.
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "after", Limit: 6, WindowMs: 60_000}
	total := 0
	for _, r := range []string{"a", "b", "c"} {
		total += leaseCheckUntil(t, byRegion[r], rc, 6, 2*time.Second)
	}
	if total > 6 {
		t.Errorf("%d admitted after the bad messages, over the limit 6", total)
	}
	one := startNode(t, "solo", clock)
	if _, err := one.Server().Lease(context.Background(), &sluicev1.LeaseRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a node without regions: %v, want FAILED_PRECONDITION", err)
	}
}

// A key wanted beyond the limit in every region: once a window of it
// ended, the allocator sets each region's standing slice at its fair
// share and says (the Stand's hint) that its demand is above it, and
// from then on the regions admit the limit in all with no lease request
// at all: asking would get nothing (the pool is empty, every region
// spends what it stands at). Without the hint each region asked in each
// window, for it and for the next one.
func TestContendedKeyGoesQuiet(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 30
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "contended", Limit: limit, WindowMs: 60_000}
	flood := func() map[string]int { return floodRegions(t, byRegion, rc, 1500*time.Millisecond) }
	sum := func(m map[string]int) int { return m["a"] + m["b"] + m["c"] }
	if got := flood(); sum(got) != limit {
		t.Fatalf("first window: the regions admitted %v, want %d in all", got, limit)
	}
	clock.Advance(2 * time.Minute)
	for _, r := range []string{"a", "b", "c"} {
		byRegion[r][0].srv.leases.sweep(clock.Now())
	}
	// The allocator plans (every 200 ms): every region capped at a third.
	var alloc *inprocNode
	deadline := time.Now().Add(10 * time.Second)
	for alloc == nil && time.Now().Before(deadline) {
		for _, r := range []string{"a", "b", "c"} {
			n := byRegion[r][0]
			l := n.srv.leases
			l.amu.Lock()
			for _, se := range l.stands {
				done := len(se.St.Pending()) == 0
				for _, reg := range []string{"a", "b", "c"} {
					_, slice := se.St.Through(reg)
					h, _ := se.Said(reg)
					done = done && h.Capped && slice >= limit/3-1 && slice <= limit/3+1
				}
				if done {
					alloc = n
				}
			}
			l.amu.Unlock()
		}
		time.Sleep(20 * time.Millisecond)
	}
	if alloc == nil {
		t.Fatal("no allocator set the regions' standing slices at a third, capped")
	}
	clock.Advance(2 * time.Minute) // a window the stands cover
	requests := func() (n int64) {
		for _, r := range []string{"a", "b", "c"} {
			n += byRegion[r][0].srv.Stats().LeaseRequests
		}
		return n
	}
	before := requests()
	got := flood()
	if sum(got) != limit {
		t.Errorf("the regions admitted %v, want %d in all", got, limit)
	}
	for r, n := range got {
		if n < limit/3-1 || n > limit/3+1 {
			t.Errorf("%s admitted %d, want its standing slice, about %d (%v)", r, n, limit/3, got)
		}
	}
	if n := requests() - before; n != 0 {
		t.Errorf("the regions sent %d lease requests in a window their standing slices covered, want none", n)
	}
	// The stands reach a few windows: the allocator renews them (from
	// the window after the current one) while the regions spend the
	// current one. The windows a renewal falls in stay quiet too: the
	// renewal's hint holds for the window the last Stand set (before, it
	// held only from the next one, and the regions asked for the rest
	// of the window in which each renewal came).
	stands := alloc.srv.Stats().LeaseStands
	for i := range standReach(time.Minute) + 1 {
		clock.Advance(time.Minute)
		before := requests()
		got := floodRegions(t, byRegion, rc, 700*time.Millisecond)
		if sum(got) != limit {
			t.Errorf("window %d after: the regions admitted %v, want %d in all", i+2, got, limit)
		}
		if n := requests() - before; n != 0 {
			t.Errorf("window %d after: %d lease requests, want none (stands set %d)", i+2, n, alloc.srv.Stats().LeaseStands-stands)
		}
	}
	if n := alloc.srv.Stats().LeaseStands - stands; n < 3 {
		t.Errorf("the allocator set %d stands over %d windows, want the three regions' renewals at least", n, standReach(time.Minute)+1)
	}
	t.Logf("admitted %v; %d stands set", got, alloc.srv.Stats().LeaseStands)
}

// A global limit changed mid-window (a limits file reloaded): the key's
// holders start afresh at 0 in every region (the store's count of the
// window stays), report what their region admitted to the new limit's
// allocator, which learns first, and late messages of the old limit's
// allocator change nothing. Lowered, the window admits at most the larger
// of what it had admitted and the new limit; raised, at most the new
// limit, and the regions get to it.
func TestLimitChangedMidWindow(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	// Lowered: a admitted 60 of 90, then the limit is 30.
	rc := &sluicev1.RateLimitCheck{Name: "api", Key: "lowered", Limit: 90, WindowMs: 60_000}
	before := leaseCheckUntil(t, byRegion["a"], rc, 60, 10*time.Second)
	if before != 60 {
		t.Fatalf("a admitted %d of 60 asked under a limit of 90", before)
	}
	rc.Limit = 30
	after := floodRegions(t, byRegion, rc, 2*time.Second)
	if n := after["a"] + after["b"] + after["c"]; n != 0 {
		t.Errorf("after the limit went from 90 to 30 with 60 admitted, the regions admitted %d more (%v); want 0", n, after)
	}
	// Raised: a admitted 20 of 30, then the limit is 90.
	rc = &sluicev1.RateLimitCheck{Name: "api", Key: "raised", Limit: 30, WindowMs: 60_000}
	before = leaseCheckUntil(t, byRegion["a"], rc, 20, 10*time.Second)
	rc.Limit = 90
	after = floodRegions(t, byRegion, rc, 3*time.Second)
	total := before + after["a"] + after["b"] + after["c"]
	if total > 90 || total < 80 {
		t.Errorf("after the limit went from 30 to 90 with %d admitted, %d in all (%v); want 80 to 90", before, total, after)
	}
	t.Logf("raised: %d before, then %v", before, after)
}

// A global sliding-window limit's slices follow demand too: a key used in
// one region admits there what one sliding counter of the limit less the
// other regions' bases would (60 with bases of 10: a counter of 40, where
// fixed slices gave 20; checked at each quarter of a window, that is 40,
// 30, 32, 32 a window, the count of the window before still counting as
// the window goes on); and flooded in every region, the regions' sliding
// estimate (the last window's count weighted by what is left of the
// current one, plus the current count) never passes the limit, checked
// at each quarter of four windows; nor when the demand moves to another
// region at a window's start, where the first region's count of the
// window before still counts (without the carry, the new region was
// granted the whole pool at once).
func TestLeasedSlidingWindow(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	const limit = 60
	w := time.Minute
	// Start at a window's start.
	clock.Advance(w - time.Duration(clock.Now().UnixNano()%int64(w)))
	for _, c := range []struct {
		key     string
		regions []string
		moveTo  string // from the second window on, the demand is here alone
	}{{"sliding-one", []string{"a"}, ""}, {"sliding-all", []string{"a", "b", "c"}, ""}, {"sliding-moved", []string{"a"}, "b"}} {
		rc := &sluicev1.RateLimitCheck{Name: "api", Key: c.key, Limit: limit, WindowMs: w.Milliseconds(),
			Algorithm: sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW}
		counts := map[int64]int{} // window id -> admitted in it
		var perWindow []int
		for i := range 4 {
			id := clock.Now().UnixNano() / int64(w)
			regions := c.regions
			if i > 0 && c.moveTo != "" {
				regions = []string{c.moveTo}
			}
			for q := range 4 {
				for _, r := range regions {
					counts[id] += leaseCheckUntil(t, byRegion[r], rc, limit, 150*time.Millisecond)
				}
				f := float64(q) / 4 // how far into the window the checks came
				est := float64(counts[id-1])*(1-f) + float64(counts[id])
				if est > limit {
					t.Fatalf("%s: window %d at %.2f: estimate %.1f (last %d, now %d), over the limit %d",
						c.key, id, f, est, counts[id-1], counts[id], limit)
				}
				clock.Advance(w / 4)
			}
			perWindow = append(perWindow, counts[id])
		}
		t.Logf("%s: admitted per window %v", c.key, perWindow)
		if c.moveTo != "" && perWindow[3] < 30 {
			// Within the window the demand moved in, the first region's
			// count is held for it until it reports lower (conservative);
			// two windows later the slices followed.
			t.Errorf("%s: the fourth window admitted %d in %s, want 30 or more: %v", c.key, perWindow[3], c.moveTo, perWindow)
		}
		if len(c.regions) == 1 && c.moveTo == "" {
			// One sliding counter of 40, checked at each quarter.
			var want []int
			last := 0
			for range 4 {
				n := 0
				for q := range 4 {
					n = max(n, int(math.Floor(40-float64(last)*(1-float64(q)/4))))
				}
				want = append(want, n)
				last = n
			}
			for i, n := range perWindow {
				if n < want[i]-2 || n > want[i] {
					t.Errorf("%s: window %d admitted %d, want %d (a sliding counter of the limit less the others' bases): %v, want %v",
						c.key, i+1, n, want[i], perWindow, want)
				}
			}
		}
	}
}

// A holder answers Lowers as its window and its key's limit allow: a
// sliding window's region still in the window before the Lower's (its
// clock behind the allocator's) does not answer yet (what it admits there
// still counts in the Lower's window, and may still grow: found by
// review, where an Ack of 0 let the allocator grant that count again);
// and a learning allocator's report for a limit no check here has
// brought yet is answered from the holders of the old limit (what the
// region may still admit), without replacing them, so that the new
// limit's pool opens.
func TestLowerAnsweredByWindowAndLimit(t *testing.T) {
	clock := windowClock()
	byRegion := startLeaseRegions(t, clock)
	l := byRegion["a"][0].srv.leases
	cur := windowID(clock.Now(), time.Minute)
	slide := &sluicev1.RateLimitCheck{Name: "api", Key: "behind", Limit: 30, WindowMs: 60_000, Algorithm: sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW}
	if n := leaseCheckUntil(t, byRegion["a"], slide, 7, 3*time.Second); n != 7 {
		t.Fatalf("admitted %d of 7", n)
	}
	sk := ring.Key(nil, slide.Name, slide.Key)
	lower := &sluicev1.LeaseMessage{Kind: sluicev1.LeaseKind_LEASE_KIND_LOWER, Name: slide.Name, Key: slide.Key, WindowMs: 60_000,
		Limit: 30, Region: "a", Allocator: 77, Seq: 1, Target: 0, Sliding: true}
	ahead := proto.CloneOf(lower)
	ahead.WindowId = cur + 1
	if k := l.onLower(sk, ahead); k != nil {
		t.Errorf("a Lower of the next window answered %v; want none until the region is in it", k)
	}
	now := proto.CloneOf(lower)
	now.WindowId = cur
	if k := l.onLower(sk, now); k == nil || k.Consumed != 7 || k.Slice != 7 {
		t.Errorf("a Lower of the current window answered %v; want slice 7, consumed 7 (the estimate)", k)
	}
	// The limit is 60 at the allocator, not yet here.
	report := proto.CloneOf(now)
	report.Limit, report.Target, report.Seq = 60, lease.ReportOnly, 1
	k := l.onLower(sk, report)
	if k == nil || k.Limit != 60 || k.Consumed != 7 || k.Slice < 7 {
		t.Fatalf("a report of limit 60 to holders of 30 answered %v; want its 7 admitted", k)
	}
	if e := l.entry(sk, slide.Name, slide.Key, time.Minute, 30, true); e.Limit != 30 {
		t.Errorf("the report replaced the holders: limit %d", e.Limit)
	}
}
