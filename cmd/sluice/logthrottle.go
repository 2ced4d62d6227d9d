package main

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// throttleHandler is a slog.Handler that rate limits warnings and errors
// by kind: it passes records below slog.LevelWarn as they come, and of
// the records at Warn or above it lets through at most one per kind per
// interval; the next one it lets through of a kind carries
// suppressed=N, the records of that kind it left out meanwhile. A kind
// is a record's level, message and "code" attribute (the gRPC code the
// client logs with each failed call), so that a cluster that is down
// logs one line per kind of failure per interval, whatever the number of
// requests and nodes. The number of kinds is bounded by the program's
// messages and gRPC's codes. Handlers made by WithAttrs and WithGroup
// share the kinds of the handler they were made from.
type throttleHandler struct {
	next slog.Handler
	st   *throttleState
}

// throttleState is what the handlers of one newThrottleHandler share.
type throttleState struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	kinds map[throttleKind]*throttleCount
}

type throttleKind struct {
	level slog.Level
	msg   string
	code  string
}

type throttleCount struct {
	last       time.Time // when a record of the kind was last let through
	suppressed int       // left out since
}

// newThrottleHandler returns next rate limited as throttleHandler says,
// at most one record of a kind per every (> 0) by the clock now.
func newThrottleHandler(next slog.Handler, every time.Duration, now func() time.Time) *throttleHandler {
	return &throttleHandler{next: next, st: &throttleState{every: every, now: now, kinds: map[throttleKind]*throttleCount{}}}
}

// Enabled is next's.
func (h *throttleHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

// Handle passes r to next unless its kind had a record let through less
// than the interval ago; it returns next's error, or nil for a record
// left out.
func (h *throttleHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	k := throttleKind{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "code" {
			k.code = a.Value.String()
			return false
		}
		return true
	})
	now := h.st.now()
	h.st.mu.Lock()
	c := h.st.kinds[k]
	if c == nil {
		c = &throttleCount{}
		h.st.kinds[k] = c
	} else if now.Sub(c.last) < h.st.every {
		c.suppressed++
		h.st.mu.Unlock()
		return nil
	}
	n := c.suppressed
	c.last, c.suppressed = now, 0
	h.st.mu.Unlock()
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", n))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a handler of next.WithAttrs(as) sharing h's kinds.
func (h *throttleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &throttleHandler{next: h.next.WithAttrs(as), st: h.st}
}

// WithGroup returns a handler of next.WithGroup(name) sharing h's kinds.
func (h *throttleHandler) WithGroup(name string) slog.Handler {
	return &throttleHandler{next: h.next.WithGroup(name), st: h.st}
}
