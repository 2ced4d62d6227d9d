package main

import (
	"context"
	"log/slog"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
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

// tracing is what a node needs to trace its RPCs.
type tracing struct {
	server   []grpc.ServerOption // for the node's gRPC server
	dial     []grpc.DialOption   // for its connections to peers
	shutdown func(context.Context) error
}

// setupTracing starts an OTLP/gRPC trace exporter configured by the
// standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, TLS,
// timeout), with the service name "sluice" unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES say otherwise, and returns otelgrpc stats
// handlers for the server and the peer connections, so a check's trace
// follows it to its owner (W3C trace context). The exporter connects
// lazily: a collector that is down loses spans, never checks; such errors
// go to logger.
func setupTracing(ctx context.Context, logger *slog.Logger) (*tracing, error) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: spans lost", "error", err)
	}))
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "sluice"), attribute.String("service.version", version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &tracing{
		server:   []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp)))},
		dial:     []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp)))},
		shutdown: tp.Shutdown,
	}, nil
}
