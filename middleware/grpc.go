package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/client"
)

// GRPCKeyFunc returns the key a gRPC call is limited by; fullMethod is
// e.g. "/pkg.Service/Method". Errors as for KeyFunc: a call with no key
// (ErrNoKey), or one whose key would be empty, not valid UTF-8 or longer
// than MaxKeyBytes (ErrBadRequest), is answered INVALID_ARGUMENT and
// its key never sent.
type GRPCKeyFunc func(ctx context.Context, fullMethod string) (string, error)

// GRPCConfig configures the gRPC interceptors.
type GRPCConfig struct {
	// Checker answers the checks, e.g. a *client.Client. (Required)
	Checker Checker
	// Name is the limit's name (see Config.Name). (Required)
	Name string
	// Limit gives inline numbers; nil uses the named limit. (Optional)
	Limit *client.Limit
	// Window of a named limit, for the ratelimit-policy metadata.
	// (Optional)
	Window time.Duration
	// Key returns the key of a call. (Required)
	Key GRPCKeyFunc
	// ExemptMethods are full method names never limited, e.g.
	// "/grpc.health.v1.Health/Check". (Optional)
	ExemptMethods []string
	// Now is the clock of the reset deltas. Default time.Now. (Optional)
	Now func() time.Time
	// Logger receives errors. Default slog.Default(). (Optional)
	Logger *slog.Logger
}

// grpcLimiter is the shared core of the interceptors.
type grpcLimiter struct {
	cfg    GRPCConfig
	m      *Middleware // for the header values
	exempt map[string]bool
}

func newGRPCLimiter(cfg GRPCConfig) (*grpcLimiter, error) {
	if cfg.Key == nil {
		return nil, errors.New("middleware: GRPCConfig.Key: required")
	}
	m, err := New(Config{Checker: cfg.Checker, Name: cfg.Name, Limit: cfg.Limit, Window: cfg.Window,
		Key: func(*http.Request) (string, error) { return "", nil }, Now: cfg.Now, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("%s", strings.Replace(err.Error(), "Config.", "GRPCConfig.", 1))
	}
	l := &grpcLimiter{cfg: cfg, m: m, exempt: map[string]bool{}}
	for _, meth := range cfg.ExemptMethods {
		l.exempt[meth] = true
	}
	return l, nil
}

// check decides a call: nil to go on, or the status error to answer.
// setHeader sends response metadata.
func (l *grpcLimiter) check(ctx context.Context, method string, setHeader func(metadata.MD) error) error {
	if l.exempt[method] {
		return nil
	}
	key, err := l.cfg.Key(ctx, method)
	if err == nil {
		err = checkKey(key)
	}
	if errors.Is(err, ErrNoKey) || errors.Is(err, ErrBadRequest) { // the client's doing: never sent, no error log
		l.m.log.DebugContext(ctx, "call cannot be keyed", "event", "rate_limit.bad_request", "method", method, "err", err)
		return status.Error(codes.InvalidArgument, "rate limit: the call cannot be keyed")
	}
	if err != nil {
		l.m.log.ErrorContext(ctx, "rate limit key failed", "event", "rate_limit.error", "method", method, "err", err)
		return status.Error(codes.Internal, "rate limit: no key for the call")
	}
	d, err := l.cfg.Checker.Check(ctx, client.Check{Name: l.cfg.Name, Key: key, Limit: l.m.cfg.Limit})
	if err == nil && d.Degraded && l.m.failsClosed {
		err = errDegradedClosed
	}
	if err != nil {
		l.m.log.ErrorContext(ctx, "rate limit check failed", "event", "rate_limit.error", "method", method, "err", err)
		if errors.Is(err, client.ErrUnavailable) {
			return status.Error(codes.Unavailable, "rate limiter unavailable")
		}
		return status.Error(codes.Internal, "rate limit check failed")
	}
	if d.Degraded && d.Cause != nil {
		return nil
	}
	h := http.Header{}
	l.m.setHeaders(h, d)
	md := metadata.MD{}
	for k, v := range h {
		md.Set(strings.ToLower(k), v...)
	}
	if d.Allowed {
		_ = setHeader(md)
		return nil
	}
	secs := RetryAfterSeconds(d, l.m.cfg.Now())
	md.Set("retry-after", strconv.FormatInt(secs, 10))
	_ = setHeader(md)
	st, _ := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit %q exceeded; retry in %d s", l.cfg.Name, secs)).
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(secs) * time.Second)})
	return st.Err()
}

// UnaryServerInterceptor returns an interceptor that checks every unary
// call: over the limit it answers RESOURCE_EXHAUSTED with a RetryInfo
// detail and "retry-after" metadata (seconds); the rate-limit headers go
// out as response metadata (lower case). A fail-closed outage answers
// UNAVAILABLE. The error names the bad field of cfg.
func UnaryServerInterceptor(cfg GRPCConfig) (grpc.UnaryServerInterceptor, error) {
	l, err := newGRPCLimiter(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := l.check(ctx, info.FullMethod, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}, nil
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: a stream
// is checked once, when it opens.
func StreamServerInterceptor(cfg GRPCConfig) (grpc.StreamServerInterceptor, error) {
	l, err := newGRPCLimiter(cfg)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := l.check(ss.Context(), info.FullMethod, ss.SetHeader); err != nil {
			return err
		}
		return handler(srv, ss)
	}, nil
}

// PeerIP returns a GRPCKeyFunc keying a call by its client's IP as
// ClientIP does: the socket peer, or, when the peer is a trusted proxy,
// the right-most untrusted hop of the "x-forwarded-for" (or "forwarded")
// metadata.
func PeerIP(cfg IPConfig) (GRPCKeyFunc, error) {
	k, err := newIPKeyer(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: no peer address", ErrNoKey)
		}
		h := http.Header{}
		md, _ := metadata.FromIncomingContext(ctx)
		for _, name := range []string{k.cfg.Header, k.cfg.PlatformHeader} {
			if name != "" {
				h[http.CanonicalHeaderKey(name)] = md.Get(name)
			}
		}
		a, err := k.addr(p.Addr.String(), h)
		if err != nil {
			return "", err
		}
		return k.key(a), nil
	}, nil
}

// MetadataUser returns a GRPCKeyFunc keying a call by the user id in
// metadata name (set by a trusted gateway): "user:" and the id, as
// UserFromHeader. No id: ErrNoKey; an id that is not valid UTF-8 or too
// long for a key: INVALID_ARGUMENT.
func MetadataUser(name string) GRPCKeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(name); len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return userTag + strings.TrimSpace(v[0]), nil
		}
		return "", fmt.Errorf("%w: no %s metadata", ErrNoKey, name)
	}
}
