package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// checkLine is one answer of `sluice check --json`: exactly these fields.
type checkLine struct {
	Name       string `json:"name"`
	Key        string `json:"key"`
	Allowed    bool   `json:"allowed"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	ResetTime  int64  `json:"reset_time"`  // Unix ms
	RetryAfter int64  `json:"retry_after"` // ms; -1: never
	Owner      string `json:"owner"`
	Delay      int64  `json:"delay"`    // ms; leaky_bucket: until the queue ahead has drained
	Degraded   bool   `json:"degraded"` // the owner was unreachable: decided per --on-owner-unavailable
	Shadow     bool   `json:"shadow"`   // over a limit in shadow mode: allowed anyway
	// With regions (serve --regions): the scope that applied, the region
	// that decided, a global limit's slice here (hits), and whether a
	// denial is that slice running out.
	Scope          string `json:"scope,omitempty"`
	Region         string `json:"region,omitempty"`
	Slice          int64  `json:"slice,omitempty"`
	SliceExhausted bool   `json:"slice_exhausted,omitempty"`
	SlicePending   bool   `json:"slice_pending,omitempty"`
}

// clientFlags are the flags every client command has.
func clientFlags(e env) []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "addr", Value: "127.0.0.1:7070", Usage: "host:port of any node's gRPC server", Sources: e.of("addr")},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "bound on each call", Sources: e.of("timeout")},
	}, clientAuthFlags(e)...)
}

func checkCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "send a check to a node, --count times in a row",
		Description: "Prints one answer per call. Exit status: 0 when every call was answered,\n" +
			"2 on invalid input (the message names the flag), 1 on any other error.",
		Flags: append(clientFlags(e),
			&cli.StringFlag{Name: "name", Usage: "the limit's name, e.g. api (required)"},
			&cli.StringFlag{Name: "key", Usage: "who is limited, e.g. user:42 (required)"},
			&cli.Int64Flag{Name: "limit", Value: 10, Usage: "hits allowed per window"},
			&cli.DurationFlag{Name: "window", Value: time.Minute, Usage: "the window, whole milliseconds, at most 8784h (366 days), e.g. 1m, 1500ms"},
			&cli.StringFlag{Name: "algorithm", Value: "fixed_window", Usage: "fixed_window, sliding_window, token_bucket or leaky_bucket"},
			&cli.StringFlag{Name: "scope", Usage: "with regions: global, regional or exact (default: the limit's configured scope, else global)"},
			&cli.Int64Flag{Name: "burst", Usage: "bucket capacity for the bucket algorithms (0: the limit)"},
			&cli.Int64Flag{Name: "hits", Value: 1, Usage: "hits to consume (0: peek)"},
			&cli.BoolFlag{Name: "named", Usage: "send no numbers: the node applies the limit configured under --name (serve --limits); --limit, --window, --algorithm and --burst may not be given"},
			&cli.IntFlag{Name: "count", Value: 1, Usage: "how many times to send the check"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per answer"},
			&cli.StringFlag{Name: "on-owner-unavailable", Value: "local", Usage: "when the key's owner cannot be reached: local (decide from the answering node's replica and its own count), allow or deny; the answer is marked degraded"},
		),
		Action: runCheck,
	}
}

func runCheck(ctx context.Context, cmd *cli.Command) error {
	if err := noArgs(cmd); err != nil {
		return err
	}
	name, key := cmd.String("name"), cmd.String("key")
	w := cmd.Duration("window")
	switch {
	case name == "":
		return usagef("name", "required")
	case key == "":
		return usagef("key", "required")
	case w <= 0:
		return usagef("window", "must be > 0, got %s", w)
	case w%time.Millisecond != 0:
		return usagef("window", "must be a whole number of milliseconds, got %s", w)
	case cmd.Int("count") < 1:
		return usagef("count", "must be >= 1, got %d", cmd.Int("count"))
	case cmd.Int64("hits") < 0:
		// Negative hits on the wire give hits back (a refund, the Check
		// API's and client.Refund's): never by a slip of this command.
		return usagef("hits", "must be >= 0, got %d (a refund gives hits back through the Check API: negative hits, or the Go client's Refund)", cmd.Int64("hits"))
	case cmd.Duration("timeout") <= 0:
		return usagef("timeout", "must be > 0, got %s", cmd.Duration("timeout"))
	}
	policy, ok := ownerUnavailablePolicies[cmd.String("on-owner-unavailable")]
	if !ok {
		return usagef("on-owner-unavailable", "want local, allow or deny, got %q", cmd.String("on-owner-unavailable"))
	}
	alg, err := window.ParseAlgorithm(cmd.String("algorithm"))
	if err != nil {
		return usagef("algorithm", "%s", strings.TrimPrefix(err.Error(), "algorithm: "))
	}
	if cmd.IsSet("burst") && alg != window.TokenBucket && alg != window.LeakyBucket {
		fmt.Fprintf(cmd.Root().ErrWriter, "sluice: note: --burst applies to token_bucket and leaky_bucket only; %s ignores it\n", alg)
	}
	scope, err := region.ParseScope(cmd.String("scope"))
	if err != nil {
		return usagef("scope", "%v", err)
	}
	rc := &sluicev1.RateLimitCheck{
		Name: name, Key: key, Hits: proto.Int64(cmd.Int64("hits")), Limit: cmd.Int64("limit"),
		WindowMs: w.Milliseconds(), Burst: cmd.Int64("burst"), Algorithm: sluicev1.Algorithm(alg),
		OnOwnerUnavailable: policy, Scope: sluicev1.Scope(scope),
	}
	if cmd.Bool("named") {
		for _, f := range []string{"limit", "window", "algorithm", "burst"} {
			if cmd.IsSet(f) {
				return usagef(f, "cannot be given with --named (the node's configured numbers apply)")
			}
		}
		rc.Limit, rc.WindowMs, rc.Burst, rc.Algorithm = 0, 0, 0, sluicev1.Algorithm_ALGORITHM_UNSPECIFIED
	}
	conn, err := dialNode(cmd, cmd.String("addr"))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := sluicev1.NewRateLimitServiceClient(conn)
	out := cmd.Root().Writer
	failed := 0
	for i := 0; i < cmd.Int("count"); i++ {
		callCtx, cancel := context.WithTimeout(ctx, cmd.Duration("timeout"))
		resp, err := client.Check(callCtx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}})
		cancel()
		if err != nil {
			if cmd.Bool("named") && status.Code(err) == codes.InvalidArgument && strings.HasPrefix(status.Convert(err).Message(), "checks[0].limit:") {
				return usagef("name", "no limit called %q is configured on the node (serve --limits)", name)
			}
			return callError(cmd.String("addr"), err)
		}
		if len(resp.Decisions) != 1 {
			return fmt.Errorf("node %s answered %d decisions for 1 check", cmd.String("addr"), len(resp.Decisions))
		}
		d := resp.Decisions[0]
		if d.Error != "" {
			fmt.Fprintf(cmd.Root().ErrWriter, "check %d: not decided: %s\n", i+1, d.Error)
			failed++
			continue
		}
		if cmd.Bool("json") {
			b, _ := json.Marshal(checkLine{Name: name, Key: key, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
				ResetTime: d.ResetTime, RetryAfter: d.RetryAfter, Owner: d.Owner, Delay: d.Delay, Degraded: d.Degraded, Shadow: d.Shadow,
				Scope: scopeWord(d.Scope), Region: d.Region, Slice: d.Slice, SliceExhausted: d.SliceExhausted, SlicePending: d.SlicePending})
			fmt.Fprintf(out, "%s\n", b)
			continue
		}
		verdict := "allowed"
		switch {
		case d.Shadow:
			verdict = "shadow" // over a limit in shadow mode: allowed anyway
		case !d.Allowed:
			verdict = "over limit"
		}
		delay := ""
		if alg == window.LeakyBucket {
			delay = " delay=" + (time.Duration(d.Delay) * time.Millisecond).String()
		}
		degraded := ""
		if d.Degraded {
			degraded = " degraded (owner unreachable)"
		}
		regions := ""
		if d.Region != "" {
			regions = " scope=" + scopeWord(d.Scope) + " region=" + d.Region
			if d.Slice > 0 || d.SliceExhausted {
				regions += fmt.Sprintf(" slice=%d", d.Slice)
			}
			if d.SliceExhausted {
				regions += " slice_exhausted"
			}
			if d.SlicePending {
				regions += " slice_pending"
			}
		}
		fmt.Fprintf(out, "%-10s remaining=%d limit=%d reset_time=%s retry_after=%s%s owner=%s%s%s\n",
			verdict, d.Remaining, d.Limit, time.UnixMilli(d.ResetTime).UTC().Format(time.RFC3339Nano),
			retryString(d.RetryAfter), delay, d.Owner, regions, degraded)
	}
	if failed > 0 {
		return cli.Exit(fmt.Sprintf("%d of %d checks were not decided", failed, cmd.Int("count")), exitFailure)
	}
	return nil
}

// ownerUnavailablePolicies maps --on-owner-unavailable to the proto.
var ownerUnavailablePolicies = map[string]sluicev1.OwnerUnavailablePolicy{
	"local": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL,
	"allow": sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW,
	"deny":  sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY,
}

func retryString(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// callNode checks the client flags of cmd (no arguments, --timeout > 0),
// dials --addr and calls f with the connection and a context bounded by
// --timeout; it closes the connection after.
func callNode(ctx context.Context, cmd *cli.Command, f func(ctx context.Context, conn *grpc.ClientConn) error) error {
	if err := noArgs(cmd); err != nil {
		return err
	}
	if cmd.Duration("timeout") <= 0 {
		return usagef("timeout", "must be > 0, got %s", cmd.Duration("timeout"))
	}
	conn, err := dialNode(cmd, cmd.String("addr"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, cmd.Duration("timeout"))
	defer cancel()
	return f(ctx, conn)
}

// dialNode opens a gRPC connection to addr (no I/O until the first call):
// plaintext, or TLS and a token as cmd's client auth flags say.
// extra options come after those.
func dialNode(cmd *cli.Command, addr string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts, err := dialOptions(cmd)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(opts, extra...)...)
	if err != nil {
		return nil, usagef("addr", "%v", err)
	}
	return conn, nil
}

// callError turns a failed call into an error: a usageError naming the
// flag for INVALID_ARGUMENT, a plain error otherwise.
func callError(addr string, err error) error {
	st, _ := status.FromError(err)
	if st.Code() == codes.Unavailable && strings.Contains(st.Message(), "error reading server preface") {
		// A plaintext call to a TLS port: the server hangs up on it.
		return fmt.Errorf("node %s: %s: %s (does the node serve TLS? give --tls-ca, and --tls-cert and --tls-key for mutual TLS)", addr, st.Code(), st.Message())
	}
	if st.Code() != codes.InvalidArgument {
		return fmt.Errorf("node %s: %s: %s", addr, st.Code(), st.Message())
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			fv := br.FieldViolations[0]
			return usagef(flagOf(fv.Field), "%s", fv.Description)
		}
	}
	return usageError{errors.New(st.Message())}
}

// flagOf maps a wire field such as "checks[0].window_ms" to its flag,
// "window".
func flagOf(field string) string {
	if i := strings.LastIndexByte(field, '.'); i >= 0 {
		field = field[i+1:]
	}
	if field == "window_ms" {
		return "window"
	}
	return strings.ReplaceAll(field, "_", "-")
}

// scopeWord returns a decision's scope as limits.yaml writes it ("" when
// the node said none: no regions).
func scopeWord(s sluicev1.Scope) string { return region.Scope(s).String() }
