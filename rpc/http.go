package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/rls"

	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/rpc/sluicev1gw"
)

// MaxHTTPBodyBytes bounds the body of an HTTP request: 1 MiB, enough for
// MaxBatch checks with the longest names and keys.
const MaxHTTPBodyBytes = 1 << 20

// HTTPConfig configures a node's HTTP face.
type HTTPConfig struct {
	// Server answers /v1/check, /v1/members and /v1/routes. (Required)
	Server *Server
	// Ready reports nil when the node should take traffic, else why not;
	// it backs /readyz. nil: always ready. (Optional)
	Ready func() error
	// Metrics backs /metrics; nil: no /metrics. (Optional)
	Metrics *Metrics
	// RLS backs POST /json (envoyproxy/ratelimit's HTTP face of Envoy's
	// rate limit service); nil: no /json. (Optional)
	RLS *rls.Service

	auth    *security.Authenticator // a node's client authentication; nil: none
	rlsPath string                  // the path of RLS's rules, for the admin API
}

// NewHTTPHandler returns the HTTP/JSON face of a node:
//
//   - POST /v1/check: a CheckRequest in the JSON form of the protobuf
//     messages (grpc-gateway; field names as in the .proto, e.g.
//     "window_ms"; 64-bit numbers may be given as numbers or strings, and
//     are answered as strings, as proto3 JSON does) answered with a
//     CheckResponse. Bad input gets 400 and a google.rpc.Status JSON
//     naming the field.
//   - GET /v1/members: the MembersResponse.
//   - GET /v1/routes: the RoutingTable (docs/routing.md).
//   - POST /v1/admin/key/inspect, POST /v1/admin/key/reset, GET
//     /v1/admin/limits: the admin API (InspectKey, ResetKey, ListLimits;
//     docs/admin.md), authorised apart from the rest: an admin token or
//     an admin certificate, or, on a node with neither configured and no
//     client authentication, a caller on loopback. Refused: 403 (or 401
//     for an unknown token) with a google.rpc.Status naming what is
//     needed.
//   - GET /healthz: 200 while the process serves (liveness).
//   - GET /readyz: 200 when Ready says so, else 503 with the reason;
//     with cfg.RLS a second line says how many RLS rules are in force
//     ("rls rules: 12 in 3 domains"; 0: every Envoy request is OK).
//   - GET /metrics: Prometheus text format.
//   - POST /json (with cfg.RLS): a RateLimitRequest of Envoy's rate limit
//     service in proto3 JSON, answered as envoyproxy/ratelimit's /json
//     does: the RateLimitResponse in proto3 JSON (lowerCamelCase names),
//     200 when OK, 429 when OVER_LIMIT; 400 for a body that is not a
//     RateLimitRequest or a request the service refuses (naming the
//     field), 503 when a descriptor could not be decided.
//   - GET /healthcheck: envoyproxy/ratelimit's health path: 200 "OK" when
//     Ready says so, else 500.
//
// A body over MaxHTTPBodyBytes gets 413.
//
// It returns an error only if the gateway cannot register the service.
func NewHTTPHandler(cfg HTTPConfig) (http.Handler, error) {
	gw := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{},
	}), runtime.WithRoutingErrorHandler(routingError))
	var svc sluicev1.RateLimitServiceServer = cfg.Server
	if cfg.auth != nil && cfg.auth.Mode() != ClientAuthNone {
		svc = gatewayServer{Server: cfg.Server, auth: cfg.auth}
	}
	if err := sluicev1gw.RegisterRateLimitServiceHandlerServer(context.Background(), gw, svc); err != nil {
		return nil, fmt.Errorf("http gateway: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", bodyLimit(gw, MaxHTTPBodyBytes))
	admin, err := adminHTTP(cfg)
	if err != nil {
		return nil, err
	}
	mux.Handle(security.AdminHTTPPrefix, bodyLimit(admin, MaxHTTPBodyBytes))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		rules := func() {
			if cfg.RLS != nil {
				st := cfg.RLS.Stats()
				fmt.Fprintf(w, "rls rules: %d in %d domains\n", st.Rules, st.Domains)
			}
		}
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", err)
				rules()
				return
			}
		}
		fmt.Fprintln(w, "ready")
		rules()
	})
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = w.Write([]byte("OK"))
	})
	if cfg.RLS != nil {
		mux.Handle("POST /json", bodyLimit(rlsJSON(cfg.RLS, cfg.auth), MaxHTTPBodyBytes))
	}
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Metrics.Registry(), promhttp.HandlerOpts{}))
	}
	if cfg.auth != nil && cfg.auth.Mode() != ClientAuthNone {
		return cfg.auth.HTTPHandler(mux), nil
	}
	return mux, nil
}

// rlsJSON is POST /json (see NewHTTPHandler).
func rlsJSON(svc *rls.Service, auth *security.Authenticator) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(err error) {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.Unauthenticated:
				code = http.StatusUnauthorized
			case codes.PermissionDenied:
				code = http.StatusForbidden
			case codes.Unavailable, codes.DeadlineExceeded:
				code = http.StatusServiceUnavailable
			}
			http.Error(w, status.Convert(err).Message(), code)
		}
		if auth != nil && auth.Mode() != ClientAuthNone {
			if err := auth.AuthorizeGatewayMethod(r.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName); err != nil {
				fail(err)
				return
			}
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "body: not a RateLimitRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := svc.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			fail(err)
			return
		}
		js, err := protojson.Marshal(resp)
		if err != nil {
			fail(err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(js)
	})
}

// bodyLimit reads a request's body (at most limit bytes) before h sees it,
// answering 413 with a google.rpc.Status JSON when it is longer.
func bodyLimit(h http.Handler, limit int64) http.Handler {
	tooLarge := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		fmt.Fprintf(w, `{"code":%d,"message":"body: at most %d bytes","details":[]}`+"\n", codes.InvalidArgument, limit)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			tooLarge(w)
			return
		}
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge(w)
				return
			}
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

// routingError answers a request the gateway has no route for. A known
// path with another method gets 405 (grpc-gateway's default turns it
// into 501, a server error); the rest is the default's.
func routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	if httpStatus != http.StatusMethodNotAllowed {
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
		return
	}
	allow := http.MethodPost
	if r.URL.Path == "/v1/members" || r.URL.Path == "/v1/routes" || r.URL.Path == "/v1/admin/limits" {
		allow = http.MethodGet
	}
	msg, _ := json.Marshal(fmt.Sprintf("method %s not allowed: use %s", r.Method, allow))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Allow", allow)
	w.WriteHeader(http.StatusMethodNotAllowed)
	fmt.Fprintf(w, `{"code":%d,"message":%s,"details":[]}`+"\n", codes.Unimplemented, msg)
}
