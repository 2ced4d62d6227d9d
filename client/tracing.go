package client

import (
	"context"
	"errors"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// SpanCheck is the name of the span of a Check or CheckAll call when
// Config.TracerProvider is set.
const SpanCheck = "sluice.client.check"

// tracerName is the instrumentation scope of the client's spans.
const tracerName = "github.com/sluicehq/sluice/client"

// The attributes of a SpanCheck span. They name limits and count checks
// and answers; never a key or a node's address.
const (
	attrLimitNames   = attribute.Key("sluice.limit_names")    // the checks' distinct limit names
	attrCheckCount   = attribute.Key("sluice.check_count")    // checks in the call
	attrFailureMode  = attribute.Key("sluice.failure_mode")   // open or closed
	attrAllOrNothing = attribute.Key("sluice.all_or_nothing") // a CheckAll call
	attrAttempts     = attribute.Key("sluice.attempts")       // nodes tried
	attrAllowedCount = attribute.Key("sluice.allowed_count")  // checks answered allowed
	attrDeniedCount  = attribute.Key("sluice.denied_count")   // checks answered not allowed
	attrDegraded     = attribute.Key("sluice.degraded")       // some answer was degraded
	attrCode         = attribute.Key("rpc.grpc.status_code")  // a failed attempt's gRPC code (an event's)
)

// callTrace is the span of one call, and what its end reports.
type callTrace struct {
	span     trace.Span
	attempts int
}

// startCall starts the span of a call of chs (all or nothing for
// CheckAll) as a child of ctx's span, and returns ctx with the span and
// its W3C trace context in the outgoing gRPC metadata (traceparent,
// tracestate: the node's spans join the trace); nil and ctx when the
// client does not trace.
func (c *Client) startCall(ctx context.Context, chs []Check, allOrNothing bool) (context.Context, *callTrace) {
	if c.tracer == nil {
		return ctx, nil
	}
	ctx, span := c.tracer.Start(ctx, SpanCheck, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		var names []string
		for _, ch := range chs {
			if !slices.Contains(names, ch.Name) {
				names = append(names, ch.Name)
			}
		}
		span.SetAttributes(attrLimitNames.StringSlice(names), attrCheckCount.Int(len(chs)),
			attrFailureMode.String(c.mode.String()), attrAllOrNothing.Bool(allOrNothing))
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	pairs := make([]string, 0, 2*len(carrier))
	for k, v := range carrier {
		pairs = append(pairs, k, v)
	}
	return metadata.AppendToOutgoingContext(ctx, pairs...), &callTrace{span: span}
}

// failed records an attempt on a node that failed with code.
func (t *callTrace) failed(code codes.Code) {
	if t == nil {
		return
	}
	t.attempts++
	t.span.AddEvent("attempt failed", trace.WithAttributes(attrCode.Int(int(code))))
}

// answered records the attempt that a node answered.
func (t *callTrace) answered() {
	if t != nil {
		t.attempts++
	}
}

// end ends the span with the call's outcome: its decisions or its error
// (the span's status then says which kind, never the error's text, which
// names a node's address).
func (t *callTrace) end(ds []Decision, err error) {
	if t == nil {
		return
	}
	if t.span.IsRecording() {
		var allowed, denied int
		degraded := false
		for _, d := range ds {
			if d.Allowed {
				allowed++
			} else {
				denied++
			}
			degraded = degraded || d.Degraded
		}
		t.span.SetAttributes(attrAttempts.Int(t.attempts), attrAllowedCount.Int(allowed), attrDeniedCount.Int(denied), attrDegraded.Bool(degraded))
		switch {
		case err == nil && degraded:
			t.span.SetStatus(otelcodes.Error, "degraded: "+ErrUnavailable.Error())
		case errors.Is(err, ErrInvalid):
			t.span.SetStatus(otelcodes.Error, ErrInvalid.Error())
		case errors.Is(err, ErrUnavailable):
			t.span.SetStatus(otelcodes.Error, ErrUnavailable.Error())
		case errors.Is(err, ErrClosed):
			t.span.SetStatus(otelcodes.Error, ErrClosed.Error())
		case err != nil:
			t.span.SetStatus(otelcodes.Error, err.Error()) // the caller's context's end
		}
	}
	t.span.End()
}
