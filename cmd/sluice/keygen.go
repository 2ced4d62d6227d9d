package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/cluster"
)

// keygenCommand prints a new gossip key for serve --gossip-key-file.
func keygenCommand() *cli.Command {
	return &cli.Command{
		Name:  "keygen",
		Usage: "print a new random gossip key (32 bytes, base64) for serve --gossip-key-file",
		Action: func(_ context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			k, err := cluster.NewKey()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.Root().Writer, k)
			return nil
		},
	}
}
