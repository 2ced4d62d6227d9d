package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/region"
)

// Answer is a target's answer to one check.
type Answer struct {
	// Allowed is true when the hits were admitted (degraded answers
	// included: the report counts what users get).
	Allowed bool
	// Degraded is set when the answer was not the deciding owner's normal
	// one (an owner or region could not be reached).
	Degraded bool
	// SliceExhausted is set when the check was denied because its
	// region's slice of a global limit ran out.
	SliceExhausted bool
	// Region is the region whose owner decided; empty when the target does
	// not say (the report then takes the home region for exact scope and
	// the region the check entered otherwise).
	Region string
	// Scope is the scope that applied (region.Unspecified when the target
	// does not say).
	Scope region.Scope
	// Limit is the check's limit in hits, as the target echoes it.
	Limit int64
	// Slice is the deciding region's slice of Limit in hits (global
	// scope); 0 otherwise.
	Slice int64
	// Remaining is the hits still allowed after the check.
	Remaining int64
	// ResetTime is when the key is back at full capacity, Unix ms (the
	// decider's clock); 0 when unknown.
	ResetTime int64
	// Latency is how long the check took, measured by [Run] around
	// Target.Check (whatever the target set is replaced).
	Latency time.Duration
}

// Target is what [Run] drives: a limiter with regions. Check is called
// concurrently (up to Options.Workers calls per region at once) and must
// honour ctx, which carries the per-check timeout.
type Target interface {
	// Check sends hits hits of key into region and returns the answer. An
	// error means there was no answer (the report counts it under
	// errors, neither admitted nor denied).
	Check(ctx context.Context, region, key string, hits int64) (Answer, error)
}

// MessageCounter is implemented by a Target that counts the messages it
// sends between regions. [Run] reads it before and after the run.
type MessageCounter interface {
	// CrossRegionMessages returns the messages sent between regions so
	// far (each request and each answer counts one). Safe for concurrent
	// use.
	CrossRegionMessages() int64
}

// Cutter is implemented by a Target that can cut a region off from the
// others, for a scenario's cuts. [Run] calls Cut at a cut's From and Heal
// at its To (and Heal for any region still cut when the run ends early),
// from its scheduling goroutine: they should return quickly.
type Cutter interface {
	// Cut stops all traffic between region and the other regions.
	Cut(region string) error
	// Heal restores it.
	Heal(region string) error
}

// ErrCutsUnsupported is returned by [Run] for a plan with cuts and a
// target that is no [Cutter], unless Options.IgnoreCuts.
var ErrCutsUnsupported = errors.New("scenario: the target cannot cut regions off (it is no Cutter)")

// Restarter is implemented by a Target that can restart its nodes, for a
// scenario's restarts (deploys). [Run] calls Restart at each restart's At,
// from a goroutine of its own (the checks keep being sent meanwhile), one
// restart at a time in the order of At: a restart due while the one before
// has not returned yet starts when it returns.
type Restarter interface {
	// Restart stops node r.Node of region r.Region (gracefully, or as a
	// crash when r.Kill()), waits r.Down, starts it again under the same
	// name and returns once it serves again and the others see it. It
	// must honour ctx. Checks to the region while its node is down are
	// the target's to answer (another node of the region) or fail (an
	// error: the report counts them as errors, not admitted).
	Restart(ctx context.Context, r Restart) error
}

// ErrRestartsUnsupported is returned by [Run] for a plan with restarts and
// a target that is no [Restarter], unless Options.IgnoreRestarts.
var ErrRestartsUnsupported = errors.New("scenario: the target cannot restart nodes (it is no Restarter)")

// Options tune [Run]. The zero value is the defaults.
type Options struct {
	// Workers is the most checks in flight per region, 1..100000; 0 means
	// 64. A check waits for a free worker (its send time, not its planned
	// time, is what the report uses).
	Workers int
	// Timeout bounds each check; 0 means 5 s.
	Timeout time.Duration
	// Start is when the run starts (checks are sent at Start + At). Zero
	// means the next start of a window of the limit on this machine's
	// clock (epoch-aligned, as fixed windows are), so Run may first wait
	// up to a window.
	Start time.Time
	// IgnoreCuts runs a plan with cuts against a target that is no
	// Cutter, without the cuts (Results.CutsEnforced is then false).
	IgnoreCuts bool
	// IgnoreRestarts runs a plan with restarts against a target that is
	// no Restarter, without the restarts (Results.RestartsEnforced is then
	// false).
	IgnoreRestarts bool
}

// Result is one check of a run and its answer.
type Result struct {
	Check
	// Sent is when the check was sent, as an offset from Results.Start
	// (its planned At, plus any wait for a worker).
	Sent time.Duration
	// Answer is the target's answer (zero when Err is set, but for
	// Latency).
	Answer Answer
	// Err is set when the target gave no answer.
	Err error
}

// Results is what [Run] recorded.
type Results struct {
	// Start is the run's start: offsets are from it.
	Start time.Time
	// Checks holds one result per planned check, in plan order.
	Checks []Result
	// CutsEnforced is true when the plan's cuts were applied (or it has
	// none).
	CutsEnforced bool
	// RestartsEnforced is true when the plan's restarts were applied (or
	// it has none).
	RestartsEnforced bool
	// Restarts holds one entry per restart applied, in the order applied
	// (the plan's, by At); none when they were not.
	Restarts []RestartResult
	// CrossRegionMessages is the messages the target sent between regions
	// during the run; -1 when the target does not count them.
	CrossRegionMessages int64
}

// RestartResult is one restart of a run.
type RestartResult struct {
	Restart
	// Began is when Run called Restarter.Restart, an offset from
	// Results.Start (its At, or later when the restart before it was
	// still under way).
	Began time.Duration
	// Back is when Restart returned: the node served again (or Err).
	Back time.Duration
	// Err is Restart's error; nil when the node came back.
	Err error
}

// Run sends p's checks to t, each at Start + its At in real time, from a
// pool of Options.Workers goroutines per region, so that a slow answer
// holds up only its own region's queue and never the schedule of the
// others. It records every answer, then returns once every check has been
// answered or has timed out: the run lasts p.Duration (after the wait for
// the first window's start), plus what a region's backlog takes to drain
// when its answers are slower than its arrivals (each check waits at most
// Timeout for its answer, so that too is bounded), and until the last
// restart has returned. Cuts are applied at their times (see [Cutter]),
// restarts from their times on, in turn (see [Restarter]). Errors: a
// FieldError naming an Options field, ErrCutsUnsupported,
// ErrRestartsUnsupported, the first error of a cut, heal or restart, or
// ctx's error when ctx ends first (the cuts are healed before it
// returns).
func Run(ctx context.Context, p *Plan, t Target, o Options) (*Results, error) {
	switch {
	case o.Workers < 0 || o.Workers > 100_000:
		return nil, bad("Options.Workers", "must be in 0..100000, got %d", o.Workers)
	case o.Timeout < 0:
		return nil, bad("Options.Timeout", "must be >= 0, got %s", o.Timeout)
	}
	if o.Workers == 0 {
		o.Workers = 64
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	cutter, canCut := t.(Cutter)
	if len(p.Cuts) > 0 && !canCut {
		if !o.IgnoreCuts {
			return nil, fmt.Errorf("%w; scenario %q has %d cuts (run it with cuts ignored, or against a target that can cut)", ErrCutsUnsupported, p.Scenario.Name, len(p.Cuts))
		}
	}
	restarter, canRestart := t.(Restarter)
	if len(p.Restarts) > 0 && !canRestart && !o.IgnoreRestarts {
		return nil, fmt.Errorf("%w; scenario %q has %d restarts (run it with restarts ignored, or against a target that can restart nodes)", ErrRestartsUnsupported, p.Scenario.Name, len(p.Restarts))
	}
	res := &Results{Checks: make([]Result, len(p.Checks)), CutsEnforced: canCut || len(p.Cuts) == 0,
		RestartsEnforced: canRestart || len(p.Restarts) == 0, CrossRegionMessages: -1}
	mc, counts := t.(MessageCounter)
	start := o.Start
	if start.IsZero() {
		now := time.Now()
		w := int64(p.Limit.Window)
		ns := now.UnixNano()
		start = now.Add(time.Duration(floorDiv(ns+w-1, w)*w - ns)) // keeps the monotonic reading
	}
	res.Start = start

	// One queue per region, deep enough for all its checks: the schedule
	// never blocks on a busy region.
	names := p.RegionNames()
	queues := make(map[string]chan int, len(names))
	perRegion := map[string]int{}
	for _, c := range p.Checks {
		perRegion[c.Region]++
	}
	var wg sync.WaitGroup
	for _, r := range names {
		q := make(chan int, max(perRegion[r], 1))
		queues[r] = q
		for range min(o.Workers, perRegion[r]) {
			wg.Go(func() {
				for i := range q {
					c := p.Checks[i]
					cctx, cancel := context.WithTimeout(ctx, o.Timeout)
					sent := time.Now()
					a, err := t.Check(cctx, c.Region, c.Key, c.Hits)
					lat := time.Since(sent)
					cancel()
					if err != nil {
						a = Answer{}
					}
					a.Latency = lat
					res.Checks[i] = Result{Check: c, Sent: sent.Sub(start), Answer: a, Err: err}
				}
			})
		}
	}

	cut := map[string]bool{}
	var cutErr error
	healAll := func() {
		if !canCut {
			return
		}
		for _, r := range names {
			if cut[r] {
				if err := cutter.Heal(r); err != nil && cutErr == nil {
					cutErr = fmt.Errorf("scenario: heal %s: %w", r, err)
				}
				cut[r] = false
			}
		}
	}
	// The schedule: the cut and heal events and the checks, in time
	// order (a cut or heal before a check at the same instant).
	type event struct {
		at     time.Duration
		region string
		cut    bool
	}
	var events []event
	if canCut {
		for _, c := range p.Cuts {
			events = append(events, event{c.From, c.Region, true}, event{c.To, c.Region, false})
		}
		slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	wait := func(at time.Duration) bool {
		d := time.Until(start.Add(at))
		if d <= 0 {
			return ctx.Err() == nil
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	if counts {
		res.CrossRegionMessages = -mc.CrossRegionMessages()
	}
	// The restarts, in turn, on a goroutine of their own: a restart takes
	// seconds, and the checks keep their schedule meanwhile.
	var rwg sync.WaitGroup
	if canRestart && len(p.Restarts) > 0 {
		rwg.Go(func() {
			tm := time.NewTimer(time.Hour)
			defer tm.Stop()
			for _, r := range p.Restarts {
				if d := time.Until(start.Add(r.At)); d > 0 {
					tm.Reset(d)
					select {
					case <-ctx.Done():
						return
					case <-tm.C:
					}
				}
				if ctx.Err() != nil {
					return
				}
				rr := RestartResult{Restart: r, Began: time.Since(start)}
				rr.Err = restarter.Restart(ctx, r)
				rr.Back = time.Since(start)
				res.Restarts = append(res.Restarts, rr)
			}
		})
	}
	ei, stopped := 0, false
	for i := 0; i < len(p.Checks) && !stopped; i++ {
		c := p.Checks[i]
		for ; ei < len(events) && events[ei].at <= c.At && !stopped; ei++ {
			e := events[ei]
			if stopped = !wait(e.at); !stopped {
				applyCut(cutter, cut, e.region, e.cut, &cutErr)
			}
		}
		if stopped = stopped || !wait(c.At); !stopped {
			queues[c.Region] <- i
		}
	}
	for ; ei < len(events) && !stopped; ei++ {
		e := events[ei]
		if stopped = !wait(e.at); !stopped {
			applyCut(cutter, cut, e.region, e.cut, &cutErr)
		}
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	rwg.Wait()
	healAll()
	if counts {
		res.CrossRegionMessages += mc.CrossRegionMessages()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cutErr != nil {
		return nil, cutErr
	}
	for _, rr := range res.Restarts {
		if rr.Err != nil {
			return nil, fmt.Errorf("scenario: restart node %d of %s at %s: %w", rr.Node, rr.Region, rr.At, rr.Err)
		}
	}
	return res, nil
}

// applyCut cuts or heals region, recording it in cut and the first error
// in errp.
func applyCut(c Cutter, cut map[string]bool, region string, on bool, errp *error) {
	var err error
	if on {
		err = c.Cut(region)
	} else {
		err = c.Heal(region)
	}
	cut[region] = on
	if err != nil && *errp == nil {
		verb := "heal"
		if on {
			verb = "cut"
		}
		*errp = fmt.Errorf("scenario: %s %s: %w", verb, region, err)
	}
}
