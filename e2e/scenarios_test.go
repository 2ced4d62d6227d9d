//go:build e2e

package e2e

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// base are the nodes every scenario starts with.
var base = []string{"sluice1", "sluice2", "sluice3"}

// checkBench fails the test if the background sluice bench failed or had
// an error (a degraded answer is not one), logs its numbers, and reports
// whether it passed.
func checkBench(t *testing.T, what string, r benchResult) bool {
	t.Helper()
	if r.err != nil {
		t.Errorf("bench %s: %v", what, r.err)
		return false
	}
	ok := true
	if r.Errors != 0 || r.RPCs == 0 {
		t.Errorf("bench %s: %d RPCs, %d errors; want some and none", what, r.RPCs, r.Errors)
		ok = false
	}
	t.Logf("bench %s: %d RPCs, %d allowed, %d denied, %d errors", what, r.RPCs, r.Allowed, r.Denied, r.Errors)
	return ok
}

// Issue 9: docker kill (SIGKILL) of a key's owner amid a steady stream of
// checks. As TestKilledOwnerLosesAtMostOneReplicationInterval: 60 hits per
// key through the survivors, then a round every 200 ms through every
// survivor, the owner of user:0 killed at about 80 (in later runs of a
// repeat, each node that owns a key in turn). Under the default
// policy the dead owner's keys get degraded answers from its stand-in
// holder until the ring settles, and those count. Asserted per key, every
// allowed answer counted, degraded or not:
//   - a key of the dead owner admits beyond the limit at most what the dead
//     owner admitted in its last replication interval plus one send
//     (bounded by the forward timeout) before the kill: the answers it gave
//     as owner, allowed, for checks sent in the replicationInterval +
//     forwardTimeout before the kill;
//   - a survivor's key admits at most the limit;
//   - no key falls short of the limit by more than its degraded answers
//     (an owner counted a check whose answer was lost: its stand-in counted
//     it again);
//   - every check is answered within answerBound (three times the forward
//     timeout plus the client's margin: owner, stand-in holder, one retry
//     when the ring changed; those after twice are counted and logged);
//   - once the survivors agree, one owner and one count per key, and no
//     key admits anything more.
//
// The run is repeated SLUICE_E2E_KILL_RUNS times (default 1) for each
// cluster size of SLUICE_E2E_KILL_NODES (3 and/or 5, comma-separated;
// default 3, or 3,5 when SLUICE_E2E_KILL_RUNS is set), each on a fresh
// cluster, and a table of every run's figures is logged at the end.
func TestKilledOwnerUnderLoad(t *testing.T) {
	runs := envInt(t, "SLUICE_E2E_KILL_RUNS", 1)
	sizes := []int{3}
	if os.Getenv("SLUICE_E2E_KILL_RUNS") != "" {
		sizes = []int{3, 5}
	}
	if v := os.Getenv("SLUICE_E2E_KILL_NODES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || (n != 3 && n != 5) {
				t.Fatalf("SLUICE_E2E_KILL_NODES=%q: want 3 and/or 5, comma-separated", v)
			}
			sizes = append(sizes, n)
		}
	}
	var figs []*crashFigures
	for _, size := range sizes {
		for run := 1; run <= runs; run++ {
			f := &crashFigures{nodes: size, run: run}
			figs = append(figs, f)
			t.Run(fmt.Sprintf("nodes=%d/run=%02d", size, run), func(t *testing.T) {
				defer func() { f.failed = t.Failed() }() // also after a t.Fatal
				crashScenario(t, "kill", f)
			})
		}
	}
	logCrashTable(t, figs)
}

// Issue 9: docker network disconnect of a key's owner (a partition) amid
// the same stream, and reconnect once the majority has taken its keys
// over and used them up. The partition lasts partitionFor (35 s), longer
// than memberlist gossips to members it declared dead (30 s on a LAN):
// after that only sluice's reconnect loop (cluster/reconnect.go) brings
// the sides together, so the heal tests it.
//
// What the README promises for a partition, and so what is asserted: each
// side takes over the other's keys and may admit up to the limit for a key
// (so no key admits more than twice the limit in all, its degraded allowed
// answers counted); every check is answered within answerBound; once
// reconnected, every node agrees on the ring of all three
// within ringTimeout (the time is logged), names one owner and one count
// for every key, and counts add, so no key admits anything more. The
// victim is cut off from the test's clients too (its published ports go
// with the network), so only the majority admits during the partition: the
// kill's figures (over-admission against what the victim admitted in its
// last replication interval) are logged for comparison, not asserted.
func TestPartitionedOwnerHeals(t *testing.T) {
	f := &crashFigures{nodes: 3, run: 1}
	defer func() {
		f.failed = t.Failed()
		logCrashTable(t, []*crashFigures{f})
	}()
	crashScenario(t, "partition", f)
}

// crashFigures are one kill or partition run's numbers.
type crashFigures struct {
	nodes, run int
	victim     string
	victimKeys int
	// worst and total: admitted beyond the limit on the victim's keys
	// (worst per key, total over them); overBound: keys beyond their bound.
	worst, total, overBound int
	// short: keys admitted less than the limit (each by at most its
	// degraded answers, or it is a failure).
	short int
	// degraded answers, and those that allowed, over all keys and over the
	// victim's keys.
	degraded, degradedAllowed        int
	victimDegraded, victimDegAllowed int
	// lastSum and lastMax: what the victim admitted as owner for checks sent
	// in its last replicationInterval+forwardTimeout before the cut, over
	// its keys and worst per key: the bound.
	lastSum, lastMax int
	settle           time.Duration // until the survivors agreed without the victim
	heal             time.Duration // partition: until all agreed after the reconnect
	late             int           // answers after answerBound (bad)
	past2FT          int           // answers after twice the forward timeout (+ margin)
	slowest          time.Duration // the slowest answer
	errors           int           // checks answered with an error or not at all
	wall             time.Duration
	failed           bool
}

// logCrashTable logs one line per run of figs, for the note.
func logCrashTable(t *testing.T, figs []*crashFigures) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-5s %-3s %-7s %-5s %-5s %-5s %-7s %-5s %-5s %-8s %-5s %-8s %-7s %-7s %-7s %-4s %-4s %-4s %-9s %-6s %s",
		"nodes", "run", "victim", "vkeys", "worst", "total", "overBnd", "short", "degr", "degrAllw", "vDegr", "vDegAllw",
		"lastSum", "lastMax", "slowest", ">2FT", "late", "errs", "settle", "wall", "result")
	for _, f := range figs {
		result := "ok"
		if f.failed {
			result = "FAIL"
		}
		settle := f.settle.Round(100 * time.Millisecond).String()
		if f.heal > 0 {
			settle += "/" + f.heal.Round(100*time.Millisecond).String()
		}
		fmt.Fprintf(&b, "\n%-5d %-3d %-7s %-5d %-5d %-5d %-7d %-5d %-5d %-8d %-5d %-8d %-7d %-7d %-7s %-4d %-4d %-4d %-9s %-6s %s",
			f.nodes, f.run, f.victim, f.victimKeys, f.worst, f.total, f.overBound, f.short, f.degraded, f.degradedAllowed,
			f.victimDegraded, f.victimDegAllowed, f.lastSum, f.lastMax, f.slowest.Round(10*time.Millisecond), f.past2FT, f.late, f.errors,
			settle, f.wall.Round(time.Second), result)
	}
	t.Logf("runs (worst/total: admitted beyond the limit on the victim's keys; lastSum/lastMax: what the victim admitted as owner in its last %s, the bound; degr/degrAllw: degraded answers and those allowed, all keys; vDegr/vDegAllw: the victim's keys; >2FT: answers after %s; late: after %s):%s",
		replicationInterval+forwardTimeout, 2*forwardTimeout+answerMargin, answerBound, b.String())
}

func crashScenario(t *testing.T, scenario string, f *crashFigures) {
	began := time.Now()
	defer func() { f.wall = time.Since(began) }()
	c := newCluster(t, fmt.Sprintf("%s%d", scenario, f.nodes))
	all := base
	if f.nodes == 5 {
		all = allNodes
		c.start("sluice4", "sluice5")
	}
	c.waitRing(all...)
	l := newLedger(t, c, "e2e-"+scenario)
	ownerBefore := l.peekAll(all...)
	// The victim: the owner of user:0 in run 1, and in later runs the
	// next node that owns a key (in the order of the keys' first owners),
	// so that repeated runs kill each node in turn.
	var keyOwners []string
	for _, k := range l.keys {
		if o := ownerBefore[k]; o != "" && !slices.Contains(keyOwners, o) {
			keyOwners = append(keyOwners, o)
		}
	}
	if len(keyOwners) == 0 {
		t.Fatal("no key has an owner")
	}
	if o := l.ownerOf("sluice1", l.keys[0]); o != keyOwners[0] {
		t.Fatalf("sluice check names %s the owner of %s, the peeks %s", o, l.keys[0], keyOwners[0])
	}
	victim := keyOwners[(f.run-1)%len(keyOwners)]
	if v := os.Getenv("SLUICE_E2E_KILL_VICTIM"); v != "" {
		if !slices.Contains(keyOwners, v) {
			t.Fatalf("SLUICE_E2E_KILL_VICTIM=%s owns no key (owners: %v)", v, keyOwners)
		}
		victim = v
	}
	f.victim = victim
	survivors := others(all, victim)
	for _, k := range l.keys {
		if ownerBefore[k] == victim {
			f.victimKeys++
		}
	}
	l.rounds(60, survivors...)
	benchDone := c.bench(30*time.Second, survivors...)
	s := l.stream(survivors...)
	s.waitRounds(t, 20)
	cutAt := time.Now()
	if scenario == "partition" {
		c.disconnect(victim)
	} else {
		c.kill(victim)
	}
	f.settle = c.waitRing(survivors...)
	t.Logf("%s: %s owned %d of %d keys; the %d survivors agreed on a ring without it %s after the %s",
		scenario, victim, f.victimKeys, numKeys, len(survivors), f.settle.Round(time.Millisecond), scenario)
	saturated := l.waitSaturated(s, time.Now())
	live := survivors
	if scenario == "partition" && saturated {
		// Outlast memberlist's gossip to the dead, so that the heal is
		// the reconnect loop's doing.
		if wait := partitionFor - time.Since(cutAt); wait > 0 {
			time.Sleep(wait)
		}
		lasted := time.Since(cutAt)
		c.reconnect(victim)
		heal, ok := c.tryWaitRing(base...)
		if !ok {
			t.Fatalf("after a partition of %s and the reconnect, the nodes did not agree on one ring within %s (split brain: %s alone, the others without it)",
				lasted.Round(time.Millisecond), ringTimeout, victim)
		}
		f.heal = heal
		t.Logf("partition of %s healed: all three agreed on one ring %s after the reconnect (bound %s)",
			lasted.Round(time.Millisecond), heal.Round(time.Millisecond), ringTimeout)
		live = base
		s.setVias(live...)
		saturated = l.waitSaturated(s, time.Now())
	}
	s.stop(t)
	checkBench(t, "through the survivors", benchDone())
	var moved []string
	for _, name := range live {
		m, err := c.metrics(name)
		if err != nil {
			t.Logf("metrics of %s: %v", name, err)
			continue
		}
		moved = append(moved, name+": "+formatSeries(accounting(nil, m)))
	}
	t.Logf("%s: the nodes' accounting counters: %s", scenario, strings.Join(moved, "; "))

	// One owner and one count per key, whichever node is asked (also with
	// the CLI), then more hits: nothing is admitted any more. (Not when a
	// key got stuck: the accounting below still runs on what came.)
	owners := map[string]string{}
	if saturated {
		owners = l.peekAll(live...)
		for _, name := range live {
			if d := l.cliPeek(name, l.keys[0]); d.Owner != owners[l.keys[0]] || d.Allowed || d.Degraded || d.Remaining != 0 {
				t.Errorf("sluice check --json via %s: %+v, want owner %s, used up", name, d, owners[l.keys[0]])
			}
		}
		admitted := l.tally().admitted
		l.rounds(10, live...)
		if n := l.tally().admitted; n != admitted {
			t.Errorf("after the %s settled, %d more hits admitted, want none", scenario, n-admitted)
		}
	}
	tl := l.tally()
	l.mu.Lock()
	f.errors = len(l.bad)
	for _, b := range l.bad {
		if strings.Contains(b, "answered after") {
			f.late++
			f.errors--
		}
	}
	f.slowest, f.past2FT = l.slowest, l.past2FT
	l.mu.Unlock()

	// The bound, per key, as in rpc/replica_test.go: what the victim
	// admitted as owner for checks sent from one replication interval
	// plus one send (bounded by the forward timeout) before the cut.
	since := cutAt.Add(-replicationInterval - forwardTimeout)
	nearCut := map[string]int{}
	l.mu.Lock()
	for _, a := range l.answers {
		if a.allowed && !a.degraded && a.owner == victim && !a.sent.Before(since) {
			nearCut[a.key]++
		}
		if !a.degraded && a.owner == victim && ownerBefore[a.key] != victim {
			t.Errorf("%s decided %s, which it did not own: %+v", victim, a.key, a)
		}
	}
	l.mu.Unlock()
	f.degraded, f.degradedAllowed = tl.degraded, tl.degradedAllowed
	var failing []string
	for _, k := range l.keys {
		n, over := tl.allowed[k], tl.allowed[k]-limit
		if n < limit {
			f.short++
		}
		if ownerBefore[k] == victim {
			f.worst, f.total = max(f.worst, over), f.total+max(over, 0)
			f.lastSum, f.lastMax = f.lastSum+nearCut[k], max(f.lastMax, nearCut[k])
			f.victimDegraded += tl.degradedFor[k]
			f.victimDegAllowed += tl.degradedAllowFor[k]
		}
		if scenario == "partition" {
			// Each side at most the limit: the README's promise.
			if n > 2*limit {
				t.Errorf("key %s (owner %s): %d admitted (%d of them degraded), more than the limit on each side of the partition (%d)",
					k, ownerBefore[k], n, tl.degradedAllowFor[k], 2*limit)
				failing = append(failing, k)
			}
			if ownerBefore[k] == victim && over > nearCut[k] {
				f.overBound++
				t.Logf("key %s (owner %s): %d admitted (%d of them degraded) beyond the crash bound %d + %d (not asserted for a partition)",
					k, victim, n, tl.degradedAllowFor[k], limit, nearCut[k])
			}
			continue
		}
		bound := 0
		if ownerBefore[k] == victim {
			bound = nearCut[k]
		}
		if over > bound {
			f.overBound++
			failing = append(failing, k)
			t.Errorf("key %s (owner %s): %d admitted (%d of them degraded, %d degraded answers); the bound: %d + %d (what %s admitted as owner in the %s before the %s)",
				k, ownerBefore[k], n, tl.degradedAllowFor[k], tl.degradedFor[k], limit, bound, victim, replicationInterval+forwardTimeout, scenario)
		}
		// An owner may have counted a check whose answer was lost; its
		// stand-in (the entry node answered it degraded) counted it
		// again: a key may fall short by at most its degraded answers.
		if n < limit-tl.degradedFor[k] {
			failing = append(failing, k)
			t.Errorf("key %s (owner %s): %d admitted with %d degraded answers, want at least %d",
				k, ownerBefore[k], n, tl.degradedFor[k], limit-tl.degradedFor[k])
		}
	}
	for i, k := range failing {
		if i == 3 {
			t.Logf("(%d more failing keys' answers left out)", len(failing)-3)
			break
		}
		t.Logf("key %s: owner before %s, after %s; the victim admitted %d as owner in its last %s",
			k, ownerBefore[k], owners[k], nearCut[k], replicationInterval+forwardTimeout)
		tl.logKey(t, k)
	}
	t.Logf("%s: over-admission on %s's %d keys: worst %d, total %d; it admitted %d (worst %d per key) as owner in its last %s (the bound per key); %d degraded answers (%d allowed), %d of them (%d allowed) on its keys",
		scenario, victim, f.victimKeys, f.worst, f.total, f.lastSum, f.lastMax, replicationInterval+forwardTimeout,
		f.degraded, f.degradedAllowed, f.victimDegraded, f.victimDegAllowed)
	tl.logDegraded(t, scenario, cutAt, map[string]time.Time{"the " + scenario: cutAt, "the survivors agreed": cutAt.Add(f.settle)})
	tl.log(t, fmt.Sprintf("%s (%d nodes)", scenario, f.nodes), time.Since(began))
}

// Issue 9: docker stop (SIGTERM: hand-off, leave) and docker start of each
// node in turn while the stream runs (20 hits per key first): exactly the
// limit per key in all, every allowed answer counted (degraded or not; a
// key may fall short by at most its degraded answers, see wantExact),
// every check answered within answerBound, and a sluice bench against the
// two other nodes without an error during each step.
func TestRollingRestartKeepsCounts(t *testing.T) {
	began := time.Now()
	c := newCluster(t, "rolling")
	c.waitRing(base...)
	l := newLedger(t, c, "e2e-rolling")
	l.rounds(20, base...)
	s := l.stream(base...)
	for _, name := range base {
		rest := others(base, name)
		s.setVias(rest...)
		s.waitRounds(t, 1) // no round in flight enters by name
		benchDone := c.bench(10*time.Second, rest...)
		stopAt := time.Now()
		c.stop(name)
		stopped := time.Since(stopAt)
		left := c.waitRing(rest...)
		startAt := time.Now()
		c.restart(name)
		c.waitRing(base...)
		s.setVias(base...)
		checkBench(t, "while "+name+" restarted", benchDone())
		t.Logf("rolling: %s stopped in %s, the others agreed without it %s later; back and agreed %s after its start",
			name, stopped.Round(time.Millisecond), left.Round(time.Millisecond), time.Since(startAt).Round(time.Millisecond))
	}
	saturated := l.waitSaturated(s, time.Now())
	s.stop(t)
	if saturated {
		l.peekAll(base...)
		l.rounds(20, base...)
	}
	tl := l.tally()
	tl.wantExact(t, "after a rolling restart")
	tl.log(t, "rolling restart", time.Since(began))
}

// churnLimit is the limit of the scale scenario's keys: high enough that
// every key is still counting when sluice4 and sluice5 leave (the counts
// at the joins and at the leave are logged), so both hand-offs move keys
// that are being counted.
const churnLimit = 200

// Issue 9: scale from 3 to 5 nodes (compose services sluice4 and sluice5,
// profile scale) and back to 3 (docker stop: graceful leave) while the
// stream runs, through all five while they are there: exactly the limit
// per key in all, every allowed answer counted (degraded or not; a key may
// fall short by at most its degraded answers, see wantExact), every check
// answered within answerBound, and a sluice bench against sluice1..3
// throughout each cycle without an error.
//
// The cycle 3 -> 5 -> 3 runs SLUICE_E2E_CHURN_CYCLES times (default 1) on
// one cluster, each cycle on keys of its own (a limit name per cycle), so
// each cycle's keys are judged alone; a table of every cycle's figures is
// logged at the end, and a cycle that fails logs its details: its answers
// by entry node and deciding node, the nodes' accounting counters that
// moved (re-forwards, degraded checks, hand-off errors; bench traffic
// included), and its failing keys' answers.
func TestScaleOutAndInKeepsCounts(t *testing.T) {
	began := time.Now()
	cycles := envInt(t, "SLUICE_E2E_CHURN_CYCLES", 1)
	c := newCluster(t, "scale")
	c.waitRing(base...)
	var figs []*churnFigures
	defer func() { logChurnTable(t, figs) }()
	for i := 1; i <= cycles; i++ {
		f := &churnFigures{cycle: i}
		figs = append(figs, f)
		churnCycle(t, c, f)
	}
	t.Logf("scale 3->5->3: %d cycles in %s", cycles, time.Since(began).Round(time.Second))
}

// churnFigures are one 3 -> 5 -> 3 cycle's numbers.
type churnFigures struct {
	cycle int
	// out: from compose up until all five agreed; in: from the first stop
	// until the three agreed.
	out, in time.Duration
	// the lowest and highest count of a key (allowed answers) when all
	// five agreed, and when the leave began.
	atOutLo, atOutHi, atInLo, atInHi int
	degraded, degradedAllowed        int
	exact, short, over               int // keys
	late, errors, past2FT            int
	slowest                          time.Duration
	reforwarded, notOwner, degradedN float64 // the nodes' counters (bench included)
	ok                               bool
}

// logChurnTable logs one line per cycle of figs, for the note.
func logChurnTable(t *testing.T, figs []*churnFigures) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-5s %-6s %-6s %-9s %-9s %-5s %-8s %-5s %-5s %-4s %-7s %-4s %-4s %-4s %-5s %-7s %-8s %s",
		"cycle", "out", "in", "atOut", "atIn", "degr", "degrAllw", "exact", "short", "over", "slowest", ">2FT", "late", "errs",
		"refwd", "notOwnr", "nodeDegr", "result")
	for _, f := range figs {
		result := "ok"
		if !f.ok {
			result = "FAIL"
		}
		fmt.Fprintf(&b, "\n%-5d %-6s %-6s %-9s %-9s %-5d %-8d %-5d %-5d %-4d %-7s %-4d %-4d %-4d %-5g %-7g %-8g %s",
			f.cycle, f.out.Round(100*time.Millisecond), f.in.Round(100*time.Millisecond),
			fmt.Sprintf("%d-%d", f.atOutLo, f.atOutHi), fmt.Sprintf("%d-%d", f.atInLo, f.atInHi),
			f.degraded, f.degradedAllowed, f.exact, f.short, f.over, f.slowest.Round(10*time.Millisecond), f.past2FT, f.late, f.errors,
			f.reforwarded, f.notOwner, f.degradedN, result)
	}
	t.Logf("cycles (limit %d per key; atOut/atIn: lowest-highest count of a key when the five agreed and when the leave began; degr/degrAllw: degraded answers and those allowed; refwd/notOwnr/nodeDegr: the nodes' reforwarded, not-owner-applied and degraded counters over the cycle, bench included; >2FT: answers after %s; late: after %s):%s",
		churnLimit, 2*forwardTimeout+answerMargin, answerBound, b.String())
}

// countRange returns the lowest and highest count of allowed answers of a
// key of l so far.
func (l *ledger) countRange() (lo, hi int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, a := range l.answers {
		if a.allowed {
			n[a.key]++
		}
	}
	lo = int(l.limit) * 10
	for _, k := range l.keys {
		lo, hi = min(lo, n[k]), max(hi, n[k])
	}
	return lo, hi
}

// byNode logs tl's answers by entry node and deciding node.
func (tl tally) byNode(t *testing.T, what string) {
	t.Helper()
	type route struct{ via, owner string }
	type counts struct{ allowed, denied, degAllowed, degDenied int }
	m := map[route]*counts{}
	for _, as := range tl.byKey {
		for _, a := range as {
			r := route{a.via, a.owner}
			if m[r] == nil {
				m[r] = &counts{}
			}
			switch {
			case a.degraded && a.allowed:
				m[r].degAllowed++
			case a.degraded:
				m[r].degDenied++
			case a.allowed:
				m[r].allowed++
			default:
				m[r].denied++
			}
		}
	}
	routes := slices.SortedFunc(maps.Keys(m), func(a, b route) int {
		return cmp.Or(cmp.Compare(a.via, b.via), cmp.Compare(a.owner, b.owner))
	})
	var b strings.Builder
	for _, r := range routes {
		n := m[r]
		fmt.Fprintf(&b, "\n  via %s decided by %s: allowed %d, denied %d, degraded allowed %d, degraded denied %d",
			r.via, r.owner, n.allowed, n.denied, n.degAllowed, n.degDenied)
	}
	t.Logf("%s: answers by entry node and deciding node:%s", what, b.String())
}

// logDegraded logs tl's degraded answers grouped by entry node and
// deciding node (the stand-in), with when their checks were sent relative
// to the events given (by name).
func (tl tally) logDegraded(t *testing.T, what string, ref time.Time, events map[string]time.Time) {
	t.Helper()
	if tl.degraded == 0 {
		return
	}
	type route struct{ via, owner string }
	type group struct {
		n, allowed  int
		first, last time.Time
	}
	m := map[route]*group{}
	for _, as := range tl.byKey {
		for _, a := range as {
			if !a.degraded {
				continue
			}
			r := route{a.via, a.owner}
			g := m[r]
			if g == nil {
				g = &group{first: a.sent, last: a.sent}
				m[r] = g
			}
			g.n++
			if a.allowed {
				g.allowed++
			}
			if a.sent.Before(g.first) {
				g.first = a.sent
			}
			if a.sent.After(g.last) {
				g.last = a.sent
			}
		}
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(events)) {
		fmt.Fprintf(&b, " %s at %s;", name, events[name].Sub(ref).Round(time.Millisecond))
	}
	for _, r := range slices.SortedFunc(maps.Keys(m), func(a, b route) int {
		return cmp.Or(cmp.Compare(a.via, b.via), cmp.Compare(a.owner, b.owner))
	}) {
		g := m[r]
		fmt.Fprintf(&b, "\n  via %s decided by %s: %d (%d allowed), sent from %s to %s",
			r.via, r.owner, g.n, g.allowed, g.first.Sub(ref).Round(time.Millisecond), g.last.Sub(ref).Round(time.Millisecond))
	}
	t.Logf("%s: %d degraded answers (%d allowed, counted); times from the start:%s", what, tl.degraded, tl.degradedAllowed, b.String())
}

// churnCycle runs one 3 -> 5 -> 3 cycle on c with keys of its own.
func churnCycle(t *testing.T, c *cluster, f *churnFigures) {
	what := fmt.Sprintf("cycle %d", f.cycle)
	five := append(append([]string(nil), base...), "sluice4", "sluice5")
	scrape := func(names ...string) map[string]map[string]float64 {
		ms := map[string]map[string]float64{}
		for _, name := range names {
			m, err := c.metrics(name)
			if err != nil {
				t.Logf("%s: metrics of %s: %v", what, name, err)
			}
			ms[name] = m
		}
		return ms
	}
	before := scrape(base...)
	l := newLedger(t, c, fmt.Sprintf("e2e-scale-c%02d", f.cycle))
	l.limit = churnLimit
	l.rounds(20, base...)
	benchDone := c.bench(40*time.Second, base...)
	s := l.stream(base...)
	s.waitRounds(t, 5)
	startAt := time.Now()
	c.start("sluice4", "sluice5")
	c.waitRing(five...)
	f.out = time.Since(startAt)
	f.atOutLo, f.atOutHi = l.countRange()
	s.setVias(five...)
	s.waitRounds(t, 20)
	s.setVias(base...)
	s.waitRounds(t, 1) // no round in flight enters by sluice4 or sluice5
	// sluice4 and sluice5 started in this cycle: their counters are the
	// cycle's (up to their leave).
	joined := scrape("sluice4", "sluice5")
	f.atInLo, f.atInHi = l.countRange()
	leaveAt := time.Now()
	c.stop("sluice4")
	c.stop("sluice5")
	c.waitRing(base...)
	f.in = time.Since(leaveAt)
	saturated := l.waitSaturated(s, time.Now())
	s.stop(t)
	benchOK := checkBench(t, what+": through sluice1..3", benchDone())
	if saturated {
		l.peekAll(base...)
		l.rounds(20, base...)
	}
	tl := l.tally()
	exact := tl.wantExact(t, what+": after 3 -> 5 -> 3 nodes")
	after := scrape(base...)

	moved := map[string]map[string]float64{}
	for _, name := range base {
		moved[name] = accounting(before[name], after[name])
	}
	for _, name := range []string{"sluice4", "sluice5"} {
		moved[name] = accounting(nil, joined[name])
	}
	for _, m := range moved {
		f.reforwarded += m["sluice_reforwarded_checks_total"]
		f.notOwner += m["sluice_not_owner_applied_total"]
		f.degradedN += m["sluice_degraded_checks_total"]
	}
	f.degraded, f.degradedAllowed = tl.degraded, tl.degradedAllowed
	for _, k := range l.keys {
		switch n := tl.allowed[k]; {
		case n == tl.limit:
			f.exact++
		case n < tl.limit:
			f.short++
		default:
			f.over++
		}
	}
	l.mu.Lock()
	for _, b := range l.bad {
		if strings.Contains(b, "answered after") {
			f.late++
		} else {
			f.errors++
		}
	}
	f.slowest, f.past2FT = l.slowest, l.past2FT
	l.mu.Unlock()
	f.ok = saturated && exact && benchOK && f.late == 0 && f.errors == 0
	t.Logf("%s: sluice4 and sluice5 joined and all five agreed %s after compose up (keys at %d..%d of %d); left, and the three agreed %s after the first stop (keys at %d..%d)",
		what, f.out.Round(time.Millisecond), f.atOutLo, f.atOutHi, tl.limit, f.in.Round(time.Millisecond), f.atInLo, f.atInHi)
	tl.logDegraded(t, what, startAt, map[string]time.Time{"compose up": startAt, "the leave": leaveAt})
	var counters []string
	for _, name := range five {
		counters = append(counters, name+": "+formatSeries(moved[name]))
	}
	t.Logf("%s: the nodes' accounting counters over the cycle (bench included; sluice4 and sluice5 up to their leave): %s",
		what, strings.Join(counters, "; "))
	if !f.ok {
		tl.byNode(t, what)
	}
	tl.log(t, what+": scale 3->5->3", time.Since(startAt))
	if !saturated {
		t.Fatalf("%s: keys stuck; the cycles end here", what)
	}
}
