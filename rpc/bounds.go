package rpc

import (
	"encoding/binary"
	"log"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limits"
)

// Defaults of GRPCBounds and HTTPBounds.
const (
	// DefaultMaxRecvBytes bounds one gRPC message a node receives: 1 MiB,
	// enough for MaxBatch checks with long names and keys.
	DefaultMaxRecvBytes = 1 << 20
	// DefaultMaxConcurrentStreams bounds the calls in flight on one gRPC
	// connection.
	DefaultMaxConcurrentStreams = 1000
	// DefaultKeepaliveMinTime is the shortest interval between a client's
	// keepalive pings that the server tolerates; a client that pings more
	// often is sent GOAWAY (ENHANCE_YOUR_CALM) and disconnected.
	DefaultKeepaliveMinTime = 10 * time.Second
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout: the server pings a
	// connection idle this long, and closes it when the ping is not
	// answered within the timeout (a dead or half-open client).
	DefaultKeepaliveTime    = time.Minute
	DefaultKeepaliveTimeout = 20 * time.Second
	// DefaultMaxInflight bounds the checks a node works on at once for
	// its clients (Check, POST /v1/check, Envoy RLS): beyond it a call is
	// refused with RESOURCE_EXHAUSTED.
	DefaultMaxInflight = 50_000

	// DefaultReadHeaderTimeout bounds reading an HTTP request's headers.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultHTTPReadTimeout bounds reading a whole HTTP request.
	DefaultHTTPReadTimeout = 30 * time.Second
	// DefaultHTTPWriteTimeout bounds writing an HTTP response (from the
	// end of the request's headers).
	DefaultHTTPWriteTimeout = 30 * time.Second
	// DefaultHTTPIdleTimeout bounds how long a kept-alive HTTP connection
	// may wait for its next request.
	DefaultHTTPIdleTimeout = 2 * time.Minute
	// DefaultMaxHeaderBytes bounds an HTTP request's headers (request
	// line included): 64 KiB; more is answered 431.
	DefaultMaxHeaderBytes = 64 << 10
)

// GRPCBounds bounds what one client can make a node's gRPC server hold.
// Zero fields take the defaults above.
type GRPCBounds struct {
	// MaxRecvBytes bounds one received message, in bytes; a larger one is
	// refused with RESOURCE_EXHAUSTED before it is decoded.
	MaxRecvBytes int
	// MaxConcurrentStreams bounds the calls in flight per connection.
	MaxConcurrentStreams uint32
	// KeepaliveMinTime: clients pinging more often are disconnected.
	// Pings without an active call are permitted (at that rate).
	KeepaliveMinTime time.Duration
	// KeepaliveTime, KeepaliveTimeout: an idle connection is pinged after
	// KeepaliveTime and closed when the ping goes unanswered for
	// KeepaliveTimeout.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MaxConnectionAge, when > 0, makes the server ask a client to
	// reconnect (GOAWAY) once its connection is this old, and
	// MaxConnectionAgeGrace (default 30 s) later closes it, cutting the
	// calls still open on it (a peer's forward stream among them: the
	// checks in flight on it are then answered degraded). 0: connections
	// live as long as they are used.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// MaxInflight bounds the checks in flight for clients on the node
	// (see DefaultMaxInflight); < 0: no bound.
	MaxInflight int
}

func (b GRPCBounds) withDefaults() GRPCBounds {
	if b.MaxRecvBytes <= 0 {
		b.MaxRecvBytes = DefaultMaxRecvBytes
	}
	if b.MaxConcurrentStreams == 0 {
		b.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if b.KeepaliveMinTime <= 0 {
		b.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	if b.KeepaliveTime <= 0 {
		b.KeepaliveTime = DefaultKeepaliveTime
	}
	if b.KeepaliveTimeout <= 0 {
		b.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if b.MaxConnectionAge > 0 && b.MaxConnectionAgeGrace <= 0 {
		b.MaxConnectionAgeGrace = 30 * time.Second
	}
	if b.MaxInflight == 0 {
		b.MaxInflight = DefaultMaxInflight
	}
	return b
}

// serverOptions returns the gRPC server options that enforce b.
func (b GRPCBounds) serverOptions() []grpc.ServerOption {
	b = b.withDefaults()
	kp := keepalive.ServerParameters{Time: b.KeepaliveTime, Timeout: b.KeepaliveTimeout}
	if b.MaxConnectionAge > 0 {
		kp.MaxConnectionAge, kp.MaxConnectionAgeGrace = b.MaxConnectionAge, b.MaxConnectionAgeGrace
	}
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(b.MaxRecvBytes),
		grpc.MaxConcurrentStreams(b.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: b.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(kp),
	}
}

// HTTPBounds bounds what one client can make an HTTP server hold; zero
// fields take the defaults above.
type HTTPBounds struct {
	// ReadHeaderTimeout bounds reading a request's headers: a client that
	// dribbles them is disconnected once it has passed.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing the response; < 0: no bound (for a
	// proxy whose upstream streams).
	WriteTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a kept-alive
	// connection.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; more is answered 431.
	MaxHeaderBytes int
}

// Apply sets srv's timeouts and header bound from b (defaults for zero
// fields) and returns srv.
func (b HTTPBounds) Apply(srv *http.Server) *http.Server {
	pick := func(v, def time.Duration) time.Duration {
		switch {
		case v < 0:
			return 0
		case v == 0:
			return def
		}
		return v
	}
	srv.ReadHeaderTimeout = pick(b.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	srv.ReadTimeout = pick(b.ReadTimeout, DefaultHTTPReadTimeout)
	srv.WriteTimeout = pick(b.WriteTimeout, DefaultHTTPWriteTimeout)
	srv.IdleTimeout = pick(b.IdleTimeout, DefaultHTTPIdleTimeout)
	srv.MaxHeaderBytes = b.MaxHeaderBytes
	if srv.MaxHeaderBytes <= 0 {
		srv.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return srv
}

// inflight bounds the checks in flight; the zero value (max 0) does not
// bound.
type inflight struct {
	max     int64
	n       atomic.Int64
	refused atomic.Int64
}

// acquire takes k slots, or returns a RESOURCE_EXHAUSTED error (and counts
// the refusal) when that would go over the bound. Release what it took
// with release.
func (f *inflight) acquire(k int) error {
	if f.max <= 0 {
		return nil
	}
	if f.n.Add(int64(k)) > f.max {
		f.n.Add(-int64(k))
		f.refused.Add(1)
		return status.Error(codes.ResourceExhausted, "sluice: node busy: over "+strconv.FormatInt(f.max, 10)+" checks in flight (max_inflight); retry with backoff or ask another node")
	}
	return nil
}

func (f *inflight) release(k int) {
	if f.max > 0 {
		f.n.Add(-int64(k))
	}
}

// DefaultNameKeyShare is the default NodeConfig.NameKeyShare: one limit
// name may hold half of MaxKeys.
const DefaultNameKeyShare = 50

// nameGroup returns the window.StoreConfig.Group of a node's store keys
// (ring.Key encodings): the limit name when it is a configured limit in
// src (src may be nil), else InlineName, so that inventing names gives no
// extra share.
func nameGroup(src *limits.Source) func(string) string {
	return func(key string) string {
		n, w := binary.Uvarint(unsafe.Slice(unsafe.StringData(key), len(key)))
		if w <= 0 || uint64(len(key)-w) < n {
			return InlineName
		}
		name := key[w : w+int(n)]
		if src != nil && src.Current().Has(name) {
			return name
		}
		return InlineName
	}
}

// httpErrorLog returns the log net/http writes its connection errors to
// (TLS handshakes, bad requests), at Debug level with client addresses
// replaced by "(addr)": no log line of a node names a client's IP.
func httpErrorLog(l *slog.Logger) *log.Logger {
	sl := l.With("component", "http")
	return log.New(redactWriter(func(msg string) { sl.Debug(msg) }), "", 0)
}

// addrPattern matches IPv4 and bracketed or bare IPv6 addresses, with an
// optional port.
var addrPattern = regexp.MustCompile(`\[[0-9A-Fa-f:.%a-z0-9]+\](:\d+)?|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\b[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}\b`)

// RedactAddrs returns s with every IP address (and port) replaced by
// "(addr)", for text that reaches a log or an error from code that names
// client addresses (net/http, gRPC transports).
func RedactAddrs(s string) string { return addrPattern.ReplaceAllString(s, "(addr)") }

type redactWriter func(string)

func (w redactWriter) Write(p []byte) (int, error) {
	w(strings.TrimRight(RedactAddrs(string(p)), "\n"))
	return len(p), nil
}
