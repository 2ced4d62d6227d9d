package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// The operators' commands: sluice key get, sluice key reset, sluice limits
// show (the admin API, docs/admin.md). They take the client commands'
// flags (--addr, --timeout, --tls-*, --token-file) and the admin
// credential: --admin-token-file (or SLUICE_ADMIN_TOKEN), sent instead of
// --token-file's token, or an admin certificate as --tls-cert.

// adminFlags are the flags of every admin command.
func adminFlags(e env) []cli.Flag {
	return append(clientFlags(e),
		&cli.StringFlag{Name: "admin-token-file", Usage: "file whose first line is an admin token (a token of the node's serve --admin-token-file), sent instead of --token-file's; SLUICE_ADMIN_TOKEN gives the token itself. Over TLS, or in plaintext to loopback only", Sources: e.of("admin-token-file")},
		// SLUICE_ADMIN_TOKEN only: a token on the command line shows in ps.
		&cli.StringFlag{Name: "admin-token", Hidden: true, Sources: e.of("admin-token")},
		&cli.BoolFlag{Name: "json", Usage: "print the answer as JSON (the protobuf JSON mapping, field names as in the .proto)"},
	)
}

// adminDialOptions returns the dial options of an admin command: the
// client auth flags', with the admin token (when given) as the bearer
// token. The error is a usageError naming the flag.
func adminDialOptions(cmd *cli.Command) ([]grpc.DialOption, error) {
	a, err := clientAuthOf(cmd)
	if err != nil {
		return nil, err
	}
	if f := cmd.String("admin-token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usagef("admin-token-file", "%v", err)
		}
		tok, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if tok = strings.TrimSpace(tok); tok == "" {
			return nil, usagef("admin-token-file", "%s: empty", f)
		}
		a.token, a.tokenFrom = tok, "--admin-token-file "+f
	} else if tok := strings.TrimSpace(cmd.String("admin-token")); tok != "" {
		a.token, a.tokenFrom = tok, EnvName("admin-token")
	}
	return a.dialOptions()
}

// adminCall checks the admin command's flags, dials --addr with the admin
// credential and calls f with an AdminService client and a context
// bounded by --timeout. A failed call is callError's.
func adminCall(ctx context.Context, cmd *cli.Command, f func(ctx context.Context, c sluicev1.AdminServiceClient) error) error {
	if err := noArgs(cmd); err != nil {
		return err
	}
	if cmd.Duration("timeout") <= 0 {
		return usagef("timeout", "must be > 0, got %s", cmd.Duration("timeout"))
	}
	opts, err := adminDialOptions(cmd)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(cmd.String("addr"), opts...)
	if err != nil {
		return usagef("addr", "%v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, cmd.Duration("timeout"))
	defer cancel()
	if err := f(ctx, sluicev1.NewAdminServiceClient(conn)); err != nil {
		var ue usageError
		var ec cli.ExitCoder
		if errors.As(err, &ue) || errors.As(err, &ec) {
			return err
		}
		return callError(cmd.String("addr"), err)
	}
	return nil
}

// nameKey returns --name and --key, both required.
func nameKey(cmd *cli.Command) (string, string, error) {
	name, key := cmd.String("name"), cmd.String("key")
	switch {
	case name == "":
		return "", "", usagef("name", "required")
	case key == "":
		return "", "", usagef("key", "required")
	}
	return name, key, nil
}

// printJSON writes m in the protobuf JSON mapping, field names as in the
// .proto, every field present.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func keyCommand(e env) *cli.Command {
	keyFlags := func(extra ...cli.Flag) []cli.Flag {
		return append(append(adminFlags(e),
			&cli.StringFlag{Name: "name", Usage: "the limit's name, e.g. api (required)"},
			&cli.StringFlag{Name: "key", Usage: "the key, e.g. user:42 (required)"},
		), extra...)
	}
	return &cli.Command{
		Name:  "key",
		Usage: "inspect or reset one key (the admin API: an admin token or certificate, or loopback on a node with no credentials)",
		Commands: []*cli.Command{
			{
				Name:  "get",
				Usage: "show a key's owner and replicas in each region, and the owner's window of it",
				Description: "Prints, per region, the key's owner and replica holders, then one line per window a node\n" +
					"holds: its own (window), a replica's copy (copy), hits admitted in an unreachable owner's\n" +
					"stead (stand-in), or an exact check's window outside the home region (away).\n" +
					"Exit status: 0 when answered, 2 on invalid input, 1 on any other error.",
				Flags: keyFlags(
					&cli.BoolFlag{Name: "replicas", Usage: "also ask each replica holder for its copy"},
					&cli.BoolFlag{Name: "all-members", Usage: "also ask every member (stand-in windows, stray state); members holding nothing are left out"},
				),
				Action: func(ctx context.Context, cmd *cli.Command) error {
					name, key, err := nameKey(cmd)
					if err != nil {
						return err
					}
					return adminCall(ctx, cmd, func(ctx context.Context, c sluicev1.AdminServiceClient) error {
						resp, err := c.InspectKey(ctx, &sluicev1.InspectKeyRequest{Name: name, Key: key, Replicas: cmd.Bool("replicas"), AllMembers: cmd.Bool("all-members")})
						if err != nil {
							return err
						}
						out := cmd.Root().Writer
						if cmd.Bool("json") {
							return printJSON(out, resp)
						}
						fmt.Fprintf(out, "key %q of %q, answered by %s\n", key, name, resp.AnsweredBy)
						return printRegions(out, resp.Regions)
					})
				},
			},
			{
				Name:  "reset",
				Usage: "start a key afresh on every node that may answer for it (its owner, replicas and stand-ins, in every region)",
				Description: "Prints what each node held before the reset. Exit status: 0 when every node was reached\n" +
					"and reset the key, 1 when one was not (the answer names it: it may still count what it\n" +
					"held) or on another error, 2 on invalid input. See docs/admin.md for what a reset cannot reach.",
				Flags: keyFlags(),
				Action: func(ctx context.Context, cmd *cli.Command) error {
					name, key, err := nameKey(cmd)
					if err != nil {
						return err
					}
					return adminCall(ctx, cmd, func(ctx context.Context, c sluicev1.AdminServiceClient) error {
						resp, err := c.ResetKey(ctx, &sluicev1.ResetKeyRequest{Name: name, Key: key})
						if err != nil {
							return err
						}
						out := cmd.Root().Writer
						if cmd.Bool("json") {
							if err := printJSON(out, resp); err != nil {
								return err
							}
						} else {
							fmt.Fprintf(out, "key %q of %q reset through %s; before the reset:\n", key, name, resp.AnsweredBy)
							if err := printRegions(out, resp.Regions); err != nil {
								return err
							}
						}
						if !resp.Complete {
							return cli.Exit("reset incomplete: a node or region above was not reached, and may still count what it held", exitFailure)
						}
						if !cmd.Bool("json") {
							fmt.Fprintln(out, "reset complete: every node reached")
						}
						return nil
					})
				},
			},
		},
	}
}

// printRegions writes each region's owner and replicas, then a table of
// the windows its nodes hold.
func printRegions(w io.Writer, regions []*sluicev1.RegionKey) error {
	for _, rk := range regions {
		where := ""
		if rk.Region != "" {
			where = "region " + rk.Region + ": "
		}
		if rk.Error != "" {
			fmt.Fprintf(w, "%s%s\n", where, rk.Error)
			continue
		}
		fmt.Fprintf(w, "%sowner %s, replicas %s\n", where, rk.Owner, orNone(strings.Join(rk.Replicas, ", ")))
		var table bytes.Buffer
		tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
		var notReached []string
		fmt.Fprintln(tw, "NODE\tROLE\tHOLDS\tALGORITHM\tWINDOW\tCOUNT\tPREVIOUS\tLIMIT\tREMAINING\tRESET")
		for _, h := range rk.Nodes {
			// Every row has the header's ten cells, so that the table
			// stays aligned (tabwriter aligns runs of equal cell counts).
			if h.Error != "" {
				fmt.Fprintf(tw, "%s\t%s\tnot reached\t\t\t\t\t\t\t\n", h.Node, h.Role)
				notReached = append(notReached, h.Node+": "+h.Error)
				continue
			}
			rows := 0
			row := func(what string, kw *sluicev1.KeyWindow) {
				if kw == nil {
					return
				}
				rows++
				if h.CopyOwner != "" && what == "copy" {
					what = "copy of " + h.CopyOwner
				}
				limit, remaining, prev := "-", "-", "-"
				if kw.Limit > 0 {
					limit, remaining = fmt.Sprint(kw.Limit), fmt.Sprint(kw.Remaining)
				}
				if kw.Algorithm == sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW {
					prev = fmt.Sprint(kw.PreviousCount)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", h.Node, h.Role, what, window.Algorithm(kw.Algorithm),
					time.Duration(kw.WindowMs)*time.Millisecond, kw.Count, prev, limit, remaining,
					time.UnixMilli(kw.ResetTime).UTC().Format(time.RFC3339Nano))
			}
			row("window", h.Window)
			row("copy", h.Copy)
			row("stand-in", h.StandIn)
			row("away", h.Away)
			if rows == 0 {
				fmt.Fprintf(tw, "%s\t%s\tnothing\t\t\t\t\t\t\t\n", h.Node, h.Role)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for line := range strings.Lines(table.String()) {
			fmt.Fprintln(w, strings.TrimRight(line, " \n")) // the padding of empty cells
		}
		for _, e := range notReached {
			fmt.Fprintf(w, "not reached: %s\n", e)
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func limitsCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "limits",
		Usage: "the limits a node has in force (the admin API)",
		Commands: []*cli.Command{{
			Name:        "show",
			Usage:       "list the named limits (serve --limits) and the RLS rules (serve --rls-config) a node has in force",
			Description: "Exit status: 0 when answered, 2 on invalid input, 1 on any other error.",
			Flags:       adminFlags(e),
			Action: func(ctx context.Context, cmd *cli.Command) error {
				return adminCall(ctx, cmd, func(ctx context.Context, c sluicev1.AdminServiceClient) error {
					resp, err := c.ListLimits(ctx, &sluicev1.ListLimitsRequest{})
					if err != nil {
						return err
					}
					out := cmd.Root().Writer
					if cmd.Bool("json") {
						return printJSON(out, resp)
					}
					return printLimits(out, resp)
				})
			},
		}},
	}
}

// printLimits writes the named limits as a table, then the RLS rules as
// envoyproxy/ratelimit's /rlconfig does.
func printLimits(w io.Writer, resp *sluicev1.ListLimitsResponse) error {
	fmt.Fprintf(w, "named limits of %s (%s): %d\n", resp.AnsweredBy, orNone(resp.LimitsFile), len(resp.Limits))
	if len(resp.Limits) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKEY PREFIX\tALGORITHM\tLIMIT\tWINDOW\tBURST\tSCOPE\tOWNER UNAVAILABLE\tSHADOW")
		row := func(name, prefix string, n *sluicev1.LimitNumbers) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%t\n", name, prefix, window.Algorithm(n.GetAlgorithm()), n.GetLimit(),
				time.Duration(n.GetWindowMs())*time.Millisecond, n.GetBurst(), orDash(region.Scope(n.GetScope()).String()),
				orDash(n.GetOnOwnerUnavailable()), n.GetShadow())
		}
		for _, l := range resp.Limits {
			row(l.Name, "-", l.Numbers)
			for _, o := range l.Overrides {
				row("", o.KeyPrefix, o.Numbers)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if resp.RlsConfig == "" && len(resp.RlsRules) == 0 {
		fmt.Fprintln(w, "no RLS rules (serve --rls-config)")
		return nil
	}
	fmt.Fprintf(w, "RLS rules (%s): %d\n", orNone(resp.RlsConfig), len(resp.RlsRules))
	if _, err := io.WriteString(w, resp.RlsDump); err != nil {
		return err
	}
	if len(resp.RlsRules) == 0 {
		return nil
	}
	// The name a descriptor's key is counted under: what sluice key get
	// and reset take as --name (the key is the descriptors' values, each
	// quoted, separated by spaces: docs/admin.md).
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tCHECK NAME (--name of sluice key)")
	for _, r := range resp.RlsRules {
		fmt.Fprintf(tw, "%s\t%s\n", r.FullKey, r.CheckName)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
