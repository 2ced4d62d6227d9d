package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/client"
)

// What the proxy did with a request: the outcome label of
// sluice_proxy_requests_total.
const (
	outcomePassed       = "passed"        // checked, allowed from the owner's count, forwarded
	outcomeLimited      = "limited"       // denied: 429, or forwarded marked (over_limit: forward)
	outcomeFailedOpen   = "failed_open"   // no answer from the owner's count; let through (failure: open)
	outcomeFailedClosed = "failed_closed" // no answer from the owner's count; refused, 503 (failure: closed)
	outcomeError        = "error"         // the check was refused as invalid (e.g. a limit no node has): 500
	outcomeBadRequest   = "bad_request"   // no key, or a bad one: 400 or 431, nothing sent
	outcomeUnchecked    = "unchecked"     // no rule, or exempt: forwarded unlimited
)

// Kinds of cluster errors: the kind label of
// sluice_proxy_cluster_errors_total, counted per check call.
const (
	clusterNoAnswer = "no_answer" // no node answered within the timeout
	clusterDegraded = "degraded"  // a node answered, but not from the owner's count
	clusterInvalid  = "invalid"   // a node refused the check as invalid
)

// proxyMetrics are the proxy's own Prometheus metrics, served on
// --admin-addr: no label holds a key, an IP or a path.
type proxyMetrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	clusterErrors *prometheus.CounterVec
	probes        *prometheus.CounterVec
	ready         prometheus.Gauge
}

func newProxyMetrics() *proxyMetrics {
	m := &proxyMetrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_requests_total",
			Help: "Requests the proxy answered, by outcome: passed, limited, failed_open, failed_closed, error, bad_request, unchecked.",
		}, []string{"outcome"}),
		clusterErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_cluster_errors_total",
			Help: "Check calls the cluster did not answer from the owner's count, by kind: no_answer (no node answered), degraded (a node answered without the owner's count), invalid (a node refused the check).",
		}, []string{"kind"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_probes_total",
			Help: "Probes of the cluster (at start, every --probe-interval, and after a check no node answered), by result: ok, unreachable, refused (the cluster refuses the proxy's credentials).",
		}, []string{"result"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_proxy_cluster_ready",
			Help: "1 when the last probe or check answer reached the cluster (/readyz 200), else 0.",
		}),
	}
	for _, o := range []string{outcomePassed, outcomeLimited, outcomeFailedOpen, outcomeFailedClosed, outcomeError, outcomeBadRequest, outcomeUnchecked} {
		m.requests.WithLabelValues(o)
	}
	for _, k := range []string{clusterNoAnswer, clusterDegraded, clusterInvalid} {
		m.clusterErrors.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "unreachable", "refused"} {
		m.probes.WithLabelValues(r)
	}
	m.reg.MustRegister(m.requests, m.clusterErrors, m.probes, m.ready,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// minKickGap is the least time between two probes that failed checks
// ask for (the interval's probes come anyway).
const minKickGap = time.Second

// clusterWatch knows whether the cluster is reachable, by the last probe
// or check answer: it runs the probes (at start, every interval, and
// soon after a check no node answered), counts the proxy's metrics and
// logs the changes. It is safe for concurrent use.
type clusterWatch struct {
	c       *client.Client
	addrs   []string
	auth    clientAuth
	names   []string // the rules' limit names, peeked with a token
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	m       *proxyMetrics
	kick    chan struct{}

	mu        sync.Mutex
	ready     bool
	reason    string
	lastProbe time.Time
}

// newClusterWatch returns a watch of c (at addrs, with auth's
// credentials), not ready until a probe or an answer says otherwise.
func newClusterWatch(c *client.Client, addrs []string, auth clientAuth, names []string, timeout time.Duration, now func() time.Time, log *slog.Logger) *clusterWatch {
	return &clusterWatch{c: c, addrs: addrs, auth: auth, names: names, timeout: timeout, now: now, log: log,
		m: newProxyMetrics(), kick: make(chan struct{}, 1), reason: "not probed yet"}
}

// state returns whether the cluster is reachable, and why not.
func (w *clusterWatch) state() (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready, w.reason
}

// set records the cluster's state and logs a change: reachable again
// at info, out of reach at warn (rate limited with the rest).
func (w *clusterWatch) set(ready bool, reason string) {
	w.mu.Lock()
	was := w.ready
	w.ready, w.reason = ready, reason
	w.mu.Unlock()
	if ready {
		w.m.ready.Set(1)
	} else {
		w.m.ready.Set(0)
	}
	switch {
	case ready && !was:
		w.log.Info("cluster reachable", "event", "proxy.cluster_ready")
	case !ready && was:
		w.log.Warn("cluster unreachable", "event", "proxy.cluster_unready", "reason", reason)
	}
}

// probe probes the cluster once, bounded by the watch's timeout, and
// records and returns the result.
func (w *clusterWatch) probe(ctx context.Context) probeResult {
	w.mu.Lock()
	w.lastProbe = w.now()
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	r := probeCluster(ctx, w.c, w.addrs, w.auth, w.names)
	cancel()
	switch r.verdict() {
	case probeOK:
		w.m.probes.WithLabelValues("ok").Inc()
	case probeRefused:
		w.m.probes.WithLabelValues("refused").Inc()
	default:
		w.m.probes.WithLabelValues("unreachable").Inc()
	}
	w.set(r.verdict() == probeOK, r.reason())
	return r
}

// run probes every interval, and when a failed check asks, until ctx
// ends. A probe that finds the credentials refused (the nodes' CA,
// certificates or tokens changed since the start) is logged as an error:
// the proxy cannot stop serving, but /readyz says so.
func (w *clusterWatch) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
		}
		if r := w.probe(ctx); r.verdict() == probeRefused && ctx.Err() == nil {
			w.log.Error("the cluster refuses the proxy's credentials", "event", "proxy.cluster_refused", "reason", r.refused[0].Error())
		}
	}
}

// askProbe asks run for a probe soon, unless one started less than
// minKickGap ago (by the watch's clock) or one is asked for already.
func (w *clusterWatch) askProbe() {
	w.mu.Lock()
	recent := w.now().Sub(w.lastProbe) < minKickGap
	w.mu.Unlock()
	if recent {
		return
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// requestNote is what the checks of one request came to; the proxy puts
// one in the request's context and counts the request by it.
type requestNote struct {
	checked bool
	ds      []client.Decision
	err     error
}

type requestNoteKey struct{}

// outcome is the request's outcome label, for a request a rule matched.
func (n *requestNote) outcome() string {
	switch {
	case !n.checked:
		return outcomeBadRequest
	case n.err != nil && errors.Is(n.err, client.ErrUnavailable):
		return outcomeFailedClosed
	case n.err != nil:
		return outcomeError
	}
	degraded := false
	for _, d := range n.ds {
		if !d.Allowed && !d.Refunded {
			return outcomeLimited
		}
		degraded = degraded || d.Degraded
	}
	if degraded {
		return outcomeFailedOpen
	}
	return outcomePassed
}

// observe records a check call's answer: in the request's note, in the
// cluster error counters, and in the cluster's state (an answer from a
// node means reachable; no answer means not, and asks for a probe to
// tell why).
func (w *clusterWatch) observe(ctx context.Context, ds []client.Decision, err error) {
	if n, ok := ctx.Value(requestNoteKey{}).(*requestNote); ok {
		n.checked, n.ds, n.err = true, ds, err
	}
	cause := err
	degraded := false
	for _, d := range ds {
		if cause == nil && d.Cause != nil {
			cause = d.Cause
		}
		degraded = degraded || d.Degraded
	}
	switch {
	case errors.Is(cause, client.ErrNoAnswer):
		w.m.clusterErrors.WithLabelValues(clusterNoAnswer).Inc()
		w.set(false, "no node answered a check: "+cause.Error())
		w.askProbe()
		return
	case errors.Is(cause, client.ErrUnavailable), cause == nil && degraded:
		w.m.clusterErrors.WithLabelValues(clusterDegraded).Inc()
	case errors.Is(cause, client.ErrInvalid):
		w.m.clusterErrors.WithLabelValues(clusterInvalid).Inc()
	case cause != nil:
		return // the caller gave up (ctx), or the client is closed: says nothing of the cluster
	}
	if ok, _ := w.state(); !ok {
		w.set(true, "")
	}
}

// watchedChecker is a *client.Client whose answers a clusterWatch
// observes; it has the client's FailureMode, so the middleware fails
// closed with it as with the client.
type watchedChecker struct {
	c *client.Client
	w *clusterWatch
}

// FailureMode is the client's.
func (o watchedChecker) FailureMode() client.FailureMode { return o.c.FailureMode() }

// Check is the client's Check, observed.
func (o watchedChecker) Check(ctx context.Context, ch client.Check) (client.Decision, error) {
	d, err := o.c.Check(ctx, ch)
	o.w.observe(ctx, []client.Decision{d}, err)
	return d, err
}

// CheckAll is the client's CheckAll, observed.
func (o watchedChecker) CheckAll(ctx context.Context, chs []client.Check) ([]client.Decision, error) {
	ds, err := o.c.CheckAll(ctx, chs)
	o.w.observe(ctx, ds, err)
	return ds, err
}

// adminHandler serves the proxy's own endpoints: GET /healthz (200 while
// the process serves), GET /readyz (200 when the cluster is reachable by
// the last probe or answer, else 503 and why) and GET /metrics.
func (w *clusterWatch) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ok, why := w.state(); !ok {
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(rw, "not ready: %s\n", why)
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.m.reg, promhttp.HandlerOpts{}))
	return mux
}

// serveAdmin serves w's admin endpoints on lis until the returned stop is
// called.
func serveAdmin(lis net.Listener, w *clusterWatch) (stop func()) {
	srv := &http.Server{Handler: w.adminHandler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	done := make(chan struct{})
	go func() { _ = srv.Serve(lis); close(done) }()
	return func() { _ = srv.Close(); <-done }
}
