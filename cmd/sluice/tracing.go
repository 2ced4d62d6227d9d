package main

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// tracingWanted reports whether the standard OpenTelemetry environment
// asks for traces: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with no
// OTEL_TRACES_EXPORTER. OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none
// turn it off. Any other exporter name is not supported and is reported.
func tracingWanted(getenv func(string) (string, bool)) (bool, string) {
	get := func(k string) string { v, _ := getenv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false, ""
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
		return true, ""
	case "", "none":
		return exp == "" && (get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""), ""
	default:
		return false, "OTEL_TRACES_EXPORTER=" + exp + " is not supported (want otlp or none); tracing is off"
	}
}

// tracing is what a node or the proxy needs to trace.
type tracing struct {
	provider trace.TracerProvider // for rpc.NodeConfig and client.Config
	server   []grpc.ServerOption  // for the node's gRPC server
	dial     []grpc.DialOption    // for its connections to peers
	shutdown func(context.Context) error
}

// setupTracing starts an OTLP/gRPC trace exporter configured by the
// standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, TLS,
// timeout) and the batch span processor's OTEL_BSP_* ones, with the
// resource service.name service and service.instance.id instance (none
// when empty) unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
// otherwise, and the sampler of OTEL_TRACES_SAMPLER (default: parent
// based, always on). It returns the tracer provider and otelgrpc stats
// handlers for a server and its peer connections with the W3C trace
// context propagator, which trace every RPC but the long-lived peer
// streams (ForwardStream: the checks they carry are traced by rpc, each
// request carrying its checks' trace contexts). Nothing is global: the
// caller hands the provider to what it traces. The exporter connects
// lazily: a collector that is down loses spans, never checks; such errors
// go to logger (through OpenTelemetry's global error handler, the one
// global it sets). shutdown flushes the spans not yet exported.
func setupTracing(ctx context.Context, logger *slog.Logger, service, instance string) (*tracing, error) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: spans lost", "error", err)
	}))
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, err
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", service), attribute.String("service.version", build.Version)}
	if instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", instance))
	}
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	prop := propagation.TraceContext{}
	notStream := otelgrpc.WithFilter(filters.Not(filters.FullMethodName(sluicev1.PeerService_ForwardStream_FullMethodName)))
	return &tracing{
		provider: tp,
		server:   []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop), notStream))},
		dial:     []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop), notStream))},
		shutdown: tp.Shutdown,
	}, nil
}

// proxyTracing starts the proxy's tracing when the OTEL_* variables of
// getenv ask for it (see tracingWanted; nil getenv: never): a tracer
// provider for its client (service name sluice-proxy), and stop, which
// flushes the spans not yet exported (for at most 5 s). Otherwise it
// returns nil and a stop that does nothing; an unsupported exporter is
// logged. The error is setupTracing's.
func proxyTracing(ctx context.Context, getenv func(string) (string, bool), logger *slog.Logger) (trace.TracerProvider, func(), error) {
	if getenv == nil {
		return nil, func() {}, nil
	}
	want, warn := tracingWanted(getenv)
	if warn != "" {
		logger.Warn(warn)
	}
	if !want {
		return nil, func() {}, nil
	}
	tr, err := setupTracing(ctx, logger.With("component", "tracing"), "sluice-proxy", "")
	if err != nil {
		return nil, nil, cli.Exit("tracing: "+err.Error(), exitFailure)
	}
	logger.Info("tracing check calls with OpenTelemetry (OTLP)")
	return tr.provider, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tr.shutdown(sctx)
	}, nil
}

// withTraceContext makes h's requests carry the W3C trace context of
// their traceparent and tracestate headers, so that the proxy's spans
// (its client's check calls) join the caller's trace, as
// OpenTelemetry's HTTP instrumentation does; h itself when tp is nil (no
// tracing). The headers go on upstream unchanged.
func withTraceContext(h http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return h
	}
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))))
	})
}
