package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// membersJSON is the output of `sluice members --json`.
type membersJSON struct {
	Members []memberJSON `json:"members"`
}

type memberJSON struct {
	Name       string  `json:"name"`
	GRPCAddr   string  `json:"grpc_addr"`
	GossipAddr string  `json:"gossip_addr"`
	Region     string  `json:"region"`
	State      string  `json:"state"`
	RingShare  float64 `json:"ring_share"` // fraction of the ring's partitions, 0..1
	Version    string  `json:"version"`    // the sluice build it runs (see sluice --version); "" when it gossips none
}

func membersCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "members",
		Usage: "show the cluster as one node sees it",
		Flags: append(clientFlags(e),
			&cli.BoolFlag{Name: "json", Usage: `print {"members":[...]} as JSON`},
		),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			var resp *sluicev1.MembersResponse
			if err := callNode(ctx, cmd, func(ctx context.Context, conn *grpc.ClientConn) (err error) {
				resp, err = sluicev1.NewRateLimitServiceClient(conn).Members(ctx, &sluicev1.MembersRequest{})
				return err
			}); err != nil {
				var ue usageError
				if errors.As(err, &ue) {
					return err
				}
				return callError(cmd.String("addr"), err)
			}
			out := cmd.Root().Writer
			if cmd.Bool("json") {
				mj := membersJSON{Members: make([]memberJSON, 0, len(resp.Members))}
				for _, m := range resp.Members {
					mj.Members = append(mj.Members, memberJSON{Name: m.Name, GRPCAddr: m.GrpcAddr, GossipAddr: m.GossipAddr,
						Region: m.Region, State: m.State, RingShare: m.RingShare, Version: m.Version})
				}
				b, _ := json.Marshal(mj)
				fmt.Fprintf(out, "%s\n", b)
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tGRPC\tGOSSIP\tREGION\tSTATE\tRING SHARE\tVERSION")
			for _, m := range resp.Members {
				self := ""
				if m.Name == resp.Self {
					self = " (answering)"
				}
				fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%.1f%%\t%s\n", m.Name, self, m.GrpcAddr, m.GossipAddr, m.Region, m.State, 100*m.RingShare, m.Version)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "ring %s: %d partitions\n", resp.RingFingerprint, resp.PartitionCount)
			return nil
		},
	}
}
