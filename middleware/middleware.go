// Package middleware limits HTTP requests (and gRPC calls) with a sluice
// cluster, through package client:
//
//	c, _ := client.New(client.Config{Addrs: []string{"127.0.0.1:7070"}})
//	byIP, _ := middleware.ClientIP(middleware.IPConfig{Secret: secret})
//	limit, _ := middleware.New(middleware.Config{Checker: c, Name: "api", Key: byIP})
//	http.ListenAndServe(":8080", limit.Handler(mux))
//
// Every limited answer carries the limit's state in headers:
// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (Unix
// seconds, or delta seconds with Config.ResetDelta), and the IETF httpapi
// draft's structured fields RateLimit-Policy (`"api";q=30;w=60`: quota
// and window in seconds) and RateLimit (`"api";r=12;t=41`: remaining, and
// seconds until the quota resets). A request over the limit gets 429 with
// Retry-After (delta seconds, rounded up, at least 1) and Cache-Control:
// no-store. Fail-open answers (the cluster did not answer; see
// client.FailOpen) pass with no rate-limit headers: their numbers are
// unknown. The failure mode is the Checker's: with a *client.Client
// failing closed, the nodes are asked to deny a check whose key's owner
// they cannot reach, and a degraded answer is client.ErrUnavailable, so
// the request gets 503 (OnError), never through.
//
// A [Group] checks a request against several limits in one call, which
// the nodes decide all or nothing.
//
// The package imports only package client and sluice's generated API
// types, never the server.
package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/client"
)

// Checker answers checks; *client.Client is one. It must be safe for
// concurrent use. A Checker that also has a FailureMode method (as
// *client.Client does) and reports client.FailClosed never has a decision
// it marks Degraded let a request through: the middleware answers it as
// client.ErrUnavailable (503 by default).
type Checker interface {
	Check(ctx context.Context, c client.Check) (client.Decision, error)
}

// BatchChecker answers several checks in one call, one decision per
// check, in order (see client.Client.CheckAll: the nodes decide them all
// or nothing); *client.Client is one. It must be safe for concurrent use.
type BatchChecker interface {
	CheckAll(ctx context.Context, cs []client.Check) ([]client.Decision, error)
}

var (
	_ Checker      = (*client.Client)(nil)
	_ BatchChecker = (*client.Client)(nil)
)

// failsClosed reports whether c says it fails closed.
func failsClosed(c any) bool {
	fm, ok := c.(interface{ FailureMode() client.FailureMode })
	return ok && fm.FailureMode() == client.FailClosed
}

// errDegradedClosed is the error of a degraded decision from a Checker
// that fails closed.
var errDegradedClosed = fmt.Errorf("%w: a degraded answer, and the checker fails closed", client.ErrUnavailable)

// Config configures a Middleware.
type Config struct {
	// Checker answers the checks, e.g. a *client.Client. (Required)
	Checker Checker
	// Name is the limit's name: of a limit configured on the nodes
	// (serve --limits), or the scope of Limit. It also names the policy
	// in the RateLimit headers. (Required)
	Name string
	// Limit gives inline numbers; nil uses the limit configured on the
	// nodes under Name. (Optional)
	Limit *client.Limit
	// Window is the window of the named limit, for RateLimit-Policy's w
	// (the nodes' answers do not carry it); 0 leaves w out. Ignored when
	// Limit is set. (Optional)
	Window time.Duration
	// Key returns the key a request is limited by. (Required)
	Key KeyFunc
	// ExemptMethods are never limited. Nil means OPTIONS (CORS
	// preflights); an empty, non-nil slice exempts none. (Optional)
	ExemptMethods []string
	// Exempt, when it returns true, lets a request through unlimited
	// (e.g. a route with flow control of its own). (Optional)
	Exempt func(*http.Request) bool
	// ResetDelta writes X-RateLimit-Reset as seconds from now instead of
	// Unix seconds. (Optional)
	ResetDelta bool
	// OnLimited answers a request over the limit. The rate-limit headers,
	// Retry-After and Cache-Control are set before it is called. Default:
	// 429 with a JSON body {"error":"rate_limited","limit":"api",
	// "retry_after":50} (seconds). It may instead call the next handler
	// (see DecisionFrom). (Optional)
	OnLimited func(w http.ResponseWriter, r *http.Request, d client.Decision)
	// PassOverLimit lets a request over the limit through to the next
	// handler anyway, with the rate-limit headers but no 429, Retry-After
	// or OnLimited: the handler tells by DecisionFrom and skips only the
	// work the limit guards (e.g. a logout that must always clear the
	// session but may skip calling an upstream system). (Optional)
	PassOverLimit bool
	// OnError answers a request that could not be checked: err wraps
	// client.ErrUnavailable (the client fails closed, and the cluster did
	// not answer or answered degraded: the key's owner unreachable),
	// client.ErrInvalid, or a KeyFunc's error: ErrNoKey (no
	// key and no fallback) or ErrBadRequest (a key that is not valid
	// UTF-8 or longer than MaxKeyBytes, or an ambiguous body; such a key
	// is never sent). Default: 400 for ErrNoKey and ErrBadRequest (431
	// for ErrHeaderTooLarge), logged at debug level only, since the
	// client chose them; 503 for ErrUnavailable, else 500, logged as
	// errors; a short text body naming no detail. (Optional)
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// Now is the clock of the Reset and RateLimit headers' deltas (the
	// decisions come from the owner's clock). Default time.Now. (Optional)
	Now func() time.Time
	// Logger receives errors. Default slog.Default(). (Optional)
	Logger *slog.Logger
}

// Middleware limits the requests through its Handler. It is safe for
// concurrent use.
type Middleware struct {
	cfg         Config
	exempt      map[string]bool
	log         *slog.Logger
	failsClosed bool // the Checker fails closed: a degraded answer is ErrUnavailable
}

// New validates cfg and returns a Middleware; the error names the field.
func New(cfg Config) (*Middleware, error) {
	switch {
	case cfg.Checker == nil:
		return nil, errors.New("middleware: Config.Checker: required")
	case cfg.Name == "":
		return nil, errors.New("middleware: Config.Name: required")
	case !utf8.ValidString(cfg.Name):
		return nil, errors.New("middleware: Config.Name: not valid UTF-8")
	case cfg.Key == nil:
		return nil, errors.New("middleware: Config.Key: required")
	case cfg.Window < 0:
		return nil, fmt.Errorf("middleware: Config.Window: must be >= 0, got %s", cfg.Window)
	}
	if cfg.Limit != nil {
		if cfg.Limit.Limit <= 0 {
			return nil, fmt.Errorf("middleware: Config.Limit.Limit: must be > 0, got %d", cfg.Limit.Limit)
		}
		if cfg.Limit.Window <= 0 || cfg.Limit.Window%time.Millisecond != 0 {
			return nil, fmt.Errorf("middleware: Config.Limit.Window: must be a positive whole number of milliseconds, got %s", cfg.Limit.Window)
		}
		if _, err := client.ParseAlgorithm(string(cfg.Limit.Algorithm)); err != nil {
			return nil, fmt.Errorf("middleware: Config.Limit.Algorithm: %v", err)
		}
		l := *cfg.Limit
		cfg.Limit = &l
		cfg.Window = l.Window
	}
	if cfg.ExemptMethods == nil {
		cfg.ExemptMethods = []string{http.MethodOptions}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Middleware{cfg: cfg, exempt: map[string]bool{}, log: cfg.Logger.With("package", "middleware", "limit", cfg.Name),
		failsClosed: failsClosed(cfg.Checker)}
	for _, meth := range cfg.ExemptMethods {
		m.exempt[meth] = true
	}
	if m.cfg.OnLimited == nil {
		m.cfg.OnLimited = m.tooManyRequests
	}
	if m.cfg.OnError == nil {
		m.cfg.OnError = m.internalError
	}
	return m, nil
}

type decisionKey struct{}

// DecisionFrom returns the decision the middleware made for the request
// whose context is ctx (in the next handler or OnLimited), if any.
func DecisionFrom(ctx context.Context) (client.Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(client.Decision)
	return d, ok
}

// Handler returns next limited: exempt requests pass; others are checked
// by their key, and over the limit answered by OnLimited.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.exempts(r) {
			next.ServeHTTP(w, r)
			return
		}
		ch, err := m.check(r)
		if err != nil {
			m.cfg.OnError(w, r, err)
			return
		}
		d, err := m.cfg.Checker.Check(r.Context(), ch)
		if err == nil && d.Degraded && m.failsClosed {
			err = errDegradedClosed
		}
		if err != nil {
			m.cfg.OnError(w, r, err)
			return
		}
		if r, ok := m.apply(w, r, d); ok {
			next.ServeHTTP(w, r)
		}
	})
}

// exempts reports whether r passes unchecked.
func (m *Middleware) exempts(r *http.Request) bool {
	return m.exempt[r.Method] || m.cfg.Exempt != nil && m.cfg.Exempt(r)
}

// check returns the check of r, or the key's error (for OnError).
func (m *Middleware) check(r *http.Request) (client.Check, error) {
	key, err := m.cfg.Key(r)
	if err == nil {
		err = checkKey(key)
	}
	if err != nil {
		return client.Check{}, fmt.Errorf("middleware: key: %w", err)
	}
	return client.Check{Name: m.cfg.Name, Key: key, Limit: m.cfg.Limit}, nil
}

// apply answers r by decision d: it puts d in r's context, sets the
// rate-limit headers (none for a fail-open answer, whose numbers are
// unknown) and, over the limit, answers 429 by OnLimited unless
// PassOverLimit. It reports whether the request goes on, and returns it
// with d in its context. A refunded decision (see client.CheckAll) is not
// the denial: the request goes on to the check that denied it.
func (m *Middleware) apply(w http.ResponseWriter, r *http.Request, d client.Decision) (*http.Request, bool) {
	r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
	if d.Degraded && d.Cause != nil { // failed open: no numbers to tell
		return r, true
	}
	m.setHeaders(w.Header(), d)
	if d.Allowed || d.Refunded || m.cfg.PassOverLimit {
		return r, true
	}
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(d, m.cfg.Now()), 10))
	h.Set("Cache-Control", "no-store")
	m.cfg.OnLimited(w, r, d)
	return r, false
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds returns the Retry-After of a denied decision at now:
// its retry_after in seconds rounded up, at least 1. A check that can
// never be allowed (hits above the capacity) gets the seconds until the
// key's reset, at least 1.
func RetryAfterSeconds(d client.Decision, now time.Time) int64 {
	s := ceilSeconds(d.RetryAfter)
	if d.RetryAfter < 0 {
		s = ceilSeconds(d.ResetTime.Sub(now))
	}
	return max(s, 1)
}

// setHeaders writes the rate-limit headers of d.
func (m *Middleware) setHeaders(h http.Header, d client.Decision) {
	now := m.cfg.Now()
	remaining := max(d.Remaining, 0)
	resetIn := ceilSeconds(d.ResetTime.Sub(now))
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	if m.cfg.ResetDelta {
		h.Set("X-RateLimit-Reset", strconv.FormatInt(resetIn, 10))
	} else {
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(time.Duration(d.ResetTime.UnixNano())), 10))
	}
	policy := httpsfv.NewItem(m.cfg.Name)
	policy.Params.Add("q", d.Limit)
	if m.cfg.Window > 0 {
		policy.Params.Add("w", ceilSeconds(m.cfg.Window))
	}
	state := httpsfv.NewItem(m.cfg.Name)
	state.Params.Add("r", remaining)
	state.Params.Add("t", resetIn)
	// Marshal fails only on a name that is no sf-string (control bytes);
	// the draft fields are then left out rather than written wrong.
	if v, err := httpsfv.Marshal(httpsfv.List{policy}); err == nil {
		h.Set("RateLimit-Policy", v)
	}
	if v, err := httpsfv.Marshal(httpsfv.List{state}); err == nil {
		h.Set("RateLimit", v)
	}
}

// tooManyRequests is the default OnLimited.
func (m *Middleware) tooManyRequests(w http.ResponseWriter, r *http.Request, d client.Decision) {
	body, _ := json.Marshal(struct {
		Error      string `json:"error"`
		Limit      string `json:"limit"`
		RetryAfter int64  `json:"retry_after"`
	}{"rate_limited", m.cfg.Name, RetryAfterSeconds(d, m.cfg.Now())})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n'))
}

// internalError is the default OnError.
func (m *Middleware) internalError(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrHeaderTooLarge):
		code = http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, ErrNoKey), errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, client.ErrUnavailable):
		code = http.StatusServiceUnavailable
	}
	if code < 500 { // the client's doing: no error log a client can flood
		m.log.DebugContext(r.Context(), "request cannot be keyed", "event", "rate_limit.bad_request", "method", r.Method, "status", code, "err", err)
		http.Error(w, http.StatusText(code), code)
		return
	}
	m.log.ErrorContext(r.Context(), "rate limit check failed", "event", "rate_limit.error", "method", r.Method, "path", r.URL.Path, "err", err)
	http.Error(w, http.StatusText(code), code)
}
