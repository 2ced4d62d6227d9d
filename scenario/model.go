package scenario

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Model is a [Target] that models, in memory, a cluster of the plan's
// regions with one owner per key and region, for the plan's limit and
// scope (a region's owner decides on its region's clock: the real clock
// plus the region's offset):
//
//   - global (Design C's first step, static slices): each region enforces
//     its slice of the limit (Plan.Slice: region.Config.Share of the limit
//     and of the capacity) in a window.Store of its own; a check never
//     leaves its region. A region whose slice is 0 denies every check. A
//     denial is SliceExhausted when the slice is below the limit.
//   - regional: each region enforces the whole limit in its own store.
//   - exact: the home region's store decides every check. A check entering
//     another region travels RTT/2 there and RTT/2 back (it sleeps, on the
//     real clock: run it under testing/synctest), two cross-region
//     messages. While the check's region or the home region is cut off it
//     is answered degraded and denied at once (fail closed), counting
//     nothing.
//
// Cuts change nothing for global and regional (nothing crosses regions).
// Model is safe for concurrent use.
type Model struct {
	plan   *Plan
	stores map[string]*window.Store
	msgs   atomic.Int64
	mu     sync.Mutex
	cut    map[string]bool
}

// NewModel returns a Model of p's regions and limit (with p's scope).
func NewModel(p *Plan) *Model {
	m := &Model{plan: p, stores: map[string]*window.Store{}, cut: map[string]bool{}}
	for _, r := range p.RegionNames() {
		m.stores[r] = window.NewStore(window.StoreConfig{Clock: window.NewManualClock(time.Unix(0, 0))}) // never read: decisions pass their time
	}
	return m
}

// Check answers a check entering region (see [Model]). It returns ctx's
// error when ctx ends during an exact check's round trip (the check may
// then have been counted, as a real one would).
func (m *Model) Check(ctx context.Context, reg, key string, hits int64) (Answer, error) {
	spec := m.plan.Limit
	switch spec.Scope {
	case region.Exact:
		home := m.plan.Home()
		if reg == home {
			return m.decide(home, key, spec.Check(hits), 0), nil
		}
		m.mu.Lock()
		cut := m.cut[reg] || m.cut[home]
		m.mu.Unlock()
		if cut {
			return Answer{Degraded: true, Region: reg, Scope: region.Exact, Limit: spec.Limit}, nil
		}
		oneway := m.plan.RTT(reg, home) / 2
		m.msgs.Add(1)
		if err := sleep(ctx, oneway); err != nil {
			return Answer{}, err
		}
		a := m.decide(home, key, spec.Check(hits), 0)
		m.msgs.Add(1)
		if err := sleep(ctx, oneway); err != nil {
			return Answer{}, err
		}
		return a, nil
	case region.Regional:
		return m.decide(reg, key, spec.Check(hits), 0), nil
	}
	limit, capacity := m.plan.Slice(reg, key)
	if limit == 0 || capacity == 0 {
		return Answer{SliceExhausted: true, Region: reg, Scope: region.Global, Limit: spec.Limit}, nil
	}
	c := spec.Check(hits)
	c.Limit = limit
	if spec.Bucket() {
		c.Burst = capacity
	}
	a := m.decide(reg, key, c, limit)
	a.SliceExhausted = !a.Allowed && limit < spec.Limit
	return a, nil
}

// decide applies c to key in region's store on region's clock.
func (m *Model) decide(reg, key string, c window.Check, slice int64) Answer {
	now := time.Now().Add(m.plan.ClockOffset(reg))
	d, err := m.stores[reg].Apply(key, c, now)
	a := Answer{Region: reg, Scope: m.plan.Limit.Scope, Limit: m.plan.Limit.Limit, Slice: slice}
	if err != nil { // unreachable for a valid plan: window refuses only numbers out of range
		return a
	}
	a.Allowed, a.Remaining, a.ResetTime = d.Allowed, d.Remaining, d.ResetTime.UnixMilli()
	return a
}

// CrossRegionMessages returns the messages exact checks sent between
// regions: a request and an answer each.
func (m *Model) CrossRegionMessages() int64 { return m.msgs.Load() }

// Cut cuts region off (see [Model]). It never fails.
func (m *Model) Cut(region string) error {
	m.mu.Lock()
	m.cut[region] = true
	m.mu.Unlock()
	return nil
}

// Heal ends region's cut. It never fails.
func (m *Model) Heal(region string) error {
	m.mu.Lock()
	delete(m.cut, region)
	m.mu.Unlock()
	return nil
}

// sleep waits d or until ctx ends (then its error).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

var (
	_ Target         = (*Model)(nil)
	_ MessageCounter = (*Model)(nil)
	_ Cutter         = (*Model)(nil)
)
