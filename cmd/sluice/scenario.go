package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/scenario"
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
			"and stops by itself (the scenario's duration plus --timeout at most).\n" +
			"The round-trip times and clock offsets of a scenario are the network's and the nodes'\n" +
			"business here: this command only uses them to place each check in the window its\n" +
			"deciding region saw. It cannot cut regions off either: a scenario with cuts is refused\n" +
			"unless --ignore-cuts (cut the network yourself, e.g. with netem).\n" +
			"Each run uses the scenario's limit name plus a run id, so runs do not share counts.\n" +
			"Exit status: 0, 1 when the over-admission exceeds the scope's bound (global and exact:\n" +
			"0; regional: (regions-1) x limit per window) or a call fails, 2 on invalid input.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "file", Usage: "the scenario, a YAML file (required)"},
			&cli.StringFlag{Name: "region", Usage: "each region's node addresses, REGION=H:P[,REGION=H:P...]; list a region again for more nodes (required: every region of the scenario)", Sources: e.of("region")},
			&cli.StringFlag{Name: "scope", Usage: "run with this scope instead of the scenario's: global, regional or exact"},
			&cli.IntFlag{Name: "concurrency", Value: 64, Usage: "checks in flight per region at most (a check waits for a free slot; the report uses its actual send time)"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "deadline of each check", Sources: e.of("timeout")},
			&cli.BoolFlag{Name: "ignore-cuts", Usage: "run a scenario that has cuts without them (the report says they were not enforced)"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as one JSON object"},
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
	addrs, err := parseRegionAddrs(cmd.String("region"), p.RegionNames())
	if err != nil {
		return err
	}
	conc, timeout := cmd.Int("concurrency"), cmd.Duration("timeout")
	switch {
	case conc < 1 || conc > 10000:
		return usagef("concurrency", "must be in 1..10000, got %d", conc)
	case timeout <= 0:
		return usagef("timeout", "must be > 0, got %s", timeout)
	}
	if len(p.Cuts) > 0 {
		var cuts []string
		for _, c := range p.Cuts {
			cuts = append(cuts, fmt.Sprintf("%s from %s to %s", c.Region, c.From, c.To))
		}
		if !cmd.Bool("ignore-cuts") {
			return usagef("file", "scenario %q cuts regions off (%s), which this command cannot do to real nodes "+
				"(it would have to partition their network): give --ignore-cuts to run it without the cuts, "+
				"or cut the network yourself (e.g. tc netem) and give --ignore-cuts", s.Name, strings.Join(cuts, "; "))
		}
		fmt.Fprintf(cmd.Root().ErrWriter, "sluice: warning: cuts not enforced (%s): this command cannot cut regions off\n", strings.Join(cuts, "; "))
	}
	opts, err := dialOptions(cmd)
	if err != nil {
		return err
	}
	// Every node answers before the run starts, so that a wrong address
	// fails fast instead of filling the report with errors.
	for _, r := range p.RegionNames() {
		for _, a := range addrs[r] {
			conn, err := dialNode(cmd, a, rpc.WindowDialOptions()...)
			if err != nil {
				return err
			}
			err = waitServing(ctx, sluicev1.NewRateLimitServiceClient(conn), a, timeout)
			conn.Close()
			if err != nil {
				return err
			}
		}
	}
	t := &nodesTarget{
		spec:    p.Limit,
		name:    p.Limit.Name + "." + strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36),
		clients: map[string]*client.Client{},
	}
	for _, r := range p.RegionNames() {
		c, err := client.New(client.Config{
			Addrs: addrs[r], Timeout: timeout, FailureMode: client.FailOpen,
			Logger: slog.New(slog.DiscardHandler), DialOptions: opts,
		})
		if err != nil {
			return err
		}
		defer c.Close()
		t.clients[r] = c
	}
	res, err := scenario.Run(ctx, p, t, scenario.Options{Workers: conc, Timeout: timeout, IgnoreCuts: true})
	if err != nil {
		return err
	}
	rep := scenario.NewReport(p, res)
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

// nodesTarget sends a scenario's checks to real nodes: each region's to
// its own client (its nodes, round robin), with the limit's numbers and
// scope inline.
type nodesTarget struct {
	spec    scenario.Spec
	name    string // the limit's name plus the run id
	clients map[string]*client.Client
}

// Check sends the check through region's client. A client that got no
// answer (its failure mode answered, Cause set) is an error: the report
// counts it as failed, not as admitted.
func (t *nodesTarget) Check(ctx context.Context, reg, key string, hits int64) (scenario.Answer, error) {
	d, err := t.clients[reg].Check(ctx, client.Check{
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

var _ scenario.Target = (*nodesTarget)(nil)
