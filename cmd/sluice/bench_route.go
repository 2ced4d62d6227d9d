package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// benchRouter picks the node each of a bench's RPCs goes to: the next in
// turn (--route any), or, once fetch has a routing table (--route
// owner), each check's owner, by the cluster's routing table
// (client.Router: as the Go client places keys).
type benchRouter struct {
	names  []string                      // the node name behind each client
	router atomic.Pointer[client.Router] // nil: --route any
	index  map[string]int                // --route owner: a node's gRPC address -> its client
}

// fetch asks the first node for the cluster's routing table and routes by
// it from now on; each member must be among addrs (the bench dials no
// other node).
func (b *benchRouter) fetch(ctx context.Context, clients []sluicev1.RateLimitServiceClient, addrs []string, timeout time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rt, err := clients[0].Routes(cctx, &sluicev1.RoutesRequest{})
	if err != nil {
		return fmt.Errorf("--route owner: node %s did not give its routing table: %w", addrs[0], err)
	}
	b.index = make(map[string]int, len(addrs))
	for i, a := range addrs {
		b.index[a] = i
	}
	return b.install(rt)
}

// install routes by rt from now on.
func (b *benchRouter) install(rt *sluicev1.RoutingTable) error {
	r, err := client.NewRouter(rt)
	if err != nil {
		return usagef("route", "%v", err)
	}
	for _, m := range r.Members() {
		if _, ok := b.index[r.Addr(m)]; !ok {
			return usagef("addrs", "member %s of the ring is at %q, which is not among --addrs: give every node's address for --route owner", m, r.Addr(m))
		}
	}
	b.router.Store(r)
	return nil
}

// benchSplit is one goroutine's requests of a batch split per owner,
// reused from RPC to RPC.
type benchSplit struct {
	parts map[int]*sluicev1.CheckRequest
	resps map[int]*sluicev1.CheckResponse
}

// check sends req: to clients[turn] under --route any; else each check to
// its key's owner (a batch split per owner, the parts sent at once; split
// holds the goroutine's reusable parts, nil for a single check). It
// returns the decisions in req's order and how many of them the node
// called decided itself.
func (b *benchRouter) check(ctx context.Context, clients []sluicev1.RateLimitServiceClient, turn int, req *sluicev1.CheckRequest, split *benchSplit) (*sluicev1.CheckResponse, int, error) {
	r := b.router.Load()
	if r == nil {
		resp, err := clients[turn].Check(ctx, req)
		return resp, b.ownedBy(turn, resp), err
	}
	req.RoutingFingerprint = r.Fingerprint()
	if len(req.Checks) == 1 || split == nil {
		_, addr := r.Owner(req.Checks[0].Name, req.Checks[0].Key)
		n := b.index[addr]
		resp, err := clients[n].Check(ctx, req)
		b.refresh(resp)
		return resp, b.ownedBy(n, resp), err
	}
	if split.parts == nil {
		split.parts = map[int]*sluicev1.CheckRequest{}
		split.resps = map[int]*sluicev1.CheckResponse{}
	}
	for _, p := range split.parts {
		p.Checks = p.Checks[:0]
	}
	clear(split.resps) // the last batch's: a stale table one brought must not be installed again
	owner := make([]int, len(req.Checks))
	for i, c := range req.Checks {
		_, addr := r.Owner(c.Name, c.Key)
		n := b.index[addr]
		owner[i] = n
		p := split.parts[n]
		if p == nil {
			p = &sluicev1.CheckRequest{}
			split.parts[n] = p
		}
		p.Checks = append(p.Checks, c)
		p.RoutingFingerprint = req.RoutingFingerprint
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ferr  error
		owned int
	)
	for n, p := range split.parts {
		if len(p.Checks) == 0 {
			continue
		}
		wg.Go(func() {
			resp, err := clients[n].Check(ctx, p)
			if err == nil && len(resp.Decisions) != len(p.Checks) {
				err = fmt.Errorf("%d decisions for %d checks", len(resp.Decisions), len(p.Checks))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				ferr = err
				return
			}
			split.resps[n] = resp
			owned += b.ownedBy(n, resp)
		})
	}
	wg.Wait()
	if ferr != nil {
		return nil, 0, ferr
	}
	out := &sluicev1.CheckResponse{Decisions: make([]*sluicev1.Decision, len(req.Checks))}
	next := map[int]int{}
	for i, n := range owner {
		out.Decisions[i] = split.resps[n].Decisions[next[n]]
		next[n]++
	}
	for _, resp := range split.resps {
		b.refresh(resp)
	}
	return out, owned, nil
}

// refresh installs the table an answer carried (the ring changed); a table
// the bench cannot route by keeps the old one.
func (b *benchRouter) refresh(resp *sluicev1.CheckResponse) {
	if rt := resp.GetRoutes(); rt != nil {
		_ = b.install(rt)
	}
}

// ownedBy counts the decisions of resp that the node called (clients[n])
// made itself, as their owner, rather than forwarded.
func (b *benchRouter) ownedBy(n int, resp *sluicev1.CheckResponse) int {
	owned := 0
	for _, d := range resp.GetDecisions() {
		if d.GetOwner() == b.names[n] {
			owned++
		}
	}
	return owned
}
