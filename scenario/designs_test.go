package scenario

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// runModel runs s with its scope set to scope against target (nil: a
// Model of the plan) inside a synctest bubble, and returns the report.
func runModel(t *testing.T, s *Scenario, scope string, target func(*Plan) Target, o Options) *Report {
	t.Helper()
	s2 := *s
	s2.Limit.Scope = scope
	p, err := NewPlan(&s2)
	if err != nil {
		t.Fatal(err)
	}
	var rep *Report
	synctest.Test(t, func(t *testing.T) {
		var tg Target = NewModel(p)
		if target != nil {
			tg = target(p)
			o.IgnoreCuts = true
		}
		res, err := Run(context.Background(), p, tg, o)
		if err != nil {
			t.Fatal(err)
		}
		rep = NewReport(p, res)
	})
	return rep
}

// overSlicer is a broken global target: every region gets ceil(L/R) + 1
// of the limit (a rounding bug), so the regions together over-admit.
type overSlicer struct {
	p      *Plan
	stores map[string]*window.Store
}

func newOverSlicer(p *Plan) Target {
	o := &overSlicer{p: p, stores: map[string]*window.Store{}}
	for _, r := range p.RegionNames() {
		o.stores[r] = window.NewStore(window.StoreConfig{})
	}
	return o
}

func (o *overSlicer) Check(_ context.Context, reg, key string, hits int64) (Answer, error) {
	n := int64(len(o.p.RegionNames()))
	c := o.p.Limit.Check(hits)
	c.Limit = (c.Limit+n-1)/n + 1
	d, err := o.stores[reg].Apply(key, c, time.Now().Add(o.p.ClockOffset(reg)))
	if err != nil {
		return Answer{}, err
	}
	return Answer{Allowed: d.Allowed, Region: reg, Scope: region.Global, Limit: o.p.Limit.Limit, Slice: c.Limit}, nil
}

// The done-when runs of issue 19 against the Model: global and exact
// never over-admit, regional stays within (R−1)×L and reaches it under
// the flood, and a broken slicer is caught.
func TestDoneWhenScenariosAgainstModels(t *testing.T) {
	p := DefaultParams()
	L := p.Limit
	R := int64(p.Regions)
	for _, s := range DoneWhen(p) {
		t.Run(s.Name, func(t *testing.T) {
			g := runModel(t, s, "global", nil, Options{})
			r := runModel(t, s, "regional", nil, Options{})
			x := runModel(t, s, "exact", nil, Options{Workers: 8192})
			b := runModel(t, s, "global", newOverSlicer, Options{})
			for _, rep := range []*Report{g, r, x, b} {
				tt := rep.Totals
				t.Logf("%-7s %-8s checks %5d admitted %4d oracle %4d O %4d (max %3d, bound %3d) U %4d degraded %4d slice_exhausted %5d errors %d msgs/check %.3f p99 %.0f ms lag %.1f ms",
					rep.Scenario, rep.Scope, tt.Checks, tt.Admitted, tt.OracleAdmitted, tt.Over, tt.MaxOver, rep.Bound, tt.Under,
					tt.Degraded, tt.SliceExhausted, tt.Errors, tt.MessagesPerCheck, tt.P99Ms, tt.MaxLagMs)
				if tt.Errors != 0 || tt.MaxLagMs != 0 {
					t.Errorf("%s: errors %d, lag %.1f ms", rep.Scope, tt.Errors, tt.MaxLagMs)
				}
			}
			if g.Totals.Over != 0 || g.Verify() != nil {
				t.Errorf("global over-admitted: %v", g.Verify())
			}
			if x.Totals.Over != 0 || x.Verify() != nil {
				t.Errorf("exact over-admitted: %v", x.Verify())
			}
			if r.Totals.MaxOver > (R-1)*L || r.Verify() != nil {
				t.Errorf("regional over the bound: %v", r.Verify())
			}
			if g.Totals.CrossRegionMessages != 0 || r.Totals.CrossRegionMessages != 0 {
				t.Errorf("global or regional sent cross-region messages")
			}
			if x.Totals.MessagesPerCheck <= 0 || x.Totals.P99Ms != float64(p.RTT.Milliseconds()) {
				t.Errorf("exact: %.3f msgs/check, p99 %.1f ms (want > 0 and the RTT)", x.Totals.MessagesPerCheck, x.Totals.P99Ms)
			}
			switch s.Name {
			case "flood":
				if r.Totals.MaxOver != (R-1)*L {
					t.Errorf("regional flood: max over %d, want (R-1)L = %d", r.Totals.MaxOver, (R-1)*L)
				}
				if g.Totals.Admitted != g.Totals.OracleAdmitted || g.Totals.Under != 0 {
					t.Errorf("global flood: admitted %d of the oracle's %d, U %d", g.Totals.Admitted, g.Totals.OracleAdmitted, g.Totals.Under)
				}
			case "skew":
				if g.Totals.Under == 0 {
					t.Error("global skew: no under-admission reported")
				}
			case "cut":
				if x.Totals.Degraded == 0 {
					t.Error("exact cut: no degraded answer")
				}
			}
			// The broken slicer (5 + 5 + 5 of 10) over-admits wherever the
			// regions' demand exceeds 10 in a window: surely in all but the
			// skew, whose two small regions mostly idle (it did there too,
			// with this seed, but that is the draw's luck).
			if s.Name != "skew" && (b.BoundOK || b.Verify() == nil || b.Totals.Over == 0) {
				t.Errorf("broken slicer not caught: O %d", b.Totals.Over)
			}
		})
	}
}
