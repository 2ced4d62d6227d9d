package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
)

func serveCommand(e env) *cli.Command {
	host, _ := os.Hostname()
	table := serveFlags(host)
	cliFlags := make([]cli.Flag, len(table))
	for i, f := range table {
		cliFlags[i] = f.cliFlag(e)
	}
	return &cli.Command{
		Name:  "serve",
		Usage: "run a sluice node",
		Description: "Runs a node: it answers checks on --grpc-addr, gossips membership on --gossip-addr,\n" +
			"and joins the members listed in --join (none: a cluster of one). With --join, until it\n" +
			"has joined it refuses client checks (UNAVAILABLE: ask another node), and gRPC health says\n" +
			"NOT_SERVING until it has joined and its ring has settled, as /readyz does. SIGINT or SIGTERM\n" +
			"makes it leave gracefully: health goes NOT_SERVING, it stops taking checks, hands the\n" +
			"state of all its keys to their next owners (bounded by --handoff-timeout), leaves the\n" +
			"gossip and exits; with --state-dir, keys no member can take (the whole cluster is\n" +
			"stopping) are written there and read back at the next start. SIGHUP reloads --limits, --gossip-key-file, the TLS files, --token-file and --admin-token-file.\n\n" +
			"Each setting comes from its flag, else from SLUICE_<FLAG>, else from the --config file.",
		Flags: cliFlags,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			if path := cmd.String("config"); path != "" {
				if err := applyConfigFile(cmd, path); err != nil {
					return usagef("config", "%v", err)
				}
			}
			logger, err := newLogger(cmd.String("log-level"), cmd.String("log-format"), cmd.Root().ErrWriter)
			if err != nil {
				return err
			}
			cfg, err := nodeConfig(cmd, table, rpc.NodeConfig{Version: build.Version, Revision: build.Revision, Logger: logger})
			if err != nil {
				return err
			}
			// Every line names the node, as the node's own do (rpc adds
			// node= to cfg.Logger itself).
			logger = logger.With("node", cfg.Name)
			if want, warn := tracingWanted(e.getenv); warn != "" {
				logger.Warn(warn)
			} else if want {
				tr, err := setupTracing(ctx, logger.With("component", "tracing"), "sluice", cfg.Name)
				if err != nil {
					return cli.Exit("tracing: "+err.Error(), exitFailure)
				}
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = tr.shutdown(sctx) // flushes the last spans
				}()
				cfg.ServerOptions, cfg.DialOptions, cfg.TracerProvider = tr.server, tr.dial, tr.provider
				logger.Info("tracing RPCs with OpenTelemetry (OTLP)")
			}
			if gc, set := defaultGCPercent(e.getenv); set {
				debug.SetGCPercent(gc)
				logger.Debug("garbage collector target set", "GOGC", gc)
			}
			var onHUP []func() // what SIGHUP reloads
			if path := cmd.String("limits"); path != "" {
				src, err := limits.Open(path, logger.With("component", "limits"))
				if err != nil {
					return usagef("limits", "%v", err)
				}
				cfg.Limits = src
				defer follow(ctx, src, &onHUP, func(err error) {
					logger.Warn("not watching the limits file; reload it with SIGHUP", "file", path, "error", err)
				})()
			}
			keyFile := cmd.String("gossip-key-file")
			if keyFile != "" {
				keys, err := cluster.ReadKeyFile(keyFile)
				if err != nil {
					return usagef("gossip-key-file", "%v", err)
				}
				cfg.GossipKeys = keys
			}
			var rlsRules *rls.Source
			if path := cmd.String("rls-config"); path != "" {
				rlsLog := logger.With("component", "rls")
				rlsRules, err = rls.Open(path, rls.LoadOptions{MergeDomains: cmd.Bool("rls-merge-domain-config")}, rlsLog)
				if err != nil {
					return usagef("rls-config", "%v", err)
				}
				cfg.RLSSource = rlsRules
				if rules := rlsRules.Current(); len(rules.Domains()) == 0 {
					rlsLog.Warn("no rls rules yet: every Envoy request is OK until rule files appear", "path", path)
				} else {
					rlsLog.Info("rls rules loaded", "domains", strings.Join(rules.Domains(), ","), "files", len(rules.Files()), "rules", len(rules.Rules()))
				}
				defer follow(ctx, rlsRules, &onHUP, func(err error) {
					rlsLog.Warn("not watching the rls rules; reload them with SIGHUP", "path", path, "error", err)
				})()
			}
			node, err := rpc.StartNode(cfg)
			if err != nil {
				return cli.Exit(err.Error(), exitFailure)
			}
			if keyFile != "" {
				onHUP = append(onHUP, func() {
					keys, err := cluster.ReadKeyFile(keyFile)
					if err == nil {
						err = node.SetGossipKeys(keys)
					}
					if err != nil {
						logger.Error("gossip key file refused; the running keys stay", "file", keyFile, "error", err)
					}
				})
			}
			if cfg.TLSCert != "" || cfg.TokenFile != "" || cfg.AdminTokenFile != "" {
				onHUP = append(onHUP, func() { _ = node.ReloadTLS() }) // a refused file is logged; the running ones stay
			}
			if len(onHUP) > 0 {
				hup := make(chan os.Signal, 1)
				signal.Notify(hup, syscall.SIGHUP)
				defer signal.Stop(hup)
				hupCtx, stopHUP := context.WithCancel(ctx)
				defer stopHUP()
				go func() {
					for {
						select {
						case <-hupCtx.Done():
							return
						case <-hup:
							for _, f := range onHUP {
								f()
							}
						}
					}
				}()
			}
			if addr := cmd.String("debug-addr"); addr != "" {
				stopDebug, err := serveDebug(addr, logger, rlsRules)
				if err != nil {
					_ = node.Close(context.Background())
					return usagef("debug-addr", "%v", err)
				}
				defer stopDebug()
			}
			var failure error
			select {
			case <-ctx.Done():
				logger.Info("shutting down", "reason", "signal")
			case failure = <-node.Failed():
			}
			stopCtx, cancel := context.WithTimeout(context.Background(), cfg.HandOffTimeout+cfg.LeaveTimeout+cfg.ForwardTimeout)
			defer cancel()
			if err := node.Close(stopCtx); err != nil {
				logger.Warn("graceful leave incomplete", "error", err)
			}
			if failure != nil {
				return cli.Exit(failure.Error(), exitFailure)
			}
			return nil
		},
	}
}

// reloader is a file-backed source the node follows: named limits, RLS
// rules.
type reloader interface {
	// Watch reloads on every change of the files until ctx is done; an
	// error means the watch could not start.
	Watch(ctx context.Context) error
	// Reload reads the files again; a refused file is logged by the
	// source, and what is in force stays.
	Reload() error
}

// follow watches src until the returned function is called (or ctx is
// done), and adds its Reload to onHUP (what SIGHUP runs); warn gets the
// error of a watch that cannot start.
func follow(ctx context.Context, src reloader, onHUP *[]func(), warn func(error)) (stop func()) {
	wctx, stop := context.WithCancel(ctx)
	go func() {
		if err := src.Watch(wctx); err != nil {
			warn(err)
		}
	}()
	*onHUP = append(*onHUP, func() { _ = src.Reload() })
	return stop
}

// serveDebug serves net/http/pprof's handlers on addr until the returned
// function is called, and with rules (nil: none) /rlconfig, the RLS rules
// in force as envoyproxy/ratelimit's debug port dumps them
// (rls.Config.Dump).
func serveDebug(addr string, logger *slog.Logger, rules *rls.Source) (func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if rules != nil {
		mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, rules.Current().Dump())
		})
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	logger.Info("debug endpoints up", "addr", lis.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// newLogger builds the node's slog logger.
func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("log-level", "want debug, info, warn or error, got %q", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("log-format", "want text or json, got %q", format)
}

// splitList splits a comma-separated list, dropping empty entries and
// surrounding spaces.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// serveGCPercent is the garbage collector's target (GOGC) that serve sets
// when the environment sets none. A node's heap is small (82 bytes a key)
// and its allocation rate high (gRPC's buffers and messages, a few KB a
// check), so at Go's default of 100 the collector runs many times a second
// under load: on the 2-core machine of BENCHMARKS.md, 400 cut the nodes'
// CPU per check by about a fifth. The price is memory: the heap may grow to
// five times what is live (about 100 MB live at the default --max-keys of
// 1000000, with replicas), not two. GOGC in the environment takes
// precedence, as everywhere in Go, and GOMEMLIMIT still caps the heap.
const serveGCPercent = 400

// defaultGCPercent returns serveGCPercent and true when getenv has no GOGC,
// else 0 and false (the runtime has already applied it).
func defaultGCPercent(getenv func(string) (string, bool)) (int, bool) {
	if v, ok := getenv("GOGC"); ok && v != "" {
		return 0, false
	}
	return serveGCPercent, true
}
