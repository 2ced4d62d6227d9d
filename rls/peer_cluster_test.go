package rls_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// replayT0 is the peer's MockClock of test/service/ratelimit_test.go
// (UnixNow 2222: 2 s into a minute, so a minute's reset is 58 s) moved
// to 2027: 2222 s into an hour, 31022 s into a day.
var replayT0 = time.Unix(3600*500_000+2222, 0)

// peerClusterConfig is what startPeerCluster starts nodes with.
type peerClusterConfig struct {
	// Options are the rate limit service's settings (its Clock and
	// Logger are the node's).
	Options rls.Options
	// Config is the rules every node serves; ignored with Source; nil
	// with no Source: no domains.
	Config *rls.Config
	// Source, when set, gives every node its rules and reloads.
	Source *rls.Source
	// Start is the shared clock's first time; zero: replayT0.
	Start time.Time
}

// replayNode is one running node and its clients.
type replayNode struct {
	*rpc.Node
	rls    rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
}

// replayRig is a cluster of real nodes (real gossip and gRPC on
// 127.0.0.1) sharing one manual clock, called round-robin: call i goes to
// node i mod n. It counts every request answered, and checks when the
// test ends that the nodes' Stats counted exactly those, each node some.
type replayRig struct {
	clock *window.ManualClock
	nodes []*replayNode

	mu       sync.Mutex
	next     int
	answered int64 // requests answered (gRPC or /json), all nodes
}

// startPeerCluster starts n nodes on 127.0.0.1 with OS-picked ports (gRPC,
// gossip, HTTP), serving RLS from c, and waits until their rings agree.
func startPeerCluster(t *testing.T, n int, c peerClusterConfig) *replayRig {
	t.Helper()
	if c.Start.IsZero() {
		c.Start = replayT0
	}
	if c.Config == nil && c.Source == nil {
		c.Config = &rls.Config{} // no domains: every request OK
	}
	r := &replayRig{clock: window.NewManualClock(c.Start)}
	var members []sluicev1.RateLimitServiceClient
	for i := 1; i <= n; i++ {
		var join []string
		if i > 1 {
			join = []string{r.nodes[0].GossipAddr()}
		}
		node, err := rpc.StartNode(rpc.NodeConfig{
			Name: fmt.Sprintf("node%d", i), GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Join: join, Profile: cluster.Local, Clock: r.clock, Logger: testLogger(),
			ForwardTimeout: 2 * time.Second, LeaveTimeout: 100 * time.Millisecond, SettleTime: 10 * time.Millisecond,
			RLS: c.Config, RLSSource: c.Source, RLSOptions: c.Options,
		})
		if err != nil {
			t.Fatal(err)
		}
		nd := &replayNode{Node: node}
		r.nodes = append(r.nodes, nd)
		if i == 1 {
			// The nodes close after the clients (cleanups run last
			// registered first).
			t.Cleanup(r.close)
		}
		conn, err := grpc.NewClient(node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		nd.rls, nd.health = rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
		members = append(members, sluicev1.NewRateLimitServiceClient(conn))
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		fps := map[string]bool{}
		for _, m := range members {
			resp, err := m.Members(context.Background(), &sluicev1.MembersRequest{})
			if err == nil && len(resp.Members) == n {
				fps[resp.RingFingerprint] = true
			} else {
				fps[""] = true
			}
		}
		if len(fps) == 1 && !fps[""] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the rings to agree")
		}
		time.Sleep(10 * time.Millisecond) // polls the members; moves no clock
	}
	// Registered after the nodes' cleanups, so it runs before them.
	t.Cleanup(func() { r.checkAnswered(t) })
	return r
}

// close closes the nodes, all at once.
func (r *replayRig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range r.nodes {
		wg.Go(func() { _ = n.Close(ctx) })
	}
	wg.Wait()
}

// pick returns the node the next call goes to, round-robin.
func (r *replayRig) pick() *replayNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	nd := r.nodes[r.next%len(r.nodes)]
	r.next++
	return nd
}

// answer counts one request answered.
func (r *replayRig) answer() {
	r.mu.Lock()
	r.answered++
	r.mu.Unlock()
}

// try sends req to the next node.
func (r *replayRig) try(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := r.pick().rls.ShouldRateLimit(context.Background(), req)
	if err == nil {
		r.answer()
	}
	return resp, err
}

// call sends req to the next node and returns its answer, one status per
// descriptor.
func (r *replayRig) call(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.try(req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// services returns every node's rate limit service.
func (r *replayRig) services() []*rls.Service {
	var out []*rls.Service
	for _, n := range r.nodes {
		out = append(out, n.RLS())
	}
	return out
}

// setConfig puts cfg in force on every node.
func (r *replayRig) setConfig(cfg *rls.Config) {
	for _, s := range r.services() {
		s.SetConfig(cfg)
	}
}

// ruleStats returns what each rule counted on all the nodes together,
// by full key (each node counts the requests it answered).
func (r *replayRig) ruleStats() map[string]rls.RuleStat {
	out := map[string]rls.RuleStat{}
	for _, s := range r.services() {
		for _, st := range s.RuleStats() {
			sum := out[st.Rule]
			sum.Domain, sum.Rule = st.Domain, st.Rule
			sum.TotalHits += st.TotalHits
			sum.OverLimit += st.OverLimit
			sum.NearLimit += st.NearLimit
			sum.WithinLimit += st.WithinLimit
			sum.ShadowMode += st.ShadowMode
			out[st.Rule] = sum
		}
	}
	return out
}

// stats returns the nodes' request counters added up (the load counters
// are the first node's: a shared Source counts its loads once).
func (r *replayRig) stats() rls.Stats {
	var out rls.Stats
	for i, s := range r.services() {
		st := s.Stats()
		out.Requests += st.Requests
		out.OverLimit += st.OverLimit
		out.ShadowOK += st.ShadowOK
		out.PartialCharges += st.PartialCharges
		if i == 0 {
			out.ConfigLoads, out.ConfigLoadErrors, out.Domains = st.ConfigLoads, st.ConfigLoadErrors, st.Domains
		}
	}
	return out
}

// checkAnswered checks that the nodes answered exactly the requests the
// test saw answered, none partially charged, and that with several
// nodes each answered some.
func (r *replayRig) checkAnswered(t *testing.T) {
	r.mu.Lock()
	answered := r.answered
	r.mu.Unlock()
	var total int64
	var per []string
	for _, n := range r.nodes {
		st := n.RLS().Stats()
		total += st.Requests
		per = append(per, fmt.Sprintf("%s:%d", n.Name(), st.Requests))
		if st.PartialCharges != 0 {
			t.Errorf("%s: %d partial charges", n.Name(), st.PartialCharges)
		}
		if answered >= int64(len(r.nodes)) && st.Requests == 0 {
			t.Errorf("%s answered no request of %d sent round-robin", n.Name(), answered)
		}
	}
	sort.Strings(per)
	if total != answered {
		t.Errorf("the nodes counted %d requests answered (%v), the test %d", total, per, answered)
	}
}

// replayNodes runs f on 1 node and on 3 nodes, each time on a fresh
// cluster started by start (its rules, settings and clock).
func replayNodes(t *testing.T, start func(t *testing.T, n int) *replayRig, f func(t *testing.T, r *replayRig)) {
	t.Helper()
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) { f(t, start(t, n)) })
	}
}

// replayOn is replayNodes for a cluster serving cfg with opts.
func replayOn(t *testing.T, cfg *rls.Config, opts rls.Options, f func(t *testing.T, r *replayRig)) {
	t.Helper()
	replayNodes(t, func(t *testing.T, n int) *replayRig {
		return startPeerCluster(t, n, peerClusterConfig{Options: opts, Config: cfg})
	}, f)
}
