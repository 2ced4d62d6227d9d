// Package client is the Go client of sluice's Check API: give it the gRPC
// addresses of any nodes of a cluster (any node answers for any key), a
// per-call timeout and a failure mode, and ask it whether a hit is allowed.
//
//	c, err := client.New(client.Config{Addrs: []string{"10.0.0.5:7070", "10.0.0.6:7070"}})
//	...
//	d, err := c.Check(ctx, client.Check{Name: "api", Key: "user:42"})
//	if err != nil { ... } // invalid check, or the cluster is unreachable and the client fails closed
//	if !d.Allowed { ... } // over limit: d.RetryAfter says for how long
//
// Each check goes straight to the node that owns its key ([RouteOwner],
// the default): the client keeps the cluster's routing table (which the
// first answer brings, and any answer from a node whose ring differs
// corrects) and places keys on the ring as the nodes do, so a check costs
// one network hop, not two. A check whose owner is unknown, skipped or
// does not answer within half the time left goes to the addresses in turn
// (round robin), as every check does under [RouteAny]; that node forwards
// it to the owner. [Client.CheckBatch] splits a batch of independent
// checks by owner. A node whose call fails is skipped for [Config.SkipFor]
// and the call moves on to the next node, all within one [Config.Timeout]:
// the client never retries past it. When no node answers in time the
// failure mode decides: [FailOpen] (the default) answers allowed and marks
// the decision [Decision.Degraded]; [FailClosed] answers an error wrapping
// [ErrUnavailable]. The failure mode also reaches the nodes: under
// FailClosed every check asks the node to deny it when the key's owner
// cannot be reached (OWNER_UNAVAILABLE_DENY, unless [Check.OnOwnerUnavailable]
// says otherwise), and any answer a node marks degraded is that same error,
// never an allowed decision. Failures are logged (event
// "rate_limit.unavailable") with the limit's name, the node's address and
// the gRPC code only: never the key, which may identify a person, nor
// error text.
//
// [Client.CheckAll] sends several checks in one call, which the nodes
// decide all or nothing: when one is denied, the others that were allowed
// are given back ([Decision.Refunded]).
//
// [Client.Refund] gives back hits a check consumed (the token-quota
// pattern: charge an estimate, give back what was not used), at the key's
// owner, never below zero, on nodes started with serve --allow-refunds.
//
// A check moved to another node after a failed attempt may be counted
// twice when the first node had counted it before failing (a node that
// dies with the call in flight); the client accepts that over failing the
// request.
//
// With [Config.TracerProvider] set, each call is an OpenTelemetry span
// ([SpanCheck]) whose trace context the node receives, so a trace follows
// the check to the node and on to the key's owner (docs/tracing.md).
//
// The package imports only sluice's generated API types (rpc/sluicev1)
// and its ring (package ring, no I/O), never the server.
package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Errors returned by [Client.Check] (test with errors.Is).
var (
	// ErrInvalid is wrapped by errors about a check the client or the
	// node refused as malformed; the message names the field, e.g.
	// "client: invalid check: checks[0].limit: must be > 0, got 0".
	// Trying again does not help.
	ErrInvalid = errors.New("client: invalid check")
	// ErrUnavailable is wrapped by errors (fail closed) and by
	// [Decision.Cause] (fail open) when no node gave an answer within the
	// timeout, or the key's owner could not be reached.
	ErrUnavailable = errors.New("client: rate limiter unavailable")
	// ErrClosed is returned by Check after Close.
	ErrClosed = errors.New("client: closed")
	// ErrNoAnswer is matched (errors.Is), besides ErrUnavailable, by the
	// errors and [Decision.Cause] of a call that no node answered within
	// the timeout: every node tried failed (refused the connection, the
	// TLS handshake or the credentials, or timed out). It tells a cluster
	// out of reach from one that answered without the owner's count (the
	// key's owner unreachable, or an answer marked degraded), which
	// matches ErrUnavailable only. The message is ErrUnavailable's.
	ErrNoAnswer = errors.New("client: no node answered")
)

// noAnswer wraps the ErrUnavailable error of a call no node answered; it
// also matches ErrNoAnswer, and its message is the wrapped one's.
type noAnswer struct{ err error }

func (e noAnswer) Error() string        { return e.err.Error() }
func (e noAnswer) Unwrap() error        { return e.err }
func (e noAnswer) Is(target error) bool { return target == ErrNoAnswer }

// FailureMode says what a check answers when the cluster cannot.
type FailureMode int

const (
	// FailOpen answers allowed, with Decision.Degraded set and
	// Decision.Cause saying why, and a nil error. The default. Checks
	// are sent with the policy of Check.OnOwnerUnavailable (by default
	// none: the node applies the named limit's, else local), and a
	// decision a node marks degraded is returned as it is.
	FailOpen FailureMode = iota
	// FailClosed answers not allowed with an error wrapping
	// ErrUnavailable. Checks are sent with OWNER_UNAVAILABLE_DENY (unless
	// Check.OnOwnerUnavailable sets a policy), and a decision a node marks
	// degraded, allowed or not, is answered that same error.
	FailClosed
)

// OwnerUnavailable is what a node answers a check whose key's owner it
// cannot reach (the API's RateLimitCheck.on_owner_unavailable). Every
// such answer is degraded.
type OwnerUnavailable int

// The policies.
const (
	// OwnerUnavailableDefault follows the client's failure mode: deny
	// under FailClosed; under FailOpen none is sent, so the node applies
	// the policy of the limit configured under the check's name
	// (on_owner_unavailable in its limits file), else local.
	OwnerUnavailableDefault OwnerUnavailable = iota
	// OwnerUnavailableLocal decides from the answering node's copy of the
	// key (it may admit beyond the limit).
	OwnerUnavailableLocal
	// OwnerUnavailableAllow allows the check, counting nothing.
	OwnerUnavailableAllow
	// OwnerUnavailableDeny denies the check, counting nothing.
	OwnerUnavailableDeny
)

// MaxChecks is the most checks one CheckAll call may carry (the nodes'
// bound on a request).
const MaxChecks = 1000

// String returns "open" or "closed".
func (m FailureMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// Algorithm names how hits are counted (see DESIGN.md): the names are
// those of the limits file.
type Algorithm string

// The algorithms. The empty Algorithm means FixedWindow.
const (
	// FixedWindow: windows aligned to the Unix epoch; allowed iff
	// count + hits <= limit.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindow: Cloudflare's weighted two-window counter.
	SlidingWindow Algorithm = "sliding_window"
	// TokenBucket: burst tokens refilled at limit per window (GCRA).
	TokenBucket Algorithm = "token_bucket"
	// LeakyBucket: a queue of room burst drained at limit per window;
	// allowed checks get a Delay.
	LeakyBucket Algorithm = "leaky_bucket"
)

// ParseAlgorithm returns the Algorithm called s ("" is FixedWindow), or an
// error naming the valid ones.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch a := Algorithm(s); a {
	case "", FixedWindow, SlidingWindow, TokenBucket, LeakyBucket:
		if a == "" {
			a = FixedWindow
		}
		return a, nil
	}
	return "", fmt.Errorf("unknown algorithm %q (want fixed_window, sliding_window, token_bucket or leaky_bucket)", s)
}

func (a Algorithm) proto() sluicev1.Algorithm {
	switch a {
	case SlidingWindow:
		return sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW
	case TokenBucket:
		return sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET
	case LeakyBucket:
		return sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET
	}
	return sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW
}

// Scope says where a check's limit is enforced when the cluster has
// several regions (serve --regions): the names are those of the limits
// file's scope. With one region they all mean the same.
type Scope string

// The scopes. The empty Scope (ScopeDefault) sends none: the node applies
// the scope configured for the check's name, else ScopeGlobal with several
// regions.
const (
	// ScopeDefault sends no scope.
	ScopeDefault Scope = ""
	// ScopeGlobal splits the limit into per-region slices that never add
	// up to more than the limit; decided in the region the check entered
	// (Decision.SliceExhausted when the region's slice ran out).
	ScopeGlobal Scope = "global"
	// ScopeRegional enforces the whole limit in each region on its own.
	ScopeRegional Scope = "regional"
	// ScopeExact has the key's one owner in the home region decide, at a
	// cross-region round trip for checks entering another region.
	ScopeExact Scope = "exact"
)

// ParseScope returns the Scope called s ("" is ScopeDefault), or an error
// naming the valid ones.
func ParseScope(s string) (Scope, error) {
	switch sc := Scope(s); sc {
	case ScopeDefault, ScopeGlobal, ScopeRegional, ScopeExact:
		return sc, nil
	}
	return "", fmt.Errorf("unknown scope %q (want global, regional or exact)", s)
}

func (s Scope) proto() sluicev1.Scope {
	switch s {
	case ScopeGlobal:
		return sluicev1.Scope_SCOPE_GLOBAL
	case ScopeRegional:
		return sluicev1.Scope_SCOPE_REGIONAL
	case ScopeExact:
		return sluicev1.Scope_SCOPE_EXACT
	}
	return sluicev1.Scope_SCOPE_UNSPECIFIED
}

// scopeOf converts a decision's scope ("" for unspecified).
func scopeOf(s sluicev1.Scope) Scope {
	switch s {
	case sluicev1.Scope_SCOPE_GLOBAL:
		return ScopeGlobal
	case sluicev1.Scope_SCOPE_REGIONAL:
		return ScopeRegional
	case sluicev1.Scope_SCOPE_EXACT:
		return ScopeExact
	}
	return ScopeDefault
}

// Limit is a check's own numbers ("inline"), as opposed to the numbers of
// a limit configured on the nodes under the check's name.
type Limit struct {
	// Limit is the hits allowed per Window, 1..2^53. (Required)
	Limit int64
	// Window is the period, whole milliseconds, up to 366 days. (Required)
	Window time.Duration
	// Burst is the bucket capacity in hits for the bucket algorithms; 0
	// means Limit. (Optional)
	Burst int64
	// Algorithm; empty means FixedWindow. (Optional)
	Algorithm Algorithm
}

// Check asks to consume hits of Key within the limit called Name.
type Check struct {
	// Name is the limit's name, e.g. "api". (Required)
	Name string
	// Key is who is limited within Name, e.g. "user:42" or an HMAC of an
	// IP; at most 1 KiB of UTF-8. (Required)
	Key string
	// Hits to consume; 0 means 1 (see Peek). Must not be negative
	// ([Client.Refund] gives Hits back).
	Hits int64
	// Peek consumes nothing and asks whether one more hit would be
	// allowed; Hits is then ignored.
	Peek bool
	// Limit gives the check numbers of its own. Nil names a limit
	// configured on the nodes (serve --limits): the check then sends no
	// numbers at all (limit, window_ms, burst and algorithm unset).
	Limit *Limit
	// OnOwnerUnavailable is what the node answers when the key's owner
	// cannot be reached. The default (zero) follows the failure mode
	// (see OwnerUnavailableDefault). Under FailClosed a degraded answer
	// is an error whatever the policy: there a policy of the check's own
	// only changes what the node counts meanwhile (local counts the hit
	// in its copy of the key). (Optional)
	OnOwnerUnavailable OwnerUnavailable
	// Scope is where the limit is enforced with several regions; the
	// default (empty) sends none. (Optional)
	Scope Scope
}

// Decision answers one check.
type Decision struct {
	// Allowed is true when the hits were admitted (or, degraded and
	// failing open, when the client allowed them without an answer).
	Allowed bool
	// Limit is the check's limit in hits per window; 0 when degraded.
	Limit int64
	// Remaining is the hits still allowed now; 0 when degraded.
	Remaining int64
	// ResetTime is when the key is back at full capacity (the owner's
	// clock); zero when degraded.
	ResetTime time.Time
	// RetryAfter is how long until this same check would be allowed: 0
	// when allowed, negative when it never can be (hits above capacity).
	RetryAfter time.Duration
	// Delay is, for an allowed leaky-bucket check, how long until the
	// queue ahead of it has drained.
	Delay time.Duration
	// Owner is the name of the node that decided; empty when degraded.
	Owner string
	// Shadow is set when the named limit is in shadow mode and would have
	// denied the check (Allowed is true anyway).
	Shadow bool
	// Degraded is set when the decision is not the owner's normal answer:
	// the client answered by its failure mode (Cause says why), or the
	// node marked its answer degraded (under FailOpen only: under
	// FailClosed such an answer is an error).
	Degraded bool
	// Refunded is set, with Allowed false, on a check of a CheckAll call
	// that would have been allowed but was given back because another
	// check of the call was denied: nothing of it is counted, and
	// Remaining is what the key had before it. The denied check says
	// when to retry. On the answer of [Client.Refund] (Allowed true) it
	// says the refund gave hits back.
	Refunded bool
	// Cause is why the client answered by its failure mode (it wraps
	// ErrUnavailable); nil otherwise.
	Cause error
	// Scope is the scope that applied, as the node says; empty when it
	// says none (or degraded by the client).
	Scope Scope
	// Region is the region whose owner decided (for ScopeExact the home
	// region), as the node says; empty when it says none.
	Region string
	// Slice is, for ScopeGlobal with several regions, the region's slice
	// of Limit in hits (per window, or the bucket's rate); 0 otherwise.
	Slice int64
	// SliceExhausted is set when the check was denied because the
	// region's slice ran out (ScopeGlobal): other regions may have room.
	SliceExhausted bool
	// SlicePending is set, with SliceExhausted, when the region has
	// asked for more of the limit (or waits for its share after its node
	// started): RetryAfter is then about a lease round trip (tens to
	// hundreds of ms), and a retry then may pass. Unset with
	// SliceExhausted, RetryAfter is the window's end.
	SlicePending bool
}

// Config configures a Client. The zero value of every optional field is
// its default.
type Config struct {
	// Addrs are host:port gRPC addresses of nodes of one cluster; any
	// node answers for any key. (Required, at least one)
	Addrs []string
	// Timeout bounds one Check, every attempt on every node included.
	// Default 1 s. (Optional)
	Timeout time.Duration
	// FailureMode says what Check answers when no node does, and what a
	// node answers for the client when a key's owner cannot be reached
	// (see FailClosed). Default FailOpen. (Optional)
	FailureMode FailureMode
	// SkipFor is how long a node whose call failed is tried only after
	// the others. Default 2 s. (Optional)
	SkipFor time.Duration
	// Logger receives failures (warnings). Default slog.Default().
	// (Optional)
	Logger *slog.Logger
	// DialOptions replace the default options of the connections
	// (plaintext). (Optional)
	DialOptions []grpc.DialOption
	// Now is the client's clock, used only to skip failed nodes. Default
	// time.Now. (Optional)
	Now func() time.Time
	// TracerProvider, when set, traces every Check and CheckAll call: a
	// span SpanCheck (kind client, a child of the call's context's span)
	// whose W3C trace context goes to the node in the call's metadata
	// (traceparent), so that the node's spans, and its owner's, join the
	// trace. Its attributes name the limits and count the checks, the
	// nodes tried and the answers; never a key or an address (see
	// docs/tracing.md). nil: no spans, and nothing is sent. (Optional)
	TracerProvider trace.TracerProvider
	// Route says which node a check goes to: RouteOwner (the default)
	// straight to its key's owner, found with the cluster's routing table,
	// falling back to the nodes of Addrs; RouteAny to the nodes of Addrs
	// in turn. (Optional)
	Route Route
}

// node is one address and its connection.
type node struct {
	addr      string
	conn      *grpc.ClientConn
	api       sluicev1.RateLimitServiceClient
	downUntil atomic.Int64 // Unix ns; skipped until then
}

// Client sends checks to a sluice cluster. It is safe for concurrent use.
type Client struct {
	*shared
	mode FailureMode
}

// shared is what the Clients of one New share (see WithFailureMode).
type shared struct {
	cfg    Config
	nodes  []*node
	next   atomic.Uint64
	closed atomic.Bool
	once   sync.Once
	log    *slog.Logger
	tracer trace.Tracer // nil: no spans

	table   atomic.Pointer[table] // RouteOwner's routing table; nil until the first answer brings one
	routing routing
}

// New validates cfg and returns a Client. Connections are made lazily, so
// New succeeds while nodes are down. Close it when done.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("client: Config.Addrs: at least one address is required")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("client: Config.Timeout: must be >= 0, got %s", cfg.Timeout)
	}
	if cfg.SkipFor < 0 {
		return nil, fmt.Errorf("client: Config.SkipFor: must be >= 0, got %s", cfg.SkipFor)
	}
	if cfg.FailureMode != FailOpen && cfg.FailureMode != FailClosed {
		return nil, fmt.Errorf("client: Config.FailureMode: unknown mode %d", cfg.FailureMode)
	}
	if cfg.Route != RouteOwner && cfg.Route != RouteAny {
		return nil, fmt.Errorf("client: Config.Route: unknown route %d", cfg.Route)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.SkipFor == 0 {
		cfg.SkipFor = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	opts := cfg.DialOptions
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	c := &Client{shared: &shared{cfg: cfg, log: cfg.Logger.With("package", "client")}, mode: cfg.FailureMode}
	c.routing = routing{byAddr: make(map[string]*node, len(cfg.Addrs)), opts: opts}
	if cfg.TracerProvider != nil {
		c.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	for i, addr := range cfg.Addrs {
		if addr == "" {
			c.closeConns()
			return nil, fmt.Errorf("client: Config.Addrs[%d]: empty address", i)
		}
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("client: Config.Addrs[%d]: %w", i, err)
		}
		n := &node{addr: addr, conn: conn, api: sluicev1.NewRateLimitServiceClient(conn)}
		c.nodes = append(c.nodes, n)
		if _, dup := c.routing.byAddr[addr]; !dup {
			c.routing.byAddr[addr] = n
		}
	}
	return c, nil
}

// Close closes the connections (those of every Client WithFailureMode
// made from the same New). It is idempotent; Check fails with ErrClosed
// afterwards.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.closeConns()
	})
	return nil
}

func (c *Client) closeConns() {
	for _, n := range c.nodes {
		_ = n.conn.Close()
	}
	c.routing.mu.Lock()
	defer c.routing.mu.Unlock()
	for _, n := range c.routing.byAddr {
		if !slices.Contains(c.nodes, n) {
			_ = n.conn.Close()
		}
	}
}

// FailureMode returns the client's failure mode.
func (c *Client) FailureMode() FailureMode { return c.mode }

// WithFailureMode returns a Client that answers by failure mode m and
// shares everything else with c: its connections, its turn over the
// nodes, the nodes it skips, and Close (closing either closes both). The
// error names an unknown mode.
func (c *Client) WithFailureMode(m FailureMode) (*Client, error) {
	if m != FailOpen && m != FailClosed {
		return nil, fmt.Errorf("client: WithFailureMode: unknown mode %d", m)
	}
	return &Client{shared: c.shared, mode: m}, nil
}

// request validates ch, the check at index of field, and builds its wire
// form; errors name the bad field after field[index]. (e.g.
// "checks[2].key"; field "": the field alone).
func (c *Client) request(ch Check, field string, index int) (*sluicev1.RateLimitCheck, error) {
	bad := func(format string, a ...any) error {
		prefix := ""
		if field != "" { // formatted only for an error: a batch's checks cost nothing here
			prefix = fmt.Sprintf("%s[%d].", field, index)
		}
		return fmt.Errorf("%w: %s%s", ErrInvalid, prefix, fmt.Sprintf(format, a...))
	}
	switch {
	case ch.Name == "":
		return nil, bad("name: must not be empty")
	case ch.Key == "":
		return nil, bad("key: must not be empty")
	case !utf8.ValidString(ch.Name):
		return nil, bad("name: must be valid UTF-8")
	case !utf8.ValidString(ch.Key):
		// gRPC refuses such a string before any node sees it: sending it
		// would look like an unavailable cluster and fail open.
		return nil, bad("key: must be valid UTF-8 (hash or hex-encode binary keys)")
	case ch.Hits < 0:
		return nil, bad("hits: must be >= 0, got %d", ch.Hits)
	}
	rc := &sluicev1.RateLimitCheck{Name: ch.Name, Key: ch.Key}
	if _, err := ParseScope(string(ch.Scope)); err != nil {
		return nil, bad("scope: %v", err)
	}
	rc.Scope = ch.Scope.proto()
	switch ch.OnOwnerUnavailable {
	case OwnerUnavailableDefault:
		if c.mode == FailClosed {
			rc.OnOwnerUnavailable = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
		}
	case OwnerUnavailableLocal:
		rc.OnOwnerUnavailable = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL
	case OwnerUnavailableAllow:
		rc.OnOwnerUnavailable = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW
	case OwnerUnavailableDeny:
		rc.OnOwnerUnavailable = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
	default:
		return nil, bad("on_owner_unavailable: unknown policy %d", ch.OnOwnerUnavailable)
	}
	switch {
	case ch.Peek:
		rc.Hits = proto.Int64(0)
	case ch.Hits > 0:
		rc.Hits = proto.Int64(ch.Hits)
	}
	if l := ch.Limit; l != nil {
		alg, err := ParseAlgorithm(string(l.Algorithm))
		switch {
		case err != nil:
			return nil, bad("limit.algorithm: %v", err)
		case l.Limit <= 0:
			return nil, bad("limit.limit: must be > 0, got %d", l.Limit)
		case l.Window <= 0 || l.Window%time.Millisecond != 0:
			return nil, bad("limit.window: must be a positive whole number of milliseconds, got %s", l.Window)
		case l.Burst < 0:
			return nil, bad("limit.burst: must be >= 0, got %d", l.Burst)
		}
		rc.Limit, rc.WindowMs, rc.Burst, rc.Algorithm = l.Limit, l.Window.Milliseconds(), l.Burst, alg.proto()
	}
	return rc, nil
}

// Check sends ch to a node and returns its decision. Attempts go to the
// nodes in turn, skipping recently failed ones, until one answers or
// Config.Timeout (or ctx) ends. Errors: ErrInvalid (the check is malformed;
// no failure mode applies), ErrUnavailable (FailClosed, and no answer, the
// key's owner unreachable, or an answer the node marked degraded; the
// Decision is then not allowed and Degraded, with Cause set), ErrClosed,
// or ctx's error when ctx ended before the timeout did.
func (c *Client) Check(ctx context.Context, ch Check) (Decision, error) {
	ds, err := c.check(ctx, []Check{ch}, "")
	if len(ds) != 1 {
		return Decision{}, err
	}
	return ds[0], err
}

// Refund gives back ch.Hits hits (0 means 1) that earlier checks of
// ch.Name and ch.Key consumed; ch gives the same numbers as they did (or
// none, for a configured limit), and Peek is refused. The key's owner
// takes them off the key as it is now, as window.Store.Refund does:
// never below zero; for the fixed and sliding windows from the window in
// force (hits counted in a window that has ended are taken from the
// current one: call Refund within the window of the charge, or accept
// that the next window may admit up to the hits given back more than its
// limit); for the buckets from the debt, exactly unless another check
// updates the key at that very moment (then less). More hits than the
// key can hold give back what it holds.
//
// The answer is Allowed (a refund is never refused), Refunded when it
// gave hits back (false: nothing was counted), and Remaining the hits
// left after it. A refund is never answered by the failure mode: when
// no node answers, or the key's owner cannot be reached (a refund is
// applied by the owner or by nobody), the error wraps ErrUnavailable
// and the Decision is Degraded with Cause set, whatever Config.FailureMode
// says. As for a check, a refund retried on another node after a failed
// attempt may be given back twice (never below zero). Bad input is
// ErrInvalid naming the field.
//
// Refunds are the operator's to allow: a node started without serve
// --allow-refunds refuses them, ErrInvalid naming checks[0].hits and the
// flag. With it, a token limited to name prefixes may not refund (the
// nodes answer PERMISSION_DENIED: ErrUnavailable naming that code); a
// token with the prefix "*" or a client certificate may. A refund let in
// by a node with the flag whose key's owner runs without it is not
// applied (ErrUnavailable, as for an owner that cannot be reached).
func (c *Client) Refund(ctx context.Context, ch Check) (Decision, error) {
	if ch.Peek {
		return Decision{}, fmt.Errorf("%w: peek: a refund gives hits back; it cannot peek", ErrInvalid)
	}
	// FailClosed: a refund that reached nobody is an error, never an
	// allowed guess.
	fc := &Client{shared: c.shared, mode: FailClosed}
	chs := []Check{ch}
	ctx, tr := fc.startCall(ctx, chs, false)
	req, err := fc.build(chs, "", false)
	var ds []Decision
	if err == nil {
		req.Checks[0].Hits = proto.Int64(-max(ch.Hits, 1))
		ds, err = fc.send(ctx, req, chs, fc.ownerNode(ch.Name, ch.Key), false, tr)
	}
	tr.end(ds, err)
	if len(ds) != 1 {
		return Decision{}, err
	}
	return ds[0], err
}

// CheckAll sends checks (1..MaxChecks), the limits of one request, to a
// node in one call and returns one decision per check, in order, as Check
// does for one. The call asks the node for all or nothing
// (CheckRequest.all_or_nothing): when a check is denied (or cannot be
// decided), the others that were allowed are given back and answered
// Refunded, not allowed; a check answered degraded is not given back.
// (To batch independent checks, e.g. many users', call Check for each.) Bad input is ErrInvalid naming the check, e.g.
// "checks[1].key: must not be empty". When the call fails as a whole (no
// answer) every decision is the failure mode's; under FailOpen a check
// whose owner could not be reached is answered allowed and Degraded (with
// Cause) and the others as the node answered them; under FailClosed any
// such check, or any answer the node marked degraded, fails the whole
// call with ErrUnavailable and every decision is not allowed and
// Degraded.
func (c *Client) CheckAll(ctx context.Context, checks []Check) ([]Decision, error) {
	return c.check(ctx, checks, "checks")
}

// check is Check and CheckAll; field names the checks in errors ("":
// one check, named by its fields alone), and a call with a field is one
// request's checks, all or nothing. With tracing on it is the span
// SpanCheck.
func (c *Client) check(ctx context.Context, chs []Check, field string) ([]Decision, error) {
	ctx, tr := c.startCall(ctx, chs, field != "")
	req, err := c.build(chs, field, field != "")
	var ds []Decision
	if err == nil {
		// One request's checks go together, to the owner of the first:
		// that node decides it and forwards the others (all or nothing
		// needs one node to see every answer).
		ds, err = c.send(ctx, req, chs, c.ownerNode(chs[0].Name, chs[0].Key), false, tr)
	}
	tr.end(ds, err)
	return ds, err
}

// CheckBatch sends independent checks (1..MaxChecks, e.g. many users'
// checks gathered by a proxy) and returns one decision per check, in
// order: each is decided on its own, as Check decides one. Under
// RouteOwner the checks are split by their keys' owners and the parts
// sent at once, each straight to its owner's node (a part whose owner is
// unknown goes to any node); under RouteAny they go in one call to one
// node, which forwards them. Each part is bounded by Config.Timeout and
// falls back as Check does. Bad input is ErrInvalid naming the check,
// e.g. "checks[1].key: must not be empty", and nothing is sent. A node
// may refuse a part the client accepted (ErrInvalid, e.g. a name no
// limit is configured under): the part's checks are then answered not
// allowed with that Cause, the error (naming the check by its place in
// the batch) is returned with the decisions, and the other parts'
// decisions stand: they were counted. (Under RouteAny the whole batch
// goes to one node, which refuses it whole: no decisions, nothing
// counted.) A check
// that could not be decided is answered by the failure mode: under
// FailOpen allowed and Degraded; under FailClosed not allowed and
// Degraded with Cause set, and the call's error is the first such Cause
// (wrapping ErrUnavailable); the other checks' decisions stand. The
// error is ErrClosed after Close, or ctx's error when ctx ended first.
func (c *Client) CheckBatch(ctx context.Context, checks []Check) ([]Decision, error) {
	ctx, tr := c.startCall(ctx, checks, true)
	ds, err := c.batch(ctx, checks, tr)
	tr.end(ds, err)
	return ds, err
}

// batch is CheckBatch's work.
func (c *Client) batch(ctx context.Context, chs []Check, tr *callTrace) ([]Decision, error) {
	req, err := c.build(chs, "checks", false)
	if err != nil {
		return nil, err
	}
	var (
		parts map[*node][]int
		rest  []int // checks of no known owner
	)
	if t := c.usableTable(); t != nil {
		parts = make(map[*node][]int, len(t.owners))
		for i, ch := range chs {
			if n := c.ownerNode(ch.Name, ch.Key); n != nil {
				parts[n] = append(parts[n], i)
			} else {
				rest = append(rest, i)
			}
		}
	}
	if len(parts) == 0 || (len(parts) == 1 && len(rest) == 0) {
		var first *node
		for n := range parts {
			first = n
		}
		return c.send(ctx, req, chs, first, true, tr)
	}
	if len(rest) > 0 {
		parts[nil] = rest
	}
	out := make([]Decision, len(chs))
	var (
		mu    sync.Mutex
		cause error
		wg    sync.WaitGroup
	)
	for n, is := range parts {
		wg.Go(func() {
			sub := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, len(is))}
			subChs := make([]Check, len(is))
			for j, i := range is {
				sub.Checks[j], subChs[j] = req.Checks[i], chs[i]
			}
			ds, err := c.send(ctx, sub, subChs, n, true, tr)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, ErrInvalid) {
				// A node refused the part (e.g. a limit name it has no
				// limit for): its checks fail, named by their place in
				// the batch; the other parts were decided.
				err = fmt.Errorf("%w: %s", ErrInvalid, batchIndex(strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "), is))
				cause = cmp.Or(cause, err)
				for _, i := range is {
					out[i] = Decision{Cause: err}
				}
				return
			}
			if err != nil && (len(ds) != len(is) || !errors.Is(err, ErrUnavailable)) {
				cause = cmp.Or(cause, err) // ctx ended, or closed: no decisions
				return
			}
			if err != nil {
				cause = cmp.Or(cause, err)
			}
			for j, i := range is {
				out[i] = ds[j]
			}
		})
	}
	wg.Wait()
	if cause != nil && !errors.Is(cause, ErrUnavailable) && !errors.Is(cause, ErrInvalid) {
		return nil, cause
	}
	return out, cause
}

// batchIndex rewrites a node's message about "checks[j]" of a part into
// one about the check's place in the batch, is[j].
func batchIndex(msg string, is []int) string {
	rest, ok := strings.CutPrefix(msg, "checks[")
	if !ok {
		return msg
	}
	num, after, ok := strings.Cut(rest, "]")
	j, err := strconv.Atoi(num)
	if !ok || err != nil || j < 0 || j >= len(is) {
		return msg
	}
	return "checks[" + strconv.Itoa(is[j]) + "]" + after
}

// build validates chs (1..MaxChecks) and returns their request; field
// prefixes the names of bad fields in errors (e.g. "checks[2]."; "": one
// check, named by its fields alone).
func (c *Client) build(chs []Check, field string, allOrNothing bool) (*sluicev1.CheckRequest, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	switch {
	case len(chs) == 0:
		return nil, fmt.Errorf("%w: %s: at least one check is required", ErrInvalid, field)
	case len(chs) > MaxChecks:
		return nil, fmt.Errorf("%w: %s: at most %d per call, got %d", ErrInvalid, field, MaxChecks, len(chs))
	}
	req := &sluicev1.CheckRequest{Checks: make([]*sluicev1.RateLimitCheck, len(chs)), AllOrNothing: allOrNothing}
	for i, ch := range chs {
		rc, err := c.request(ch, field, i)
		if err != nil {
			return nil, err
		}
		req.Checks[i] = rc
	}
	return req, nil
}

// send sends req (the checks chs) to first, when set, then to the nodes
// of Config.Addrs in turn, until one answers or Config.Timeout (or ctx)
// ends; first gets half the time left when another node could still be
// tried. each says how a check the cluster could not decide fails closed:
// alone (independent checks) or with the whole call (one request's). tr
// (nil: untraced) hears of each attempt.
func (c *Client) send(ctx context.Context, req *sluicev1.CheckRequest, chs []Check, first *node, each bool, tr *callTrace) ([]Decision, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()

	var last error
	for k, n := range c.attempts(first) {
		if ctx.Err() != nil {
			break
		}
		actx := ctx
		if k == 0 && n == first && (len(c.nodes) > 1 || c.nodes[0] != first) {
			if d, ok := ctx.Deadline(); ok {
				var acancel context.CancelFunc
				// The real clock, as ctx's deadline is: Config.Now only
				// skips failed nodes, and may be a test's frozen clock.
				actx, acancel = context.WithDeadline(ctx, ownerDeadline(time.Now(), d))
				defer acancel()
			}
		}
		// Each attempt says which table routed it: a node whose ring
		// differs answers with its own.
		req.RoutingFingerprint = c.routeFingerprint()
		resp, err := n.api.Check(actx, req)
		if err == nil && len(resp.GetDecisions()) != len(chs) {
			err = status.Errorf(codes.Internal, "%d decisions for %d checks", len(resp.GetDecisions()), len(chs))
		}
		if err != nil {
			code := status.Code(err)
			tr.failed(code)
			if code == codes.InvalidArgument || (code == codes.Internal && strings.Contains(status.Convert(err).Message(), "invalid UTF-8")) {
				return nil, fmt.Errorf("%w: %s", ErrInvalid, status.Convert(err).Message())
			}
			if code != codes.Canceled { // also a node that used up its time (the owner its share)
				n.downUntil.Store(c.cfg.Now().Add(c.cfg.SkipFor).UnixNano())
			}
			c.log.WarnContext(ctx, "rate limit check failed", "event", "rate_limit.unavailable",
				"name", names(chs), "addr", n.addr, "code", code.String())
			last = fmt.Errorf("%w: node %s: %s", ErrUnavailable, n.addr, code)
			continue
		}
		tr.answered()
		c.install(resp.GetRoutes())
		return c.answer(ctx, n, chs, resp.Decisions, each)
	}
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.Canceled) { // the caller gave up: no answer is wanted
			return nil, err
		}
		c.log.WarnContext(context.WithoutCancel(ctx), "rate limit check timed out", "event", "rate_limit.unavailable",
			"name", names(chs), "timeout", c.cfg.Timeout)
		last = fmt.Errorf("%w: no answer within %s", ErrUnavailable, c.cfg.Timeout)
	}
	return c.fail(len(chs), noAnswer{last})
}

// Probe asks every node of Config.Addrs at once for the cluster's members
// (the Members call, which every caller the node authenticates may make;
// it counts nothing) and returns one result per address, in order: nil
// when the node answered, else the call's error, a gRPC status error
// (status.Code and status.Convert read it): Unauthenticated or
// PermissionDenied when the node refused the client's credentials,
// Unavailable when it could not be reached or the connection failed (the
// message says why: connection refused, a TLS handshake or certificate
// error), DeadlineExceeded when it did not answer before ctx ended, or
// Unimplemented from a server that is no sluice node. With names, a node
// that answered is also sent a peek (hits 0: nothing is counted, no key
// changes) of the limit called each name, sent with no numbers (the
// nodes' configured limits), so that a token whose prefixes do not cover
// a name is found (PermissionDenied); names must be valid limit names (a
// node's InvalidArgument, e.g. for a name no limit is configured under,
// is returned too). Each call is bounded by ctx alone (not
// Config.Timeout), and Probe neither logs nor changes which nodes Check
// skips. After Close every result is ErrClosed.
func (c *Client) Probe(ctx context.Context, names ...string) []error {
	out := make([]error, len(c.nodes))
	if c.closed.Load() {
		for i := range out {
			out[i] = ErrClosed
		}
		return out
	}
	var peeks []*sluicev1.RateLimitCheck
	for _, name := range names {
		peeks = append(peeks, &sluicev1.RateLimitCheck{Name: name, Key: "sluice-probe", Hits: proto.Int64(0)})
	}
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			if _, err := n.api.Members(ctx, &sluicev1.MembersRequest{}); err != nil {
				out[i] = err
				return
			}
			for batch := range slices.Chunk(peeks, MaxChecks) {
				if _, err := n.api.Check(ctx, &sluicev1.CheckRequest{Checks: batch}); err != nil {
					out[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return out
}

// answer converts node n's decisions of chs, applying the failure mode to
// those it could not make from the owner's count. Another entry node
// would forward to the same owners, so this is the answer.
//
// With each (independent checks), a check that fails closed fails alone:
// it is answered not allowed and Degraded with its Cause, and the error
// returned is the first Cause; else it fails the whole call.
func (c *Client) answer(ctx context.Context, n *node, chs []Check, ds []*sluicev1.Decision, each bool) ([]Decision, error) {
	out := make([]Decision, len(ds))
	var cause error // the first check that fails the call closed
	for i, d := range ds {
		switch {
		case d.Error != "":
			// The owner could not be reached and the node has no answer.
			c.log.WarnContext(ctx, "rate limit check failed", "event", "rate_limit.unavailable",
				"name", chs[i].Name, "addr", n.addr, "owner", d.Owner, "code", "owner_unreachable")
			err := fmt.Errorf("%w: owner %s unreachable", ErrUnavailable, d.Owner)
			if c.mode == FailClosed {
				cause = cmp.Or(cause, err)
				out[i] = Decision{Degraded: true, Cause: err}
				continue
			}
			out[i] = Decision{Allowed: true, Degraded: true, Cause: err}
		case d.Degraded && c.mode == FailClosed:
			// Answered by the node's policy (the owner could not be
			// reached) or refused for want of room: not the owner's count.
			c.log.WarnContext(ctx, "rate limit check answered degraded", "event", "rate_limit.unavailable",
				"name", chs[i].Name, "addr", n.addr, "node", d.Owner, "code", "degraded")
			err := fmt.Errorf("%w: node %s answered degraded, not from the owner's count", ErrUnavailable, d.Owner)
			cause = cmp.Or(cause, err)
			out[i] = Decision{Degraded: true, Cause: err}
		default:
			out[i] = decision(d)
		}
	}
	switch {
	case cause != nil && each:
		return out, cause
	case cause != nil:
		return c.fail(len(ds), cause)
	}
	return out, nil
}

// names returns the names of chs for a log line: the name of one check,
// else the distinct names joined by commas.
func names(chs []Check) string {
	if len(chs) == 1 {
		return chs[0].Name
	}
	var out []string
	for _, ch := range chs {
		if !slices.Contains(out, ch.Name) {
			out = append(out, ch.Name)
		}
	}
	return strings.Join(out, ",")
}

// fail answers n checks by the failure mode; cause wraps ErrUnavailable.
func (c *Client) fail(n int, cause error) ([]Decision, error) {
	out := make([]Decision, n)
	for i := range out {
		out[i] = Decision{Allowed: c.mode == FailOpen, Degraded: true, Cause: cause}
	}
	if c.mode == FailClosed {
		return out, cause
	}
	return out, nil
}

// order returns the nodes to try: from the next in turn, the healthy ones
// first, then the skipped ones.
func (c *Client) order() []*node {
	k := len(c.nodes)
	start := int(c.next.Add(1) % uint64(k))
	now := c.cfg.Now().UnixNano()
	out := make([]*node, 0, k)
	var skipped []*node
	for i := range k {
		n := c.nodes[(start+i)%k]
		if n.downUntil.Load() > now {
			skipped = append(skipped, n)
		} else {
			out = append(out, n)
		}
	}
	return append(out, skipped...)
}

// serverDegraded reports whether the node marked d degraded: the key's
// owner could not be reached and the node answered per the check's
// on_owner_unavailable policy.
func serverDegraded(d *sluicev1.Decision) bool { return d.GetDegraded() }

// decision converts a node's answer.
func decision(d *sluicev1.Decision) Decision {
	out := Decision{
		Allowed:   d.Allowed,
		Limit:     d.Limit,
		Remaining: d.Remaining,
		ResetTime: time.UnixMilli(d.ResetTime),
		Delay:     durationFromMillis(d.Delay),
		Owner:     d.Owner,
		Shadow:    d.Shadow,
		Degraded:  serverDegraded(d),
		Refunded:  d.Refunded,

		Scope:          scopeOf(d.Scope),
		Region:         d.Region,
		Slice:          d.Slice,
		SliceExhausted: d.SliceExhausted,
		SlicePending:   d.SlicePending,
	}
	if d.RetryAfter < 0 {
		out.RetryAfter = -1
	} else {
		out.RetryAfter = durationFromMillis(d.RetryAfter)
	}
	return out
}

// durationFromMillis converts ms to a Duration, saturating instead of
// overflowing.
func durationFromMillis(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	if ms < 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
