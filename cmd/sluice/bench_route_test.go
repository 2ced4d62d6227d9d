package main

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// tableNode is a RateLimitServiceClient answering every check allowed as
// owner name, with its table when the request's fingerprint differs.
type tableNode struct {
	sluicev1.RateLimitServiceClient
	name  string
	table *atomic.Pointer[sluicev1.RoutingTable]
}

func (n tableNode) Check(_ context.Context, req *sluicev1.CheckRequest, _ ...grpc.CallOption) (*sluicev1.CheckResponse, error) {
	resp := &sluicev1.CheckResponse{}
	for range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Owner: n.name})
	}
	if t := n.table.Load(); req.RoutingFingerprint != t.RingFingerprint {
		resp.Routes = t
	}
	return resp, nil
}

func benchTable(t *testing.T, partitions int, addrs []string) *sluicev1.RoutingTable {
	t.Helper()
	r, err := ring.New([]string{"a", "b", "c"}, ring.Config{PartitionCount: partitions})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config()
	rt := &sluicev1.RoutingTable{RingFingerprint: r.Fingerprint(), PartitionCount: int32(c.PartitionCount),
		ReplicationFactor: int32(c.ReplicationFactor), Load: c.Load, Hash: "xxhash64", Library: ring.Library}
	for i, n := range r.Members() {
		rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: n, GrpcAddr: addrs[i]})
	}
	return rt
}

// Finding: under --route owner a batch's split kept each node's last
// response from RPC to RPC and installed the table of every one of them
// after each batch, including the responses of nodes not called this
// time: a stale table one of them had brought could be installed again
// over the newer one (costing hops, never counts). Only this batch's
// responses are read now.
func TestBenchOwnerRouteKeepsTheNewestTable(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	t0, t1, t2 := benchTable(t, 271, addrs), benchTable(t, 300, addrs), benchTable(t, 330, addrs)
	var truth atomic.Pointer[sluicev1.RoutingTable]
	truth.Store(t1)
	var clients []sluicev1.RateLimitServiceClient
	b := &benchRouter{names: []string{"a", "b", "c"}, index: map[string]int{}}
	for i, n := range b.names {
		clients = append(clients, tableNode{name: n, table: &truth})
		b.index[addrs[i]] = i
	}
	if err := b.install(t0); err != nil {
		t.Fatal(err)
	}
	// keys whose owner is the same under every table: a's and b's.
	routers := []*client.Router{}
	for _, rt := range []*sluicev1.RoutingTable{t0, t1, t2} {
		r, err := client.NewRouter(rt)
		if err != nil {
			t.Fatal(err)
		}
		routers = append(routers, r)
	}
	keyOn := func(owner string, skip int) string {
		for i := range 100000 {
			k := "k" + strconv.Itoa(i)
			ok := true
			for _, r := range routers {
				if o, _ := r.Owner("api", k); o != owner {
					ok = false
				}
			}
			if ok {
				if skip == 0 {
					return k
				}
				skip--
			}
		}
		t.Fatalf("no key on %s", owner)
		return ""
	}
	batch := func(keys ...string) *sluicev1.CheckRequest {
		req := &sluicev1.CheckRequest{}
		for _, k := range keys {
			req.Checks = append(req.Checks, &sluicev1.RateLimitCheck{Name: "api", Key: k})
		}
		return req
	}
	split := &benchSplit{}
	ctx := context.Background()
	// t0 -> t1: a and b both answer with t1.
	if _, _, err := b.check(ctx, clients, 0, batch(keyOn("a", 0), keyOn("b", 0)), split); err != nil {
		t.Fatal(err)
	}
	if got := b.router.Load().Fingerprint(); got != t1.RingFingerprint {
		t.Fatalf("after the first batch: %s, want t1's", got)
	}
	truth.Store(t2)
	for i := range 12 {
		if _, _, err := b.check(ctx, clients, 0, batch(keyOn("a", 0), keyOn("a", 1)), split); err != nil {
			t.Fatal(err)
		}
		if got := b.router.Load().Fingerprint(); got != t2.RingFingerprint {
			t.Fatalf("batch %d of a's keys after the ring moved to t2: routing by %s, want t2's %s", i, got, t2.RingFingerprint)
		}
	}
}
