// Package proxyrules reads the rules file of sluice proxy (see docs/protect.md,
// "The proxy in one command"): which requests are checked against which limits,
// keyed by what, and answered how when the cluster cannot answer. It
// parses, compiles keys and matches requests to rules; it serves nothing
// (cmd/sluice wires the result to package middleware and a reverse proxy).
//
//	rs, err := proxyrules.Load("proxy.yaml", os.LookupEnv)
//	if i := rs.Match(r.Method, r.URL.Path); i >= 0 {
//		rule := rs.Rules[i] // check rule.Checks in one call, by rule.Failure
//	}
//
// Errors name the file, the line and the field:
// "proxy.yaml:4: rules[0].key: unknown key source ...".
//
// The package imports client, middleware, limits and YAML, never the
// server (internal/layout holds it to that).
package proxyrules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/middleware"
)

// rulesFile is the YAML of a rules file (see docs/protect.md).
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

// Rules is a loaded rules file: what Load and Parse return.
type Rules struct {
	// File is the path of the rules file as given to Load or Parse;
	// errors name it.
	File string
	// Timeout bounds one check call to the cluster, every node tried
	// included (timeout:; default 1s, always > 0).
	Timeout time.Duration
	// Failure is the file's failure mode (failure: open or closed;
	// default client.FailOpen). A rule's own failure: wins (Rule.Failure).
	Failure client.FailureMode
	// ResetDelta is reset: delta: X-RateLimit-Reset carries seconds from
	// now, not Unix seconds (reset: unix, the default).
	ResetDelta bool
	// Rules are the file's rules in file order, at least one; a request
	// is checked by the first that matches it (see Match).
	Rules []Rule
	// Now is the clock of signed IPs' freshness (signed_ip.max_age) and
	// of the rate-limit headers' deltas; nil means time.Now. It is read
	// on every call of Clock, so it may be set after Parse (tests do),
	// before the first request.
	Now func() time.Time

	exempt  []route
	fold    bool // compare paths case-insensitively (not case_sensitive_paths)
	ipCfg   *middleware.IPConfig
	signed  *middleware.SignedIPConfig
	user    string
	windows *limits.Set
}

// Clock returns the current time by rs.Now, or time.Now when Now is nil.
// Pass the method value rs.Clock as a clock (e.g. middleware.Config.Now)
// to follow later changes of Now.
func (rs *Rules) Clock() time.Time {
	if rs.Now != nil {
		return rs.Now()
	}
	return time.Now()
}

// Rule is one rule of the file: a route (its match:) and the checks of
// the requests it matches, sent in one call, which the nodes count all or
// nothing, and answered by its failure mode.
type Rule struct {
	// Line is the rule's line in the file (1-based), for errors about it.
	Line int
	// Failure is the rule's failure mode: its failure:, else the file's.
	Failure client.FailureMode
	// Checks are the rule's limits in file order: one for a rule of
	// limit: and key:, the entries of checks: otherwise; at least one.
	Checks []Check

	route route
}

// Check is one limit a rule's requests are checked against.
type Check struct {
	// Limit is the name of a limit configured on the nodes (limit:;
	// never empty; with limits_file, a name that file has).
	Limit string
	// Key returns a request's key, compiled from key: (sources ip,
	// signed_ip, user, route, field:NAME, header:NAME; a|b the first that
	// has a value; a+b a composite key).
	Key middleware.KeyFunc
	// Window is the limit's window, for RateLimit-Policy's w: window:,
	// else the default window of Limit in limits_file, else 0 (w left
	// out). Never negative.
	Window time.Duration
	// ForwardOverLimit is over_limit: forward: a request over the limit
	// goes upstream anyway, marked (the rule's only check); false is
	// over_limit: deny, the default (429).
	ForwardOverLimit bool
}

// Load reads the rules file at file and parses it (see Parse); getenv
// (os.LookupEnv, or a stand-in) supplies the secrets the file names. A
// file that cannot be read is an error "rules: " wrapping os.ReadFile's
// (*fs.PathError); the others are Parse's.
func Load(file string, getenv func(string) (string, bool)) (*Rules, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return Parse(file, data, getenv)
}

// Parse parses and checks the rules file data, read from file (which
// errors name, and against whose directory a relative limits_file is
// read); getenv supplies the secrets that client_ip.secret_env and
// signed_ip.secret_env name (each must be set, at least 16 bytes). An
// error reads "FILE:LINE: FIELD: REASON" (FIELD as written in the file,
// e.g. rules[0].checks[1].key), or "FILE:LINE: REASON" for YAML that does
// not parse or a setting the file cannot have: the first error found
// only, as a plain error (no sentinel to match).
func Parse(file string, data []byte, getenv func(string) (string, bool)) (*Rules, error) {
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

	rs := &Rules{File: file, Timeout: time.Second, user: spec.UserHeader, fold: !spec.CaseSensitivePaths}
	if spec.Timeout != "" {
		d, err := time.ParseDuration(spec.Timeout)
		if err != nil || d <= 0 {
			return nil, errf(line("timeout"), "timeout", "want a positive duration such as 1s, got %q", spec.Timeout)
		}
		rs.Timeout = d
	}
	var ok bool
	if rs.Failure, ok = parseFailure(spec.Failure, client.FailOpen); !ok {
		return nil, errf(line("failure"), "failure", "want open or closed, got %q", spec.Failure)
	}
	switch spec.Reset {
	case "", "unix":
	case "delta":
		rs.ResetDelta = true
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
		cfg := middleware.SignedIPConfig{Secret: s, Header: spec.SignedIP.Header, Now: rs.Clock}
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
		r := Rule{Line: line("rules", i)}
		var err error
		if r.route, err = parseRoute(rspec.Match, rs.fold); err != nil {
			return nil, errf(lineOr(line("rules", i, "match"), r.Line), fmt.Sprintf("rules[%d].match", i), "%v", err)
		}
		var ok bool
		if r.Failure, ok = parseFailure(rspec.Failure, rs.Failure); !ok {
			return nil, errf(lineOr(line("rules", i, "failure"), r.Line), fmt.Sprintf("rules[%d].failure", i), "want open or closed, got %q", rspec.Failure)
		}
		checks, at := rspec.Checks, []any{"rules", i, "checks"}
		if len(checks) == 0 {
			checks, at = []checkSpec{{Limit: rspec.Limit, Key: rspec.Key, OverLimit: rspec.OverLimit, Window: rspec.Window}}, []any{"rules", i}
		} else if rspec.Limit != "" || rspec.Key != "" || rspec.OverLimit != "" || rspec.Window != "" {
			return nil, errf(r.Line, fmt.Sprintf("rules[%d]", i), "give limit, key, over_limit and window, or checks, not both")
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
			c := Check{Limit: cs.Limit}
			if cs.Limit == "" {
				return nil, fail("limit", "required: the name of a limit configured on the nodes")
			}
			if rs.windows != nil && !rs.windows.Has(cs.Limit) {
				return nil, fail("limit", "no limit called %q in %s", cs.Limit, spec.LimitsFile)
			}
			if c.Key, err = rs.keyFunc(cs.Key, rspec.Match); err != nil {
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
				c.ForwardOverLimit = true
			default:
				return nil, fail("over_limit", "want deny or forward, got %q", cs.OverLimit)
			}
			if cs.Window != "" {
				if c.Window, err = time.ParseDuration(cs.Window); err != nil || c.Window <= 0 {
					return nil, fail("window", "want a positive duration, got %q", cs.Window)
				}
			} else if rs.windows != nil {
				c.Window = rs.windows.Get(cs.Limit).Default.Window
			}
			r.Checks = append(r.Checks, c)
		}
		rs.Rules = append(rs.Rules, r)
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
func (rs *Rules) keyFunc(spec, match string) (middleware.KeyFunc, error) {
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

func (rs *Rules) source(s, match string) (middleware.KeyFunc, error) {
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
		reason := regexp.MustCompile(` in type proxyrules\.\w+$`).ReplaceAllString(m[2], "")
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
