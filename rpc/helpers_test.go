package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"

	"github.com/sluicehq/sluice/internal/poll"
)

// windowStart is a Unix time that is a whole multiple of every window the
// tests use (1 s, 1 min, 1 h).
var windowStart = time.Unix(3600*500_000, 0)

// testLogger logs warnings and errors to stderr when SLUICE_TEST_LOG is
// set, and nothing otherwise.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// regionsUnderTest is the region list every node of these tests gets when
// SLUICE_TEST_REGIONS is set (e.g. "local=1000000,far=1": the nodes are in
// the region "local" unless a test says otherwise, and a second region
// without nodes is configured): the tests then run with regions configured
// (one ring per region, the list in the ring's fingerprint and the
// gossiped metadata, global limits split into slices; with those weights
// the local slice of every limit up to 10^6 is the whole limit, so the
// tests' numbers hold: LeaseBase 1 keeps fixed slices, as no allocator
// can lease with the second region down). make test runs the hand-off,
// crash and leave tests so too. nil when unset.
var regionsUnderTest = func() *region.Config {
	r, err := region.Parse(os.Getenv("SLUICE_TEST_REGIONS"))
	if err != nil {
		panic("SLUICE_TEST_REGIONS: " + err.Error())
	}
	return r
}()

// withTestRegions gives cfg the regions under test, if any (and its
// region the list's first when it has none).
func withTestRegions(cfg NodeConfig) NodeConfig {
	if regionsUnderTest == nil || cfg.Regions != nil {
		return cfg
	}
	cfg.Regions = regionsUnderTest
	if cfg.LeaseBase == 0 {
		cfg.LeaseBase = 1
	}
	if cfg.Region == "" {
		cfg.Region = regionsUnderTest.Home()
	}
	return cfg
}

// testRegion is the region of the nodes under test: the home region of
// the regions under test, "" without (a member list a test writes by hand
// gives its members this region, as gossip would).
func testRegion() string { return regionsUnderTest.Home() }

// eventually waits up to 40 s for cond: gossip runs on its own timers, so
// this is the one place these tests wait. (A CI machine running the race
// suite on 2 cores has taken over 15 s for five members to agree once; a
// healthy run takes well under a second.)
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 40*time.Second, what, cond)
}

// testNode is a running node and a client connected to it.
type testNode struct {
	*Node
	client sluicev1.RateLimitServiceClient
}

// startNode starts one node on 127.0.0.1 with OS-picked ports, joined to
// join (if any), using clock, and stops it (gracefully) when the test ends.
func startNode(t *testing.T, name string, clock window.Clock, join ...string) *testNode {
	t.Helper()
	return startNodeWith(t, name, clock, NodeConfig{ForwardTimeout: 2 * time.Second}, join...)
}

// startNodeWith starts a node like startNode, with cfg's other settings
// (replication, forward and hand-off timeouts, limits, HTTP...).
func startNodeWith(t *testing.T, name string, clock window.Clock, cfg NodeConfig, join ...string) *testNode {
	t.Helper()
	cfg.Name, cfg.GRPCAddr, cfg.GossipAddr, cfg.Join = name, "127.0.0.1:0", "127.0.0.1:0", join
	cfg.Profile, cfg.Clock, cfg.LeaveTimeout = cluster.Local, clock, time.Second
	cfg = withTestRegions(cfg)
	if cfg.hooks == nil {
		cfg.hooks = &testHooks{decideOwned: decideOwnedHook}
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	n, err := StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return &testNode{Node: n, client: dial(t, n.GRPCAddr())}
}

// dialConn opens a plaintext connection to addr, closed when the test ends.
func dialConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func dial(t *testing.T, addr string) sluicev1.RateLimitServiceClient {
	return sluicev1.NewRateLimitServiceClient(dialConn(t, addr))
}

// startCluster starts n nodes named node1..nodeN, all sharing clock, joined
// through node1, and waits until every node's ring has all n members and
// the same fingerprint.
func startCluster(t *testing.T, n int, clock window.Clock) []*testNode {
	t.Helper()
	nodes := []*testNode{startNode(t, "node1", clock)}
	for i := 2; i <= n; i++ {
		nodes = append(nodes, startNode(t, fmt.Sprintf("node%d", i), clock, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	return nodes
}

// waitRingAgrees waits until every node sees all the nodes and their rings
// have one fingerprint.
func waitRingAgrees(t *testing.T, nodes []*testNode) {
	t.Helper()
	defer func() {
		if t.Failed() {
			for _, n := range nodes {
				v := n.Server().view.Load()
				t.Logf("%s: ring %s, members %v", n.Name(), v.ring, v.ring.Members())
			}
		}
	}()
	eventually(t, "the rings to agree", func() bool { return ringsAgree(nodes) })
}

// check sends one check and fails the test on an RPC or per-check error.
func check(t *testing.T, c sluicev1.RateLimitServiceClient, rc *sluicev1.RateLimitCheck) *sluicev1.Decision {
	t.Helper()
	resp, err := c.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
	if err != nil {
		t.Fatalf("Check(%v): %v", rc, err)
	}
	if len(resp.Decisions) != 1 {
		t.Fatalf("Check: %d decisions for 1 check", len(resp.Decisions))
	}
	if d := resp.Decisions[0]; d.Error != "" {
		t.Fatalf("Check(%v): per-check error %s", rc, d.Error)
	}
	return resp.Decisions[0]
}

// keyOwnedBy returns a key of limit name that owner owns on n's ring (n
// a *testNode or an *inprocNode).
func keyOwnedBy(t *testing.T, n interface{ Server() *Server }, name, owner string) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		k := "user:" + strconv.Itoa(i)
		if n.Server().Owner(name, k) == owner {
			return k
		}
	}
	t.Fatalf("no key of %s is owned by %s", name, owner)
	return ""
}

// boundAddr returns the address n's gRPC server actually listens on.
func boundAddr(n *Node) string { return n.lis.Addr().(*net.TCPAddr).String() }

var algorithms = []sluicev1.Algorithm{
	sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW,
	sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW,
	sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET,
	sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET,
}

func dialPeer(t *testing.T, addr string) sluicev1.PeerServiceClient {
	return sluicev1.NewPeerServiceClient(dialConn(t, addr))
}

// windowClock returns a manual clock at windowStart.
func windowClock() *window.ManualClock { return window.NewManualClock(windowStart) }

// decideOwnedHook is the decideOwned hook (see testHooks) of the nodes
// started from now on; set it with hookDecideOwned.
var decideOwnedHook func(s *Server, storeKey []byte)

// hookDecideOwned makes f the decideOwned hook of the nodes the test
// starts after it, until the test (and its nodes' cleanups) ends.
func hookDecideOwned(t *testing.T, f func(s *Server, storeKey []byte)) {
	decideOwnedHook = f
	t.Cleanup(func() { decideOwnedHook = nil }) // runs after the nodes' cleanups
}
