// Command sluice is the one binary of sluice, a distributed rate limiter:
//
//	sluice serve    run a node
//	sluice check    send a check to a node
//	sluice members  show the cluster as a node sees it
//	sluice bench    load a cluster and measure it
//	sluice scenario run a multi-region scenario against nodes and report over- and under-admission
//	sluice healthcheck  exit 0 if a node is ready (container health checks, readiness probes)
//	sluice proxy    a reverse proxy that applies limits per route
//	sluice keygen   print a new gossip encryption key
//	sluice tls      make development certificates (a CA; peer, client and admin certificates)
//	sluice key      inspect or reset one key (get, reset; the admin API)
//	sluice limits   show the limits a node has in force (the admin API)
//	sluice validate check a limits file or RLS rules before deploying them
//
// Every flag of serve, and --addr and --timeout of the client commands, can
// also come from the environment as SLUICE_<FLAG> (upper case, dashes as
// underscores), e.g. SLUICE_GRPC_ADDR; a flag on the command line wins.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

// version and revision are what the build stamped with -ldflags
// "-X main.version=... -X main.revision=..." (make build and make docker:
// git describe --tags --always --dirty, and the commit); "" when nothing
// was, and build then takes them from what the Go toolchain recorded.
var version, revision string

// build is this binary's build: `sluice --version` prints it, serve
// gossips its version and exports it in sluice_build_info.
var build = buildinfo.Read(version, revision)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a call failed or a check went unanswered
	exitUsage   = 2 // invalid input: a flag or a field of a check
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args (args[0] is the program name) with the
// environment lookup getenv and returns the exit code. It never exits the
// process itself.
func run(ctx context.Context, args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) int {
	e := env{getenv: getenv}
	root := &cli.Command{
		Name:      "sluice",
		Usage:     "a distributed rate limiter",
		Writer:    stdout,
		ErrWriter: stderr,
		Commands:  []*cli.Command{serveCommand(e), checkCommand(e), membersCommand(e), benchCommand(e), scenarioCommand(e), healthcheckCommand(e), keygenCommand(), tlsCommand(), proxyCommand(e), keyCommand(e), limitsCommand(e), validateCommand()},
		// --version is ours (cli's prints the version only): the
		// version, the revision and the Go that built the binary.
		HideVersion: true,
		Flags:       []cli.Flag{&cli.BoolFlag{Name: "version", Aliases: []string{"v"}, Usage: "print the version, the revision and the Go version"}},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Bool("version") {
				_, err := fmt.Fprint(stdout, build.String())
				return err
			}
			if cmd.Args().Len() > 0 {
				return usageError{fmt.Errorf("unknown command %q (want serve, check, members, bench, scenario, healthcheck, proxy, keygen, tls, key, limits or validate; see sluice --help)", cmd.Args().First())}
			}
			return cli.ShowAppHelp(cmd)
		},
		// Return errors to run instead of exiting inside the library.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		OnUsageError: func(_ context.Context, _ *cli.Command, err error, _ bool) error {
			return usageError{err}
		},
	}
	for _, c := range root.Commands {
		c.OnUsageError = root.OnUsageError
	}
	err := root.Run(ctx, args)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "sluice: %v\n", err)
	var ue usageError
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ec):
		return ec.ExitCode()
	case strings.Contains(err.Error(), "flag provided but not defined"),
		strings.Contains(err.Error(), "invalid value"),
		strings.Contains(err.Error(), "from environment variable"),
		strings.Contains(err.Error(), "Required flag"):
		return exitUsage
	}
	return exitFailure
}

// usageError is invalid input on the command line: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// noArgs refuses positional arguments: every input of sluice is a flag.
func noArgs(cmd *cli.Command) error {
	if cmd.Args().Len() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (every input is a --flag; see sluice %s --help)", cmd.Args().First(), cmd.Name)}
	}
	return nil
}

// usagef returns a usageError naming the flag.
func usagef(flag, format string, a ...any) error {
	return usageError{fmt.Errorf("invalid --%s: %s", flag, fmt.Sprintf(format, a...))}
}

// env makes SLUICE_<FLAG> sources from an injected lookup, so tests need not
// touch the process environment.
type env struct {
	getenv func(string) (string, bool)
}

// of returns the source for flag: SLUICE_ and the flag in upper case with
// dashes as underscores, e.g. "grpc-addr" -> SLUICE_GRPC_ADDR.
func (e env) of(flag string) cli.ValueSourceChain {
	return cli.NewValueSourceChain(&envSource{key: EnvName(flag), getenv: e.getenv})
}

// EnvName returns the environment variable that sets flag, e.g.
// "grpc-addr" -> "SLUICE_GRPC_ADDR".
func EnvName(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envSource is a cli.ValueSource reading one environment variable.
type envSource struct {
	key    string
	getenv func(string) (string, bool)
}

func (s *envSource) Lookup() (string, bool) { return s.getenv(s.key) }
func (s *envSource) IsFromEnv() bool        { return true }
func (s *envSource) Key() string            { return s.key }
func (s *envSource) String() string         { return "environment variable " + s.key }
func (s *envSource) GoString() string       { return fmt.Sprintf("&envSource{key:%q}", s.key) }

var (
	_ cli.ValueSource    = (*envSource)(nil)
	_ cli.EnvValueSource = (*envSource)(nil)
)
