package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthcheckCommand asks a node's gRPC health service whether it is
// ready: for container health checks and readiness probes (exit 0 when
// SERVING, 1 otherwise). It is no liveness check: a node still joining is
// alive and NOT_SERVING.
func healthcheckCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "exit 0 if the node at --addr is ready (SERVING), 1 if not (for container health checks and readiness probes)",
		Description: "Calls grpc.health.v1.Health/Check on --addr. A node reports SERVING when it is ready,\n" +
			"as its /readyz says: a node started without --join at once; one with --join once it has\n" +
			"joined the cluster and its ring has settled (membership unchanged for 1 s). It reports\n" +
			"NOT_SERVING before that, and again from when it begins to leave (SIGTERM). A node that is\n" +
			"not ready is not dead: for liveness, probe GET /healthz.",
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
				return cli.Exit(fmt.Sprintf("node %s: %s (not ready: joining, ring settling or leaving; its /readyz says which)", cmd.String("addr"), resp.Status), exitFailure)
			}
			fmt.Fprintln(cmd.Root().Writer, "SERVING")
			return nil
		},
	}
}
