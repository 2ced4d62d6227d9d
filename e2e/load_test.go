//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// The accounting of rpc/handoff_test.go and rpc/replica_test.go: 50 keys
// of a fixed window of 100 (here per 366 days, the longest window, so no
// window boundary falls in a run; every owner's answer's reset_time is
// checked to be one), under the default on_owner_unavailable policy
// (local: a check whose owner cannot be reached is decided by the owner's
// stand-in holder, marked degraded, and what it admits counts toward the
// key). The ledgers count every allowed answer, degraded or not: that is
// what a client was admitted.
const (
	numKeys = 50
	limit   = 100
	window  = 8784 * time.Hour
	// pace is the stream's round period: 50 checks every 200 ms.
	pace = 200 * time.Millisecond
	// maxStreamRounds and maxStreamTime bound every stream whatever the
	// scenario does (about 10 minutes at the pace).
	maxStreamRounds = 3000
	maxStreamTime   = 10 * time.Minute
)

// answer is one check's outcome as the client saw it.
type answer struct {
	key, via, owner   string
	allowed, degraded bool
	remaining         int64
	resetTime         int64
	sent, at          time.Time
}

// ledger sends the scenario's checks and keeps every answer.
type ledger struct {
	t     *testing.T
	c     *cluster
	name  string
	keys  []string
	limit int64 // per key and window (limit unless a scenario sets another)

	mu          sync.Mutex
	sent        int
	answers     []answer
	bad         []string
	badReported int // of bad, already reported by tally
	// slowest answer, and how many took longer than twice the forward
	// timeout plus the margin (within answerBound: not bad).
	slowest time.Duration
	past2FT int
}

func newLedger(t *testing.T, c *cluster, name string) *ledger {
	l := &ledger{t: t, c: c, name: name, limit: limit}
	for i := range numKeys {
		l.keys = append(l.keys, fmt.Sprintf("user:%d", i))
	}
	return l
}

// request is the check for key: hits 1 (0 to peek), no
// on_owner_unavailable (the node's default, local, applies).
func (l *ledger) request(key string, hits int64) *sluicev1.CheckRequest {
	return &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{
		Name: l.name, Key: key, Hits: proto.Int64(hits), Limit: l.limit, WindowMs: window.Milliseconds()}}}
}

// round sends one hit on every key, entering by vias round-robin (offset
// by r), 10 at a time. An error or an answer with an error is bad (and
// admitted nothing); an answer later than answerBound is bad too, and is
// kept in the ledger all the same: what it allowed was admitted.
func (l *ledger) round(vias []string, r int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	for i, k := range l.keys {
		via := vias[(i+r)%len(vias)]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), answerBound+answerMargin)
			resp, err := l.c.nodes[via].rateLimit.Check(ctx, l.request(k, 1))
			cancel()
			at := time.Now()
			l.mu.Lock()
			defer l.mu.Unlock()
			l.sent++
			switch {
			case err != nil:
				l.bad = append(l.bad, fmt.Sprintf("%s via %s: %v", k, via, err))
			case resp.Decisions[0].Error != "":
				l.bad = append(l.bad, fmt.Sprintf("%s via %s: %s", k, via, resp.Decisions[0].Error))
			default:
				d := resp.Decisions[0]
				took := at.Sub(sent)
				l.slowest = max(l.slowest, took)
				if took > 2*forwardTimeout+answerMargin {
					l.past2FT++
				}
				if took > answerBound {
					l.bad = append(l.bad, fmt.Sprintf("%s via %s: answered after %s (owner %s allowed %v degraded %v)",
						k, via, took, d.Owner, d.Allowed, d.Degraded))
				}
				l.answers = append(l.answers, answer{key: k, via: via, owner: d.Owner, allowed: d.Allowed,
					degraded: d.Degraded, remaining: d.Remaining, resetTime: d.ResetTime, sent: sent, at: at})
			}
		})
	}
	wg.Wait()
}

// rounds sends n rounds back to back through vias.
func (l *ledger) rounds(n int, vias ...string) {
	for r := range n {
		l.round(vias, r)
	}
}

// stream is a steady stream of rounds, one per pace, through the nodes
// currently set as its vias; it ends on stop, after maxStreamRounds or
// after maxStreamTime, whichever comes first.
type stream struct {
	l       *ledger
	vias    atomic.Pointer[[]string]
	rounds  atomic.Int64
	stopped chan struct{}
	done    chan struct{}
	bounded atomic.Bool // ended by its bound, not by stop
}

func (l *ledger) stream(vias ...string) *stream {
	s := &stream{l: l, stopped: make(chan struct{}), done: make(chan struct{})}
	s.setVias(vias...)
	go func() {
		defer close(s.done)
		end := time.Now().Add(maxStreamTime)
		for r := 0; r < maxStreamRounds; r++ {
			start := time.Now()
			if start.After(end) {
				break
			}
			l.round(*s.vias.Load(), r)
			s.rounds.Add(1)
			select {
			case <-s.stopped:
				return
			case <-time.After(pace - time.Since(start)): // the stream's pace, not a wait for a state
			}
		}
		s.bounded.Store(true)
	}()
	return s
}

// setVias sets the nodes the next rounds enter by.
func (s *stream) setVias(vias ...string) { s.vias.Store(&vias) }

// waitRounds waits until the stream has sent n more rounds.
func (s *stream) waitRounds(t *testing.T, n int64) {
	t.Helper()
	want := s.rounds.Load() + n
	for s.rounds.Load() < want {
		select {
		case <-s.done:
			t.Fatalf("the stream ended (bound reached) before %d more rounds", n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends the stream after its current round and fails the test if it
// had already ended by its bound.
func (s *stream) stop(t *testing.T) {
	t.Helper()
	close(s.stopped)
	<-s.done
	if s.bounded.Load() {
		t.Fatalf("the stream ended by its bound (%d rounds or %s) before the scenario stopped it", maxStreamRounds, maxStreamTime)
	}
}

// saturatedSince reports whether every key has had a check sent after
// since that its owner denied (not degraded): every key is used up.
func (l *ledger) saturatedSince(since time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	denied := map[string]bool{}
	for _, a := range l.answers {
		if !a.allowed && !a.degraded && a.sent.After(since) {
			denied[a.key] = true
		}
	}
	return len(denied) == len(l.keys)
}

// saturateTimeout bounds the wait for every key to be used up once a ring
// has settled: at the stream's pace every key gets a check every round, so
// a key not denied by its owner for this long is stuck (its checks fail,
// or are answered degraded, or it keeps admitting).
const saturateTimeout = 2 * time.Minute

// waitSaturated waits (the stream going on) until every key has been
// denied by its owner after since, at most saturateTimeout. When that
// passes it fails the test, logs the keys that are not used up with their
// answers and errors since, and returns false.
func (l *ledger) waitSaturated(s *stream, since time.Time) bool {
	l.t.Helper()
	deadline := time.Now().Add(saturateTimeout)
	for !l.saturatedSince(since) {
		if time.Now().After(deadline) {
			l.reportUnsaturated(since)
			return false
		}
		s.waitRounds(l.t, 1)
	}
	return true
}

// reportUnsaturated fails the test naming the keys that no owner denied
// after since, and logs, for the first three, every answer and error since
// a little before since.
func (l *ledger) reportUnsaturated(since time.Time) {
	l.t.Helper()
	l.mu.Lock()
	denied := map[string]bool{}
	type sum struct{ allowed, denied, degAllowed, degDenied, errs int }
	sums := map[string]*sum{}
	for _, k := range l.keys {
		sums[k] = &sum{}
	}
	for _, a := range l.answers {
		if !a.sent.After(since) {
			continue
		}
		n := sums[a.key]
		switch {
		case a.degraded && a.allowed:
			n.degAllowed++
		case a.degraded:
			n.degDenied++
		case a.allowed:
			n.allowed++
		default:
			n.denied++
			denied[a.key] = true
		}
	}
	var errs []string
	for _, b := range l.bad {
		k, _, _ := strings.Cut(b, " via ")
		if n := sums[k]; n != nil && !denied[k] {
			n.errs++
			errs = append(errs, b)
		}
	}
	var stuck []string
	var b strings.Builder
	for _, k := range l.keys {
		if denied[k] {
			continue
		}
		stuck = append(stuck, k)
		n := sums[k]
		fmt.Fprintf(&b, "\n  %s: since then allowed %d, degraded allowed %d, degraded denied %d, errors (all time) %d",
			k, n.allowed, n.degAllowed, n.degDenied, n.errs)
	}
	l.mu.Unlock()
	l.t.Errorf("%d keys not used up (no owner's denial) within %s of %s: %v%s",
		len(stuck), saturateTimeout, since.UTC().Format("15:04:05.000"), stuck, b.String())
	for i, e := range errs {
		if i == 10 {
			l.t.Logf("(%d more errors of those keys left out)", len(errs)-10)
			break
		}
		l.t.Logf("  error: %s", e)
	}
	tl := l.counts()
	for i, k := range stuck {
		if i == 3 {
			break
		}
		tl.logKeySince(l.t, k, since.Add(-10*time.Second))
	}
}

// tally is the ledger's numbers. Every allowed answer counts as admitted,
// degraded or not.
type tally struct {
	limit                                  int
	sent, answered, admitted               int
	degraded, degradedAllowed              int
	allowed, degradedFor, degradedAllowFor map[string]int
	byKey                                  map[string][]answer // in the order answered
	slowest                                time.Duration
	past2FT                                int
	resets                                 map[int64]bool // owners' answers' window ends
}

// tally fails the test on bad answers (each reported once) or on owners'
// answers from two windows, and counts the rest.
func (l *ledger) tally() tally {
	l.t.Helper()
	l.mu.Lock()
	if len(l.bad) > l.badReported {
		l.t.Errorf("%d of %d checks not answered right, e.g. %s", len(l.bad)-l.badReported, l.sent, l.bad[l.badReported])
		for _, b := range l.bad[l.badReported+1 : min(len(l.bad), l.badReported+10)] {
			l.t.Logf("  also: %s", b)
		}
		l.badReported = len(l.bad)
	}
	l.mu.Unlock()
	tl := l.counts()
	if len(tl.resets) != 1 {
		l.t.Errorf("owners' answers name %d window ends, want one (a window boundary fell in the run?)", len(tl.resets))
	}
	return tl
}

// counts counts the ledger's answers.
func (l *ledger) counts() tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	tl := tally{limit: int(l.limit), sent: l.sent, answered: len(l.answers), slowest: l.slowest, past2FT: l.past2FT, allowed: map[string]int{},
		degradedFor: map[string]int{}, degradedAllowFor: map[string]int{}, byKey: map[string][]answer{}}
	tl.resets = map[int64]bool{}
	for _, a := range l.answers {
		tl.byKey[a.key] = append(tl.byKey[a.key], a)
		if !a.degraded {
			tl.resets[a.resetTime] = true
		}
		if a.degraded {
			tl.degraded++
			tl.degradedFor[a.key]++
		}
		if a.allowed {
			tl.allowed[a.key]++
			tl.admitted++
			if a.degraded {
				tl.degradedAllowed++
				tl.degradedAllowFor[a.key]++
			}
		}
	}
	return tl
}

// log logs the scenario's numbers for the note.
func (tl tally) log(t *testing.T, scenario string, took time.Duration) {
	t.Helper()
	lo, hi, exact := tl.limit*10, 0, 0
	for _, n := range tl.allowed {
		lo, hi = min(lo, n), max(hi, n)
		if n == tl.limit {
			exact++
		}
	}
	t.Logf("%s: %d checks sent, %d answered (%d degraded, %d of them allowed; slowest %s, %d after %s), %d admitted (degraded included) on %d keys against a limit of %d each (%d): per key min %d max %d, %d keys exactly %d; wall time %s",
		scenario, tl.sent, tl.answered, tl.degraded, tl.degradedAllowed, tl.slowest.Round(time.Millisecond), tl.past2FT, 2*forwardTimeout+answerMargin,
		tl.admitted, len(tl.allowed), tl.limit, tl.limit*numKeys, lo, hi, exact, tl.limit, took.Round(time.Second))
}

// wantExact fails unless every key was admitted exactly the limit, its
// degraded allowed answers counted: the graceful changes' rule, and it
// reports whether it held. The one slack is below the limit, never above:
// an owner may have counted a check whose answer was lost (it came after
// the entry node's forward timeout, or the connection broke on the way
// back); the entry node then answered that check degraded, from the
// owner's stand-in, which counts it too, so the key denies one hit early
// for each such check. A key may fall short of the limit by at most its
// degraded answers.
func (tl tally) wantExact(t *testing.T, when string) bool {
	t.Helper()
	ok := true
	if len(tl.allowed) != numKeys {
		t.Errorf("%s: %d keys admitted anything, want %d", when, len(tl.allowed), numKeys)
		ok = false
	}
	shown := 0
	for _, k := range slices.Sorted(maps.Keys(tl.allowed)) {
		n := tl.allowed[k]
		if n > tl.limit || n < tl.limit-tl.degradedFor[k] {
			t.Errorf("%s: key %s admitted %d (%d of them degraded), with %d degraded answers; want exactly %d (at least %d)",
				when, k, n, tl.degradedAllowFor[k], tl.degradedFor[k], tl.limit, tl.limit-tl.degradedFor[k])
			ok = false
			if shown < 3 {
				shown++
				tl.logKey(t, k)
			}
		}
	}
	return ok
}

// logKey logs every answer for key in the order they came: a remaining
// that goes up (or repeats) shows where a count was lost or doubled.
func (tl tally) logKey(t *testing.T, key string) {
	t.Helper()
	tl.logKeySince(t, key, time.Time{})
}

// logKeySince is logKey for the answers to checks sent after since.
func (tl tally) logKeySince(t *testing.T, key string, since time.Time) {
	t.Helper()
	var b strings.Builder
	for _, a := range tl.byKey[key] {
		if a.sent.Before(since) {
			continue
		}
		verdict := "denied"
		if a.allowed {
			verdict = "allowed"
		}
		if a.degraded {
			verdict = "degraded-" + verdict
		}
		fmt.Fprintf(&b, "\n  sent %s took %s via %s owner %s %s remaining %d",
			a.sent.UTC().Format("15:04:05.000"), a.at.Sub(a.sent).Round(time.Millisecond), a.via, a.owner, verdict, a.remaining)
	}
	t.Logf("answers for %s:%s", key, b.String())
}

// peekAll asks every node of names about every key without consuming
// (hits 0): each must answer from an owner, not degraded, and all nodes
// must name the same owner and the same remaining for a key (one owner
// counts it, whichever node is asked). It returns the owners by key.
func (l *ledger) peekAll(names ...string) map[string]string {
	l.t.Helper()
	owners := map[string]string{}
	for _, k := range l.keys {
		first := ""
		var want *sluicev1.Decision
		for _, name := range names {
			ctx, cancel := context.WithTimeout(context.Background(), 3*forwardTimeout)
			resp, err := l.c.nodes[name].rateLimit.Check(ctx, l.request(k, 0))
			cancel()
			if err != nil || resp.Decisions[0].Error != "" || resp.Decisions[0].Degraded {
				l.t.Errorf("peek %s via %s: %v %v", k, name, err, resp)
				continue
			}
			d := resp.Decisions[0]
			if want == nil {
				first, want = name, d
				owners[k] = d.Owner
			} else if d.Owner != want.Owner || d.Remaining != want.Remaining {
				l.t.Errorf("peek %s: via %s owner %s remaining %d, via %s owner %s remaining %d",
					k, name, d.Owner, d.Remaining, first, want.Owner, want.Remaining)
			}
		}
	}
	return owners
}

// cliPeek peeks key through node with sluice check --json (the CLI a user
// has) and returns its answer.
func (l *ledger) cliPeek(name, key string) cliDecision {
	l.t.Helper()
	out, err := cli("check", "--addr", l.c.nodes[name].grpcAddr(), "--name", l.name, "--key", key,
		"--limit", fmt.Sprint(l.limit), "--window", window.String(), "--hits", "0", "--json")
	if err != nil {
		l.t.Fatal(err)
	}
	var d cliDecision
	if err := json.Unmarshal(out, &d); err != nil {
		l.t.Fatalf("sluice check --json: %v: %s", err, out)
	}
	return d
}

// ownerOf returns the node that owns key, asking through via.
func (l *ledger) ownerOf(via, key string) string {
	l.t.Helper()
	d := l.cliPeek(via, key)
	if d.Owner == "" || d.Degraded {
		l.t.Fatalf("peek %s via %s: %+v", key, via, d)
	}
	return d.Owner
}

// others returns names without the ones in drop.
func others(names []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(drop, n) })
}
