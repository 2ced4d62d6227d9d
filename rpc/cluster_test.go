package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Three nodes (in process: gRPC over bufconn, members set by hand; the
// e2e suite runs real processes): 30 hits on each
// of 5 keys (limit 20 per minute), concurrently and spread over all nodes,
// admit exactly 20 per key for every algorithm; every node names the same
// owner for a key; the keys land on at least 2 owners.
func TestThreeNodesExactAdmission(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	nodes := startInprocCluster(t, 3, clock)
	keys := []string{"user:1", "user:2", "user:3", "user:4", "user:5"}

	owners := map[string]bool{}
	for _, k := range keys {
		o := nodes[0].Server().Owner("api", k)
		for _, n := range nodes[1:] {
			if got := n.Server().Owner("api", k); got != o {
				t.Fatalf("key %s: %s names owner %s, node1 names %s", k, n.Name(), got, o)
			}
		}
		owners[o] = true
	}
	if len(owners) < 2 {
		t.Fatalf("5 keys landed on %d owner(s), want at least 2", len(owners))
	}

	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			name := "api." + alg.String()
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				allowed = map[string]int{}
				owner   = map[string]map[string]bool{}
				start   = make(chan struct{})
			)
			for _, k := range keys {
				owner[k] = map[string]bool{}
				for i := 0; i < 30; i++ {
					c := nodes[i%3].client
					wg.Go(func() {
						<-start
						d := check(t, c, &sluicev1.RateLimitCheck{Name: name, Key: k, Hits: proto.Int64(1), Limit: 20, WindowMs: 60000, Algorithm: alg})
						mu.Lock()
						defer mu.Unlock()
						if d.Allowed {
							allowed[k]++
						}
						owner[k][d.Owner] = true
					})
				}
			}
			close(start)
			wg.Wait()
			for _, k := range keys {
				if allowed[k] != 20 {
					t.Errorf("key %s: %d allowed, want exactly 20", k, allowed[k])
				}
				if want := nodes[0].Server().Owner(name, k); len(owner[k]) != 1 || !owner[k][want] {
					t.Errorf("key %s: decisions came from %v, want only %s", k, owner[k], want)
				}
			}
		})
	}
}

// C01: a node that listens on one address and advertises another (here
// 127.0.0.2, which nothing listens on) decides the keys it owns itself:
// remaining 9..0, the 11th denied, and no peer RPC to itself. Ownership is
// decided by member name, never by address.
func TestSelfOwnerNeverForwardsToItself(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	n, err := StartNode(NodeConfig{
		Name: "self", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		AdvertiseHost: "127.0.0.2", Profile: "local", Clock: clock, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if n.GRPCAddr() == boundAddr(n) {
		t.Fatalf("advertised %s equals the bound address", n.GRPCAddr())
	}
	c := dial(t, boundAddr(n))
	for i := 0; i < 11; i++ {
		d := check(t, c, &sluicev1.RateLimitCheck{Name: "api", Key: "user:42", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000})
		wantAllowed, wantRemaining := i < 10, int64(9-i)
		if i == 10 {
			wantRemaining = 0
		}
		if d.Allowed != wantAllowed || d.Remaining != wantRemaining || d.Owner != "self" {
			t.Fatalf("hit %d: %v, want allowed=%v remaining=%d owner=self", i+1, d, wantAllowed, wantRemaining)
		}
	}
	if st := n.Server().Stats(); st.ForwardRPCs != 0 || st.ReceivedRPCs != 0 || st.LocalChecks != 11 {
		t.Fatalf("stats %+v: want 11 local checks and no peer RPCs", st)
	}
}

// In a cluster, a check for a key the entry node owns never leaves it.
func TestOwnedKeyStaysLocalInCluster(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	nodes := startInprocCluster(t, 3, clock)
	for _, n := range nodes {
		k := keyOwnedBy(t, n, "api", n.Name())
		before := make([]Stats, len(nodes))
		for i, m := range nodes {
			before[i] = m.Server().Stats()
		}
		for i := 0; i < 11; i++ {
			d := check(t, n.client, &sluicev1.RateLimitCheck{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000})
			if d.Owner != n.Name() || d.Allowed != (i < 10) {
				t.Fatalf("%s hit %d: %v", n.Name(), i+1, d)
			}
		}
		for i, m := range nodes {
			after := m.Server().Stats()
			if after.ForwardRPCs != before[i].ForwardRPCs || after.ReceivedRPCs != before[i].ReceivedRPCs {
				t.Fatalf("a check owned by %s caused peer RPCs on %s: %+v -> %+v", n.Name(), m.Name(), before[i], after)
			}
		}
	}
}

// C02: one budget whichever node answers. Fixed window 10 per 60 s, one hit
// a second for 30 s, round-robin over the nodes: exactly 10 allowed with
// remaining 9..0 in order, then 0.
func TestOneBudgetRoundRobin(t *testing.T) {
	for _, size := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d_nodes", size), func(t *testing.T) {
			clock := window.NewManualClock(windowStart)
			nodes := startInprocCluster(t, size, clock)
			for i := 0; i < 30; i++ {
				d := check(t, nodes[i%size].client, &sluicev1.RateLimitCheck{Name: "api", Key: "user:7", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000})
				wantRemaining := max(int64(9-i), 0)
				if d.Allowed != (i < 10) || d.Remaining != wantRemaining {
					t.Fatalf("t=%ds via %s: allowed=%v remaining=%d, want allowed=%v remaining=%d",
						i, nodes[i%size].Name(), d.Allowed, d.Remaining, i < 10, wantRemaining)
				}
				if !d.Allowed && d.RetryAfter != int64(60-i)*1000 {
					t.Fatalf("t=%ds: retry_after %d, want %d", i, d.RetryAfter, (60-i)*1000)
				}
				clock.Advance(time.Second)
			}
		})
	}
}

// C03a: limit 5 per second, 10 hits released at once from 10 goroutines,
// to one node and spread over three, 100 times: exactly 5 allowed each time,
// for every algorithm.
func TestConcurrentHitsExact(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	nodes := startInprocCluster(t, 3, clock)
	for _, alg := range algorithms {
		for _, spread := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/spread=%v", alg, spread), func(t *testing.T) {
				for rep := 0; rep < 100; rep++ {
					key := fmt.Sprintf("rep:%d:spread=%v", rep, spread)
					var allowed atomic.Int64
					var wg sync.WaitGroup
					start := make(chan struct{})
					for i := 0; i < 10; i++ {
						c := nodes[0].client
						if spread {
							c = nodes[i%3].client
						}
						wg.Go(func() {
							<-start
							if check(t, c, &sluicev1.RateLimitCheck{Name: "c03." + alg.String(), Key: key, Hits: proto.Int64(1), Limit: 5, WindowMs: 1000, Algorithm: alg}).Allowed {
								allowed.Add(1)
							}
						})
					}
					close(start)
					wg.Wait()
					if got := allowed.Load(); got != 5 {
						t.Fatalf("rep %d: %d allowed, want exactly 5", rep, got)
					}
				}
			})
		}
	}
}

// C03b: fixed window 100000 per 60 s, 1000 concurrent hits over 3 nodes
// from 50 goroutines: all allowed, and a peek after reports 99000.
func TestConcurrentHitsUnderLimitAllCounted(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	nodes := startInprocCluster(t, 3, clock)
	rc := func(hits int64) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "api", Key: "tenant:big", Hits: proto.Int64(hits), Limit: 100000, WindowMs: 60000}
	}
	var denied atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Go(func() {
			for i := 0; i < 20; i++ {
				if !check(t, nodes[(g+i)%3].client, rc(1)).Allowed {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if denied.Load() != 0 {
		t.Fatalf("%d of 1000 hits denied under a limit of 100000", denied.Load())
	}
	for _, n := range nodes {
		if d := check(t, n.client, rc(0)); !d.Allowed || d.Remaining != 99000 {
			t.Fatalf("peek via %s: %v, want allowed with remaining 99000", n.Name(), d)
		}
	}
}

// A second node under a name the cluster already has refuses to take part,
// stops without a leave message, and the rightful member stays.
func TestDuplicateNameIsRefused(t *testing.T) {
	clock := window.NewManualClock(windowStart)
	nodes := startCluster(t, 2, clock)
	impostor, err := StartNode(withTestRegions(NodeConfig{
		Name: "node2", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0",
		Join: []string{nodes[0].GossipAddr()}, Profile: "local", Clock: clock, Logger: testLogger(),
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close(context.Background())
	select {
	case err := <-impostor.Failed():
		if !errors.Is(err, cluster.ErrNameTaken) || !strings.Contains(err.Error(), nodes[1].GossipAddr()) {
			t.Fatalf("impostor failed with %v, want ErrNameTaken naming %s", err, nodes[1].GossipAddr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the impostor was not refused")
	}
	if err := impostor.Close(context.Background()); err != nil {
		t.Fatalf("close after refusal: %v", err)
	}
	// The rightful node2 is still a member of node1's view, at its address,
	// and checks still flow between the two.
	resp, err := nodes[0].client.Members(context.Background(), &sluicev1.MembersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Members) != 2 || resp.Members[1].Name != "node2" || resp.Members[1].GrpcAddr != nodes[1].GRPCAddr() {
		t.Fatalf("after the impostor: members %v", resp.Members)
	}
	k := keyOwnedBy(t, nodes[0], "api", "node2")
	if d := check(t, nodes[0].client, &sluicev1.RateLimitCheck{Name: "api", Key: k, Hits: proto.Int64(1), Limit: 2, WindowMs: 60000}); d.Owner != "node2" {
		t.Fatalf("decided by %s, want node2", d.Owner)
	}
}

// Checks of one request on a key owned by another node are applied in
// request order, also when some of them ask for no batching.
func TestForwardedChecksKeepRequestOrder(t *testing.T) {
	nodes := startInprocCluster(t, 2, windowClock())
	var keys []string // keys of "order" that node2 owns
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprint("k", i); nodes[0].Server().Owner("order", k) == "node2" {
			keys = append(keys, k)
		}
	}
	for rep, k := range keys {
		var checks []*sluicev1.RateLimitCheck
		for i := 0; i < 6; i++ {
			checks = append(checks, &sluicev1.RateLimitCheck{Name: "order", Key: k, Hits: proto.Int64(1), Limit: 3,
				WindowMs: 60000, NoBatching: i%2 == 1})
		}
		resp, err := nodes[0].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: checks})
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, d := range resp.Decisions {
			if d.Allowed {
				got += "A"
			} else {
				got += "D"
			}
		}
		if got != "AAADDD" {
			t.Fatalf("rep %d: %s, want AAADDD", rep, got)
		}
		if o := resp.Decisions[0].Owner; o != "node2" {
			t.Fatalf("decided by %s, want node2 (the test is about forwarding)", o)
		}
	}
}
