// Package lab runs a scenario's regions as a real sluice cluster in one
// process: rpc.StartNode nodes (real gRPC and memberlist on 127.0.0.1,
// ports the OS picks), a few per region, all given the scenario's region
// list, with the scenario's round-trip times put between regions on both
// gRPC and gossip by internal/wan, each region's nodes on a clock offset
// by the scenario's, and the scenario's cuts made by cutting the region's
// links. [Lab.Restart] stops a node (gracefully or as a crash) and starts
// it again under its name, as a deploy does. [Lab.Target] is the
// scenario.Target that sends each region's checks to that region's nodes
// and applies the scenario's cuts and restarts, so scenario.Run and
// scenario.NewReport measure the cluster against the central-limiter
// oracle (issue 19's runner; `sluice scenario --simulate` uses it).
//
// It is for tests and measurements on one machine: every node lives in
// this process, and the WAN is simulated (see internal/wan for what it
// delays and what it does not).
package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/wan"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/scenario"
)

// Config shapes a Lab.
type Config struct {
	// Plan gives the regions (names and weights), the round-trip time
	// between each pair and each region's clock offset. (Required)
	Plan *scenario.Plan
	// NodesPerRegion is how many nodes each region runs, 1..16. Default 1.
	// (Optional)
	NodesPerRegion int
	// RTTScale multiplies every round-trip time of the plan: 0 means 1;
	// a negative value runs without any WAN delay (the baseline a WAN run
	// is compared with). (Optional)
	RTTScale float64
	// Jitter is added to each one-way delay, uniform in [0, Jitter).
	// (Optional)
	Jitter time.Duration
	// Logger receives the nodes' logs. Default: discarded. (Optional)
	Logger *slog.Logger
	// Ready bounds the wait for every region's ring to hold its nodes and
	// agree. Default 30 s. (Optional)
	Ready time.Duration
	// LeaseBase is the nodes' rpc.NodeConfig.LeaseBase: the part of a
	// global limit the regions own as bases, (0, 1]; 1 is fixed slices,
	// no leases. 0: the default, rpc.DefaultLeaseBase. (Optional)
	LeaseBase float64
}

// Lab is a running multi-region cluster. Close it when done.
type Lab struct {
	// Net is the simulated WAN between the regions.
	Net     *wan.Net
	plan    *scenario.Plan
	regions *region.Config
	ready   time.Duration // Config.Ready

	restartMu sync.Mutex // one Restart at a time

	mu      sync.Mutex
	nodes   map[string][]*rpc.Node    // by region, in start order; a restarted node takes its old place
	region  map[string]string         // node name -> region
	configs map[string]rpc.NodeConfig // node name -> the config Start gave it (Restart reuses it)
	retired []*rpc.Node               // nodes a restart replaced: their counters still count
	targets map[*Target]struct{}      // open Targets, re-pointed on a restart
	closed  bool
}

// offsetClock is a region's clock: the system clock plus the region's
// offset.
type offsetClock struct{ d time.Duration }

func (c offsetClock) Now() time.Time { return time.Now().Add(c.d) }

// Start starts the cluster of cfg and returns once every node's ring
// holds exactly its region's nodes and they agree (within cfg.Ready). It
// returns an error naming the node that could not start, or what did not
// converge; nothing is left running then.
func Start(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Plan == nil {
		return nil, errors.New("lab: plan: required")
	}
	if cfg.NodesPerRegion == 0 {
		cfg.NodesPerRegion = 1
	}
	if cfg.NodesPerRegion < 1 || cfg.NodesPerRegion > 16 {
		return nil, fmt.Errorf("lab: nodes per region: want 1..16, got %d", cfg.NodesPerRegion)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Ready <= 0 {
		cfg.Ready = 30 * time.Second
	}
	scale := cfg.RTTScale
	if scale == 0 {
		scale = 1
	}
	p := cfg.Plan
	regions := p.Regions
	l := &Lab{Net: wan.New(int64(len(p.Checks))), plan: p, regions: regions, ready: cfg.Ready,
		nodes: map[string][]*rpc.Node{}, region: map[string]string{}, configs: map[string]rpc.NodeConfig{},
		targets: map[*Target]struct{}{}}
	names := p.RegionNames()
	for i, a := range names {
		for _, b := range names[i+1:] {
			rtt := time.Duration(float64(p.RTT(a, b)) * scale)
			if scale < 0 {
				rtt = 0
			}
			l.Net.SetRTT(a, b, rtt, cfg.Jitter)
			if p.Scenario.Loss > 0 {
				l.Net.SetLoss(a, b, p.Scenario.Loss)
			}
		}
	}
	var seed string
	for _, r := range names {
		for i := range cfg.NodesPerRegion {
			name := fmt.Sprintf("%s-%d", r, i+1)
			tr, err := l.Net.Transport(r, "127.0.0.1:0")
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("lab: %s: gossip transport: %w", name, err)
			}
			nc := rpc.NodeConfig{
				Name: name, Region: r, Regions: regions,
				GRPCAddr: "127.0.0.1:0", GossipTransport: tr, DialOptions: l.Net.DialOptions(r),
				Clock: offsetClock{p.ClockOffset(r)}, Logger: cfg.Logger, LeaveTimeout: time.Second,
				LeaseBase: cfg.LeaseBase,
			}
			l.configs[name] = nc
			if seed != "" {
				nc.Join = []string{seed}
			}
			n, err := rpc.StartNode(nc)
			if err != nil {
				_ = tr.Shutdown()
				l.Close()
				return nil, fmt.Errorf("lab: %s: %w", name, err)
			}
			l.Net.Register(n.GRPCAddr(), r)
			l.nodes[r] = append(l.nodes[r], n)
			l.region[name] = r
			if seed == "" {
				seed = n.GossipAddr()
			}
		}
	}
	if err := l.waitReady(ctx, cfg.Ready, nil); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// waitReady waits until every node is ready and sees every node of the
// cluster, and each region's nodes have one ring of exactly them; with
// fresh set, also until every node sees fresh (a restarted node) at its
// new gRPC address, alive: not the process it replaced, which a node may
// still list while gossip has not declared it dead or the restarted one
// has not refuted it yet. It gives up early when fresh fails (its name
// refused).
func (l *Lab) waitReady(ctx context.Context, within time.Duration, fresh *rpc.Node) error {
	deadline := time.Now().Add(within)
	var why string
	for {
		if fresh != nil {
			select {
			case err := <-fresh.Failed():
				return fmt.Errorf("lab: %s: %w", fresh.Name(), err)
			default:
			}
		}
		why = l.notReady(ctx, fresh)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("lab: the cluster did not converge in %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// snapshot returns a copy of the nodes by region and how many there are.
func (l *Lab) snapshot() (map[string][]*rpc.Node, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]*rpc.Node, len(l.nodes))
	for r, ns := range l.nodes {
		out[r] = slices.Clone(ns)
	}
	return out, len(l.region)
}

// notReady says what is not ready yet ("" when all is); see waitReady
// for fresh.
func (l *Lab) notReady(ctx context.Context, fresh *rpc.Node) string {
	nodes, total := l.snapshot()
	for r, ns := range nodes {
		fp := ""
		for _, n := range ns {
			if err := n.Ready(); err != nil {
				return n.Name() + ": " + err.Error()
			}
			resp, err := n.Server().Members(ctx, &sluicev1.MembersRequest{})
			if err != nil {
				return n.Name() + ": " + err.Error()
			}
			if len(resp.Members) != total {
				return fmt.Sprintf("%s sees %d of %d members", n.Name(), len(resp.Members), total)
			}
			if fresh != nil {
				i := slices.IndexFunc(resp.Members, func(m *sluicev1.Member) bool { return m.Name == fresh.Name() })
				if i < 0 || resp.Members[i].GrpcAddr != fresh.GRPCAddr() || resp.Members[i].State != "alive" {
					return fmt.Sprintf("%s does not see the restarted %s at %s yet", n.Name(), fresh.Name(), fresh.GRPCAddr())
				}
			}
			var inRing []string
			for _, m := range resp.Members {
				if m.RingShare > 0 {
					inRing = append(inRing, m.Name)
				}
			}
			if len(inRing) != len(ns) {
				return fmt.Sprintf("%s's ring holds %v, want the %d nodes of %s", n.Name(), inRing, len(ns), r)
			}
			if fp == "" {
				fp = resp.RingFingerprint
			} else if resp.RingFingerprint != fp {
				return fmt.Sprintf("the rings of region %s disagree", r)
			}
		}
	}
	return ""
}

// RestartKind is how [Lab.Restart] stops a node.
type RestartKind int

const (
	// Graceful stops the node as SIGTERM does (rpc.Node.Close): it hands
	// its keys off and leaves the cluster.
	Graceful RestartKind = iota
	// Kill stops it as a crash does (rpc.Node.Kill): no hand-off, no
	// leave; its state is lost and the others learn of it by gossip.
	Kill
)

// String returns "graceful" or "kill", as scenario.Restart.How spells them.
func (k RestartKind) String() string {
	switch k {
	case Graceful:
		return scenario.RestartGraceful
	case Kill:
		return scenario.RestartKill
	}
	return fmt.Sprintf("RestartKind(%d)", int(k))
}

// Restart restarts the node called name as a deploy does: it stops it
// (how), waits down, then starts a new process of it: the same name,
// region, region list, clock, lease base and other settings as Start gave
// it, none of its state, a new gRPC port, and its old gossip address when
// that can be bound again (as a process restarted on its host; else a new
// one), joining the live nodes (those of its region first). It returns
// once the new node is ready and every node sees it alive at its new
// address and agrees on its region's ring, within twice Config.Ready:
// after a Kill the others may still list the old process (gossip has not
// declared it dead); at the old gossip address the new one refutes it, at
// a new one the cluster admits it once the old is dead.
//
// The lab's Targets follow: while the node is down, a region with other
// nodes sends its checks to them (a load balancer that took the node out);
// a region of one node keeps sending to the stopped node, and those checks
// fail (errors, not answers); once the node is back, every node of the
// region takes checks again, the restarted one at its new address.
//
// A graceful stop's own error (an incomplete hand-off) is not Restart's:
// the node stopped all the same. Restarts are applied one at a time. A
// node stopped and never started again (ctx ended while it was down, or
// the new process failed) stays in place, stopped; the error says why.
func (l *Lab) Restart(ctx context.Context, name string, how RestartKind, down time.Duration) error {
	if how != Graceful && how != Kill {
		return fmt.Errorf("lab: restart %s: unknown kind %d", name, int(how))
	}
	if down < 0 {
		return fmt.Errorf("lab: restart %s: down must be >= 0, got %s", name, down)
	}
	l.restartMu.Lock()
	defer l.restartMu.Unlock()
	l.mu.Lock()
	r, ok := l.region[name]
	nc := l.configs[name]
	idx := slices.IndexFunc(l.nodes[r], func(n *rpc.Node) bool { return n.Name() == name })
	closed := l.closed
	var old *rpc.Node
	var others []string // the region's other nodes' gRPC addresses
	if ok && idx >= 0 {
		old = l.nodes[r][idx]
		for _, n := range l.nodes[r] {
			if n != old {
				others = append(others, n.GRPCAddr())
			}
		}
	}
	l.mu.Unlock()
	switch {
	case !ok || old == nil:
		return fmt.Errorf("lab: restart: no node %q", name)
	case closed:
		return fmt.Errorf("lab: restart %s: the lab is closed", name)
	}
	if len(others) > 0 {
		l.repoint(r, others)
	}
	gossip := old.GossipAddr()
	switch how {
	case Graceful:
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = old.Close(cctx)
		cancel()
	case Kill:
		old.Kill()
	}
	if down > 0 {
		t := time.NewTimer(down)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lab: restart %s: stopped, not started again: %w", name, ctx.Err())
		case <-t.C:
		}
	}

	// The new process: the old gossip address if it binds again.
	var tr memberlist.Transport
	var err error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(50 * time.Millisecond) {
		if tr, err = l.Net.Transport(r, gossip); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		if tr, err = l.Net.Transport(r, "127.0.0.1:0"); err != nil {
			return fmt.Errorf("lab: restart %s: gossip transport: %w", name, err)
		}
	}
	nc.GossipTransport = tr
	nc.GRPCAddr = "127.0.0.1:0"
	nc.Join = l.seeds(r, name)
	n, err := rpc.StartNode(nc)
	if err != nil {
		_ = tr.Shutdown()
		return fmt.Errorf("lab: restart %s: %w", name, err)
	}
	l.Net.Register(n.GRPCAddr(), r)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		n.Kill()
		return fmt.Errorf("lab: restart %s: the lab was closed meanwhile", name)
	}
	l.nodes[r][idx] = n
	l.retired = append(l.retired, old)
	l.mu.Unlock()
	err = l.waitReady(ctx, 2*l.ready, n)
	l.mu.Lock()
	var addrs []string
	for _, m := range l.nodes[r] {
		addrs = append(addrs, m.GRPCAddr())
	}
	l.mu.Unlock()
	l.repoint(r, addrs)
	if err != nil {
		return fmt.Errorf("lab: restart %s: %w", name, err)
	}
	return nil
}

// seeds returns the gossip addresses a restarted node (name, of region r)
// joins: the other nodes of its region first (a region cut off can still
// reach them), then the others, in region order.
func (l *Lab) seeds(r, name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	add := func(reg string) {
		for _, n := range l.nodes[reg] {
			if n.Name() != name {
				out = append(out, n.GossipAddr())
			}
		}
	}
	add(r)
	for _, reg := range l.plan.RegionNames() {
		if reg != r {
			add(reg)
		}
	}
	return out
}

// repoint sends region r's checks of every open Target to addrs from now
// on.
func (l *Lab) repoint(r string, addrs []string) {
	l.mu.Lock()
	ts := slices.Collect(maps.Keys(l.targets))
	l.mu.Unlock()
	for _, t := range ts {
		_ = t.SetAddrs(r, addrs) // addresses the lab's nodes bound: valid
	}
}

// Nodes returns the nodes of region r, in start order (a restarted node
// in the place of the one it replaced; during a restart, the stopped one).
func (l *Lab) Nodes(r string) []*rpc.Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.nodes[r])
}

// all returns every node that ran in the lab, those replaced by restarts
// too (their counters still count), and each one's region.
func (l *Lab) all() map[*rpc.Node]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[*rpc.Node]string{}
	for r, ns := range l.nodes {
		for _, n := range ns {
			out[n] = r
		}
	}
	for _, n := range l.retired {
		out[n] = l.region[n.Name()]
	}
	return out
}

// Regions returns the cluster's region list.
func (l *Lab) Regions() *region.Config { return l.regions }

// CrossRegionForwards returns the checks the nodes have sent to nodes of
// another region so far (their forwards' checks, by peer), and the
// messages that took: each forward call and its answer (a batch of
// checks is one call). That is the request path's cross-region traffic.
// Gossip, which crosses regions off the request path, is not counted
// (Net.Messages counts it). Nodes that restarts replaced count too.
func (l *Lab) CrossRegionForwards() (checks, messages int64) {
	l.mu.Lock()
	regionOf := maps.Clone(l.region)
	l.mu.Unlock()
	for node, r := range l.all() {
		for peer, ps := range node.Server().Stats().Peers {
			if regionOf[peer] != r {
				checks += ps.Checks
				messages += 2 * ps.Batches
			}
		}
	}
	return checks, messages
}

// LeaseMessages returns the lease messages the nodes have sent to other
// nodes so far (package rpc's leases: requests, grants, lowers, acks;
// batched in calls) and the replies they answered them with. With one
// node per region every one crosses regions; with more, those to a node
// of the same region are counted too, and so do nodes that restarts
// replaced.
func (l *Lab) LeaseMessages() int64 {
	var n int64
	for node := range l.all() {
		st := node.Server().Stats()
		n += st.LeaseMessages + st.LeaseReplies
	}
	return n
}

// Close stops every node (a graceful stop, bounded) and the WAN. A
// Restart under way when Close is called stops the node it started.
func (l *Lab) Close() {
	l.mu.Lock()
	l.closed = true
	nodes := maps.Clone(l.nodes)
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, ns := range nodes {
		for _, n := range ns {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = n.Close(ctx)
			})
		}
	}
	wg.Wait()
	_ = l.Net.Close()
}

// Target returns the scenario.Target that sends each region's checks to
// that region's nodes (round robin, through the client package), with the
// plan's limit under name (a run id appended by the caller keeps runs
// apart) and its scope. It also cuts a region off (scenario.Cutter, on the
// WAN), restarts nodes (scenario.Restarter, by Lab.Restart; it follows
// every restart, by Lab.Restart or its own, to the node's new address)
// and counts the cross-region forwards (scenario.MessageCounter). Close it
// when done.
func (l *Lab) Target(name string, timeout time.Duration) (*Target, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	addrs := map[string][]string{}
	for r, ns := range l.nodes {
		for _, n := range ns {
			addrs[r] = append(addrs[r], n.GRPCAddr())
		}
	}
	t, err := NewClientTarget(l.plan.Limit, name, addrs, timeout, nil)
	if err != nil {
		return nil, err
	}
	lt := &Target{ClientTarget: t, lab: l}
	l.targets[lt] = struct{}{}
	return lt, nil
}

// Target is a ClientTarget to a Lab's nodes that also cuts regions off on
// the lab's WAN (scenario.Cutter), restarts nodes (scenario.Restarter)
// and counts the cross-region forwards (scenario.MessageCounter). Make it
// with [Lab.Target].
type Target struct {
	*ClientTarget
	lab *Lab
}

// ClientTarget is a scenario.Target over the client package: a client per
// region, connected to that region's nodes.
type ClientTarget struct {
	spec    scenario.Spec
	name    string
	timeout time.Duration
	dial    []grpc.DialOption

	mu      sync.RWMutex
	clients map[string]*client.Client // by region: where checks go now
	mine    []*client.Client          // the clients this Target made (replaced ones too): Close closes them
	closed  bool
}

// NewClientTarget returns a Target sending the checks of spec, under
// name, to the nodes addrs[region] (host:port each) of each region, each
// call within timeout; dial adds options to every connection (TLS,
// tokens). It returns the client package's error for a bad address.
func NewClientTarget(spec scenario.Spec, name string, addrs map[string][]string, timeout time.Duration, dial []grpc.DialOption) (*ClientTarget, error) {
	t := &ClientTarget{spec: spec, name: name, timeout: timeout, dial: dial, clients: map[string]*client.Client{}}
	for _, r := range slices.Sorted(maps.Keys(addrs)) {
		if err := t.SetAddrs(r, addrs[r]); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// SetAddrs sends region reg's checks to the nodes addrs (host:port each)
// from now on, through a new client (made as NewClientTarget makes them;
// for a ClientTargetOf target, with the client package's default timeout
// and plain-text connections). Checks in flight finish on the client they
// began on; Close closes it. It returns the client package's error for a
// bad address (the region's checks then go where they went), or
// client.ErrClosed after Close.
func (t *ClientTarget) SetAddrs(reg string, addrs []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return client.ErrClosed
	}
	c, err := client.New(client.Config{
		Addrs: addrs, Timeout: t.timeout, FailureMode: client.FailOpen,
		Logger: slog.New(slog.DiscardHandler), DialOptions: t.dial,
		// The region's nodes in turn: the scenarios' entry paths (and
		// their delays) are the ones they were written for.
		Route: client.RouteAny,
	})
	if err != nil {
		return fmt.Errorf("region %s: %w", reg, err)
	}
	t.clients[reg] = c
	t.mine = append(t.mine, c)
	return nil
}

// ClientTargetOf returns the Target sending the checks of spec, under
// name, through clients[region] for each region: clients the caller made
// (its own dial options, its own use of them besides) and keeps: it closes
// them, not the Target's Close.
func ClientTargetOf(spec scenario.Spec, name string, clients map[string]*client.Client) *ClientTarget {
	return &ClientTarget{spec: spec, name: name, clients: maps.Clone(clients)}
}

// Check implements scenario.Target. A check the nodes could not answer
// (the client's fail-open answer carries its cause) is an error: the
// report counts it as failed, not as admitted.
func (t *ClientTarget) Check(ctx context.Context, reg, key string, hits int64) (scenario.Answer, error) {
	t.mu.RLock()
	c, ok := t.clients[reg]
	t.mu.RUnlock()
	if !ok {
		return scenario.Answer{}, fmt.Errorf("no nodes for region %q", reg)
	}
	d, err := c.Check(ctx, client.Check{
		Name: t.name, Key: key, Hits: hits, Scope: client.Scope(t.spec.Scope.String()),
		Limit: &client.Limit{Limit: t.spec.Limit, Window: t.spec.Window, Burst: t.spec.Burst, Algorithm: client.Algorithm(t.spec.Algorithm.String())},
	})
	if err == nil && d.Cause != nil {
		err = d.Cause
	}
	if err != nil {
		return scenario.Answer{}, err
	}
	sc, _ := region.ParseScope(string(d.Scope)) // "" (a node that says none): Unspecified
	return scenario.Answer{
		Allowed: d.Allowed, Degraded: d.Degraded, SliceExhausted: d.SliceExhausted, Region: d.Region, Scope: sc,
		Limit: d.Limit, Slice: d.Slice, Remaining: d.Remaining, ResetTime: d.ResetTime.UnixMilli(),
	}, nil
}

// Cut implements scenario.Cutter on the lab's WAN.
func (t *Target) Cut(r string) error {
	t.lab.Net.Cut(r)
	return nil
}

// Heal implements scenario.Cutter.
func (t *Target) Heal(r string) error {
	t.lab.Net.Heal(r)
	return nil
}

// Restart implements scenario.Restarter by Lab.Restart of node r.Node of
// region r.Region (its index in Lab.Nodes).
func (t *Target) Restart(ctx context.Context, r scenario.Restart) error {
	ns := t.lab.Nodes(r.Region)
	if r.Node < 0 || r.Node >= len(ns) {
		return fmt.Errorf("lab: region %s has %d nodes: no node %d to restart", r.Region, len(ns), r.Node)
	}
	how := Graceful
	if r.Kill() {
		how = Kill
	}
	return t.lab.Restart(ctx, ns[r.Node].Name(), how, r.Down)
}

// Close closes the Target's clients; the lab stops following it.
func (t *Target) Close() {
	t.lab.mu.Lock()
	delete(t.lab.targets, t)
	t.lab.mu.Unlock()
	t.ClientTarget.Close()
}

// CrossRegionMessages implements scenario.MessageCounter: the forward
// calls across regions and their answers (Lab.CrossRegionForwards), and
// the lease messages (Lab.LeaseMessages).
func (t *Target) CrossRegionMessages() int64 {
	_, m := t.lab.CrossRegionForwards()
	return m + t.lab.LeaseMessages()
}

// A ClientTarget alone cannot cut regions off, restart nodes or count
// messages: the runner refuses (or, told to ignore them, skips) a
// scenario's cuts and restarts.
var (
	_ scenario.Target         = (*ClientTarget)(nil)
	_ scenario.Cutter         = (*Target)(nil)
	_ scenario.Restarter      = (*Target)(nil)
	_ scenario.MessageCounter = (*Target)(nil)
)

// Close closes the clients it made (not those given to ClientTargetOf).
func (t *ClientTarget) Close() {
	t.mu.Lock()
	mine := t.mine
	t.mine, t.closed = nil, true
	t.mu.Unlock()
	for _, c := range mine {
		c.Close()
	}
}

// Describe returns the lab's layout for a report's header, e.g.
// "3 regions x 3 nodes (us-east, eu-west, ap-south)".
func (l *Lab) Describe() string {
	names := l.plan.RegionNames()
	return fmt.Sprintf("%d regions x %d nodes (%s)", len(names), len(l.Nodes(names[0])), strings.Join(names, ", "))
}
