package scenario

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/window"
)

// Report is what a run admitted against what the oracle would have. Hits
// are counted in hits (a check of 3 hits admitted adds 3), answers in
// checks; latencies are in ms; times are Unix ms.
//
// Each check is counted in the row of its key and window id, the window
// as the deciding region's clock saw it: floor((t + offset)/W), where t
// is the check's send time (plus, for a check decided in another region,
// e.g. an exact-scope check entering a region that is not the home one,
// the scenario's one-way time RTT/2 to that region) and offset the
// deciding region's clock offset. Window ids are given relative to the
// window the run started in (so -1 is the window before, as a region
// whose clock is behind sees the first instants of the run).
//
// Over-admission O counts hits admitted beyond the limit:
//   - fixed_window and sliding_window: per row, O = max(0, admitted − L).
//     (A sliding window's estimate is at least its current window's count,
//     so one exact sliding limiter never admits more than L in a window.)
//   - token_bucket and leaky_bucket, rate ρ = L/W and capacity B: per
//     key over the run, O = max(0, ⌊max over admission times t1 ≤ t2 of
//     (admitted in [t1, t2] − (B + ρ·(t2 − t1)))⌋), computed exactly in
//     integers; t is the true time of the admission (send time plus any
//     transit), since each region's clock offset is a constant that does
//     not change the length of an interval. One bucket never admits more
//     than B + ρ·τ in any interval of length τ.
//
// Under-admission U counts hits that the target denied and the oracle
// allowed. Checks of one key with the same hits sent at the same instant
// are interchangeable (the oracle's order among them is arbitrary), so
// they are matched as a group: U = max(0, oracle-allowed − target-allowed
// − errors) checks of the group, times their hits, assigned to the
// group's regions in region order by how many each was denied of what
// the oracle allowed it. Checks answered with an error are neither
// admitted nor denied, and not counted in U.
type Report struct {
	// Scenario is the scenario's name.
	Scenario string `json:"scenario"`
	// Scope is the limit's scope: global, regional or exact.
	Scope string `json:"scope"`
	// Algorithm is the limit's algorithm.
	Algorithm string `json:"algorithm"`
	// Limit is the hits per window (the buckets' rate per window).
	Limit int64 `json:"limit"`
	// Burst is the buckets' capacity in hits (0: Limit).
	Burst int64 `json:"burst,omitempty"`
	// WindowMs is the limit's window, ms.
	WindowMs int64 `json:"window_ms"`
	// DurationMs is the run's planned length, ms.
	DurationMs int64 `json:"duration_ms"`
	// Start is the run's start, Unix ms; it lies in window 0.
	Start int64 `json:"start"`
	// CutsEnforced is false when the scenario's cuts were not applied.
	CutsEnforced bool `json:"cuts_enforced"`
	// RestartsEnforced is false when the scenario's restarts were not
	// applied.
	RestartsEnforced bool `json:"restarts_enforced"`
	// Restarts has one entry per restart applied, in the order applied.
	Restarts []RestartStats `json:"restarts,omitempty"`
	// Bound is the most over-admission the scope allows in one row (the
	// buckets: per key): 0 for global and exact; for regional, (R−1)×L per
	// window, and (R−1)×(B + L×duration/W) per key for the buckets.
	Bound int64 `json:"bound"`
	// BoundOK is true when no row (bucket: key) is over Bound.
	BoundOK bool `json:"bound_ok"`
	// Totals sums the run.
	Totals Totals `json:"totals"`
	// Regions has one entry per region, in the scenario's order.
	Regions []RegionStats `json:"regions"`
	// Keys has one entry per key that got checks, in key order.
	Keys []KeyStats `json:"keys"`
	// Windows has one row per key and window that got checks, by key and
	// window.
	Windows []WindowStats `json:"windows"`
}

// RestartStats is one restart of a run, times in ms from the run's start.
type RestartStats struct {
	// Region is the restarted node's region.
	Region string `json:"region"`
	// Node is the node's index in its region.
	Node int `json:"node"`
	// How is graceful or kill.
	How string `json:"how"`
	// DownMs is how long the node was to stay down, ms.
	DownMs float64 `json:"down_ms"`
	// AtMs is when the restart was planned, ms.
	AtMs float64 `json:"at_ms"`
	// BeganMs is when it began (later than AtMs when the restart before
	// it was still under way), ms.
	BeganMs float64 `json:"began_ms"`
	// BackMs is when the node served again and the others saw it, ms.
	BackMs float64 `json:"back_ms"`
}

// Totals sums a run.
type Totals struct {
	// Checks is the checks sent.
	Checks int64 `json:"checks"`
	// Admitted is the hits allowed (degraded answers included).
	Admitted int64 `json:"admitted"`
	// Denied is the hits answered not allowed.
	Denied int64 `json:"denied"`
	// OracleAdmitted is the hits the oracle allowed.
	OracleAdmitted int64 `json:"oracle_admitted"`
	// Over is the over-admission in hits, summed over rows (buckets: keys).
	Over int64 `json:"over"`
	// MaxOver is the largest over-admission of one row (buckets: key).
	MaxOver int64 `json:"max_over"`
	// MaxOverKey is the key of MaxOver; empty when MaxOver is 0.
	MaxOverKey string `json:"max_over_key,omitempty"`
	// MaxOverWindow is the window of MaxOver (relative, as
	// WindowStats.Window); -1 for the buckets, whose O is per key.
	MaxOverWindow int64 `json:"max_over_window"`
	// Under is the under-admission in hits.
	Under int64 `json:"under"`
	// Utilisation is Admitted / OracleAdmitted (1 when the oracle
	// admitted nothing).
	Utilisation float64 `json:"utilisation"`
	// Degraded is the checks answered degraded.
	Degraded int64 `json:"degraded"`
	// SliceExhausted is the checks denied because their region's slice
	// ran out.
	SliceExhausted int64 `json:"slice_exhausted"`
	// Errors is the checks that got no answer.
	Errors int64 `json:"errors"`
	// Misplaced counts admitted checks whose answer's reset time named a
	// window the check was not in flight during; they are placed by their
	// send time instead (a target that says so is wrong or lying).
	Misplaced int64 `json:"misplaced"`
	// CrossRegionMessages is the messages sent between regions; -1 when
	// the target does not count them.
	CrossRegionMessages int64 `json:"cross_region_messages"`
	// MessagesPerCheck is CrossRegionMessages / Checks; -1 when unknown.
	MessagesPerCheck float64 `json:"messages_per_check"`
	// P50Ms is the median latency of the answered checks of all
	// regions, ms.
	P50Ms float64 `json:"p50_ms"`
	// P99Ms is their 99th percentile latency, ms.
	P99Ms float64 `json:"p99_ms"`
	// MaxMs is their largest latency, ms.
	MaxMs float64 `json:"max_ms"`
	// MaxLagMs is how much later than planned the latest check was sent,
	// ms (a busy worker pool or a late timer).
	MaxLagMs float64 `json:"max_lag_ms"`
}

// RegionStats is one region's share of a run (checks entering it).
type RegionStats struct {
	// Region is the region's name.
	Region string `json:"region"`
	// ClockOffsetMs is the region's clock offset, ms.
	ClockOffsetMs float64 `json:"clock_offset_ms,omitempty"`
	// Checks is the checks that entered the region.
	Checks int64 `json:"checks"`
	// Admitted is the hits of those checks allowed.
	Admitted int64 `json:"admitted"`
	// Denied is the hits of those checks answered not allowed.
	Denied int64 `json:"denied"`
	// OracleAdmitted is the hits of those checks the oracle allowed.
	OracleAdmitted int64 `json:"oracle_admitted"`
	// Under is the under-admission assigned to the region, hits.
	Under int64 `json:"under"`
	// Degraded is the region's checks answered degraded.
	Degraded int64 `json:"degraded"`
	// SliceExhausted is the region's checks denied for want of slice.
	SliceExhausted int64 `json:"slice_exhausted"`
	// Errors is the region's checks that got no answer.
	Errors int64 `json:"errors"`
	// P50Ms is the median latency of the region's answered checks, ms.
	P50Ms float64 `json:"p50_ms"`
	// P99Ms is their 99th percentile latency, ms.
	P99Ms float64 `json:"p99_ms"`
	// MaxMs is their largest latency, ms.
	MaxMs float64 `json:"max_ms"`
}

// KeyStats is one key's share of a run.
type KeyStats struct {
	// Key is the key.
	Key string `json:"key"`
	// Checks is the checks on the key.
	Checks int64 `json:"checks"`
	// Admitted is the key's hits allowed.
	Admitted int64 `json:"admitted"`
	// OracleAdmitted is the key's hits the oracle allowed.
	OracleAdmitted int64 `json:"oracle_admitted"`
	// Under is the key's under-admission, hits.
	Under int64 `json:"under"`
	// Over is the key's over-admission: the sum of its rows' (windows),
	// or the interval formula over the run (buckets).
	Over int64 `json:"over"`
}

// WindowStats is one key's share of one window.
type WindowStats struct {
	// Key is the key.
	Key string `json:"key"`
	// Window is the window id relative to the run's first window.
	Window int64 `json:"window"`
	// Checks is the key's checks counted in the window.
	Checks int64 `json:"checks"`
	// Admitted is their hits allowed.
	Admitted int64 `json:"admitted"`
	// OracleAdmitted is their hits the oracle allowed.
	OracleAdmitted int64 `json:"oracle_admitted"`
	// Under is their under-admission, hits.
	Under int64 `json:"under"`
	// Over is max(0, Admitted − L) for the windows; 0 for the buckets
	// (see KeyStats.Over).
	Over int64 `json:"over"`
}

// ErrOverBound is wrapped by [Report.Verify]'s error.
var ErrOverBound = errors.New("scenario: over-admission above the scope's bound")

// NewReport compares r, a run of p, with the oracle. See [Report] for
// what it counts and how.
func NewReport(p *Plan, r *Results) *Report {
	spec := p.Limit
	names := p.RegionNames()
	rep := &Report{
		Scenario: p.Scenario.Name, Scope: spec.Scope.String(), Algorithm: spec.Algorithm.String(),
		Limit: spec.Limit, Burst: spec.Burst, WindowMs: spec.Window.Milliseconds(), DurationMs: p.Duration.Milliseconds(),
		Start: r.Start.UnixMilli(), CutsEnforced: r.CutsEnforced, RestartsEnforced: r.RestartsEnforced,
	}
	for _, x := range r.Restarts {
		rep.Restarts = append(rep.Restarts, RestartStats{Region: x.Region, Node: x.Node, How: cmp.Or(x.How, RestartGraceful),
			DownMs: ms(x.Down), AtMs: ms(x.At), BeganMs: ms(x.Began), BackMs: ms(x.Back)})
	}
	rep.Bound = bound(p)
	oracle := OracleDecisions(spec, r.Start, r.Checks)
	w := int64(spec.Window)
	first := floorDiv(r.Start.UnixNano(), w)
	regionIdx := map[string]int{}
	rep.Regions = make([]RegionStats, len(names))
	for i, n := range names {
		regionIdx[n] = i
		rep.Regions[i] = RegionStats{Region: n, ClockOffsetMs: ms(p.ClockOffset(n))}
	}

	// Each check's row and true decision time.
	type info struct {
		row  rowKey
		at   time.Duration // true time of the decision, from Start
		ok   bool          // admitted
		seen bool          // answered (no error)
	}
	infos := make([]info, len(r.Checks))
	rows := map[rowKey]*WindowStats{}
	keys := map[int]*KeyStats{}
	lat := make([][]time.Duration, len(names))
	var allLat []time.Duration
	t := &rep.Totals
	for i, res := range r.Checks {
		dec := decider(p, res)
		at := res.Sent
		if dec != res.Region {
			at += p.RTT(res.Region, dec) / 2
		}
		abs := r.Start.UnixNano() + int64(at) + int64(p.ClockOffset(dec))
		ok := res.Err == nil && res.Answer.Allowed
		if id, exact := decidedWindow(spec, res, ok); exact {
			// The window the decider counted it in, on its clock, if the
			// check was in flight during it (sent before the window's end,
			// answered after its start): a target cannot move an admission
			// to a window it was not in flight during by its reset time.
			from := r.Start.UnixNano() + int64(res.Sent) + int64(p.ClockOffset(dec))
			if id <= from+int64(res.Answer.Latency) && id+w > from {
				abs = id
			} else {
				t.Misplaced++
			}
		}
		k := rowKey{key: p.KeyIndex(res.Key), win: floorDiv(abs, w) - first}
		infos[i] = info{row: k, at: at, ok: ok, seen: res.Err == nil}
		row := rows[k]
		if row == nil {
			row = &WindowStats{Key: res.Key, Window: k.win}
			rows[k] = row
		}
		ks := keys[k.key]
		if ks == nil {
			ks = &KeyStats{Key: res.Key}
			keys[k.key] = ks
		}
		rs := &rep.Regions[regionIdx[res.Region]]
		row.Checks++
		ks.Checks++
		rs.Checks++
		t.Checks++
		if oracle[i] {
			row.OracleAdmitted += res.Hits
			ks.OracleAdmitted += res.Hits
			rs.OracleAdmitted += res.Hits
			t.OracleAdmitted += res.Hits
		}
		if lag := res.Sent - res.At; lag > 0 {
			t.MaxLagMs = max(t.MaxLagMs, ms(lag))
		}
		if res.Err != nil {
			rs.Errors++
			t.Errors++
			continue
		}
		lat[regionIdx[res.Region]] = append(lat[regionIdx[res.Region]], res.Answer.Latency)
		allLat = append(allLat, res.Answer.Latency)
		if res.Answer.Degraded {
			rs.Degraded++
			t.Degraded++
		}
		if res.Answer.SliceExhausted {
			rs.SliceExhausted++
			t.SliceExhausted++
		}
		if ok {
			row.Admitted += res.Hits
			ks.Admitted += res.Hits
			rs.Admitted += res.Hits
			t.Admitted += res.Hits
		} else {
			rs.Denied += res.Hits
			t.Denied += res.Hits
		}
	}

	// Under-admission, by groups of interchangeable checks.
	order := make([]int, len(r.Checks))
	for i := range order {
		order[i] = i
	}
	cmpGroup := func(a, b int) int {
		ra, rb := &r.Checks[a], &r.Checks[b]
		return cmp.Or(cmp.Compare(p.KeyIndex(ra.Key), p.KeyIndex(rb.Key)), cmp.Compare(ra.Hits, rb.Hits), cmp.Compare(ra.Sent, rb.Sent))
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmpGroup(a, b), cmp.Compare(regionIdx[r.Checks[a].Region], regionIdx[r.Checks[b].Region]),
			cmp.Compare(infos[a].row.win, infos[b].row.win))
	})
	type part struct {
		region  int
		row     rowKey
		deficit int64 // checks: oracle-allowed − admitted − errors, >= 0
	}
	for g := 0; g < len(order); {
		e := g + 1
		for e < len(order) && cmpGroup(order[g], order[e]) == 0 {
			e++
		}
		var need int64
		var parts []part
		for s := g; s < e; {
			u := s + 1
			for u < e && regionIdx[r.Checks[order[s]].Region] == regionIdx[r.Checks[order[u]].Region] && infos[order[s]].row == infos[order[u]].row {
				u++
			}
			var d int64 // oracle-allowed − admitted − errors
			for _, i := range order[s:u] {
				if oracle[i] {
					d++
				}
				if infos[i].ok || !infos[i].seen {
					d--
				}
			}
			need += d
			parts = append(parts, part{region: regionIdx[r.Checks[order[s]].Region], row: infos[order[s]].row, deficit: max(d, 0)})
			s = u
		}
		hits := r.Checks[order[g]].Hits
		for _, pt := range parts {
			if need <= 0 {
				break
			}
			u := min(pt.deficit, need)
			need -= u
			rows[pt.row].Under += u * hits
			keys[pt.row.key].Under += u * hits
			rep.Regions[pt.region].Under += u * hits
			t.Under += u * hits
		}
		g = e
	}

	// Over-admission.
	if spec.Bucket() {
		adm := map[int][]admission{}
		for i, res := range r.Checks {
			if infos[i].ok {
				k := infos[i].row.key
				adm[k] = append(adm[k], admission{at: infos[i].at, hits: res.Hits})
			}
		}
		for _, k := range slices.Sorted(maps.Keys(adm)) {
			o := bucketOver(adm[k], spec.Limit, spec.Window, spec.Capacity())
			keys[k].Over = o
			t.Over += o
			if o > t.MaxOver {
				t.MaxOver, t.MaxOverKey, t.MaxOverWindow = o, p.Keys[k], -1
			}
		}
	} else {
		for k, row := range rows {
			row.Over = max(0, row.Admitted-spec.Limit)
			keys[k.key].Over += row.Over
			t.Over += row.Over
		}
	}

	for _, k := range slices.Sorted(maps.Keys(keys)) {
		rep.Keys = append(rep.Keys, *keys[k])
	}
	rk := slices.SortedFunc(maps.Keys(rows), func(a, b rowKey) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.win, b.win)) })
	for _, k := range rk {
		row := rows[k]
		rep.Windows = append(rep.Windows, *row)
		if row.Over > t.MaxOver {
			t.MaxOver, t.MaxOverKey, t.MaxOverWindow = row.Over, row.Key, row.Window
		}
	}
	for i := range rep.Regions {
		rep.Regions[i].P50Ms, rep.Regions[i].P99Ms, rep.Regions[i].MaxMs = percentiles(lat[i])
	}
	t.P50Ms, t.P99Ms, t.MaxMs = percentiles(allLat)
	t.Utilisation = 1
	if t.OracleAdmitted > 0 {
		t.Utilisation = float64(t.Admitted) / float64(t.OracleAdmitted)
	}
	t.CrossRegionMessages, t.MessagesPerCheck = r.CrossRegionMessages, -1
	if r.CrossRegionMessages >= 0 && t.Checks > 0 {
		t.MessagesPerCheck = float64(r.CrossRegionMessages) / float64(t.Checks)
	}
	rep.BoundOK = t.MaxOver <= rep.Bound
	return rep
}

// rowKey is a key (its index in Plan.Keys) and a relative window id.
type rowKey struct {
	key int
	win int64
}

// admission is an admitted check's true time and hits.
type admission struct {
	at   time.Duration
	hits int64
}

// bucketOver returns ⌊max(0, max over admission times t1 ≤ t2 of
// (hits admitted in [t1, t2] − (capacity + limit/window × (t2 − t1))))⌋,
// exactly. With S(j) the hits of admissions 1..j in time order, the
// excess of [t_i, t_j] times window is (S(j)·W − L·t_j) − (S(i−1)·W −
// L·t_i) − B·W, so one pass keeps the least second term seen so far.
func bucketOver(as []admission, limit int64, w time.Duration, capacity int64) int64 {
	slices.SortStableFunc(as, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
	W, L := big.NewInt(int64(w)), big.NewInt(limit)
	var s, v, lo, best, tmp, tt big.Int // s: hits so far; lo: least S(i-1)·W − L·t_i
	best.SetInt64(0)
	for j, a := range as {
		tt.SetInt64(int64(a.at))
		// candidate for i = j: S(j−1)·W − L·t_j
		v.Mul(&s, W)
		tmp.Mul(L, &tt)
		v.Sub(&v, &tmp)
		if j == 0 || v.Cmp(&lo) < 0 {
			lo.Set(&v)
		}
		s.Add(&s, big.NewInt(a.hits))
		// S(j)·W − L·t_j − lo − B·W
		v.Mul(&s, W)
		v.Sub(&v, &tmp)
		v.Sub(&v, &lo)
		tmp.Mul(big.NewInt(capacity), W)
		v.Sub(&v, &tmp)
		if v.Cmp(&best) > 0 {
			best.Set(&v)
		}
	}
	best.Quo(&best, W) // best >= 0: truncation is the floor
	return best.Int64()
}

// decider returns the region whose clock decided res: the answer's region
// when the target names one of the plan's, else the home region for exact
// scope, else the region the check entered.
func decider(p *Plan, res Result) string {
	if a := res.Answer.Region; a != "" && res.Err == nil && p.Regions.Has(a) {
		return a
	}
	if p.Limit.Scope == region.Exact {
		return p.Home()
	}
	return res.Region
}

// bound returns the most over-admission p's scope allows per row (buckets:
// per key).
func bound(p *Plan) int64 {
	r := int64(len(p.RegionNames()))
	if p.Limit.Scope != region.Regional || r == 1 {
		return 0
	}
	if !p.Limit.Bucket() {
		return (r - 1) * p.Limit.Limit
	}
	wins := (int64(p.Duration) + int64(p.Limit.Window) - 1) / int64(p.Limit.Window)
	return (r - 1) * (p.Limit.Capacity() + p.Limit.Limit*wins)
}

// Verify returns nil when the report's over-admission is within the
// scope's bound, else an error wrapping ErrOverBound that says where.
func (r *Report) Verify() error {
	if r.BoundOK {
		return nil
	}
	where := fmt.Sprintf("key %s window %d", r.Totals.MaxOverKey, r.Totals.MaxOverWindow)
	if r.Totals.MaxOverWindow == -1 {
		where = "key " + r.Totals.MaxOverKey
	}
	return fmt.Errorf("%w: scenario %s, scope %s: %d hits over the limit in %s (bound %d; %d over in all)",
		ErrOverBound, r.Scenario, r.Scope, r.Totals.MaxOver, where, r.Bound, r.Totals.Over)
}

// WriteJSON writes the report as one JSON object and a newline.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// MaxTextRows is how many rows of keys and windows WriteText prints at
// most (those with over- or under-admission first); the JSON has all.
const MaxTextRows = 40

// WriteText writes the report as text tables: the totals, one line per
// region, then rows of keys and windows.
func (r *Report) WriteText(w io.Writer) error {
	t := r.Totals
	var b strings.Builder
	lim := fmt.Sprintf("%s %d per %s", r.Algorithm, r.Limit, time.Duration(r.WindowMs)*time.Millisecond)
	if r.Burst > 0 {
		lim += fmt.Sprintf(" burst %d", r.Burst)
	}
	fmt.Fprintf(&b, "scenario %s: %d regions, %s, scope %s, %d keys, %s from %s\n", r.Scenario, len(r.Regions), lim, r.Scope,
		len(r.Keys), time.Duration(r.DurationMs)*time.Millisecond, time.UnixMilli(r.Start).UTC().Format(time.RFC3339Nano))
	if !r.CutsEnforced {
		b.WriteString("cuts NOT enforced: the target cannot cut regions off; the scenario's cuts were skipped\n")
	}
	if !r.RestartsEnforced {
		b.WriteString("restarts NOT enforced: the target cannot restart nodes; the scenario's restarts were skipped\n")
	}
	for _, x := range r.Restarts {
		fmt.Fprintf(&b, "restart %s node %d (%s, down %s): stopped at %.2f s, back at %.2f s\n", x.Region, x.Node, x.How,
			time.Duration(x.DownMs*float64(time.Millisecond)), x.BeganMs/1000, x.BackMs/1000)
	}
	verdict := "ok"
	if !r.BoundOK {
		verdict = fmt.Sprintf("VIOLATED (key %s window %d)", t.MaxOverKey, t.MaxOverWindow)
		if t.MaxOverWindow == -1 {
			verdict = fmt.Sprintf("VIOLATED (key %s)", t.MaxOverKey)
		}
	}
	fmt.Fprintf(&b, "over-admission %d hits (max %d, bound %d: %s)  under-admission %d hits\n", t.Over, t.MaxOver, r.Bound, verdict, t.Under)
	fmt.Fprintf(&b, "checks %d  admitted %d  denied %d  oracle admitted %d  utilisation %.3f\n", t.Checks, t.Admitted, t.Denied, t.OracleAdmitted, t.Utilisation)
	msgs := "n/a"
	if t.MessagesPerCheck >= 0 {
		msgs = fmt.Sprintf("%.3f (%d)", t.MessagesPerCheck, t.CrossRegionMessages)
	}
	fmt.Fprintf(&b, "degraded %d  slice_exhausted %d  errors %d  cross-region msgs/check %s  max send lag %.1f ms\n",
		t.Degraded, t.SliceExhausted, t.Errors, msgs, t.MaxLagMs)
	if t.Misplaced > 0 {
		fmt.Fprintf(&b, "misplaced %d admitted checks named a window they were not in flight during (placed by send time)\n", t.Misplaced)
	}
	fmt.Fprintf(&b, "latency p50 %.2f ms  p99 %.2f ms  max %.2f ms\n\n", t.P50Ms, t.P99Ms, t.MaxMs)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "region\tclock ms\tchecks\tadmitted\tdenied\toracle\tunder\tdegraded\tslice_exh\terrors\tp50 ms\tp99 ms\tmax ms")
	for _, s := range r.Regions {
		fmt.Fprintf(tw, "%s\t%+.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\n", s.Region, s.ClockOffsetMs, s.Checks, s.Admitted, s.Denied,
			s.OracleAdmitted, s.Under, s.Degraded, s.SliceExhausted, s.Errors, s.P50Ms, s.P99Ms, s.MaxMs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "key\twindow\tchecks\tadmitted\toracle\tover\tunder")
	rows := slices.Clone(r.Windows)
	if len(rows) > MaxTextRows { // the interesting rows first, then in order
		slices.SortStableFunc(rows, func(a, b WindowStats) int {
			return cmp.Compare(b.Over+b.Under, a.Over+a.Under)
		})
		rows = rows[:MaxTextRows]
		slices.SortStableFunc(rows, func(a, b WindowStats) int { return cmp.Compare(keyOrder(r, a), keyOrder(r, b)) })
	}
	for _, s := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", s.Key, s.Window, s.Checks, s.Admitted, s.OracleAdmitted, s.Over, s.Under)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Windows) > MaxTextRows {
		if _, err := fmt.Fprintf(w, "(%d of %d rows: those with over- or under-admission first; --json has all)\n", MaxTextRows, len(r.Windows)); err != nil {
			return err
		}
	}
	if r.Algorithm == "token_bucket" || r.Algorithm == "leaky_bucket" {
		for _, k := range r.Keys {
			if k.Over > 0 {
				if _, err := fmt.Fprintf(w, "key %s: over-admission %d over the run (bucket: capacity plus rate × interval)\n", k.Key, k.Over); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// keyOrder returns the position of row s in r.Windows (its key-and-window
// order).
func keyOrder(r *Report, s WindowStats) int {
	return slices.IndexFunc(r.Windows, func(o WindowStats) bool { return o.Key == s.Key && o.Window == s.Window })
}

// percentiles returns the p50, p99 and max of d in ms (0s when empty).
func percentiles(d []time.Duration) (p50, p99, mx float64) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	q := func(f float64) float64 { return ms(d[min(len(d)-1, int(f*float64(len(d))))]) }
	return q(0.5), q(0.99), ms(d[len(d)-1])
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// decidedWindow returns the start (Unix ns, the decider's clock) of the
// window an admitted check of a fixed or sliding window was counted in,
// read from its answer's reset time: after an admitted hit a fixed
// window's key is back at full capacity at the window's end (start + W),
// a sliding window's at the end of the next one (start + 2W); see package
// window. So a check sent just before a window's end and decided just
// after it is placed where the decider counted it, not where its send
// time falls. false for a denied check, a peek, another algorithm or an
// answer without a reset time: the send time (plus the decider's clock
// offset) places those.
func decidedWindow(spec Spec, res Result, ok bool) (int64, bool) {
	if !ok || res.Hits <= 0 || res.Answer.ResetTime <= 0 {
		return 0, false
	}
	reset := res.Answer.ResetTime * int64(time.Millisecond)
	switch spec.Algorithm {
	case window.FixedWindow:
		return reset - int64(spec.Window), true
	case window.SlidingWindow:
		return reset - 2*int64(spec.Window), true
	}
	return 0, false
}
