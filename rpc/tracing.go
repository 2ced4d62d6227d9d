package rpc

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/rpc/internal/forward"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Tracing (docs/tracing.md). A forwarded check travels from the node a
// client called to its owner in a batch, with other requests' checks, over
// one long-lived stream per peer, so gRPC's per-call propagation does not
// carry its trace: each forward carries the trace context of the sender's
// span for its checks in the request (ForwardRequest.traces, one run per
// request the batch gathered), and the receiver's span for the request is
// a child of that context when the request carries one trace, and links
// to each context otherwise (OpenTelemetry's answer for batches).
//
// With no TracerProvider (ServerConfig.TracerProvider nil) none of this
// runs: the paths test one nil pointer, and requests carry nothing.

// The spans this package makes.
const (
	// spanForward is the sender's span of one forward: one request's
	// checks for one owner (or a re-forward, or a stand-in's checks),
	// from its queueing in the owner's batcher to the owner's answer. A
	// client span, a child of the caller's context (the Check call's
	// span).
	spanForward = "sluice.forward"
	// spanReceive is the receiver's span of one ForwardRequest (a batch):
	// a server span, child of the sender's spanForward when the request
	// carries one trace, else a root linking to each.
	spanReceive = "sluice.forward.receive"
)

// The attributes of the spans. They name members and limits and count
// checks; never a key, an address or a client's identity.
const (
	attrPeer         = attribute.Key("sluice.peer")          // the member a forward went to
	attrSender       = attribute.Key("sluice.sender")        // the member that sent a request
	attrCheckCount   = attribute.Key("sluice.check_count")   // checks in the forward or the request
	attrBatched      = attribute.Key("sluice.batched")       // the forward went through the owner's batcher
	attrReforwarded  = attribute.Key("sluice.reforwarded")   // checks sent on by an owner whose ring names another
	attrStandIn      = attribute.Key("sluice.stand_in")      // checks sent to an unreachable owner's stand-in
	attrTraceCount   = attribute.Key("sluice.trace_count")   // distinct span contexts a request carried
	attrAllowedCount = attribute.Key("sluice.allowed_count") // checks answered allowed
	attrDeniedCount  = attribute.Key("sluice.denied_count")  // checks answered not allowed, without error
	attrErrorCount   = attribute.Key("sluice.error_count")   // checks answered with an error (not decided)
	attrNode         = attribute.Key("sluice.node")          // this node's member name
)

// tracerName is the instrumentation scope of the spans.
const tracerName = "github.com/sluicehq/sluice/rpc"

// peerForward sends r to p (forward.Peer.Forward) and returns its answer.
// With tracing on it is the span sluice.forward, a child of ctx's span,
// whose trace context r carries to p.
func (s *Server) peerForward(ctx context.Context, p *forward.Peer, r forward.Request) ([]*sluicev1.Decision, error) {
	if s.tracer == nil {
		return p.Forward(ctx, r)
	}
	ctx, span := s.tracer.Start(ctx, spanForward, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		attrs := []attribute.KeyValue{attrNode.String(s.name), attrPeer.String(p.Name()), attrCheckCount.Int(len(r.Checks)),
			attrBatched.Bool(!r.NoBatching && !r.Reforwarded && !r.StandIn)}
		if r.Reforwarded {
			attrs = append(attrs, attrReforwarded.Bool(true))
		}
		if r.StandIn {
			attrs = append(attrs, attrStandIn.Bool(true))
		}
		span.SetAttributes(attrs...)
	}
	r.Trace = wireTrace(span.SpanContext())
	ds, err := p.Forward(ctx, r)
	if span.IsRecording() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error()) // names the owner and a gRPC code only
		} else {
			span.SetAttributes(decisionCounts(ds)...)
		}
	}
	span.End()
	return ds, err
}

// receive is the PeerService's Forward, on its own (unary: ctx's span,
// if any, is gRPC's span of the call) or on the peer stream (ctx is the
// stream's: its span, if any, is not this request's). With tracing on it
// is the span sluice.forward.receive of the request (see receiveSpan).
func (s *Server) receive(ctx context.Context, req *sluicev1.ForwardRequest, unary bool) (*sluicev1.ForwardResponse, error) {
	if s.tracer == nil {
		return s.forwarded(ctx, req)
	}
	ctx, span := s.receiveSpan(ctx, req, unary)
	resp, err := s.forwarded(ctx, req)
	if span != nil {
		if span.IsRecording() {
			if err != nil {
				span.SetStatus(codes.Error, err.Error()) // names the field of a refused check, never its key
			} else {
				span.SetAttributes(decisionCounts(resp.Decisions)...)
			}
		}
		span.End()
	}
	return resp, err
}

// receiveSpan starts the span of a forwarded request at its receiver:
//
//   - unary, and ctx has a span (gRPC's per-call propagation made it, a
//     descendant of the sender's): a child of it, linking to the carried
//     contexts of other traces, if any;
//   - the carried contexts all of one trace: a child of the first (the
//     forward that sent the checks), linking to the others;
//   - several traces: a new root linking to each (not sampled when none
//     of them is);
//   - nothing carried: no span (it returns ctx, without the stream's
//     span, and nil).
//
// Each link says how many of the request's checks its context covered.
func (s *Server) receiveSpan(ctx context.Context, req *sluicev1.ForwardRequest, unary bool) (context.Context, trace.Span) {
	runs := carried(req)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	parent := trace.SpanContextFromContext(ctx)
	switch {
	case unary && parent.IsValid():
		opts = append(opts, trace.WithLinks(links(runs, parent.TraceID())...))
	case len(runs) == 0:
		if parent.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{}) // not the stream's span
		}
		return ctx, nil
	case oneTrace(runs):
		ctx = trace.ContextWithRemoteSpanContext(ctx, runs[0].sc)
		opts = append(opts, trace.WithLinks(links(runs[1:], trace.TraceID{})...))
	case !anySampled(runs):
		// Nobody wants these traces: the request's span is not sampled
		// either (a child of an unsampled context).
		ctx = trace.ContextWithRemoteSpanContext(ctx, runs[0].sc)
	default:
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(links(runs, trace.TraceID{})...))
	}
	ctx, span := s.tracer.Start(ctx, spanReceive, opts...)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{attrNode.String(s.name), attrSender.String(req.Sender),
			attrCheckCount.Int(len(req.Checks)), attrTraceCount.Int(len(runs))}
		if req.Reforwarded {
			attrs = append(attrs, attrReforwarded.Bool(true))
		}
		if req.StandIn {
			attrs = append(attrs, attrStandIn.Bool(true))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// run is one distinct span context a request carried, and how many of its
// checks it covered.
type run struct {
	sc     trace.SpanContext
	checks int
}

// carried returns the distinct valid span contexts of req's runs, in
// order of first appearance; runs that are empty (untraced checks) or
// malformed are left out.
func carried(req *sluicev1.ForwardRequest) []run {
	var out []run
	for _, t := range req.Traces {
		sc, ok := spanContextOf(t)
		if !ok {
			continue
		}
		i := 0
		for i < len(out) && !out[i].sc.Equal(sc) {
			i++
		}
		if i == len(out) {
			out = append(out, run{sc: sc})
		}
		out[i].checks += int(t.Checks)
	}
	return out
}

// spanContextOf decodes a carried trace context (as remote), or false
// when it is empty or malformed.
func spanContextOf(t *sluicev1.TraceContext) (trace.SpanContext, bool) {
	var (
		tid trace.TraceID
		sid trace.SpanID
	)
	if len(t.TraceId) != len(tid) || len(t.SpanId) != len(sid) || t.Flags > 0xff {
		return trace.SpanContext{}, false
	}
	copy(tid[:], t.TraceId)
	copy(sid[:], t.SpanId)
	cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(t.Flags), Remote: true}
	if t.TraceState != "" {
		ts, err := trace.ParseTraceState(t.TraceState)
		if err == nil {
			cfg.TraceState = ts
		}
	}
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// wireTrace returns sc as a request carries it; nil when sc is not valid.
// The caller (forward) sets its checks.
func wireTrace(sc trace.SpanContext) *sluicev1.TraceContext {
	if !sc.IsValid() {
		return nil
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	return &sluicev1.TraceContext{TraceId: tid[:], SpanId: sid[:], Flags: uint32(sc.TraceFlags()), TraceState: sc.TraceState().String()}
}

// oneTrace reports whether runs (at least one) are all of one trace.
func oneTrace(runs []run) bool {
	for _, r := range runs[1:] {
		if r.sc.TraceID() != runs[0].sc.TraceID() {
			return false
		}
	}
	return true
}

// anySampled reports whether one of runs is sampled.
func anySampled(runs []run) bool {
	for _, r := range runs {
		if r.sc.IsSampled() {
			return true
		}
	}
	return false
}

// links returns a link to each of runs not of the trace skip (zero: skip
// none), with the number of checks it covered.
func links(runs []run, skip trace.TraceID) []trace.Link {
	var out []trace.Link
	for _, r := range runs {
		if skip.IsValid() && r.sc.TraceID() == skip {
			continue
		}
		out = append(out, trace.Link{SpanContext: r.sc, Attributes: []attribute.KeyValue{attrCheckCount.Int(r.checks)}})
	}
	return out
}

// decisionCounts returns the attributes counting ds's decisions: allowed,
// denied, and not decided (error set).
func decisionCounts(ds []*sluicev1.Decision) []attribute.KeyValue {
	var allowed, denied, errs int
	for _, d := range ds {
		switch {
		case d.GetError() != "":
			errs++
		case d.GetAllowed():
			allowed++
		default:
			denied++
		}
	}
	return []attribute.KeyValue{attrAllowedCount.Int(allowed), attrDeniedCount.Int(denied), attrErrorCount.Int(errs)}
}

// withTraceContext makes the HTTP face's requests carry the W3C trace
// context of their traceparent and tracestate headers, so that the
// forwards of a POST /v1/check (or /json) join the caller's trace as a
// gRPC call's do.
func withTraceContext(h http.Handler) http.Handler {
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))))
	})
}
