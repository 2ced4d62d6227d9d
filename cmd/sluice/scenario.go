package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/scenario"
	"github.com/sluicehq/sluice/scenario/lab"
)

func scenarioCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "scenario",
		Usage: "run a multi-region scenario against nodes and compare what they admit with one central limiter",
		Description: "Reads a scenario (YAML: regions, round-trip times, the limit and its scope, keys,\n" +
			"arrivals per region, cuts, clock offsets; see scenario/testdata) and sends each region's\n" +
			"checks, at their times, to that region's nodes (--region), with the scenario's scope.\n" +
			"Then it feeds the same checks in global time order to one central limiter (the oracle)\n" +
			"and reports, per key and window: admitted, over-admission (beyond the limit), and\n" +
			"under-admission (denied where the oracle allowed); per region the latency; in all the\n" +
			"slice_exhausted, degraded and failed checks. The run starts at the next window's start\n" +
			"and stops by itself (the scenario's duration plus --timeout at most); --start-now starts it\n" +
			"at once, mid-window (a limit of an hour would otherwise wait up to an hour).\n" +
			"The round-trip times and clock offsets of a scenario are the network's and the nodes'\n" +
			"business here: this command only uses them to place each check in the window its\n" +
			"deciding region saw. It cannot cut regions off or restart nodes either: a scenario with\n" +
			"cuts is refused unless --ignore-cuts (cut the network yourself, e.g. with netem), one with\n" +
			"restarts unless --ignore-restarts (restart the nodes yourself). --simulate applies both:\n" +
			"a restart stops the node (graceful: as SIGTERM; kill: a crash), keeps it down for its\n" +
			"down time and starts it again under its name, one restart at a time (a rolling deploy).\n" +
			"Each run uses the scenario's limit name plus a run id, so runs do not share counts.\n" +
			"Exit status: 0, 1 when the over-admission exceeds the scope's bound (global and exact:\n" +
			"0; regional: (regions-1) x limit per window) or a call fails, 2 on invalid input.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "file", Usage: "the scenario, a YAML file (required)"},
			// No SLUICE_REGION: that is serve's --region (this node's region).
			&cli.StringFlag{Name: "region", Usage: "each region's node addresses, REGION=H:P[,REGION=H:P...]; list a region again for more nodes (required: every region of the scenario, unless --simulate)"},
			&cli.StringFlag{Name: "scope", Usage: "run with this scope instead of the scenario's: global, regional or exact"},
			&cli.IntFlag{Name: "concurrency", Value: 64, Usage: "checks in flight per region at most (a check waits for a free slot; the report uses its actual send time)"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "deadline of each check", Sources: e.of("timeout")},
			&cli.BoolFlag{Name: "ignore-cuts", Usage: "run a scenario that has cuts without them (the report says they were not enforced)"},
			&cli.BoolFlag{Name: "ignore-restarts", Usage: "run a scenario that has restarts without them (the report says they were not enforced)"},
			&cli.BoolFlag{Name: "start-now", Usage: "start the run at once, mid-window, instead of at the next start of a window of the limit"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as one JSON object"},
			&cli.BoolFlag{Name: "simulate", Usage: "start the scenario's regions as a cluster in this process (real nodes on 127.0.0.1, the scenario's round-trip times simulated on their gRPC and gossip, its clock offsets and cuts applied) instead of --region's nodes"},
			&cli.IntFlag{Name: "nodes-per-region", Value: 1, Usage: "with --simulate: nodes per region (1..16)"},
			&cli.BoolFlag{Name: "no-wan", Usage: "with --simulate: no delay between regions (the baseline a WAN run's latency is compared with)"},
			&cli.BoolFlag{Name: "settle", Usage: "with --simulate: start the load once the nodes' lease allocators are past their learning horizon (for 1 s windows, 23 s after the start), to measure a running cluster rather than its first seconds"},
			&cli.FloatFlag{Name: "lease-base", Value: rpc.DefaultLeaseBase, Usage: "with --simulate: the nodes' --lease-base, the part (0 < f <= 1) of a global limit the regions own as bases; 1: fixed slices, no leases"},
		}, clientAuthFlags(e)...),
		Action: runScenario,
	}
}

func runScenario(ctx context.Context, cmd *cli.Command) error {
	if err := noArgs(cmd); err != nil {
		return err
	}
	file := cmd.String("file")
	if file == "" {
		return usagef("file", "required")
	}
	s, err := scenario.Load(file)
	if err != nil {
		return usagef("file", "%v", err)
	}
	if sc := cmd.String("scope"); sc != "" {
		if _, err := region.ParseScope(sc); err != nil {
			return usagef("scope", "%v", err)
		}
		s.Limit.Scope = sc
	}
	p, err := scenario.NewPlan(s)
	if err != nil {
		return usagef("file", "%s: %v", file, err)
	}
	simulate := cmd.Bool("simulate")
	conc, timeout, perRegion := cmd.Int("concurrency"), cmd.Duration("timeout"), cmd.Int("nodes-per-region")
	switch {
	case conc < 1 || conc > 10000:
		return usagef("concurrency", "must be in 1..10000, got %d", conc)
	case timeout <= 0:
		return usagef("timeout", "must be > 0, got %s", timeout)
	case simulate && cmd.String("region") != "":
		return usagef("region", "--simulate starts its own nodes: give no --region")
	case !simulate && (cmd.IsSet("nodes-per-region") || cmd.Bool("no-wan") || cmd.Bool("settle")):
		return usagef("nodes-per-region", "--nodes-per-region, --no-wan and --settle apply to --simulate only")
	case !simulate && cmd.IsSet("lease-base"):
		return usagef("lease-base", "applies to --simulate only (a cluster's nodes take it from sluice serve --lease-base)")
	case !(cmd.Float("lease-base") > 0 && cmd.Float("lease-base") <= 1):
		return usagef("lease-base", "must be in (0, 1], got %v", cmd.Float("lease-base"))
	case perRegion < 1 || perRegion > 16:
		return usagef("nodes-per-region", "must be in 1..16, got %d", perRegion)
	}
	name := p.Limit.Name + "." + strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36)
	var (
		target interface {
			scenario.Target
			Close()
		}
		l *lab.Lab
	)
	if simulate {
		scale := 1.0
		if cmd.Bool("no-wan") {
			scale = -1
		}
		l, err = lab.Start(ctx, lab.Config{Plan: p, NodesPerRegion: perRegion, RTTScale: scale, LeaseBase: cmd.Float("lease-base")})
		if err != nil {
			return err
		}
		defer l.Close()
		lt, err := l.Target(name, timeout)
		if err != nil {
			return err
		}
		target = lt
		fmt.Fprintf(cmd.Root().ErrWriter, "sluice: simulating %s in this process, round trips %s\n", l.Describe(), rttOf(p, cmd.Bool("no-wan")))
		if cmd.Bool("settle") {
			d := rpc.LeaseLearningHorizon(p.Limit.Window)
			fmt.Fprintf(cmd.Root().ErrWriter, "sluice: settling for %s (the lease allocators' learning horizon)\n", d)
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	} else {
		addrs, err := parseRegionAddrs(cmd.String("region"), p.RegionNames())
		if err != nil {
			return err
		}
		if len(p.Cuts) > 0 {
			var cuts []string
			for _, c := range p.Cuts {
				cuts = append(cuts, fmt.Sprintf("%s from %s to %s", c.Region, c.From, c.To))
			}
			if !cmd.Bool("ignore-cuts") {
				return usagef("file", "scenario %q cuts regions off (%s), which this command cannot do to real nodes "+
					"(it would have to partition their network): give --ignore-cuts to run it without the cuts, "+
					"cut the network yourself (e.g. tc netem) and give --ignore-cuts, or run it with --simulate", s.Name, strings.Join(cuts, "; "))
			}
			fmt.Fprintf(cmd.Root().ErrWriter, "sluice: warning: cuts not enforced (%s): this command cannot cut regions off\n", strings.Join(cuts, "; "))
		}
		if len(p.Restarts) > 0 {
			var rs []string
			for _, r := range p.Restarts {
				rs = append(rs, fmt.Sprintf("%s node %d at %s", r.Region, r.Node, r.At))
			}
			if !cmd.Bool("ignore-restarts") {
				return usagef("file", "scenario %q restarts nodes (%s), which this command cannot do to real nodes: "+
					"give --ignore-restarts to run it without them (restart the nodes yourself at those times), "+
					"or run it with --simulate", s.Name, strings.Join(rs, "; "))
			}
			fmt.Fprintf(cmd.Root().ErrWriter, "sluice: warning: restarts not enforced (%s): this command cannot restart real nodes\n", strings.Join(rs, "; "))
		}
		if p.Scenario.Loss > 0 {
			fmt.Fprintf(cmd.Root().ErrWriter, "sluice: warning: loss %v not applied: this command cannot drop real nodes' packets (use tc netem, or --simulate)\n", p.Scenario.Loss)
		}
		opts, err := dialOptions(cmd)
		if err != nil {
			return err
		}
		for _, r := range p.RegionNames() {
			for _, a := range addrs[r] {
				conn, err := dialNode(cmd, a, rpc.WindowDialOptions()...)
				if err != nil {
					return err
				}
				_, err = waitServing(ctx, sluicev1.NewRateLimitServiceClient(conn), a, timeout)
				conn.Close()
				if err != nil {
					return err
				}
			}
		}
		ct, err := lab.NewClientTarget(p.Limit, name, addrs, timeout, opts)
		if err != nil {
			return err
		}
		target = ct
	}
	defer target.Close()
	opts := scenario.Options{Workers: conc, Timeout: timeout, IgnoreCuts: !simulate, IgnoreRestarts: !simulate}
	if cmd.Bool("start-now") {
		opts.Start = time.Now()
	} else if w := p.Limit.Window; w > 10*time.Second {
		now := time.Now().UnixNano()
		wait := time.Duration((now+int64(w)-1)/int64(w)*int64(w) - now)
		fmt.Fprintf(cmd.Root().ErrWriter, "sluice: the run starts at the next window's start, in %s (--start-now starts it at once)\n", wait.Round(time.Second))
	}
	res, err := scenario.Run(ctx, p, target, opts)
	if err != nil {
		return err
	}
	rep := scenario.NewReport(p, res)
	if l == nil {
		rep.Totals.CrossRegionMessages, rep.Totals.MessagesPerCheck = -1, -1 // real nodes: not counted here
	}
	out := cmd.Root().Writer
	if cmd.Bool("json") {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteText(out)
	}
	if err != nil {
		return err
	}
	if err := rep.Verify(); err != nil {
		return cli.Exit(err.Error(), exitFailure)
	}
	return nil
}

// rttOf describes a plan's round-trip times for --simulate's banner.
func rttOf(p *scenario.Plan, none bool) string {
	if none {
		return "none (--no-wan)"
	}
	names := p.RegionNames()
	var parts []string
	for i, a := range names {
		for _, b := range names[i+1:] {
			parts = append(parts, fmt.Sprintf("%s-%s %s", a, b, p.RTT(a, b)))
		}
	}
	return strings.Join(parts, ", ")
}

// parseRegionAddrs reads --region: REGION=H:P entries, a region listed
// once per address. Every region of the scenario (names) needs one.
func parseRegionAddrs(s string, names []string) (map[string][]string, error) {
	out := map[string][]string{}
	seen := map[string]bool{}
	for _, e := range splitList(s) {
		r, a, ok := strings.Cut(e, "=")
		r, a = strings.TrimSpace(r), strings.TrimSpace(a)
		switch {
		case !ok || r == "" || a == "":
			return nil, usagef("region", "%q is not REGION=H:P", e)
		case !slices.Contains(names, r):
			return nil, usagef("region", "%q is not a region of the scenario (want %s)", r, strings.Join(names, ", "))
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, usagef("region", "%s: %q is not host:port: %v", r, a, err)
		}
		if seen[r+"="+a] {
			return nil, usagef("region", "%s=%s is listed twice", r, a)
		}
		seen[r+"="+a] = true
		out[r] = append(out[r], a)
	}
	var missing []string
	for _, n := range names {
		if len(out[n]) == 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, usagef("region", "no address for region %s (give REGION=H:P for each of %s)", strings.Join(missing, ", "), strings.Join(names, ", "))
	}
	return out, nil
}
