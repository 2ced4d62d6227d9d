package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// clusterNode is a running node and an RLS client connected to it.
type clusterNode struct {
	*rpc.Node
	rls     rlsv3.RateLimitServiceClient
	members sluicev1.RateLimitServiceClient
}

func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startCluster starts n nodes on 127.0.0.1 with OS-picked ports, serving
// RLS from cfg, sharing clock, and waits until their rings agree.
func startCluster(t *testing.T, n int, cfg *rls.Config, clock window.Clock) []*clusterNode {
	t.Helper()
	return startClusterOpts(t, n, cfg, rls.Options{}, clock)
}

// startClusterOpts is startCluster with the rate limit service's settings
// opts.
func startClusterOpts(t *testing.T, n int, cfg *rls.Config, opts rls.Options, clock window.Clock) []*clusterNode {
	t.Helper()
	var nodes []*clusterNode
	for i := 1; i <= n; i++ {
		var join []string
		if i > 1 {
			join = []string{nodes[0].GossipAddr()}
		}
		node, err := rpc.StartNode(rpc.NodeConfig{
			Name: fmt.Sprintf("node%d", i), GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
			Join: join, Profile: cluster.Local, Clock: clock, Logger: testLogger(),
			ForwardTimeout: 2 * time.Second, LeaveTimeout: time.Second, RLS: cfg, RLSOptions: opts,
			AllowRefunds: opts.AllowRefunds, // the node's setting, which it gives its RLS face
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = node.Close(ctx)
		})
		conn, err := grpc.NewClient(node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		nodes = append(nodes, &clusterNode{Node: node, rls: rlsv3.NewRateLimitServiceClient(conn), members: sluicev1.NewRateLimitServiceClient(conn)})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		fps := map[string]bool{}
		for _, nd := range nodes {
			resp, err := nd.members.Members(context.Background(), &sluicev1.MembersRequest{})
			if err == nil && len(resp.Members) == n {
				fps[resp.RingFingerprint] = true
			} else {
				fps[""] = true
			}
		}
		if len(fps) == 1 && !fps[""] {
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the rings to agree")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rlsCall(t *testing.T, c rlsv3.RateLimitServiceClient, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: ds})
	if err != nil {
		t.Errorf("ShouldRateLimit: %v", err)
		return nil
	}
	if len(resp.Statuses) != len(ds) {
		t.Errorf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
		return nil
	}
	return resp
}

// TestThreeNodesShouldRateLimit drives ShouldRateLimit through
// go-control-plane's generated client against three nodes (real memberlist
// and gRPC on 127.0.0.1), with requests spread over all nodes and sent
// concurrently.
func TestThreeNodesShouldRateLimit(t *testing.T) {
	cfg, err := rls.Load("testdata/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A whole minute, so that every request falls in one window.
	clock := window.NewManualClock(time.Unix(3600*500_000, 0))
	nodes := startCluster(t, 3, cfg, clock)

	// The keys used below land on more than one owner.
	owners := map[string]bool{}
	for _, e := range [][]rls.Entry{
		d("path", "/api/orders", "user", "u1"), d("path", "/api/orders", "user", "u2"), d("path", "/api/orders", "user", "u3"),
		d("remote_address", "10.0.0.1"), d("remote_address", "10.0.0.2"), d("remote_address", "10.0.0.3"),
	} {
		m, _ := cfg.Match("shop", e)
		owners[nodes[0].Server().Owner(m.Name, m.Key)] = true
	}
	if len(owners) < 2 {
		t.Fatalf("the test's keys landed on %d owner(s), want at least 2", len(owners))
	}

	t.Run("statuses in order", func(t *testing.T) {
		r := rlsCall(t, nodes[1].rls,
			desc("nothing", "x"), desc("remote_address", "192.0.2.1"), desc("path", "/api/cart", "user", "s1"),
			desc("path", "/search"), desc("path", "/api/cart"))
		want := []st{
			{ok, 0, 0, 0}, {ok, 4, 3, time.Minute}, {ok, 5, 4, time.Minute}, {ok, 3, 2, time.Minute}, {ok, 0, 0, 0},
		}
		for i, w := range want {
			if g := got(r.Statuses[i]); g != w {
				t.Errorf("statuses[%d] = %+v, want %+v", i, g, w)
			}
		}
		if r.OverallCode != ok {
			t.Errorf("overall %s", r.OverallCode)
		}
		if n := r.Statuses[2].CurrentLimit.Name; n != "per_user" {
			t.Errorf("current_limit.name = %q, want per_user", n)
		}
	})

	// Concurrent requests for 3 users (nested descriptor with a wildcard
	// path) and 3 IPs, spread over the nodes: exactly requests_per_unit
	// admitted per descriptor value. (As in envoyproxy/ratelimit, each
	// value matched by a wildcard has its own count: /api/orders and
	// /api/cart are two.)
	t.Run("exact admission", func(t *testing.T) {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			allowed = map[string]int{}
			start   = make(chan struct{})
		)
		for _, u := range []string{"u1", "u2", "u3"} {
			for i := range 9 {
				wg.Go(func() {
					<-start
					r := rlsCall(t, nodes[i%3].rls, desc("path", "/api/orders", "user", u))
					if r != nil && r.OverallCode == ok {
						mu.Lock()
						allowed["user "+u]++
						mu.Unlock()
					}
				})
			}
		}
		for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			for i := range 7 {
				wg.Go(func() {
					<-start
					r := rlsCall(t, nodes[(i+1)%3].rls, desc("remote_address", ip))
					if r != nil && r.OverallCode == ok {
						mu.Lock()
						allowed["ip "+ip]++
						mu.Unlock()
					}
				})
			}
		}
		close(start)
		wg.Wait()
		for _, u := range []string{"u1", "u2", "u3"} {
			if allowed["user "+u] != 5 {
				t.Errorf("user %s: %d allowed, want exactly 5", u, allowed["user "+u])
			}
		}
		for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			if allowed["ip "+ip] != 4 {
				t.Errorf("ip %s: %d allowed, want exactly 4", ip, allowed["ip "+ip])
			}
		}
	})

	// The gold plan's rule replaces per_user: 8 admitted, and the
	// replaced rule is neither applied nor counted.
	t.Run("replaces", func(t *testing.T) {
		n := 0
		for i := range 10 {
			r := rlsCall(t, nodes[i%3].rls, desc("path", "/api/orders", "user", "g1"), desc("plan", "gold", "user", "g1"))
			if got(r.Statuses[0]) != (st{ok, 0, 0, 0}) {
				t.Fatalf("request %d: replaced status %+v, want OK with no limit", i, got(r.Statuses[0]))
			}
			if r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 8 {
				t.Fatalf("request %d: replacing status %+v", i, got(r.Statuses[1]))
			}
			if r.OverallCode == ok {
				n++
			}
		}
		if n != 8 {
			t.Errorf("%d admitted, want exactly 8", n)
		}
		if g := got(rlsCall(t, nodes[2].rls, desc("path", "/api/orders", "user", "g1")).Statuses[0]); g != (st{ok, 5, 4, time.Minute}) {
			t.Errorf("per_user for g1 alone: %+v, want its first hit (remaining 4)", g)
		}
	})

	// shadow_mode: never OVER_LIMIT, still counted (remaining goes to 0).
	t.Run("shadow mode", func(t *testing.T) {
		for i := range 6 {
			r := rlsCall(t, nodes[i%3].rls, desc("path", "/search"))
			want := uint32(max(0, 3-1-1-i)) // one hit taken by "statuses in order"
			if r.OverallCode != ok || got(r.Statuses[0]) != (st{ok, 3, want, time.Minute}) {
				t.Errorf("request %d: %s %+v, want OK remaining %d", i, r.OverallCode, got(r.Statuses[0]), want)
			}
		}
	})

	// All or none across owners: once the IP is exhausted, the user's
	// descriptor in the same request is not charged.
	t.Run("all or none", func(t *testing.T) {
		for i := range 7 {
			r := rlsCall(t, nodes[i%3].rls, desc("remote_address", "10.9.9.9"), desc("path", "/api/x", "user", "a1"))
			wantOver := i >= 4
			if (r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) != wantOver {
				t.Fatalf("request %d: overall %s", i, r.OverallCode)
			}
			if wantOver && (r.Statuses[0].Code != over || got(r.Statuses[1]) != (st{ok, 5, 1, time.Minute})) {
				t.Fatalf("request %d: %+v %+v", i, got(r.Statuses[0]), got(r.Statuses[1]))
			}
		}
		if g := got(rlsCall(t, nodes[0].rls, desc("path", "/api/x", "user", "a1")).Statuses[0]); g != (st{ok, 5, 0, time.Minute}) {
			t.Errorf("user a1 after the refused requests: %+v, want its 5th hit allowed", g)
		}
	})

	// Every node counted its requests; no request was partially charged.
	var requests int64
	for _, n := range nodes {
		st := n.RLS().Stats()
		requests += st.Requests
		if st.PartialCharges != 0 {
			t.Errorf("%s: %d partial charges", n.Name(), st.PartialCharges)
		}
	}
	if want := int64(1 + 27 + 21 + 10 + 1 + 6 + 7 + 1); requests != want {
		t.Errorf("%d requests answered, want %d", requests, want)
	}

	// The next minute starts afresh.
	t.Run("next window", func(t *testing.T) {
		clock.Advance(time.Minute)
		if g := got(rlsCall(t, nodes[1].rls, desc("remote_address", "10.0.0.1")).Statuses[0]); g != (st{ok, 4, 3, time.Minute}) {
			t.Errorf("next minute: %+v", g)
		}
	})
}
