package client

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Route says which node a Client sends a check to.
type Route int

const (
	// RouteOwner (the default) sends each check straight to the node that
	// owns its key, found with the cluster's routing table (the Routes
	// call; docs/routing.md): the client places the key on the ring
	// exactly as the nodes do, so the check skips the forwarding hop.
	// The first call, and any call whose key's owner is unknown, skipped
	// or has no address, goes to the nodes of Config.Addrs in turn, and
	// that call's answer brings the table. Each request carries the
	// table's fingerprint; a node whose ring differs answers with its own
	// table, so a stale table is corrected by the next answer. A node
	// that gets a check it does not own forwards it as it would any
	// check: a stale table costs a hop, never a count.
	RouteOwner Route = iota
	// RouteAny sends every call to the nodes of Config.Addrs in turn
	// (round robin), as Envoy does; a node forwards each check to its
	// key's owner: one more network hop for most checks.
	RouteAny
)

// String returns "owner" or "any".
func (r Route) String() string {
	switch r {
	case RouteOwner:
		return "owner"
	case RouteAny:
		return "any"
	}
	return fmt.Sprintf("Route(%d)", int(r))
}

// ParseRoute returns the Route called s: "owner" (or "", the default) or
// "any"; anything else is an error naming the valid values.
func ParseRoute(s string) (Route, error) {
	switch s {
	case "", "owner":
		return RouteOwner, nil
	case "any":
		return RouteAny, nil
	}
	return 0, fmt.Errorf("unknown route %q: want owner or any", s)
}

// askTable is the routing fingerprint a client without a table sends: it
// equals no ring's fingerprint (16 hex digits), so the answer carries the
// node's table.
const askTable = "-"

// tablesKept is how many tables a client keeps built, by fingerprint, so
// that nodes answering with two rings while a change spreads (gossip takes
// a moment) cost no rebuild per answer.
const tablesKept = 4

// table is a routing table as a client uses it.
type table struct {
	fp     string
	router *Router          // nil: the table cannot place keys here (see install); route any
	owners map[string]*node // by member name; a member without a usable address has none
}

// routing is the state of RouteOwner: the tables and the nodes dialed for
// their members.
type routing struct {
	mu     sync.Mutex       // guards byAddr, built and installs
	byAddr map[string]*node // every node dialed, by address: Config.Addrs' and the tables' members'
	built  []*table         // the last tablesKept tables, newest last
	opts   []grpc.DialOption
}

// routeFingerprint is the CheckRequest.routing_fingerprint of c's calls:
// "" under RouteAny, the table's fingerprint, or askTable before the first.
func (c *Client) routeFingerprint() string {
	if c.cfg.Route != RouteOwner {
		return ""
	}
	if t := c.table.Load(); t != nil {
		return t.fp
	}
	return askTable
}

// usableTable returns c's routing table when it can place keys; nil
// under RouteAny (which installs none), before the first table, or when
// the table was refused (see install).
func (c *Client) usableTable() *table {
	if t := c.table.Load(); t != nil && t.router != nil {
		return t
	}
	return nil
}

// ownerNode returns the node that owns (name, key) under c's table; nil
// without a usable table, or when the owner has no node.
func (c *Client) ownerNode(name, key string) *node {
	t := c.usableTable()
	if t == nil {
		return nil
	}
	return t.owners[t.router.member(name, key)]
}

// Owner returns the name of the member that c's routing table places the
// key of limit name on: the node RouteOwner sends its checks to. It
// returns "" under RouteAny and until a usable table arrived (the answer
// to the first call brings it).
func (c *Client) Owner(name, key string) string {
	t := c.usableTable()
	if t == nil {
		return ""
	}
	return t.router.member(name, key)
}

// RoutingFingerprint returns the ring fingerprint of c's routing table
// ("" under RouteAny or before the first table): equal to a node's
// (MembersResponse.ring_fingerprint) when c places every key as it does.
func (c *Client) RoutingFingerprint() string {
	if t := c.table.Load(); t != nil && c.cfg.Route == RouteOwner {
		return t.fp
	}
	return ""
}

// install makes rt c's routing table unless it already is. A table whose
// ring this client cannot rebuild identically (another hash or library
// version, a fingerprint that does not match) is kept for its fingerprint
// (so nodes stop sending it) but routes every check to any node.
func (c *Client) install(rt *sluicev1.RoutingTable) {
	if rt == nil || c.cfg.Route != RouteOwner || c.closed.Load() {
		return
	}
	if t := c.table.Load(); t != nil && t.fp == rt.GetRingFingerprint() {
		return
	}
	c.routing.mu.Lock()
	defer c.routing.mu.Unlock()
	c.installLocked(rt)
}

// installLocked is install's work; it requires c.routing.mu held. After
// Close (which may have run while install waited for the lock) it does
// nothing: a connection dialed now would never be closed.
func (c *Client) installLocked(rt *sluicev1.RoutingTable) {
	if c.closed.Load() {
		return
	}
	r := &c.routing
	if t := c.table.Load(); t != nil && t.fp == rt.GetRingFingerprint() {
		return
	}
	if i := slices.IndexFunc(r.built, func(t *table) bool { return t.fp == rt.GetRingFingerprint() }); i >= 0 {
		c.table.Store(r.built[i])
		return
	}
	t, err := c.buildTable(rt)
	if err != nil {
		c.log.Warn("routing table not usable: checks go to any node, which forwards them to their owner",
			"event", "rate_limit.routing_table", "reason", err.Error(), "fingerprint", t.fp)
	}
	evicted := len(r.built) == tablesKept
	if evicted {
		r.built = r.built[1:]
	}
	r.built = append(r.built, t)
	c.table.Store(t)
	if evicted {
		c.pruneLocked()
	}
}

// pruneLocked closes the connections of the nodes that neither
// Config.Addrs nor a kept table names, so that tables of ever new
// addresses (members moved, or a broken node) cannot grow the client
// without bound. A check still in flight on such a node (routed by a
// table four changes old) fails over to Config.Addrs. Requires
// c.routing.mu held.
func (c *Client) pruneLocked() {
	r := &c.routing
	keep := make(map[*node]bool, len(c.nodes))
	for _, n := range c.nodes {
		keep[n] = true
	}
	for _, t := range r.built {
		for _, n := range t.owners {
			keep[n] = true
		}
	}
	for addr, n := range r.byAddr {
		if !keep[n] {
			_ = n.conn.Close()
			delete(r.byAddr, addr)
		}
	}
}

// buildTable turns rt into a table, dialing (lazily: no I/O) the members
// it has no node for. A table NewRouter refuses is returned without a
// router, with NewRouter's error. Called with c.routing.mu held.
func (c *Client) buildTable(rt *sluicev1.RoutingTable) (*table, error) {
	t := &table{fp: rt.GetRingFingerprint(), owners: make(map[string]*node, len(rt.GetMembers()))}
	rr, err := NewRouter(rt)
	if err != nil {
		return t, err
	}
	for name, addr := range rr.addrs {
		if addr == "" {
			continue // its keys go to any node
		}
		n := c.routing.byAddr[addr]
		if n == nil {
			conn, err := grpc.NewClient(addr, c.routing.opts...)
			if err != nil {
				c.log.Warn("routing table: cannot dial a member; its keys go to any node",
					"event", "rate_limit.routing_table", "member", name, "addr", addr, "error", err)
				continue
			}
			n = &node{addr: addr, conn: conn, api: sluicev1.NewRateLimitServiceClient(conn)}
			c.routing.byAddr[addr] = n
		}
		t.owners[name] = n
	}
	t.router = rr
	return t, nil
}

// Bounds on a routing table a client builds a ring from: a table beyond
// them (from a broken or hostile node) is refused, so that building it
// can never take the client's memory or time.
const (
	// MaxRouteMembers is the most members a table may list.
	MaxRouteMembers = 10_000
	// MaxRoutePartitions is the largest partition_count (the nodes'
	// default is 271).
	MaxRoutePartitions = 1 << 16
	// MaxRouteReplicationFactor is the largest replication_factor.
	MaxRouteReplicationFactor = 1000
	// MaxRouteRingWork bounds members² × replication_factor, counting
	// distinct non-empty member names: the ring library sorts its whole
	// ring again after adding each member, so building a ring costs about
	// that many steps (2,000 members at the default replication factor of
	// 20 take seconds; the bound, about 0.1 s and 10 MB). 2^20 admits 228
	// members at the default factor; the nodes' default of 271 partitions
	// holds at most 135.
	MaxRouteRingWork = 1 << 20
)

// Router places keys on a cluster's ring exactly as its nodes do, from a
// routing table (RateLimitService.Routes, or CheckResponse.routes): for a
// caller that sends checks itself (a load generator, a proxy in another
// language's client) and wants each at its key's owner. It is immutable
// and safe for concurrent use.
type Router struct {
	ring  *ring.Ring
	fp    string
	addrs map[string]string // member name -> gRPC address ("" when it advertised none)
}

// NewRouter builds a Router from rt. It returns an error naming the field
// when rt cannot be placed identically here: a hash other than xxhash64,
// another ring library version, a config the ring refuses (e.g.
// partition_count below 2 per member), no members, or a ring whose
// fingerprint differs from rt.ring_fingerprint. Such a table must not
// route: send the checks to any node.
func NewRouter(rt *sluicev1.RoutingTable) (*Router, error) {
	switch {
	case rt.GetHash() != "xxhash64":
		return nil, fmt.Errorf("routing table: hash: %q, but this client places keys with xxhash64", rt.GetHash())
	case rt.GetLibrary() != ring.Library:
		return nil, fmt.Errorf("routing table: library: %q, but this client has %s", rt.GetLibrary(), ring.Library)
	case len(rt.GetMembers()) == 0:
		return nil, errors.New("routing table: members: none")
	case len(rt.GetMembers()) > MaxRouteMembers:
		return nil, fmt.Errorf("routing table: members: %d, at most %d", len(rt.GetMembers()), MaxRouteMembers)
	case rt.GetPartitionCount() > MaxRoutePartitions:
		return nil, fmt.Errorf("routing table: partition_count: %d, at most %d", rt.GetPartitionCount(), MaxRoutePartitions)
	case rt.GetReplicationFactor() > MaxRouteReplicationFactor:
		return nil, fmt.Errorf("routing table: replication_factor: %d, at most %d", rt.GetReplicationFactor(), MaxRouteReplicationFactor)
	}
	names := make([]string, 0, len(rt.GetMembers()))
	addrs := make(map[string]string, len(rt.GetMembers()))
	for _, m := range rt.GetMembers() {
		names = append(names, m.GetName())
		addrs[m.GetName()] = m.GetGrpcAddr()
	}
	distinct := int64(len(addrs))
	if _, empty := addrs[""]; empty {
		distinct-- // the ring ignores empty names
	}
	rf := int64(rt.GetReplicationFactor())
	if rf == 0 {
		rf = ring.DefaultReplicationFactor
	}
	if work := distinct * distinct * max(rf, 1); work > MaxRouteRingWork {
		return nil, fmt.Errorf("routing table: members: %d with replication_factor %d, too many to build a ring from here (members² × replication_factor at most %d)",
			distinct, rt.GetReplicationFactor(), MaxRouteRingWork)
	}
	rg, err := ring.New(names, ring.Config{
		PartitionCount:    int(rt.GetPartitionCount()),
		ReplicationFactor: int(rt.GetReplicationFactor()),
		Load:              rt.GetLoad(),
		Regions:           rt.GetRegions(),
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("routing table: %w", err)
	case rg.Fingerprint() != rt.GetRingFingerprint():
		return nil, fmt.Errorf("routing table: ring_fingerprint: %q, but the ring built from the table has %q", rt.GetRingFingerprint(), rg.Fingerprint())
	}
	return &Router{ring: rg, fp: rg.Fingerprint(), addrs: addrs}, nil
}

// Owner returns the name of the member that owns the key of limit name,
// and its gRPC address ("" when the member advertised none).
func (r *Router) Owner(name, key string) (member, addr string) {
	member = r.member(name, key)
	return member, r.addrs[member]
}

// member returns the name of the member that owns the key of limit name.
func (r *Router) member(name, key string) string {
	var buf [96]byte
	return r.ring.Owner(ring.Key(buf[:0], name, key))
}

// Fingerprint returns the table's ring fingerprint: what a request
// routed by r sends as CheckRequest.routing_fingerprint.
func (r *Router) Fingerprint() string { return r.fp }

// Members returns the members' names, sorted. The caller must not modify
// it.
func (r *Router) Members() []string { return r.ring.Members() }

// Addr returns member's gRPC address ("" when unknown).
func (r *Router) Addr(member string) string { return r.addrs[member] }

// attempts returns the nodes a call tries, in order: first (its key's
// owner, when known and not skipped), then the nodes of Config.Addrs from
// the next in turn, the healthy ones first.
func (c *Client) attempts(first *node) []*node {
	rest := c.order()
	if first == nil || first.downUntil.Load() > c.cfg.Now().UnixNano() {
		return rest
	}
	out := make([]*node, 0, len(rest)+1)
	out = append(out, first)
	for _, n := range rest {
		if n != first {
			out = append(out, n)
		}
	}
	return out
}

// ownerShare is the part of the time left that a call gives its key's
// owner before it tries another node: the rest is for that node's answer.
const ownerShare = 2

// ownerDeadline returns the deadline of the first attempt of a call
// routed to its owner: half the time left before deadline, so a hung
// owner leaves time for another node.
func ownerDeadline(now, deadline time.Time) time.Time {
	return now.Add(deadline.Sub(now) / ownerShare)
}
