package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/window"
)

// serveFlag is one row of serve's flag table (serveFlags): a flag's name,
// type and default, its help text, where its value goes in the node's
// config, and what values it refuses. Every flag of serve also reads
// SLUICE_<FLAG> (env.of) and the --config file (applyConfigFile).
type serveFlag interface {
	flagName() string
	// cliFlag returns the urfave/cli flag of the row, reading the
	// environment through e.
	cliFlag(e env) cli.Flag
	// check returns a usage error naming the flag when its value is
	// refused, else nil.
	check(cmd *cli.Command) error
	// apply puts the flag's value in cfg (nothing for a flag the action
	// reads itself).
	apply(cmd *cli.Command, cfg *rpc.NodeConfig)
}

// flagRow is a serveFlag whose value is a T: a string, int,
// time.Duration or bool flag.
type flagRow[T string | int | time.Duration | bool] struct {
	name string
	// def is the default; the zero value shows no default in --help.
	def   T
	usage string
	// to puts the value in the node's config; nil for a flag the action
	// reads itself (a file to open, the logger, the debug server).
	to func(cfg *rpc.NodeConfig, v T)
	// valid returns why a value is refused ("must be > 0, got 0s"); nil
	// refuses none.
	valid func(v T) error
}

type (
	stringFlag   = flagRow[string]
	intFlag      = flagRow[int]
	durationFlag = flagRow[time.Duration]
	boolFlag     = flagRow[bool]
)

func (r *flagRow[T]) flagName() string { return r.name }

func (r *flagRow[T]) cliFlag(e env) cli.Flag {
	switch def := any(r.def).(type) {
	case string:
		return &cli.StringFlag{Name: r.name, Value: def, Usage: r.usage, Sources: e.of(r.name)}
	case int:
		return &cli.IntFlag{Name: r.name, Value: def, Usage: r.usage, Sources: e.of(r.name)}
	case time.Duration:
		return &cli.DurationFlag{Name: r.name, Value: def, Usage: r.usage, Sources: e.of(r.name)}
	case bool:
		return &cli.BoolFlag{Name: r.name, Value: def, Usage: r.usage, Sources: e.of(r.name)}
	}
	panic("unreachable")
}

// value returns the flag's value in cmd.
func (r *flagRow[T]) value(cmd *cli.Command) T {
	var v any
	switch any(r.def).(type) {
	case string:
		v = cmd.String(r.name)
	case int:
		v = cmd.Int(r.name)
	case time.Duration:
		v = cmd.Duration(r.name)
	case bool:
		v = cmd.Bool(r.name)
	}
	return v.(T)
}

func (r *flagRow[T]) check(cmd *cli.Command) error {
	if r.valid == nil {
		return nil
	}
	if err := r.valid(r.value(cmd)); err != nil {
		return usagef(r.name, "%v", err)
	}
	return nil
}

func (r *flagRow[T]) apply(cmd *cli.Command, cfg *rpc.NodeConfig) {
	if r.to != nil {
		r.to(cfg, r.value(cmd))
	}
}

// positive refuses values <= 0.
func positive[T int | time.Duration](v T) error {
	if v <= 0 {
		return fmt.Errorf("must be > 0, got %v", v)
	}
	return nil
}

// nonNegative refuses values < 0.
func nonNegative[T int | time.Duration](v T) error {
	if v < 0 {
		return fmt.Errorf("must be >= 0, got %v", v)
	}
	return nil
}

// between refuses values outside lo..hi.
func between(lo, hi int) func(int) error {
	return func(v int) error {
		if v < lo || v > hi {
			return fmt.Errorf("must be in %d..%d, got %d", lo, hi, v)
		}
		return nil
	}
}

// serveFlags is serve's flag table, in the order of serve --help; host
// is the default --name.
func serveFlags(host string) []serveFlag {
	return []serveFlag{
		&stringFlag{name: "config",
			usage: "YAML file of settings by flag name (e.g. grpc-addr: 10.0.0.5:7070); the command line, then SLUICE_* variables, win over it"},
		&stringFlag{name: "name", def: host,
			usage: "unique, stable member name; the default is the host name",
			to:    func(c *rpc.NodeConfig, v string) { c.Name = v },
			valid: func(v string) error {
				if v == "" {
					return errors.New("required (the host name is unknown)")
				}
				return nil
			}},
		&stringFlag{name: "grpc-addr", def: "127.0.0.1:7070",
			usage: "host:port to serve gRPC on; port 0 lets the OS pick",
			to:    func(c *rpc.NodeConfig, v string) { c.GRPCAddr = v }},
		&stringFlag{name: "gossip-addr", def: "127.0.0.1:7946",
			usage: "host:port to gossip on (TCP and UDP)",
			to:    func(c *rpc.NodeConfig, v string) { c.GossipAddr = v }},
		&stringFlag{name: "join",
			usage: "gossip addresses of members to join, H:P[,H:P...]",
			to:    func(c *rpc.NodeConfig, v string) { c.Join = splitList(v) }},
		&stringFlag{name: "advertise-addr",
			usage: "IP other members reach this node at (default: the listening host)",
			to:    func(c *rpc.NodeConfig, v string) { c.AdvertiseHost = v }},
		&stringFlag{name: "region", def: "local",
			usage: "region of this node (with --regions, one of them)",
			to:    func(c *rpc.NodeConfig, v string) { c.Region = v }},
		&stringFlag{name: "regions",
			usage: "the cluster's regions and weights, the same on every node, e.g. us-east=2,eu-west=1,ap-south=1 (weight default 1; the first is the home region of exact limits); empty: one region",
			to:    func(c *rpc.NodeConfig, v string) { c.Regions, _ = region.Parse(v) },
			valid: func(v string) error { _, err := region.Parse(v); return err }},
		&stringFlag{name: "lease-base", def: "0.5",
			usage: "with --regions: the part (0 < f <= 1) of a global limit the regions own as bases, split by weight (what a region cut off can always admit); the rest is leased to the regions by demand; 1: no leases, fixed slices",
			to:    func(c *rpc.NodeConfig, v string) { c.LeaseBase, _ = strconv.ParseFloat(v, 64) },
			valid: func(v string) error {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil || !(f > 0 && f <= 1) {
					return fmt.Errorf("want a number in (0, 1], got %q", v)
				}
				return nil
			}},
		&stringFlag{name: "profile", def: "lan",
			usage: "gossip timings: lan, wan or local",
			to:    func(c *rpc.NodeConfig, v string) { c.Profile = cluster.Profile(v) },
			valid: func(v string) error {
				switch cluster.Profile(v) {
				case cluster.LAN, cluster.WAN, cluster.Local:
					return nil
				}
				return fmt.Errorf("want lan, wan or local, got %q", v)
			}},
		&durationFlag{name: "forward-timeout", def: rpc.DefaultForwardTimeout,
			usage: "bound on a forward to a key's owner",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.ForwardTimeout = v }, valid: positive[time.Duration]},
		&intFlag{name: "batch-size", def: rpc.DefaultBatchSize,
			usage: "send checks forwarded to one owner once this many are queued (1..1000)",
			to:    func(c *rpc.NodeConfig, v int) { c.Batch.MaxSize = v }, valid: between(1, rpc.MaxBatch)},
		&durationFlag{name: "batch-wait", def: rpc.DefaultBatchWait,
			usage: "send checks forwarded to one owner at most this long after the first was queued",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.Batch.MaxWait = v }, valid: positive[time.Duration]},
		&durationFlag{name: "leave-timeout", def: 5 * time.Second,
			usage: "bound on the leave message at shutdown (after the hand-off)",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.LeaveTimeout = v }, valid: positive[time.Duration]},
		&durationFlag{name: "handoff-timeout", def: rpc.DefaultHandOffTimeout,
			usage: "bound on handing all keys' state to their next owners at shutdown, and on how long a new owner waits for moved keys (pulling each on first touch meanwhile)",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.HandOffTimeout = v }, valid: positive[time.Duration]},
		&intFlag{name: "replicas", def: rpc.DefaultReplicationFactor,
			usage: "extra copies of each key's state, on the next members of the ring (0: none; a crashed owner's keys then start afresh)",
			to: func(c *rpc.NodeConfig, v int) {
				c.Replication.Factor, c.Replication.Disabled = v, v == 0
			}, valid: between(0, 3)},
		&durationFlag{name: "replication-interval", def: rpc.DefaultReplicationInterval,
			usage: "how often an owner sends changed keys to their replicas; a crash loses at most the hits of the last interval plus one send",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.Replication.Interval = v }, valid: positive[time.Duration]},
		&stringFlag{name: "state-dir",
			usage: "directory (created 0700 if absent) where a graceful stop that no member can take the keys from (the whole cluster stopping) writes them, and where the next start reads them back before taking checks (see docs/persistence.md); empty: counts live in memory only, and a whole-cluster stop loses them",
			to:    func(c *rpc.NodeConfig, v string) { c.StateDir = v }},
		&durationFlag{name: "state-interval",
			usage: "with --state-dir, also write a snapshot of the keys this often, so that a crash of the whole cluster loses at most the hits of the last interval (0: only a graceful stop writes)",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.StateInterval = v }, valid: nonNegative[time.Duration]},
		&durationFlag{name: "sweep-interval", def: 5 * time.Second,
			usage: "how often idle keys are removed",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.SweepInterval = v }, valid: positive[time.Duration]},
		&intFlag{name: "max-keys", def: 1_000_000,
			usage: "cap on the keys this node holds state for (0: no cap); over it, keys back at full capacity go first, then --on-key-cap decides",
			to:    func(c *rpc.NodeConfig, v int) { c.MaxKeys = v }, valid: nonNegative[int]},
		&stringFlag{name: "on-key-cap", def: "deny",
			usage: "what a new key past --max-keys gets: deny (refused: answered not allowed and degraded, counted in sluice_keys_refused_total; no live key loses its count) or evict (the least recently used key is evicted: its client gets a fresh budget)",
			to:    func(c *rpc.NodeConfig, v string) { c.OnKeyCap, _ = window.ParseKeyCapPolicy(v) },
			valid: func(v string) error { _, err := window.ParseKeyCapPolicy(v); return err }},
		&intFlag{name: "name-key-share", def: rpc.DefaultNameKeyShare,
			usage: "percent of --max-keys the keys of one limit name may hold (all unconfigured names count as one); past it that name's new keys are refused, so one name cannot starve the others (100: no share)",
			to:    func(c *rpc.NodeConfig, v int) { c.NameKeyShare = v },
			valid: func(v int) error {
				if v < 1 || v > 100 {
					return fmt.Errorf("must be in 1..100 (percent), got %d", v)
				}
				return nil
			}},
		&intFlag{name: "max-inflight", def: rpc.DefaultMaxInflight,
			usage: "checks this node works on at once for clients (gRPC, HTTP, Envoy); over it a call is refused with RESOURCE_EXHAUSTED (HTTP 429), counted in sluice_inflight_refused_total (-1: no bound)",
			to:    func(c *rpc.NodeConfig, v int) { c.GRPC.MaxInflight = v },
			valid: func(v int) error {
				if v == 0 || v < -1 {
					return fmt.Errorf("must be > 0, or -1 for no bound, got %d", v)
				}
				return nil
			}},
		&intFlag{name: "max-recv-bytes", def: rpc.DefaultMaxRecvBytes,
			usage: "largest gRPC message this node accepts, in bytes",
			to:    func(c *rpc.NodeConfig, v int) { c.GRPC.MaxRecvBytes = v }, valid: positive[int]},
		&intFlag{name: "max-concurrent-streams", def: rpc.DefaultMaxConcurrentStreams,
			usage: "gRPC calls in flight per connection",
			to:    func(c *rpc.NodeConfig, v int) { c.GRPC.MaxConcurrentStreams = uint32(max(v, 0)) }, valid: positive[int]},
		&durationFlag{name: "keepalive-min-time", def: rpc.DefaultKeepaliveMinTime,
			usage: "gRPC clients that send keepalive pings more often are disconnected",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.GRPC.KeepaliveMinTime = v }, valid: positive[time.Duration]},
		&durationFlag{name: "max-connection-age",
			usage: "ask gRPC clients to reconnect once their connection is this old, and close it --max-connection-age-grace later (0: off; peers' forward streams are cut too, and their checks in flight answered degraded)",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.GRPC.MaxConnectionAge = v }, valid: nonNegative[time.Duration]},
		&durationFlag{name: "max-connection-age-grace", def: 30 * time.Second,
			usage: "how long calls may go on after --max-connection-age",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.GRPC.MaxConnectionAgeGrace = v }, valid: positive[time.Duration]},
		&durationFlag{name: "http-read-header-timeout", def: rpc.DefaultReadHeaderTimeout,
			usage: "bound on reading an HTTP request's headers",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.HTTP.ReadHeaderTimeout = v }, valid: positive[time.Duration]},
		&durationFlag{name: "http-read-timeout", def: rpc.DefaultHTTPReadTimeout,
			usage: "bound on reading a whole HTTP request",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.HTTP.ReadTimeout = v }, valid: positive[time.Duration]},
		&durationFlag{name: "http-write-timeout", def: rpc.DefaultHTTPWriteTimeout,
			usage: "bound on writing an HTTP response",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.HTTP.WriteTimeout = v }, valid: positive[time.Duration]},
		&durationFlag{name: "http-idle-timeout", def: rpc.DefaultHTTPIdleTimeout,
			usage: "bound on an idle kept-alive HTTP connection",
			to:    func(c *rpc.NodeConfig, v time.Duration) { c.HTTP.IdleTimeout = v }, valid: positive[time.Duration]},
		&intFlag{name: "http-max-header-bytes", def: rpc.DefaultMaxHeaderBytes,
			usage: "largest HTTP request headers, in bytes (more: 431)",
			to:    func(c *rpc.NodeConfig, v int) { c.HTTP.MaxHeaderBytes = v }, valid: positive[int]},
		&stringFlag{name: "http-addr", def: "127.0.0.1:7080",
			usage: "host:port of the HTTP face: POST /v1/check, GET /v1/members, /healthz, /readyz, /metrics (empty: off; port 0 lets the OS pick)",
			to:    func(c *rpc.NodeConfig, v string) { c.HTTPAddr = v }},
		&stringFlag{name: "limits",
			usage: "YAML file of named limits (see docs/limits.md); reloaded on SIGHUP and when the file changes"},
		&stringFlag{name: "gossip-key-file",
			usage: "file of base64 gossip keys (sluice keygen), one per line, the one that encrypts first: gossip is then encrypted and authenticated (AES-256-GCM); reloaded on SIGHUP (rotate: add the new key second, then first, then drop the old)"},
		&stringFlag{name: "cluster-label",
			usage: "label on all gossip: nodes with another label (another cluster on the network) are ignored",
			to:    func(c *rpc.NodeConfig, v string) { c.ClusterLabel = v }},
		&stringFlag{name: "tls-cert",
			usage: "PEM peer certificate of this node (sluice tls cert create --peer NAME): serve gRPC and HTTP with TLS (1.2 at least), dial peers with TLS 1.3; with --tls-key and --tls-ca; reloaded when the files change and on SIGHUP",
			to:    func(c *rpc.NodeConfig, v string) { c.TLSCert = v }},
		&stringFlag{name: "tls-key",
			usage: "PEM key of --tls-cert",
			to:    func(c *rpc.NodeConfig, v string) { c.TLSKey = v }},
		&stringFlag{name: "tls-ca",
			usage: "PEM bundle of the CA(s) that sign peers and clients",
			to:    func(c *rpc.NodeConfig, v string) { c.TLSCA = v }},
		&stringFlag{name: "client-auth",
			usage: "how callers of the public API authenticate: mtls (a client certificate; the default with TLS), token (--token-file), either, or none (default without TLS and tokens)",
			to:    func(c *rpc.NodeConfig, v string) { c.ClientAuth = rpc.ClientAuth(v) }},
		&stringFlag{name: "token-file",
			usage: "bearer tokens and the limit-name prefixes each may check, one `TOKEN PREFIX...` a line (or YAML tokens: [{name, token, prefixes}]); reloaded with the TLS files; refused over plaintext from other hosts",
			to:    func(c *rpc.NodeConfig, v string) { c.TokenFile = v }},
		&stringFlag{name: "admin-token-file",
			usage: "tokens of the admin API (sluice key get/reset, sluice limits show), one `TOKEN [NAME]` a line; they check nothing, and --token-file's tokens are no admin's; reloaded with the TLS files; refused over plaintext from other hosts. Without it (or TLS and an admin certificate) the admin API answers loopback only, on a node with no client auth",
			to:    func(c *rpc.NodeConfig, v string) { c.AdminTokenFile = v }},
		&boolFlag{name: "allow-refunds",
			usage: "take callers' refunds: a check of negative hits (client.Refund) and Envoy's is_negative_hits give hits back at the key's owner. Any caller that may check a name can then raise what it admits, so it is off by default: negative hits are refused (INVALID_ARGUMENT) and is_negative_hits only peeks. On, a token refunds only with the prefix *. Give every node the same setting (sluice_refunds_allowed)",
			to:    func(c *rpc.NodeConfig, v bool) { c.AllowRefunds = v }},
		&boolFlag{name: "insecure",
			usage: "allow addresses reachable from other hosts without gossip encryption, TLS or client authentication (the node warns every 5 minutes); without it such a node refuses to start and names what is missing",
			to:    func(c *rpc.NodeConfig, v bool) { c.Insecure = v }},
		&stringFlag{name: "debug-addr",
			usage: "host:port to serve Go's /debug/pprof on (off when empty; keep it on loopback)"},
		&stringFlag{name: "log-level", def: "info",
			usage: "debug, info, warn or error"},
		&stringFlag{name: "log-format", def: "text",
			usage: "text or json"},
		&stringFlag{name: "rls-config",
			usage: "serve Envoy's rate limit service (RLS v3) on the gRPC port with the rules in this file, or in the *.yaml/*.yml files of this directory (envoyproxy/ratelimit's format; see docs/envoy.md), reloaded when they change or on SIGHUP; off when empty"},
		&boolFlag{name: "rls-merge-domain-config",
			usage: "let several rule files hold one domain and merge their descriptors (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG)"},
		&boolFlag{name: "rls-shadow-mode",
			usage: "answer every RLS request OK, counted as usual; its descriptors still say OVER_LIMIT (SHADOW_MODE)",
			to:    func(c *rpc.NodeConfig, v bool) { c.RLSOptions.ShadowMode = v }},
		&boolFlag{name: "rls-quota-mode",
			usage: "make every RLS descriptor a quota descriptor: a request is refused only when all of them are over (QUOTA_MODE)",
			to:    func(c *rpc.NodeConfig, v bool) { c.RLSOptions.QuotaMode = v }},
		&boolFlag{name: "rls-response-dynamic-metadata",
			usage: "return dynamic_metadata in RLS responses: domain, descriptors, hits_addend and the metadata of the rules passed (RESPONSE_DYNAMIC_METADATA)",
			to:    func(c *rpc.NodeConfig, v bool) { c.RLSOptions.DynamicMetadata = v }},
		&boolFlag{name: "rls-response-headers",
			usage: "ask Envoy to add the RateLimit-Limit, -Remaining and -Reset headers of the descriptor closest to its limit (LIMIT_RESPONSE_HEADERS_ENABLED)",
			to: func(c *rpc.NodeConfig, v bool) {
				if v && c.RLSOptions.Headers == nil {
					c.RLSOptions.Headers = &rls.HeaderNames{}
				}
			}},
		&stringFlag{name: "rls-limit-header", def: rls.DefaultLimitHeader,
			usage: "name of the limit header of --rls-response-headers (LIMIT_LIMIT_HEADER)",
			to:    func(c *rpc.NodeConfig, v string) { rlsHeaders(c).Limit = v }},
		&stringFlag{name: "rls-remaining-header", def: rls.DefaultRemainingHeader,
			usage: "name of the remaining header of --rls-response-headers (LIMIT_REMAINING_HEADER)",
			to:    func(c *rpc.NodeConfig, v string) { rlsHeaders(c).Remaining = v }},
		&stringFlag{name: "rls-reset-header", def: rls.DefaultResetHeader,
			usage: "name of the reset header of --rls-response-headers, in whole seconds (LIMIT_RESET_HEADER)",
			to:    func(c *rpc.NodeConfig, v string) { rlsHeaders(c).Reset = v }},
		&boolFlag{name: "rls-increment-when-over-limit",
			usage: "count RLS descriptors as envoyproxy/ratelimit does by default (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset): each on its own, refused hits included, and a peek (hits_addend 0) OK up to exactly the limit; off: a request is charged all or nothing and refused hits count nothing",
			to:    func(c *rpc.NodeConfig, v bool) { c.RLSOptions.IncrementWhenOverLimit = v }},
		&stringFlag{name: "rls-near-limit-ratio", def: "0.8",
			usage: "share of an RLS rule's limit past which its hits count as near the limit in sluice_rls_rule_near_limit_hits_total (NEAR_LIMIT_RATIO)",
			to: func(c *rpc.NodeConfig, v string) {
				c.RLSOptions.NearLimitRatio, _ = strconv.ParseFloat(v, 64)
			},
			valid: func(v string) error {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil || !(f > 0 && f <= 1) {
					return fmt.Errorf("want a number in (0, 1], got %q", v)
				}
				return nil
			}},
	}
}

// rlsHeaders returns the RLS header names of c, which --rls-response-headers
// (earlier in the table) made when on; a scratch value when off.
func rlsHeaders(c *rpc.NodeConfig) *rls.HeaderNames {
	if c.RLSOptions.Headers == nil {
		return &rls.HeaderNames{}
	}
	return c.RLSOptions.Headers
}

// serveCheckOrder is the order serve checks its flags' values in (the
// flags of the table with a valid): of several refused values, the first
// here is the one reported. It is the order of the checks before the
// table; TestServeFlagTable keeps it and the table in step.
var serveCheckOrder = []string{
	"forward-timeout", "leave-timeout", "sweep-interval", "handoff-timeout", "replication-interval",
	"batch-size", "batch-wait", "replicas", "max-keys", "on-key-cap", "name-key-share", "max-inflight",
	"max-recv-bytes", "max-concurrent-streams", "http-max-header-bytes",
	"keepalive-min-time", "max-connection-age-grace", "http-read-header-timeout", "http-read-timeout",
	"http-write-timeout", "http-idle-timeout", "max-connection-age", "name", "profile", "regions",
	"lease-base", "rls-near-limit-ratio", "state-interval",
}

// nodeConfig checks the values of the flags of table in cmd (in
// serveCheckOrder) and returns cfg with them in place; an error is a
// usage error naming the first flag refused.
func nodeConfig(cmd *cli.Command, table []serveFlag, cfg rpc.NodeConfig) (rpc.NodeConfig, error) {
	byName := make(map[string]serveFlag, len(table))
	for _, f := range table {
		byName[f.flagName()] = f
	}
	for _, name := range serveCheckOrder {
		if err := byName[name].check(cmd); err != nil {
			return cfg, err
		}
	}
	for _, f := range table {
		f.apply(cmd, &cfg)
	}
	if cfg.StateInterval > 0 && cfg.StateDir == "" {
		return cfg, usagef("state-interval", "needs --state-dir (where the snapshots go)")
	}
	if cfg.Regions != nil && !cfg.Regions.Has(cfg.Region) {
		if cfg.Region == "local" && !cmd.IsSet("region") {
			return cfg, usagef("region", "required with --regions: this node's region, one of %s", regionNames(cfg.Regions))
		}
		return cfg, usagef("region", "%q is not one of --regions (%s)", cfg.Region, regionNames(cfg.Regions))
	}
	return cfg, nil
}

// regionNames lists a region list's names for a message: "us-east, eu-west".
func regionNames(c *region.Config) string {
	var names []string
	for _, r := range c.Regions() {
		names = append(names, r.Name)
	}
	return strings.Join(names, ", ")
}
