package scenario

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Oracle is one central limiter with the whole limit: what a single exact
// limiter fed every check, in global time order, would have allowed. It
// is a window.Store on a manual clock that Decide moves to each check's
// time. It is not safe for concurrent use; times must not go backwards
// (the store would then decide as its algorithms do for a clock going
// backwards, see package window).
type Oracle struct {
	spec  Spec
	clock *window.ManualClock
	store *window.Store
}

// NewOracle returns an Oracle for the limit spec (its numbers, not its
// scope: the oracle is one limiter whatever the scope).
func NewOracle(spec Spec) *Oracle {
	c := window.NewManualClock(time.Unix(0, 0))
	return &Oracle{spec: spec, clock: c, store: window.NewStore(window.StoreConfig{Clock: c})}
}

// Decide applies hits hits of key at time at and reports whether the
// central limiter allows them (and counts them). Hits above the limit's
// capacity, or a spec that window refuses, are never allowed.
func (o *Oracle) Decide(key string, hits int64, at time.Time) bool {
	o.clock.Set(at)
	d, err := o.store.Apply(key, o.spec.Check(hits), o.clock.Now())
	return err == nil && d.Allowed
}

// OracleDecisions feeds the checks of rs to a fresh Oracle for spec in
// global time order (start + Sent; ties in plan order, by Index) and
// returns, indexed like rs, whether the oracle allowed each. Every check
// is fed, also those the target answered with an error: they were sent.
func OracleDecisions(spec Spec, start time.Time, rs []Result) []bool {
	order := make([]int, len(rs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(rs[a].Sent, rs[b].Sent), cmp.Compare(rs[a].Index, rs[b].Index))
	})
	o := NewOracle(spec)
	out := make([]bool, len(rs))
	for _, i := range order {
		out[i] = o.Decide(rs[i].Key, rs[i].Hits, start.Add(rs[i].Sent))
	}
	return out
}
