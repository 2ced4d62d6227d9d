package main

// sluice-owner: the servers of `sluice`, but the load generator sends each
// check to its key's owner, as sluice's Go client does with RouteOwner
// (`--route owner`, client/route.go): at start it asks one node for its
// routing table (RateLimitService.Routes), builds the ring from it with
// sluice's own ring package, checks that the ring's fingerprint is the
// table's, and maps each member to the load generator's connection to
// that member's gRPC address. Every request carries the table's
// fingerprint (CheckRequest.routing_fingerprint); an answer that carries a
// table (the node's ring differs) makes the worker rebuild it.
//
// A request of one check goes to its key's owner. A request of several
// checks (W3) is split by owner into one sub-request per owner, sent
// concurrently; the call is done when every part has answered. The
// sub-requests are built the same cheap way as every other target's
// request: one per member per goroutine, made once, with one check object
// per position of the batch, into which the keys are written.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"google.golang.org/protobuf/proto"
)

// ownerTable is a routing table as the load generator uses it.
type ownerTable struct {
	fp   string
	ring *ring.Ring
	node map[string]int // member name -> index into the target's addrs and clients
}

// ownerTarget is sluiceTarget with routing by owner.
type ownerTarget struct {
	*sluiceTarget
	table    atomic.Pointer[ownerTable]
	mu       sync.Mutex // serialises rebuilds
	rebuilds atomic.Int64
}

// ready waits for the cluster as sluiceTarget does, then fetches the
// routing table from the first node and builds the ring; a table this
// load generator cannot use is an error.
func (t *ownerTarget) ready(ctx context.Context) error {
	if err := t.sluiceTarget.ready(ctx); err != nil {
		return err
	}
	var rt *sluicev1.RoutingTable
	err := retry(ctx, func(cctx context.Context) error {
		var err error
		rt, err = t.clients[0].Routes(cctx, &sluicev1.RoutesRequest{})
		return err
	})
	if err != nil {
		return fmt.Errorf("sluice-owner: Routes on %s: %w", t.addrs[0], err)
	}
	tb, err := t.build(rt)
	if err != nil {
		return fmt.Errorf("sluice-owner: routing table of %s: %w", t.addrs[0], err)
	}
	t.table.Store(tb)
	return nil
}

// build turns rt into an ownerTable: the ring must be rebuilt exactly
// (same hash, library and fingerprint) and every member's gRPC address
// must be one of the load generator's, under the same name.
func (t *ownerTarget) build(rt *sluicev1.RoutingTable) (*ownerTable, error) {
	switch {
	case rt.GetHash() != "xxhash64":
		return nil, fmt.Errorf("hash %q: this load generator places keys with xxhash64", rt.GetHash())
	case rt.GetLibrary() != ring.Library:
		return nil, fmt.Errorf("ring library %q: this load generator has %s", rt.GetLibrary(), ring.Library)
	}
	names := make([]string, 0, len(rt.GetMembers()))
	for _, m := range rt.GetMembers() {
		names = append(names, m.GetName())
	}
	rg, err := ring.New(names, ring.Config{
		PartitionCount:    int(rt.GetPartitionCount()),
		ReplicationFactor: int(rt.GetReplicationFactor()),
		Load:              rt.GetLoad(),
		Regions:           rt.GetRegions(),
	})
	if err != nil {
		return nil, err
	}
	if rg.Fingerprint() != rt.GetRingFingerprint() {
		return nil, fmt.Errorf("the ring built from the table has fingerprint %s, the table says %s", rg.Fingerprint(), rt.GetRingFingerprint())
	}
	tb := &ownerTable{fp: rt.GetRingFingerprint(), ring: rg, node: make(map[string]int, len(names))}
	for _, m := range rt.GetMembers() {
		i := slices.Index(t.addrs, m.GetGrpcAddr())
		switch {
		case i < 0:
			return nil, fmt.Errorf("member %s advertises gRPC address %q, which is not one of -addrs %v", m.GetName(), m.GetGrpcAddr(), t.addrs)
		case t.names[i] != m.GetName():
			return nil, fmt.Errorf("member %s advertises %s, which -names calls %s", m.GetName(), m.GetGrpcAddr(), t.names[i])
		}
		tb.node[m.GetName()] = i
	}
	return tb, nil
}

// refresh installs rt unless the current table has its fingerprint.
func (t *ownerTarget) refresh(rt *sluicev1.RoutingTable) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.table.Load(); cur != nil && cur.fp == rt.GetRingFingerprint() {
		return nil
	}
	tb, err := t.build(rt)
	if err != nil {
		return fmt.Errorf("routing table brought by an answer: %w", err)
	}
	t.table.Store(tb)
	t.rebuilds.Add(1)
	return nil
}

// routeRebuilds is how many tables answers brought after the start.
func (t *ownerTarget) routeRebuilds() int64 { return t.rebuilds.Load() }

// ownerPart is one owner's sub-request of a worker, reused for every call.
type ownerPart struct {
	req  *sluicev1.CheckRequest
	pool []*sluicev1.RateLimitCheck // one per position of the batch
	resp *sluicev1.CheckResponse
	err  error
}

type ownerWorker struct {
	t     *ownerTarget
	name  string
	keys  []string
	buf   []byte
	parts []ownerPart // indexed like the target's clients
	wg    sync.WaitGroup
}

func (t *ownerTarget) newWorker(s limitSpec) worker {
	w := &ownerWorker{t: t, name: s.name, keys: make([]string, s.batch), buf: make([]byte, 0, 64),
		parts: make([]ownerPart, len(t.clients))}
	hits := proto.Int64(1)
	for i := range w.parts {
		p := &w.parts[i]
		p.req = &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, 0, s.batch)}
		p.pool = make([]*sluicev1.RateLimitCheck, s.batch)
		for j := range p.pool {
			p.pool[j] = &sluicev1.RateLimitCheck{
				Name: s.name, Key: "k0", Hits: hits, Limit: s.limit, WindowMs: s.windowMS,
				Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET,
			}
		}
	}
	return w
}

func (w *ownerWorker) setKey(j int, key string) { w.keys[j] = key }

// send makes part o's RPC.
func (w *ownerWorker) send(ctx context.Context, o int) {
	p := &w.parts[o]
	p.resp, p.err = w.t.clients[o].Check(ctx, p.req)
}

// call ignores node: each check goes to its key's owner.
func (w *ownerWorker) call(ctx context.Context, _ int) (callResult, error) {
	tb := w.t.table.Load()
	for i := range w.parts {
		w.parts[i].req.Checks = w.parts[i].req.Checks[:0]
	}
	for _, k := range w.keys {
		w.buf = ring.Key(w.buf[:0], w.name, k)
		o, ok := tb.node[tb.ring.Owner(w.buf)]
		if !ok {
			return callResult{}, errors.New("a key's owner is not in the routing table")
		}
		p := &w.parts[o]
		c := p.pool[len(p.req.Checks)]
		c.Key = k
		p.req.Checks = append(p.req.Checks, c)
	}
	first := -1
	for o := range w.parts {
		p := &w.parts[o]
		p.resp, p.err = nil, nil
		if len(p.req.Checks) == 0 {
			continue
		}
		p.req.RoutingFingerprint = tb.fp
		if first < 0 {
			first = o
			continue
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.send(ctx, o)
		}()
	}
	w.send(ctx, first)
	w.wg.Wait()
	var r callResult
	var err error
	for o := range w.parts {
		p := &w.parts[o]
		if len(p.req.Checks) == 0 {
			continue
		}
		r.subRPCs++
		switch {
		case p.err != nil:
			err = firstErr(err, p.err)
			continue
		case len(p.resp.Decisions) != len(p.req.Checks):
			err = firstErr(err, fmt.Errorf("%d decisions for %d checks", len(p.resp.Decisions), len(p.req.Checks)))
			continue
		}
		r.add(p.resp.Decisions, w.t.names[o])
		if rt := p.resp.GetRoutes(); rt != nil {
			err = firstErr(err, w.t.refresh(rt))
		}
	}
	if err != nil {
		return callResult{}, err
	}
	return r, nil
}

// firstErr returns the first non-nil of a and b.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
