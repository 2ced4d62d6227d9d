package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/urfave/cli/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/middleware"
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
			rules, err := loadRules(cmd.String("rules"), e.getenv)
			if err != nil {
				return usageError{err}
			}
			c, err := client.New(client.Config{Addrs: addrs, Timeout: rules.timeout, FailureMode: rules.failure, Logger: logger})
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
			logger.Info("proxy listening", "listen", lis.Addr().String(), "upstream", up.String(), "cluster", strings.Join(addrs, ","), "rules", len(rules.rules))
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

// rulesFile is the YAML of a rules file (see README, "Protect a route").
type rulesFile struct {
	Timeout    string `yaml:"timeout"`
	Failure    string `yaml:"failure"`
	Reset      string `yaml:"reset"`
	LimitsFile string `yaml:"limits_file"`
	ClientIP   struct {
		SecretEnv      string   `yaml:"secret_env"`
		TrustedProxies []string `yaml:"trusted_proxies"`
		Header         string   `yaml:"header"`
		PlatformHeader string   `yaml:"platform_header"`
		IPv6Prefix     int      `yaml:"ipv6_prefix"`
		IPv4Prefix     int      `yaml:"ipv4_prefix"`
	} `yaml:"client_ip"`
	SignedIP struct {
		Header    string `yaml:"header"`
		SecretEnv string `yaml:"secret_env"`
		MaxAge    string `yaml:"max_age"`
	} `yaml:"signed_ip"`
	UserHeader string     `yaml:"user_header"`
	Exempt     []string   `yaml:"exempt"`
	Rules      []ruleSpec `yaml:"rules"`
	// CaseSensitivePaths compares request paths with the rules' paths
	// case-sensitively (default: in any case, as case-insensitive
	// upstreams route them).
	CaseSensitivePaths bool `yaml:"case_sensitive_paths"`
}

// ruleSpec is one rule: a route and its check (limit, key, ...) or its
// checks, and its failure mode (empty: the file's).
type ruleSpec struct {
	Match     string      `yaml:"match"`
	Limit     string      `yaml:"limit"`
	Key       string      `yaml:"key"`
	OverLimit string      `yaml:"over_limit"`
	Window    string      `yaml:"window"`
	Checks    []checkSpec `yaml:"checks"`
	Failure   string      `yaml:"failure"`
}

// checkSpec is one limit a request of a rule is checked against.
type checkSpec struct {
	Limit     string `yaml:"limit"`
	Key       string `yaml:"key"`
	OverLimit string `yaml:"over_limit"`
	Window    string `yaml:"window"`
}

// route is a method (empty: any; upper case) and a path pattern: exact,
// a subtree (ending in "/"), or a path.Match pattern (with "*"); in
// lower case unless paths are case-sensitive.
type route struct {
	method, path string
}

// parseMethod returns m in upper case (methods are accepted in any case
// in the rules file), or an error if it is no HTTP method token.
func parseMethod(m string) (string, error) {
	m = strings.TrimSpace(m)
	if m == "" || strings.IndexFunc(m, func(c rune) bool {
		return c > unicode.MaxASCII || !(unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("!#$%&'*+-.^_`|~", c))
	}) >= 0 {
		return "", fmt.Errorf("%q is no HTTP method", m)
	}
	return strings.ToUpper(m), nil
}

// parseRoute parses "[METHOD ]/PATH"; fold lowers the path (paths are
// compared case-insensitively).
func parseRoute(s string, fold bool) (route, error) {
	s = strings.TrimSpace(s)
	var r route
	if m, p, ok := strings.Cut(s, " "); ok {
		var err error
		if r.method, err = parseMethod(m); err != nil {
			return route{}, fmt.Errorf("%q: %v", s, err)
		}
		r.path = strings.TrimSpace(p)
	} else {
		r.path = s
	}
	if !strings.HasPrefix(r.path, "/") {
		return route{}, fmt.Errorf("%q: want [METHOD ]/PATH, e.g. \"POST /auth/login\"", s)
	}
	if _, err := path.Match(r.path, "/"); err != nil {
		return route{}, fmt.Errorf("%q: bad pattern: %v", s, err)
	}
	if fold {
		r.path = strings.ToLower(r.path)
	}
	return r, nil
}

// matches reports whether a request of method (upper case) to the path p
// (see canonicalPath) is of the route. GET also matches HEAD, as net/http
// and most frameworks route HEAD to GET handlers.
func (rt route) matches(method, p string) bool {
	if rt.method != "" && rt.method != method && !(rt.method == http.MethodGet && method == http.MethodHead) {
		return false
	}
	switch {
	case strings.HasSuffix(rt.path, "/"):
		return strings.HasPrefix(p, rt.path) || p == strings.TrimSuffix(rt.path, "/")
	case strings.Contains(rt.path, "*"):
		ok, _ := path.Match(rt.path, p)
		return ok
	}
	return p == rt.path
}

// canonicalPath returns the path rules are matched against: p (the
// decoded request path) with backslashes as slashes, each segment's
// ";params" and trailing white space dropped, then path.Clean'ed
// (repeated slashes, "." and ".." resolved, no trailing slash), and in
// lower case when fold is set; so that any spelling an upstream may route
// to the same handler (/auth/login/, //auth/login, /auth/./login,
// /auth/login;x, /auth/login%20, /AUTH/LOGIN) meets the same rule. The
// request forwarded upstream is not changed.
func canonicalPath(p string, fold bool) string {
	segs := strings.Split(strings.ReplaceAll(p, "\\", "/"), "/")
	for i, seg := range segs {
		seg, _, _ = strings.Cut(seg, ";")
		segs[i] = strings.TrimRightFunc(seg, unicode.IsSpace)
	}
	p = path.Clean("/" + strings.Join(segs, "/"))
	if fold {
		p = strings.ToLower(p)
	}
	return p
}

// rules is a loaded rules file.
type rules struct {
	file    string
	timeout time.Duration
	failure client.FailureMode
	reset   string
	ipCfg   *middleware.IPConfig
	signed  *middleware.SignedIPConfig
	user    string
	windows *limits.Set
	exempt  []route
	rules   []rule
	// fold compares paths case-insensitively (not case_sensitive_paths).
	fold bool
	// now is the clock of signature freshness and of the headers' deltas;
	// nil means time.Now (tests set it).
	now func() time.Time
}

func (rs *rules) clock() time.Time {
	if rs.now != nil {
		return rs.now()
	}
	return time.Now()
}

// rule is a route and the checks of the requests it matches, sent in
// one call and answered by its failure mode.
type rule struct {
	route
	line    int
	failure client.FailureMode
	checks  []ruleCheck
	handler http.Handler // set by newProxyHandler: the checks, then the upstream
}

// ruleCheck is one compiled check of a rule.
type ruleCheck struct {
	spec checkSpec
	key  middleware.KeyFunc
	win  time.Duration
}

// loadRules reads and checks a rules file; getenv supplies the secrets.
// Errors read "FILE:LINE: FIELD: REASON".
func loadRules(file string, getenv func(string) (string, bool)) (*rules, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return parseRules(file, data, getenv)
}

func parseRules(file string, data []byte, getenv func(string) (string, bool)) (*rules, error) {
	var spec rulesFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&spec); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(file, err)
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	errf := func(line int, field, format string, a ...any) error {
		return fmt.Errorf("%s:%d: %s: %s", file, line, field, fmt.Sprintf(format, a...))
	}
	line := func(keys ...any) int { return lineOf(&root, keys...) }
	secret := func(env string, at ...any) ([]byte, error) {
		v, ok := getenv(env)
		if !ok || v == "" {
			return nil, errf(line(at...), strings.Join(strs(at), "."), "environment variable %s is not set", env)
		}
		if len(v) < 16 {
			return nil, errf(line(at...), strings.Join(strs(at), "."), "the secret in %s must be at least 16 bytes, got %d", env, len(v))
		}
		return []byte(v), nil
	}

	rs := &rules{file: file, timeout: time.Second, reset: "unix", user: spec.UserHeader, fold: !spec.CaseSensitivePaths}
	if spec.Timeout != "" {
		d, err := time.ParseDuration(spec.Timeout)
		if err != nil || d <= 0 {
			return nil, errf(line("timeout"), "timeout", "want a positive duration such as 1s, got %q", spec.Timeout)
		}
		rs.timeout = d
	}
	var ok bool
	if rs.failure, ok = parseFailure(spec.Failure, client.FailOpen); !ok {
		return nil, errf(line("failure"), "failure", "want open or closed, got %q", spec.Failure)
	}
	switch spec.Reset {
	case "", "unix":
	case "delta":
		rs.reset = "delta"
	default:
		return nil, errf(line("reset"), "reset", "want unix or delta, got %q", spec.Reset)
	}
	if spec.LimitsFile != "" {
		p := spec.LimitsFile
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(file), p)
		}
		set, err := limits.Load(p)
		if err != nil {
			return nil, errf(line("limits_file"), "limits_file", "%v", err)
		}
		rs.windows = set
	}
	if env := spec.ClientIP.SecretEnv; env != "" {
		s, err := secret(env, "client_ip", "secret_env")
		if err != nil {
			return nil, err
		}
		cfg := middleware.IPConfig{Secret: s, Header: spec.ClientIP.Header, PlatformHeader: spec.ClientIP.PlatformHeader,
			IPv6Prefix: spec.ClientIP.IPv6Prefix, IPv4Prefix: spec.ClientIP.IPv4Prefix}
		for i, p := range spec.ClientIP.TrustedProxies {
			pf, err := netip.ParsePrefix(p)
			if err != nil {
				a, aerr := netip.ParseAddr(p)
				if aerr != nil {
					return nil, errf(line("client_ip", "trusted_proxies", i), fmt.Sprintf("client_ip.trusted_proxies[%d]", i), "want a CIDR prefix or an address, got %q", p)
				}
				pf = netip.PrefixFrom(a, a.BitLen())
			}
			cfg.TrustedProxies = append(cfg.TrustedProxies, pf)
		}
		if _, err := middleware.ClientIP(cfg); err != nil {
			return nil, errf(line("client_ip"), "client_ip", "%v", err)
		}
		rs.ipCfg = &cfg
	}
	if env := spec.SignedIP.SecretEnv; env != "" {
		s, err := secret(env, "signed_ip", "secret_env")
		if err != nil {
			return nil, err
		}
		cfg := middleware.SignedIPConfig{Secret: s, Header: spec.SignedIP.Header, Now: rs.clock}
		if spec.SignedIP.MaxAge != "" {
			d, err := time.ParseDuration(spec.SignedIP.MaxAge)
			if err != nil || d <= 0 {
				return nil, errf(line("signed_ip", "max_age"), "signed_ip.max_age", "want a positive duration such as 60s, got %q", spec.SignedIP.MaxAge)
			}
			cfg.MaxAge = d
		}
		rs.signed = &cfg
	}
	if spec.Exempt == nil {
		spec.Exempt = []string{http.MethodOptions}
	}
	for i, ex := range spec.Exempt {
		var rt route
		var err error
		if !strings.Contains(ex, "/") { // a method alone
			rt.path = "/"
			if rt.method, err = parseMethod(ex); err != nil {
				return nil, errf(line("exempt", i), fmt.Sprintf("exempt[%d]", i), "%v: want a method or [METHOD ]/PATH", err)
			}
		} else {
			if rt, err = parseRoute(ex, rs.fold); err != nil {
				return nil, errf(line("exempt", i), fmt.Sprintf("exempt[%d]", i), "%v", err)
			}
		}
		rs.exempt = append(rs.exempt, rt)
	}
	if len(spec.Rules) == 0 {
		return nil, errf(line(), "rules", "at least one rule is required")
	}
	for i, rspec := range spec.Rules {
		r := rule{line: line("rules", i)}
		var err error
		if r.route, err = parseRoute(rspec.Match, rs.fold); err != nil {
			return nil, errf(lineOr(line("rules", i, "match"), r.line), fmt.Sprintf("rules[%d].match", i), "%v", err)
		}
		var ok bool
		if r.failure, ok = parseFailure(rspec.Failure, rs.failure); !ok {
			return nil, errf(lineOr(line("rules", i, "failure"), r.line), fmt.Sprintf("rules[%d].failure", i), "want open or closed, got %q", rspec.Failure)
		}
		checks, at := rspec.Checks, []any{"rules", i, "checks"}
		if len(checks) == 0 {
			checks, at = []checkSpec{{Limit: rspec.Limit, Key: rspec.Key, OverLimit: rspec.OverLimit, Window: rspec.Window}}, []any{"rules", i}
		} else if rspec.Limit != "" || rspec.Key != "" || rspec.OverLimit != "" || rspec.Window != "" {
			return nil, errf(r.line, fmt.Sprintf("rules[%d]", i), "give limit, key, over_limit and window, or checks, not both")
		}
		for j, cs := range checks {
			base := append([]any(nil), at...)
			name := fmt.Sprintf("rules[%d]", i)
			if len(rspec.Checks) > 0 {
				base = append(base, j)
				name = fmt.Sprintf("rules[%d].checks[%d]", i, j)
			}
			fail := func(field, format string, a ...any) error {
				return errf(lineOr(line(append(base, field)...), line(base...)), name+"."+field, format, a...)
			}
			c := ruleCheck{spec: cs}
			if cs.Limit == "" {
				return nil, fail("limit", "required: the name of a limit configured on the nodes")
			}
			if rs.windows != nil && !rs.windows.Has(cs.Limit) {
				return nil, fail("limit", "no limit called %q in %s", cs.Limit, spec.LimitsFile)
			}
			if c.key, err = rs.keyFunc(cs.Key, rspec.Match); err != nil {
				return nil, fail("key", "%v", err)
			}
			switch cs.OverLimit {
			case "", "deny":
			case "forward":
				if len(rspec.Checks) > 1 {
					// The rule's checks are one request, counted all or
					// nothing: over this limit, the others would not
					// count the request that goes upstream.
					return nil, fail("over_limit", "forward needs a rule of its own (one check): a rule's checks count all or nothing, so a request forwarded over %q would count against none of the rule's other limits", cs.Limit)
				}
			default:
				return nil, fail("over_limit", "want deny or forward, got %q", cs.OverLimit)
			}
			if cs.Window != "" {
				if c.win, err = time.ParseDuration(cs.Window); err != nil || c.win <= 0 {
					return nil, fail("window", "want a positive duration, got %q", cs.Window)
				}
			} else if rs.windows != nil {
				c.win = rs.windows.Get(cs.Limit).Default.Window
			}
			r.checks = append(r.checks, c)
		}
		rs.rules = append(rs.rules, r)
	}
	return rs, nil
}

// parseFailure parses a failure mode: "" is def.
func parseFailure(s string, def client.FailureMode) (client.FailureMode, bool) {
	switch s {
	case "":
		return def, true
	case "open":
		return client.FailOpen, true
	case "closed":
		return client.FailClosed, true
	}
	return def, false
}

// keyFunc compiles a key source: parts joined by "+" make a composite
// key; a part is one source or several separated by "|" (the first that
// has a value). Sources: ip, signed_ip, user, route, field:NAME,
// header:NAME.
func (rs *rules) keyFunc(spec, match string) (middleware.KeyFunc, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("required, e.g. ip, user|ip or route+ip+field:email")
	}
	var parts []middleware.KeyFunc
	for p := range strings.SplitSeq(spec, "+") {
		var alts []middleware.KeyFunc
		for a := range strings.SplitSeq(p, "|") {
			f, err := rs.source(strings.TrimSpace(a), match)
			if err != nil {
				return nil, err
			}
			alts = append(alts, f)
		}
		if len(alts) == 1 {
			parts = append(parts, alts[0])
		} else {
			parts = append(parts, middleware.FirstOf(alts...))
		}
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return middleware.Composite(parts...), nil
}

func (rs *rules) source(s, match string) (middleware.KeyFunc, error) {
	kind, arg, _ := strings.Cut(s, ":")
	switch {
	case s == "ip":
		if rs.ipCfg == nil {
			return nil, errors.New("ip needs client_ip.secret_env")
		}
		return middleware.ClientIP(*rs.ipCfg)
	case s == "signed_ip":
		if rs.ipCfg == nil || rs.signed == nil {
			return nil, errors.New("signed_ip needs client_ip.secret_env and signed_ip.secret_env")
		}
		return middleware.SignedClientIP(*rs.ipCfg, *rs.signed)
	case s == "user":
		if rs.user == "" {
			return nil, errors.New("user needs user_header")
		}
		return middleware.UserFromHeader(rs.user), nil
	case s == "route":
		return middleware.Const(match), nil
	case kind == "field" && arg != "":
		return middleware.Field(arg), nil
	case kind == "header" && arg != "":
		return middleware.HeaderKey(arg, "h:"), nil
	}
	return nil, fmt.Errorf("unknown key source %q (want ip, signed_ip, user, route, field:NAME or header:NAME)", s)
}

var yamlLineRe = regexp.MustCompile(`line (\d+): (.*)`)

// yamlError rewrites a YAML decoding error as "FILE:LINE: REASON" (the
// first reason when there are several).
func yamlError(file string, err error) error {
	if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
		reason := regexp.MustCompile(` in type main\.\w+$`).ReplaceAllString(m[2], "")
		reason = strings.Replace(reason, "not found", "is not a setting of the rules file", 1)
		return fmt.Errorf("%s:%s: %s", file, m[1], reason)
	}
	return fmt.Errorf("%s: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
}

// lineOr returns line, or def when line is 0.
func lineOr(line, def int) int {
	if line > 0 {
		return line
	}
	return def
}

// strs formats a path of keys and indexes.
func strs(keys []any) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprint(k)
	}
	return out
}

// lineOf returns the line of the node at keys (mapping keys as strings,
// sequence indexes as ints) in the document root; the line of the
// deepest node found when the path ends early; 1 for an empty file.
func lineOf(root *yaml.Node, keys ...any) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	best := max(n.Line, 1)
	for _, k := range keys {
		var next *yaml.Node
		switch k := k.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == k {
						next = n.Content[i+1]
						best = n.Content[i].Line
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && k < len(n.Content) {
				next = n.Content[k]
				best = next.Line
			}
		}
		if next == nil {
			return best
		}
		n = next
	}
	return best
}

// proxyHandler limits requests by the rules and forwards them upstream.
type proxyHandler struct {
	rules    *rules
	upstream http.Handler
}

// newProxyHandler builds the proxy of rs in front of upstream, checking
// through c (each rule by its own failure mode).
func newProxyHandler(rs *rules, upstream *url.URL, c *client.Client, logger *slog.Logger) (http.Handler, error) {
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
	p := &proxyHandler{rules: rs, upstream: rp}
	for i := range rs.rules {
		r := &rs.rules[i]
		checker, err := c.WithFailureMode(r.failure)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: rule: %w", rs.file, r.line, err)
		}
		var ms []*middleware.Middleware
		next := http.Handler(rp)
		for _, rc := range r.checks {
			m, err := middleware.New(middleware.Config{
				Checker:       checker,
				Name:          rc.spec.Limit,
				Window:        rc.win,
				Key:           rc.key,
				ExemptMethods: []string{}, // the proxy's exempt list decides
				ResetDelta:    rs.reset == "delta",
				PassOverLimit: rc.spec.OverLimit == "forward",
				Now:           rs.clock,
				Logger:        logger,
			})
			if err != nil {
				return nil, fmt.Errorf("%s:%d: rule: %w", rs.file, r.line, err)
			}
			ms = append(ms, m)
			if rc.spec.OverLimit == "forward" { // the rule's only check
				name := rc.spec.Limit
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
			return nil, fmt.Errorf("%s:%d: rule: %w", rs.file, r.line, err)
		}
		r.handler = g.Handler(next)
	}
	return p, nil
}

// ServeHTTP forwards exempt requests; others are checked against the
// checks of the first rule that matches them (in file order), all in one
// call, the first check that denies answering; requests no rule matches
// are forwarded unlimited.
func (p *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(overLimitHeader)
	method, cpath := strings.ToUpper(r.Method), canonicalPath(r.URL.Path, p.rules.fold)
	for _, ex := range p.rules.exempt {
		if ex.matches(method, cpath) {
			p.upstream.ServeHTTP(w, r)
			return
		}
	}
	for i := range p.rules.rules {
		if rule := &p.rules.rules[i]; rule.matches(method, cpath) {
			rule.handler.ServeHTTP(w, r)
			return
		}
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
