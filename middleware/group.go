package middleware

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/client"
)

// GroupConfig configures a Group.
type GroupConfig struct {
	// Checker answers a request's checks in one call, e.g. a
	// *client.Client. (Required)
	Checker BatchChecker
	// Limits are the limits a request is checked against, in order, each
	// a Middleware: its name, numbers, key, exemptions, headers,
	// OnLimited and OnError apply; its own Checker is not used. With more
	// than one, none may set PassOverLimit (see Group). (Required,
	// 1..client.MaxChecks)
	Limits []*Middleware
}

// Group checks a request against several limits in one call of its
// Checker: every limit that does not exempt the request is keyed first
// (a key error answers by that limit's OnError and nothing is sent), then
// all the checks go together, and the nodes decide them all or nothing: a
// request that one limit denies counts against none (the others are
// answered Refunded, see client.CheckAll). The first limit, in order,
// that denies answers the request (its headers, Retry-After and
// OnLimited); otherwise the request goes on with the headers of the last
// limit. A call that fails (for a client failing closed, also a degraded
// answer) is answered by the OnError of the first limit checked.
// DecisionFrom returns the decision of the limit that answered, else of
// the last one.
//
// PassOverLimit is refused in a group of more than one: a limit passed
// over would still deny the nodes' request, and its request, let
// through, would count against none of the group's other limits. Give
// such a limit a Middleware of its own. A Group is safe for concurrent
// use.
type Group struct {
	checker     BatchChecker
	ms          []*Middleware
	failsClosed bool
}

// NewGroup validates cfg and returns a Group; the error names the field.
func NewGroup(cfg GroupConfig) (*Group, error) {
	switch {
	case cfg.Checker == nil:
		return nil, errors.New("middleware: GroupConfig.Checker: required")
	case len(cfg.Limits) == 0:
		return nil, errors.New("middleware: GroupConfig.Limits: at least one is required")
	case len(cfg.Limits) > client.MaxChecks:
		return nil, fmt.Errorf("middleware: GroupConfig.Limits: at most %d, got %d", client.MaxChecks, len(cfg.Limits))
	}
	for i, m := range cfg.Limits {
		switch {
		case m == nil:
			return nil, fmt.Errorf("middleware: GroupConfig.Limits[%d]: nil", i)
		case m.cfg.PassOverLimit && len(cfg.Limits) > 1:
			return nil, fmt.Errorf("middleware: GroupConfig.Limits[%d]: PassOverLimit in a group of %d: "+
				"the nodes count a request's checks all or nothing, so a request let through over limit %q would count against none of the others; give it a Middleware of its own",
				i, len(cfg.Limits), m.cfg.Name)
		}
	}
	return &Group{checker: cfg.Checker, ms: append([]*Middleware(nil), cfg.Limits...), failsClosed: failsClosed(cfg.Checker)}, nil
}

// Handler returns next limited by every limit of the group (see Group).
func (g *Group) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms := make([]*Middleware, 0, len(g.ms))
		checks := make([]client.Check, 0, len(g.ms))
		for _, m := range g.ms {
			if m.exempts(r) {
				continue
			}
			ch, err := m.check(r)
			if err != nil {
				m.cfg.OnError(w, r, err)
				return
			}
			ms, checks = append(ms, m), append(checks, ch)
		}
		if len(ms) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		ds, err := g.checker.CheckAll(r.Context(), checks)
		if err == nil && len(ds) != len(checks) {
			err = fmt.Errorf("middleware: %d decisions for %d checks", len(ds), len(checks))
		}
		for i := 0; err == nil && g.failsClosed && i < len(ds); i++ {
			if ds[i].Degraded {
				err = errDegradedClosed
			}
		}
		if err != nil {
			ms[0].cfg.OnError(w, r, err)
			return
		}
		for i, m := range ms {
			var ok bool
			if r, ok = m.apply(w, r, ds[i]); !ok {
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
