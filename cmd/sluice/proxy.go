package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/proxyrules"
	"github.com/sluicehq/sluice/rpc"
)

// overLimitHeader is set on requests a rule with over_limit: forward lets
// through over its limit; its value is the limit's name. The proxy
// removes any copy a client sends.
const overLimitHeader = "Sluice-Over-Limit"

// Defaults of the proxy's probes of the cluster and of its log's rate
// limit.
const (
	defaultProbeInterval = 5 * time.Second
	defaultProbeTimeout  = 5 * time.Second
	proxyLogEvery        = 10 * time.Second // at most one warning or error of a kind per this
)

func proxyCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "proxy",
		Usage: "a reverse proxy that limits requests per route with a sluice cluster",
		Description: "Forwards every request to --upstream, after checking it against the rules of --rules\n" +
			"(a YAML file: method and path -> limit name and key; see docs/protect.md).\n" +
			"Secrets (the HMAC keys of client IPs and of signed IPs) come from the environment\n" +
			"variables the rules file names, never from the file.\n\n" +
			"At start it probes every node of --cluster with the proxy's credentials (--tls-*, --token-file)\n" +
			"and refuses to start, naming the flag, when the cluster refuses them (TLS handshake, certificate,\n" +
			"token); a cluster out of reach is no reason not to start: requests then follow the rules file's\n" +
			"failure: (open or closed). --admin-addr serves /healthz, /readyz and /metrics.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "host:port to serve HTTP on", Sources: e.of("listen")},
			&cli.StringFlag{Name: "upstream", Usage: "base URL of the app, e.g. http://127.0.0.1:3000 (required)", Sources: e.of("upstream")},
			&cli.StringFlag{Name: "cluster", Usage: "gRPC addresses of sluice nodes, host:port[,host:port...] (required)", Sources: e.of("cluster")},
			&cli.StringFlag{Name: "rules", Usage: "the rules file (required)", Sources: e.of("rules")},
			&cli.StringFlag{Name: "route", Value: "owner", Usage: "owner: send each check straight to its key's owner (the cluster's routing table; falls back to any node); any: to the --cluster nodes in turn, which forward it (docs/routing.md)", Sources: e.of("route")},
			&cli.StringFlag{Name: "admin-addr", Usage: "host:port of the proxy's own GET /healthz, /readyz (the cluster reachable) and /metrics (empty: off; port 0 lets the OS pick; keep it off the public network)", Sources: e.of("admin-addr")},
			&cli.DurationFlag{Name: "probe-interval", Value: defaultProbeInterval, Usage: "how often to probe the cluster (Members) for /readyz; a check no node answered also asks for a probe, at most once a second", Sources: e.of("probe-interval")},
			&cli.DurationFlag{Name: "probe-timeout", Value: defaultProbeTimeout, Usage: "bound on each probe of the cluster, the one at start included", Sources: e.of("probe-timeout")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Sources: e.of("log-level")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", Sources: e.of("log-format")},
			&cli.DurationFlag{Name: "read-header-timeout", Value: rpc.DefaultReadHeaderTimeout, Usage: "bound on reading a request's headers", Sources: e.of("read-header-timeout")},
			&cli.DurationFlag{Name: "read-timeout", Value: 60 * time.Second, Usage: "bound on reading a whole request, body included", Sources: e.of("read-timeout")},
			&cli.DurationFlag{Name: "write-timeout", Value: 60 * time.Second, Usage: "bound on writing a response, the upstream's time included (0: none, for upstreams that stream)", Sources: e.of("write-timeout")},
			&cli.DurationFlag{Name: "idle-timeout", Value: rpc.DefaultHTTPIdleTimeout, Usage: "bound on an idle kept-alive connection", Sources: e.of("idle-timeout")},
			&cli.IntFlag{Name: "max-header-bytes", Value: rpc.DefaultMaxHeaderBytes, Usage: "largest request headers, in bytes (more: 431)", Sources: e.of("max-header-bytes")},
			&cli.Int64Flag{Name: "max-body-bytes", Value: 10 << 20, Usage: "largest request body, in bytes (more: 413, and nothing reaches the upstream when the length is declared)", Sources: e.of("max-body-bytes")},
		}, clientAuthFlags(e)...),
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			cfg, err := proxyConfigOf(cmd, e)
			if err != nil {
				return err
			}
			return runProxy(ctx, cfg, func(addr, admin string) {
				// The admin line first: "proxy listening" is the last.
				if admin != "" {
					fmt.Fprintf(cmd.Root().Writer, "proxy admin on %s\n", admin)
				}
				fmt.Fprintf(cmd.Root().Writer, "proxy listening on %s\n", addr)
			})
		},
	}
}

// proxyConfig is a proxy to run: its flags checked and read.
type proxyConfig struct {
	listen, admin string
	upstream      *url.URL
	addrs         []string
	route         client.Route
	rules         *proxyrules.Rules
	auth          clientAuth
	dial          []grpc.DialOption
	server        rpc.HTTPBounds
	maxBody       int64
	probeInterval time.Duration
	probeTimeout  time.Duration
	logEvery      time.Duration    // the log's rate limit, per kind
	now           func() time.Time // the log's rate limit's and the probes' clock
	logLevel      string
	logFormat     string
	logTo         io.Writer
	otelEnv       func(string) (string, bool) // the OTEL_* variables (tracing); nil: no tracing
}

// proxyConfigOf reads and checks the proxy's flags (and the rules file
// and the client auth files); the error is a usageError naming the flag.
func proxyConfigOf(cmd *cli.Command, e env) (proxyConfig, error) {
	cfg := proxyConfig{listen: cmd.String("listen"), admin: cmd.String("admin-addr"), logEvery: proxyLogEvery, now: time.Now,
		logLevel: cmd.String("log-level"), logFormat: cmd.String("log-format"), logTo: cmd.Root().ErrWriter, otelEnv: e.getenv}
	if _, err := newLogger(cfg.logLevel, cfg.logFormat, io.Discard); err != nil {
		return cfg, err
	}
	route, err := client.ParseRoute(cmd.String("route"))
	if err != nil {
		return cfg, usagef("route", "%v", err)
	}
	cfg.route = route
	for _, f := range []string{"upstream", "cluster", "rules"} {
		if cmd.String(f) == "" {
			return cfg, usagef(f, "required")
		}
	}
	up, err := url.Parse(cmd.String("upstream"))
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return cfg, usagef("upstream", "want an http:// or https:// URL, got %q", cmd.String("upstream"))
	}
	cfg.upstream = up
	for a := range strings.SplitSeq(cmd.String("cluster"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.addrs = append(cfg.addrs, a)
		}
	}
	if len(cfg.addrs) == 0 {
		return cfg, usagef("cluster", "no address in %q", cmd.String("cluster"))
	}
	if cfg.rules, err = proxyrules.Load(cmd.String("rules"), e.getenv); err != nil {
		return cfg, usageError{err}
	}
	for _, f := range []string{"read-header-timeout", "read-timeout", "idle-timeout", "probe-interval", "probe-timeout"} {
		if d := cmd.Duration(f); d <= 0 {
			return cfg, usagef(f, "must be > 0, got %s", d)
		}
	}
	cfg.probeInterval, cfg.probeTimeout = cmd.Duration("probe-interval"), cmd.Duration("probe-timeout")
	if d := cmd.Duration("write-timeout"); d < 0 {
		return cfg, usagef("write-timeout", "must be >= 0, got %s", d)
	}
	if n := cmd.Int("max-header-bytes"); n <= 0 {
		return cfg, usagef("max-header-bytes", "must be > 0, got %d", n)
	}
	if cfg.maxBody = cmd.Int64("max-body-bytes"); cfg.maxBody <= 0 {
		return cfg, usagef("max-body-bytes", "must be > 0, got %d", cfg.maxBody)
	}
	wt := cmd.Duration("write-timeout")
	if wt == 0 {
		wt = -1 // HTTPBounds: no bound
	}
	cfg.server = rpc.HTTPBounds{ReadHeaderTimeout: cmd.Duration("read-header-timeout"), ReadTimeout: cmd.Duration("read-timeout"),
		WriteTimeout: wt, IdleTimeout: cmd.Duration("idle-timeout"), MaxHeaderBytes: cmd.Int("max-header-bytes")}
	if cfg.auth, err = clientAuthOf(cmd); err != nil {
		return cfg, err
	}
	if cfg.dial, err = cfg.auth.dialOptions(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// runProxy probes the cluster, then serves the proxy (and its admin
// endpoints) until ctx ends, calling started with their addresses ("" for
// no admin) once both listen. It returns a usageError naming the flag
// when the cluster refuses the proxy's credentials (no node answered and
// one refused them), or one naming --listen or --admin-addr when they
// cannot be listened on, before anything listens.
func runProxy(ctx context.Context, cfg proxyConfig, started func(addr, admin string)) error {
	base, err := newLogger(cfg.logLevel, cfg.logFormat, cfg.logTo)
	if err != nil {
		return err
	}
	logger := slog.New(newThrottleHandler(base.Handler(), cfg.logEvery, cfg.now))
	tp, stopTracing, err := proxyTracing(ctx, cfg.otelEnv, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	c, err := client.New(client.Config{Addrs: cfg.addrs, Timeout: cfg.rules.Timeout, FailureMode: cfg.rules.Failure, Logger: logger, DialOptions: cfg.dial,
		TracerProvider: tp, Route: cfg.route})
	if err != nil {
		return usagef("cluster", "%v", err)
	}
	defer c.Close()
	watch := newClusterWatch(c, cfg.addrs, cfg.auth, ruleLimits(cfg.rules), cfg.probeTimeout, cfg.now, logger)
	switch r := watch.probe(ctx); r.verdict() {
	case probeRefused:
		if len(r.refused) > 1 {
			return usageError{fmt.Errorf("%w (and %d more of the %d nodes)", r.refused[0], len(r.refused)-1, len(cfg.addrs))}
		}
		return r.refused[0]
	case probeUnreachable:
		logger.Warn("cluster unreachable at start; serving anyway", "event", "proxy.cluster_unready", "reason", r.reason(),
			"failure", cfg.rules.Failure.String())
	default:
		for _, e := range r.refused {
			logger.Warn("a node refuses the proxy's credentials", "event", "proxy.node_refused", "reason", e.Error())
		}
		for _, n := range r.notes {
			logger.Warn("a node answered the probe but refused a peek of a rule's limit", "event", "proxy.probe_note", "note", n)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	h, err := newProxyHandler(cfg.rules, cfg.upstream, c, logger, watch)
	if err != nil {
		return usageError{err}
	}
	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return usagef("listen", "%v", err)
	}
	adminAddr := ""
	if cfg.admin != "" {
		alis, err := net.Listen("tcp", cfg.admin)
		if err != nil {
			lis.Close()
			return usagef("admin-addr", "%v", err)
		}
		adminAddr = alis.Addr().String()
		stopAdmin := serveAdmin(alis, watch)
		defer stopAdmin()
	}
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { watch.run(wctx, cfg.probeInterval) })
	defer func() { stopWatch(); wg.Wait() }()
	srv := cfg.server.Apply(&http.Server{Handler: maxBody(withTraceContext(h, tp), cfg.maxBody)})
	ready, _ := watch.state()
	logger.Info("proxy listening", "listen", lis.Addr().String(), "admin", adminAddr, "upstream", cfg.upstream.String(),
		"cluster", strings.Join(cfg.addrs, ","), "rules", len(cfg.rules.Rules), "cluster_ready", ready,
		"tls", cfg.auth.ca != "", "client_cert", cfg.auth.cert != "", "token", cfg.auth.token != "")
	started(lis.Addr().String(), adminAddr)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("proxy: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-errc
	return err
}

// ruleLimits returns the distinct limit names of rs's checks, in file
// order.
func ruleLimits(rs *proxyrules.Rules) []string {
	var out []string
	for _, r := range rs.Rules {
		for _, c := range r.Checks {
			if !slices.Contains(out, c.Limit) {
				out = append(out, c.Limit)
			}
		}
	}
	return out
}

// proxyHandler limits requests by the rules and forwards them upstream.
type proxyHandler struct {
	rules    *proxyrules.Rules
	upstream http.Handler
	handlers []http.Handler // by rule (rules.Rules' index): the rule's checks, then the upstream
	watch    *clusterWatch  // counts each request by its outcome; nil: not counted
}

// newProxyHandler builds the proxy of rs in front of upstream, checking
// through c (each rule by its own failure mode); watch, when not nil,
// observes every check and counts every request. The error names the
// rule (file and line) whose checks cannot be built.
func newProxyHandler(rs *proxyrules.Rules, upstream *url.URL, c *client.Client, logger *slog.Logger, watch *clusterWatch) (http.Handler, error) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			logger.Warn("upstream failed", "method", r.Method, "path", r.URL.Path, "err", err)
			http.Error(w, http.StatusText(http.StatusBadGateway), http.StatusBadGateway)
		},
	}
	p := &proxyHandler{rules: rs, upstream: rp, handlers: make([]http.Handler, len(rs.Rules)), watch: watch}
	for i := range rs.Rules {
		r := &rs.Rules[i]
		cc, err := c.WithFailureMode(r.Failure)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: rule: %w", rs.File, r.Line, err)
		}
		var checker interface {
			middleware.Checker
			middleware.BatchChecker
		} = cc
		if watch != nil {
			checker = watchedChecker{c: cc, w: watch}
		}
		var ms []*middleware.Middleware
		next := http.Handler(rp)
		for _, rc := range r.Checks {
			m, err := middleware.New(middleware.Config{
				Checker:       checker,
				Name:          rc.Limit,
				Window:        rc.Window,
				Key:           rc.Key,
				ExemptMethods: []string{}, // the proxy's exempt list decides
				ResetDelta:    rs.ResetDelta,
				PassOverLimit: rc.ForwardOverLimit,
				Now:           rs.Clock,
				Logger:        logger,
			})
			if err != nil {
				return nil, fmt.Errorf("%s:%d: rule: %w", rs.File, r.Line, err)
			}
			ms = append(ms, m)
			if rc.ForwardOverLimit { // the rule's only check
				name := rc.Limit
				next = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					if d, ok := middleware.DecisionFrom(req.Context()); ok && !d.Allowed {
						req.Header.Add(overLimitHeader, name)
					}
					rp.ServeHTTP(w, req)
				})
			}
		}
		// All the rule's checks go in one call, which the nodes count
		// all or nothing.
		g, err := middleware.NewGroup(middleware.GroupConfig{Checker: checker, Limits: ms})
		if err != nil {
			return nil, fmt.Errorf("%s:%d: rule: %w", rs.File, r.Line, err)
		}
		p.handlers[i] = g.Handler(next)
	}
	return p, nil
}

// ServeHTTP forwards exempt requests; others are checked against the
// checks of the first rule that matches them (in file order), all in one
// call, the first check that denies answering; requests no rule matches
// are forwarded unlimited. The proxy has no paths of its own: /healthz,
// /readyz and /metrics go upstream too (its own are on --admin-addr).
func (p *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(overLimitHeader)
	i := p.rules.Match(r.Method, r.URL.Path)
	if i < 0 {
		if p.watch != nil {
			p.watch.m.requests.WithLabelValues(outcomeUnchecked).Inc()
		}
		p.upstream.ServeHTTP(w, r)
		return
	}
	if p.watch == nil {
		p.handlers[i].ServeHTTP(w, r)
		return
	}
	note := &requestNote{}
	p.handlers[i].ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestNoteKey{}, note)))
	p.watch.m.requests.WithLabelValues(note.outcome()).Inc()
}

// maxBody answers 413 to a request whose declared body is over limit bytes,
// and cuts a body that turns out longer while it is read (the upstream
// then sees a failed read).
func maxBody(h http.Handler, limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("request body over %d bytes", limit), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		h.ServeHTTP(w, r)
	})
}
