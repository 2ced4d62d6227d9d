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
	"github.com/sluicehq/sluice/window"
)

func serveCommand(e env) *cli.Command {
	host, _ := os.Hostname()
	return &cli.Command{
		Name:  "serve",
		Usage: "run a sluice node",
		Description: "Runs a node: it answers checks on --grpc-addr, gossips membership on --gossip-addr,\n" +
			"and joins the members listed in --join (none: a cluster of one). With --join, until it\n" +
			"has joined it refuses client checks (UNAVAILABLE: ask another node), and gRPC health says\n" +
			"NOT_SERVING until it has joined and its ring has settled, as /readyz does. SIGINT or SIGTERM\n" +
			"makes it leave gracefully: health goes NOT_SERVING, it stops taking checks, hands the\n" +
			"state of all its keys to their next owners (bounded by --handoff-timeout), leaves the\n" +
			"gossip and exits. SIGHUP reloads --limits, --gossip-key-file, the TLS files and --token-file.\n\n" +
			"Each setting comes from its flag, else from SLUICE_<FLAG>, else from the --config file.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "YAML file of settings by flag name (e.g. grpc-addr: 10.0.0.5:7070); the command line, then SLUICE_* variables, win over it", Sources: e.of("config")},
			&cli.StringFlag{Name: "name", Value: host, Usage: "unique, stable member name; the default is the host name", Sources: e.of("name")},
			&cli.StringFlag{Name: "grpc-addr", Value: "127.0.0.1:7070", Usage: "host:port to serve gRPC on; port 0 lets the OS pick", Sources: e.of("grpc-addr")},
			&cli.StringFlag{Name: "gossip-addr", Value: "127.0.0.1:7946", Usage: "host:port to gossip on (TCP and UDP)", Sources: e.of("gossip-addr")},
			&cli.StringFlag{Name: "join", Usage: "gossip addresses of members to join, H:P[,H:P...]", Sources: e.of("join")},
			&cli.StringFlag{Name: "advertise-addr", Usage: "IP other members reach this node at (default: the listening host)", Sources: e.of("advertise-addr")},
			&cli.StringFlag{Name: "region", Value: "local", Usage: "region label of this node", Sources: e.of("region")},
			&cli.StringFlag{Name: "profile", Value: "lan", Usage: "gossip timings: lan, wan or local", Sources: e.of("profile")},
			&cli.DurationFlag{Name: "forward-timeout", Value: rpc.DefaultForwardTimeout, Usage: "bound on a forward to a key's owner", Sources: e.of("forward-timeout")},
			&cli.IntFlag{Name: "batch-size", Value: rpc.DefaultBatchSize, Usage: "send checks forwarded to one owner once this many are queued (1..1000)", Sources: e.of("batch-size")},
			&cli.DurationFlag{Name: "batch-wait", Value: rpc.DefaultBatchWait, Usage: "send checks forwarded to one owner at most this long after the first was queued", Sources: e.of("batch-wait")},
			&cli.DurationFlag{Name: "leave-timeout", Value: 5 * time.Second, Usage: "bound on the leave message at shutdown (after the hand-off)", Sources: e.of("leave-timeout")},
			&cli.DurationFlag{Name: "handoff-timeout", Value: rpc.DefaultHandOffTimeout, Usage: "bound on handing all keys' state to their next owners at shutdown, and on how long a new owner waits for moved keys (pulling each on first touch meanwhile)", Sources: e.of("handoff-timeout")},
			&cli.IntFlag{Name: "replicas", Value: rpc.DefaultReplicationFactor, Usage: "extra copies of each key's state, on the next members of the ring (0: none; a crashed owner's keys then start afresh)", Sources: e.of("replicas")},
			&cli.DurationFlag{Name: "replication-interval", Value: rpc.DefaultReplicationInterval, Usage: "how often an owner sends changed keys to their replicas; a crash loses at most the hits of the last interval plus one send", Sources: e.of("replication-interval")},
			&cli.DurationFlag{Name: "sweep-interval", Value: 5 * time.Second, Usage: "how often idle keys are removed", Sources: e.of("sweep-interval")},
			&cli.IntFlag{Name: "max-keys", Value: 1_000_000, Usage: "cap on the keys this node holds state for (0: no cap); over it, keys back at full capacity go first, then --on-key-cap decides", Sources: e.of("max-keys")},
			&cli.StringFlag{Name: "on-key-cap", Value: "deny", Usage: "what a new key past --max-keys gets: deny (refused: answered not allowed and degraded, counted in sluice_keys_refused_total; no live key loses its count) or evict (the least recently used key is evicted: its client gets a fresh budget)", Sources: e.of("on-key-cap")},
			&cli.IntFlag{Name: "name-key-share", Value: rpc.DefaultNameKeyShare, Usage: "percent of --max-keys the keys of one limit name may hold (all unconfigured names count as one); past it that name's new keys are refused, so one name cannot starve the others (100: no share)", Sources: e.of("name-key-share")},
			&cli.IntFlag{Name: "max-inflight", Value: rpc.DefaultMaxInflight, Usage: "checks this node works on at once for clients (gRPC, HTTP, Envoy); over it a call is refused with RESOURCE_EXHAUSTED (HTTP 429), counted in sluice_inflight_refused_total (-1: no bound)", Sources: e.of("max-inflight")},
			&cli.IntFlag{Name: "max-recv-bytes", Value: rpc.DefaultMaxRecvBytes, Usage: "largest gRPC message this node accepts, in bytes", Sources: e.of("max-recv-bytes")},
			&cli.IntFlag{Name: "max-concurrent-streams", Value: rpc.DefaultMaxConcurrentStreams, Usage: "gRPC calls in flight per connection", Sources: e.of("max-concurrent-streams")},
			&cli.DurationFlag{Name: "keepalive-min-time", Value: rpc.DefaultKeepaliveMinTime, Usage: "gRPC clients that send keepalive pings more often are disconnected", Sources: e.of("keepalive-min-time")},
			&cli.DurationFlag{Name: "max-connection-age", Usage: "ask gRPC clients to reconnect once their connection is this old, and close it --max-connection-age-grace later (0: off; peers' forward streams are cut too, and their checks in flight answered degraded)", Sources: e.of("max-connection-age")},
			&cli.DurationFlag{Name: "max-connection-age-grace", Value: 30 * time.Second, Usage: "how long calls may go on after --max-connection-age", Sources: e.of("max-connection-age-grace")},
			&cli.DurationFlag{Name: "http-read-header-timeout", Value: rpc.DefaultReadHeaderTimeout, Usage: "bound on reading an HTTP request's headers", Sources: e.of("http-read-header-timeout")},
			&cli.DurationFlag{Name: "http-read-timeout", Value: rpc.DefaultHTTPReadTimeout, Usage: "bound on reading a whole HTTP request", Sources: e.of("http-read-timeout")},
			&cli.DurationFlag{Name: "http-write-timeout", Value: rpc.DefaultHTTPWriteTimeout, Usage: "bound on writing an HTTP response", Sources: e.of("http-write-timeout")},
			&cli.DurationFlag{Name: "http-idle-timeout", Value: rpc.DefaultHTTPIdleTimeout, Usage: "bound on an idle kept-alive HTTP connection", Sources: e.of("http-idle-timeout")},
			&cli.IntFlag{Name: "http-max-header-bytes", Value: rpc.DefaultMaxHeaderBytes, Usage: "largest HTTP request headers, in bytes (more: 431)", Sources: e.of("http-max-header-bytes")},
			&cli.StringFlag{Name: "http-addr", Value: "127.0.0.1:7080", Usage: "host:port of the HTTP face: POST /v1/check, GET /v1/members, /healthz, /readyz, /metrics (empty: off; port 0 lets the OS pick)", Sources: e.of("http-addr")},
			&cli.StringFlag{Name: "limits", Usage: "YAML file of named limits (see README); reloaded on SIGHUP and when the file changes", Sources: e.of("limits")},
			&cli.StringFlag{Name: "gossip-key-file", Usage: "file of base64 gossip keys (sluice keygen), one per line, the one that encrypts first: gossip is then encrypted and authenticated (AES-256-GCM); reloaded on SIGHUP (rotate: add the new key second, then first, then drop the old)", Sources: e.of("gossip-key-file")},
			&cli.StringFlag{Name: "cluster-label", Usage: "label on all gossip: nodes with another label (another cluster on the network) are ignored", Sources: e.of("cluster-label")},
			&cli.StringFlag{Name: "tls-cert", Usage: "PEM peer certificate of this node (sluice tls cert create --peer NAME): serve gRPC and HTTP with TLS (1.2 at least), dial peers with TLS 1.3; with --tls-key and --tls-ca; reloaded when the files change and on SIGHUP", Sources: e.of("tls-cert")},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM key of --tls-cert", Sources: e.of("tls-key")},
			&cli.StringFlag{Name: "tls-ca", Usage: "PEM bundle of the CA(s) that sign peers and clients", Sources: e.of("tls-ca")},
			&cli.StringFlag{Name: "client-auth", Usage: "how callers of the public API authenticate: mtls (a client certificate; the default with TLS), token (--token-file), either, or none (default without TLS and tokens)", Sources: e.of("client-auth")},
			&cli.StringFlag{Name: "token-file", Usage: "bearer tokens and the limit-name prefixes each may check, one `TOKEN PREFIX...` a line (or YAML tokens: [{name, token, prefixes}]); reloaded with the TLS files; refused over plaintext from other hosts", Sources: e.of("token-file")},
			&cli.BoolFlag{Name: "insecure", Usage: "allow addresses reachable from other hosts without gossip encryption, TLS or client authentication (the node warns every 5 minutes); without it such a node refuses to start and names what is missing", Sources: e.of("insecure")},
			&cli.StringFlag{Name: "debug-addr", Usage: "host:port to serve Go's /debug/pprof on (off when empty; keep it on loopback)", Sources: e.of("debug-addr")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Sources: e.of("log-level")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", Sources: e.of("log-format")},
			&cli.StringFlag{Name: "rls-config", Usage: "serve Envoy's rate limit service (RLS v3) on the gRPC port with the rules in this file, or in the *.yaml/*.yml files of this directory (envoyproxy/ratelimit's format; see docs/envoy.md); off when empty", Sources: e.of("rls-config")},
		},
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
			cfg := rpc.NodeConfig{
				Name:           cmd.String("name"),
				GRPCAddr:       cmd.String("grpc-addr"),
				GossipAddr:     cmd.String("gossip-addr"),
				AdvertiseHost:  cmd.String("advertise-addr"),
				Region:         cmd.String("region"),
				Join:           splitList(cmd.String("join")),
				Profile:        cluster.Profile(cmd.String("profile")),
				ForwardTimeout: cmd.Duration("forward-timeout"),
				Batch:          rpc.BatchConfig{MaxSize: cmd.Int("batch-size"), MaxWait: cmd.Duration("batch-wait")},
				LeaveTimeout:   cmd.Duration("leave-timeout"),
				HandOffTimeout: cmd.Duration("handoff-timeout"),
				Replication: rpc.ReplicationConfig{Factor: cmd.Int("replicas"), Disabled: cmd.Int("replicas") == 0,
					Interval: cmd.Duration("replication-interval")},
				SweepInterval: cmd.Duration("sweep-interval"),
				MaxKeys:       cmd.Int("max-keys"),
				NameKeyShare:  cmd.Int("name-key-share"),
				GRPC: rpc.GRPCBounds{MaxRecvBytes: cmd.Int("max-recv-bytes"), MaxConcurrentStreams: uint32(max(cmd.Int("max-concurrent-streams"), 0)),
					KeepaliveMinTime: cmd.Duration("keepalive-min-time"), MaxConnectionAge: cmd.Duration("max-connection-age"),
					MaxConnectionAgeGrace: cmd.Duration("max-connection-age-grace"), MaxInflight: cmd.Int("max-inflight")},
				HTTP: rpc.HTTPBounds{ReadHeaderTimeout: cmd.Duration("http-read-header-timeout"), ReadTimeout: cmd.Duration("http-read-timeout"),
					WriteTimeout: cmd.Duration("http-write-timeout"), IdleTimeout: cmd.Duration("http-idle-timeout"),
					MaxHeaderBytes: cmd.Int("http-max-header-bytes")},
				Version: version,
				Logger:  logger,
			}
			for _, d := range []struct {
				flag string
				v    time.Duration
			}{{"forward-timeout", cfg.ForwardTimeout}, {"leave-timeout", cfg.LeaveTimeout}, {"sweep-interval", cfg.SweepInterval},
				{"handoff-timeout", cfg.HandOffTimeout}, {"replication-interval", cfg.Replication.Interval}} {
				if d.v <= 0 {
					return usagef(d.flag, "must be > 0, got %s", d.v)
				}
			}
			if n := cfg.Batch.MaxSize; n < 1 || n > rpc.MaxBatch {
				return usagef("batch-size", "must be in 1..%d, got %d", rpc.MaxBatch, n)
			}
			if cfg.Batch.MaxWait <= 0 {
				return usagef("batch-wait", "must be > 0, got %s", cfg.Batch.MaxWait)
			}
			if n := cmd.Int("replicas"); n < 0 || n > 3 {
				return usagef("replicas", "must be in 0..3, got %d", n)
			}
			if cfg.MaxKeys < 0 {
				return usagef("max-keys", "must be >= 0, got %d", cfg.MaxKeys)
			}
			if cfg.OnKeyCap, err = window.ParseKeyCapPolicy(cmd.String("on-key-cap")); err != nil {
				return usagef("on-key-cap", "%v", err)
			}
			if n := cfg.NameKeyShare; n < 1 || n > 100 {
				return usagef("name-key-share", "must be in 1..100 (percent), got %d", n)
			}
			if n := cfg.GRPC.MaxInflight; n == 0 || n < -1 {
				return usagef("max-inflight", "must be > 0, or -1 for no bound, got %d", n)
			}
			for _, f := range []string{"max-recv-bytes", "max-concurrent-streams", "http-max-header-bytes"} {
				if n := cmd.Int(f); n <= 0 {
					return usagef(f, "must be > 0, got %d", n)
				}
			}
			for _, f := range []string{"keepalive-min-time", "max-connection-age-grace", "http-read-header-timeout", "http-read-timeout", "http-write-timeout", "http-idle-timeout"} {
				if d := cmd.Duration(f); d <= 0 {
					return usagef(f, "must be > 0, got %s", d)
				}
			}
			if d := cmd.Duration("max-connection-age"); d < 0 {
				return usagef("max-connection-age", "must be >= 0, got %s", d)
			}
			if cfg.Name == "" {
				return usagef("name", "required (the host name is unknown)")
			}
			switch cfg.Profile {
			case cluster.LAN, cluster.WAN, cluster.Local:
			default:
				return usagef("profile", "want lan, wan or local, got %q", cfg.Profile)
			}
			cfg.HTTPAddr = cmd.String("http-addr")
			cfg.Insecure = cmd.Bool("insecure")
			cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = cmd.String("tls-cert"), cmd.String("tls-key"), cmd.String("tls-ca")
			cfg.ClientAuth, cfg.TokenFile = rpc.ClientAuth(cmd.String("client-auth")), cmd.String("token-file")
			if want, warn := tracingWanted(e.getenv); warn != "" {
				logger.Warn(warn)
			} else if want {
				tr, err := setupTracing(ctx, logger.With("component", "tracing"))
				if err != nil {
					return cli.Exit("tracing: "+err.Error(), exitFailure)
				}
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = tr.shutdown(sctx) // flushes the last spans
				}()
				cfg.ServerOptions, cfg.DialOptions = tr.server, tr.dial
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
				watchCtx, stopWatch := context.WithCancel(ctx)
				defer stopWatch()
				go func() {
					if err := src.Watch(watchCtx); err != nil {
						logger.Warn("not watching the limits file; reload it with SIGHUP", "file", path, "error", err)
					}
				}()
				onHUP = append(onHUP, func() { _ = src.Reload() }) // a refused file is logged; the running limits stay
			}
			keyFile := cmd.String("gossip-key-file")
			if keyFile != "" {
				keys, err := cluster.ReadKeyFile(keyFile)
				if err != nil {
					return usagef("gossip-key-file", "%v", err)
				}
				cfg.GossipKeys = keys
			}
			cfg.ClusterLabel = cmd.String("cluster-label")
			if path := cmd.String("rls-config"); path != "" {
				rules, err := rls.Load(path)
				if err != nil {
					return usagef("rls-config", "%v", err)
				}
				cfg.RLS = rules
				logger.Info("rls rules loaded", "domains", strings.Join(rules.Domains(), ","), "files", len(rules.Files()))
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
			if cfg.TLSCert != "" || cfg.TokenFile != "" {
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
				stopDebug, err := serveDebug(addr, logger)
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

// serveDebug serves net/http/pprof's handlers on addr until the returned
// function is called.
func serveDebug(addr string, logger *slog.Logger) (func(), error) {
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
