// Package lab runs a scenario's regions as a real sluice cluster in one
// process: rpc.StartNode nodes (real gRPC and memberlist on 127.0.0.1,
// ports the OS picks), a few per region, all given the scenario's region
// list, with the scenario's round-trip times put between regions on both
// gRPC and gossip by internal/wan, each region's nodes on a clock offset
// by the scenario's, and the scenario's cuts made by cutting the region's
// links. [Lab.Target] is the scenario.Target that sends each region's
// checks to that region's nodes, so scenario.Run and scenario.NewReport
// measure the cluster against the central-limiter oracle (issue 19's
// runner; `sluice scenario --simulate` uses it).
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
	nodes   map[string][]*rpc.Node // by region, in start order
	region  map[string]string      // node name -> region
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
	l := &Lab{Net: wan.New(int64(len(p.Checks))), plan: p, regions: regions,
		nodes: map[string][]*rpc.Node{}, region: map[string]string{}}
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
	if err := l.waitReady(ctx, cfg.Ready); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// waitReady waits until every node is ready and sees every node of the
// cluster, and each region's nodes have one ring of exactly them.
func (l *Lab) waitReady(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	total := len(l.region)
	var why string
	for {
		why = l.notReady(ctx, total)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("lab: the cluster did not converge in %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notReady says what is not ready yet ("" when all is).
func (l *Lab) notReady(ctx context.Context, total int) string {
	for r, ns := range l.nodes {
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

// Nodes returns the nodes of region r, in start order.
func (l *Lab) Nodes(r string) []*rpc.Node { return slices.Clone(l.nodes[r]) }

// Regions returns the cluster's region list.
func (l *Lab) Regions() *region.Config { return l.regions }

// CrossRegionForwards returns the checks the nodes have sent to nodes of
// another region so far (their forwards' checks, by peer), and the
// messages that took: each forward call and its answer (a batch of
// checks is one call). That is the request path's cross-region traffic.
// Gossip, which crosses regions off the request path, is not counted
// (Net.Messages counts it).
func (l *Lab) CrossRegionForwards() (checks, messages int64) {
	for r, ns := range l.nodes {
		for _, node := range ns {
			for peer, ps := range node.Server().Stats().Peers {
				if l.region[peer] != r {
					checks += ps.Checks
					messages += 2 * ps.Batches
				}
			}
		}
	}
	return checks, messages
}

// LeaseMessages returns the lease messages the nodes have sent to other
// nodes so far (package rpc's leases: requests, grants, lowers, acks;
// batched in calls) and the replies they answered them with. With one
// node per region every one crosses regions; with more, those to a node
// of the same region are counted too.
func (l *Lab) LeaseMessages() int64 {
	var n int64
	for _, ns := range l.nodes {
		for _, node := range ns {
			st := node.Server().Stats()
			n += st.LeaseMessages + st.LeaseReplies
		}
	}
	return n
}

// Close stops every node (a graceful stop, bounded) and the WAN.
func (l *Lab) Close() {
	var wg sync.WaitGroup
	for _, ns := range l.nodes {
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
// WAN) and counts the cross-region forwards (scenario.MessageCounter).
// Close it when done.
func (l *Lab) Target(name string, timeout time.Duration) (*Target, error) {
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
	return &Target{ClientTarget: t, lab: l}, nil
}

// Target is a ClientTarget to a Lab's nodes that also cuts regions off on
// the lab's WAN (scenario.Cutter) and counts the cross-region forwards
// (scenario.MessageCounter). Make it with [Lab.Target].
type Target struct {
	*ClientTarget
	lab *Lab
}

// ClientTarget is a scenario.Target over the client package: a client per
// region, connected to that region's nodes.
type ClientTarget struct {
	spec     scenario.Spec
	name     string
	clients  map[string]*client.Client
	borrowed bool // ClientTargetOf's: the caller closes the clients
}

// NewClientTarget returns a Target sending the checks of spec, under
// name, to the nodes addrs[region] (host:port each) of each region, each
// call within timeout; dial adds options to every connection (TLS,
// tokens). It returns the client package's error for a bad address.
func NewClientTarget(spec scenario.Spec, name string, addrs map[string][]string, timeout time.Duration, dial []grpc.DialOption) (*ClientTarget, error) {
	t := &ClientTarget{spec: spec, name: name, clients: map[string]*client.Client{}}
	for _, r := range slices.Sorted(maps.Keys(addrs)) {
		c, err := client.New(client.Config{
			Addrs: addrs[r], Timeout: timeout, FailureMode: client.FailOpen,
			Logger: slog.New(slog.DiscardHandler), DialOptions: dial,
			// The region's nodes in turn: the scenarios' entry paths (and
			// their delays) are the ones they were written for.
			Route: client.RouteAny,
		})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("region %s: %w", r, err)
		}
		t.clients[r] = c
	}
	return t, nil
}

// ClientTargetOf returns the Target sending the checks of spec, under
// name, through clients[region] for each region: clients the caller made
// (its own dial options, its own use of them besides) and keeps: it closes
// them, not the Target's Close.
func ClientTargetOf(spec scenario.Spec, name string, clients map[string]*client.Client) *ClientTarget {
	return &ClientTarget{spec: spec, name: name, clients: clients, borrowed: true}
}

// Check implements scenario.Target. A check the nodes could not answer
// (the client's fail-open answer carries its cause) is an error: the
// report counts it as failed, not as admitted.
func (t *ClientTarget) Check(ctx context.Context, reg, key string, hits int64) (scenario.Answer, error) {
	c, ok := t.clients[reg]
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

// CrossRegionMessages implements scenario.MessageCounter: the forward
// calls across regions and their answers (Lab.CrossRegionForwards), and
// the lease messages (Lab.LeaseMessages).
func (t *Target) CrossRegionMessages() int64 {
	_, m := t.lab.CrossRegionForwards()
	return m + t.lab.LeaseMessages()
}

// A ClientTarget alone cannot cut regions off or count messages: the
// runner refuses (or, told to ignore cuts, skips) a scenario's cuts.
var (
	_ scenario.Target         = (*ClientTarget)(nil)
	_ scenario.Cutter         = (*Target)(nil)
	_ scenario.MessageCounter = (*Target)(nil)
)

// Close closes the clients (not those given to ClientTargetOf).
func (t *ClientTarget) Close() {
	if t.borrowed {
		return
	}
	for _, c := range t.clients {
		c.Close()
	}
}

// Describe returns the lab's layout for a report's header, e.g.
// "3 regions x 3 nodes (us-east, eu-west, ap-south)".
func (l *Lab) Describe() string {
	names := l.plan.RegionNames()
	return fmt.Sprintf("%d regions x %d nodes (%s)", len(names), len(l.nodes[names[0]]), strings.Join(names, ", "))
}
