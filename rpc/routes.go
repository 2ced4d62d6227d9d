package rpc

import (
	"context"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// RouteHash names the hash the ring places keys with, as a RoutingTable
// gives it (RoutingTable.hash).
const RouteHash = "xxhash64"

// Routes implements RateLimitService.Routes: this node's routing table
// (see routingTable). It counts nothing and never fails.
func (s *Server) Routes(context.Context, *sluicev1.RoutesRequest) (*sluicev1.RoutingTable, error) {
	return s.routingTable(s.view.Load()), nil
}

// routingTable returns v's routing table: its ring's members (this
// region's) with their gRPC addresses, the ring's config and fingerprint.
// It is built once per view and shared by every answer that carries it,
// so callers must not modify it.
func (s *Server) routingTable(v *view) *sluicev1.RoutingTable {
	if t := v.routes.Load(); t != nil {
		return t
	}
	cfg := v.ring.Config()
	t := &sluicev1.RoutingTable{
		RingFingerprint:   v.ring.Fingerprint(),
		RingEpoch:         v.epoch,
		PartitionCount:    int32(cfg.PartitionCount),
		ReplicationFactor: int32(cfg.ReplicationFactor),
		Load:              cfg.Load,
		Hash:              RouteHash,
		Library:           ring.Library,
		Regions:           cfg.Regions,
		Region:            s.region,
		Self:              s.name,
	}
	addrs := make(map[string]*sluicev1.RouteMember, len(v.members))
	for _, m := range v.members {
		addrs[m.Name] = &sluicev1.RouteMember{Name: m.Name, GrpcAddr: m.GRPCAddr, Region: m.Region}
	}
	for _, name := range v.ring.Members() {
		rm := addrs[name]
		if rm == nil { // a ring member this view has no address for (cannot happen): routed by name alone
			rm = &sluicev1.RouteMember{Name: name, Region: s.region}
		}
		t.Members = append(t.Members, rm)
	}
	v.routes.CompareAndSwap(nil, t)
	return v.routes.Load()
}

// routesFor returns the routing table an answer to req carries: v's, when
// the client routed req by a table whose fingerprint differs from v's
// ring's, else nil.
func (s *Server) routesFor(req *sluicev1.CheckRequest, v *view) *sluicev1.RoutingTable {
	fp := req.GetRoutingFingerprint()
	if fp == "" || fp == v.ring.Fingerprint() {
		return nil
	}
	return s.routingTable(v)
}
