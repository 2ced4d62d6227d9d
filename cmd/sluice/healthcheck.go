package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthcheckCommand asks a node's gRPC health service whether it serves:
// for container health checks (exit 0 when SERVING, 1 otherwise).
func healthcheckCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "exit 0 if the node at --addr is serving, 1 if not (for container health checks)",
		Description: "Calls grpc.health.v1.Health/Check on --addr. A node reports SERVING from its start\n" +
			"until it begins to leave (SIGTERM), then NOT_SERVING.",
		Flags: clientFlags(e),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			var resp *healthpb.HealthCheckResponse
			if err := callNode(ctx, cmd, func(ctx context.Context, conn *grpc.ClientConn) (err error) {
				resp, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
				return err
			}); err != nil {
				var ue usageError
				if errors.As(err, &ue) {
					return err
				}
				return cli.Exit(fmt.Sprintf("node %s: not healthy: %v", cmd.String("addr"), err), exitFailure)
			}
			if resp.Status != healthpb.HealthCheckResponse_SERVING {
				return cli.Exit(fmt.Sprintf("node %s: %s", cmd.String("addr"), resp.Status), exitFailure)
			}
			fmt.Fprintln(cmd.Root().Writer, "SERVING")
			return nil
		},
	}
}
