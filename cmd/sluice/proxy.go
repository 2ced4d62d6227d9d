package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/proxyrules"
	"github.com/sluicehq/sluice/rpc"
)

// overLimitHeader is set on requests a rule with over_limit: forward lets
// through over its limit; its value is the limit's name. The proxy
// removes any copy a client sends.
const overLimitHeader = "Sluice-Over-Limit"

func proxyCommand(e env) *cli.Command {
	return &cli.Command{
		Name:  "proxy",
		Usage: "a reverse proxy that limits requests per route with a sluice cluster",
		Description: "Forwards every request to --upstream, after checking it against the rules of --rules\n" +
			"(a YAML file: method and path -> limit name and key; see README, \"Protect a route\").\n" +
			"Secrets (the HMAC keys of client IPs and of signed IPs) come from the environment\n" +
			"variables the rules file names, never from the file.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "host:port to serve HTTP on", Sources: e.of("listen")},
			&cli.StringFlag{Name: "upstream", Usage: "base URL of the app, e.g. http://127.0.0.1:3000 (required)", Sources: e.of("upstream")},
			&cli.StringFlag{Name: "cluster", Usage: "gRPC addresses of sluice nodes, host:port[,host:port...] (required)", Sources: e.of("cluster")},
			&cli.StringFlag{Name: "rules", Usage: "the rules file (required)", Sources: e.of("rules")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Sources: e.of("log-level")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", Sources: e.of("log-format")},
			&cli.DurationFlag{Name: "read-header-timeout", Value: rpc.DefaultReadHeaderTimeout, Usage: "bound on reading a request's headers", Sources: e.of("read-header-timeout")},
			&cli.DurationFlag{Name: "read-timeout", Value: 60 * time.Second, Usage: "bound on reading a whole request, body included", Sources: e.of("read-timeout")},
			&cli.DurationFlag{Name: "write-timeout", Value: 60 * time.Second, Usage: "bound on writing a response, the upstream's time included (0: none, for upstreams that stream)", Sources: e.of("write-timeout")},
			&cli.DurationFlag{Name: "idle-timeout", Value: rpc.DefaultHTTPIdleTimeout, Usage: "bound on an idle kept-alive connection", Sources: e.of("idle-timeout")},
			&cli.IntFlag{Name: "max-header-bytes", Value: rpc.DefaultMaxHeaderBytes, Usage: "largest request headers, in bytes (more: 431)", Sources: e.of("max-header-bytes")},
			&cli.Int64Flag{Name: "max-body-bytes", Value: 10 << 20, Usage: "largest request body, in bytes (more: 413, and nothing reaches the upstream when the length is declared)", Sources: e.of("max-body-bytes")},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			if err := noArgs(cmd); err != nil {
				return err
			}
			logger, err := newLogger(cmd.String("log-level"), cmd.String("log-format"), cmd.Root().ErrWriter)
			if err != nil {
				return err
			}
			for _, f := range []string{"upstream", "cluster", "rules"} {
				if cmd.String(f) == "" {
					return usagef(f, "required")
				}
			}
			up, err := url.Parse(cmd.String("upstream"))
			if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
				return usagef("upstream", "want an http:// or https:// URL, got %q", cmd.String("upstream"))
			}
			var addrs []string
			for a := range strings.SplitSeq(cmd.String("cluster"), ",") {
				if a = strings.TrimSpace(a); a != "" {
					addrs = append(addrs, a)
				}
			}
			if len(addrs) == 0 {
				return usagef("cluster", "no address in %q", cmd.String("cluster"))
			}
			rules, err := proxyrules.Load(cmd.String("rules"), e.getenv)
			if err != nil {
				return usageError{err}
			}
			c, err := client.New(client.Config{Addrs: addrs, Timeout: rules.Timeout, FailureMode: rules.Failure, Logger: logger})
			if err != nil {
				return usagef("cluster", "%v", err)
			}
			defer c.Close()
			h, err := newProxyHandler(rules, up, c, logger)
			if err != nil {
				return usageError{err}
			}
			lis, err := net.Listen("tcp", cmd.String("listen"))
			if err != nil {
				return fmt.Errorf("proxy: %w", err)
			}
			for _, f := range []string{"read-header-timeout", "read-timeout", "idle-timeout"} {
				if d := cmd.Duration(f); d <= 0 {
					return usagef(f, "must be > 0, got %s", d)
				}
			}
			if d := cmd.Duration("write-timeout"); d < 0 {
				return usagef("write-timeout", "must be >= 0, got %s", d)
			}
			if n := cmd.Int("max-header-bytes"); n <= 0 {
				return usagef("max-header-bytes", "must be > 0, got %d", n)
			}
			if n := cmd.Int64("max-body-bytes"); n <= 0 {
				return usagef("max-body-bytes", "must be > 0, got %d", n)
			}
			wt := cmd.Duration("write-timeout")
			if wt == 0 {
				wt = -1 // HTTPBounds: no bound
			}
			srv := rpc.HTTPBounds{ReadHeaderTimeout: cmd.Duration("read-header-timeout"), ReadTimeout: cmd.Duration("read-timeout"),
				WriteTimeout: wt, IdleTimeout: cmd.Duration("idle-timeout"), MaxHeaderBytes: cmd.Int("max-header-bytes"),
			}.Apply(&http.Server{Handler: maxBody(h, cmd.Int64("max-body-bytes"))})
			logger.Info("proxy listening", "listen", lis.Addr().String(), "upstream", up.String(), "cluster", strings.Join(addrs, ","), "rules", len(rules.Rules))
			fmt.Fprintf(cmd.Root().Writer, "proxy listening on %s\n", lis.Addr())
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
		},
	}
}

// proxyHandler limits requests by the rules and forwards them upstream.
type proxyHandler struct {
	rules    *proxyrules.Rules
	upstream http.Handler
	handlers []http.Handler // by rule (rules.Rules' index): the rule's checks, then the upstream
}

// newProxyHandler builds the proxy of rs in front of upstream, checking
// through c (each rule by its own failure mode).
func newProxyHandler(rs *proxyrules.Rules, upstream *url.URL, c *client.Client, logger *slog.Logger) (http.Handler, error) {
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
	p := &proxyHandler{rules: rs, upstream: rp, handlers: make([]http.Handler, len(rs.Rules))}
	for i := range rs.Rules {
		r := &rs.Rules[i]
		checker, err := c.WithFailureMode(r.Failure)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: rule: %w", rs.File, r.Line, err)
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
// are forwarded unlimited.
func (p *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(overLimitHeader)
	if i := p.rules.Match(r.Method, r.URL.Path); i >= 0 {
		p.handlers[i].ServeHTTP(w, r)
		return
	}
	p.upstream.ServeHTTP(w, r)
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
