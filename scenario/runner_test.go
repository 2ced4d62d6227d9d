package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeTarget records when each check reached it and how many were in
// flight per region; delay(region) is how long an answer takes (on the
// bubble's clock).
type fakeTarget struct {
	delay func(region string) time.Duration

	mu       sync.Mutex
	start    time.Time
	at       map[int]time.Duration // by plan index, via key+region+seq
	inFlight map[string]int
	maxIn    map[string]int
	events   []string
}

func newFake(start time.Time, delay func(string) time.Duration) *fakeTarget {
	return &fakeTarget{delay: delay, start: start, inFlight: map[string]int{}, maxIn: map[string]int{}}
}

func (f *fakeTarget) Check(ctx context.Context, region, key string, hits int64) (Answer, error) {
	f.mu.Lock()
	f.inFlight[region]++
	f.maxIn[region] = max(f.maxIn[region], f.inFlight[region])
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight[region]--
		f.mu.Unlock()
	}()
	if d := f.delay(region); d > 0 {
		if err := sleep(ctx, d); err != nil {
			return Answer{}, err
		}
	}
	return Answer{Allowed: true}, nil
}

func (f *fakeTarget) Cut(region string) error  { return f.event("cut " + region) }
func (f *fakeTarget) Heal(region string) error { return f.event("heal " + region) }
func (f *fakeTarget) event(e string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, time.Since(f.start).String()+" "+e)
	return nil
}

// Each check is sent at its planned time exactly (the bubble's clock),
// from the start of the next window; the run ends by itself.
func TestRunSendsOnSchedule(t *testing.T) {
	p, err := NewPlan(Steady(DefaultParams()))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(300 * time.Millisecond) // mid-window: Run waits for the next start
		begin := time.Now()
		f := newFake(begin, func(string) time.Duration { return 0 })
		res, err := Run(t.Context(), p, f, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if want := begin.Add(700 * time.Millisecond); !res.Start.Equal(want) {
			t.Fatalf("started at %v, want %v (the next window)", res.Start, want)
		}
		if len(res.Checks) != len(p.Checks) || !res.CutsEnforced || res.CrossRegionMessages != -1 {
			t.Fatalf("%d results, cuts %v, msgs %d", len(res.Checks), res.CutsEnforced, res.CrossRegionMessages)
		}
		for i, r := range res.Checks {
			if r.Index != i || r.Sent != r.At || r.Err != nil || !r.Answer.Allowed || r.Answer.Latency != 0 {
				t.Fatalf("result %d: %+v", i, r)
			}
		}
		if el := time.Since(begin); el != 700*time.Millisecond+p.Checks[len(p.Checks)-1].At {
			t.Errorf("the run took %s", el)
		}
	})
}

// A slow region holds up only its own queue: the others' checks go out on
// time, and no region has more than Workers checks in flight.
func TestRunSlowRegionDelaysOnlyItself(t *testing.T) {
	p, err := NewPlan(Steady(DefaultParams()))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		f := newFake(time.Now(), func(r string) time.Duration {
			if r == "ap-south" {
				return 400 * time.Millisecond
			}
			return 30 * time.Millisecond
		})
		res, err := Run(t.Context(), p, f, Options{Workers: 4})
		if err != nil {
			t.Fatal(err)
		}
		var lateSlow time.Duration
		for _, r := range res.Checks {
			lag := r.Sent - r.At
			switch {
			case r.Region != "ap-south" && lag != 0:
				// 4 workers × 30 ms: a region at 50 checks/s rarely has
				// 4 in flight; allow a short wait, never the slow one's.
				if lag > 100*time.Millisecond {
					t.Errorf("%s check %d sent %s late", r.Region, r.Index, lag)
				}
			case r.Region == "ap-south":
				lateSlow = max(lateSlow, lag)
				if want := 400 * time.Millisecond; r.Answer.Latency != want {
					t.Fatalf("latency %s, want %s", r.Answer.Latency, want)
				}
			}
		}
		// ap-south: 50 checks/s, 4 workers of 400 ms each serve 10/s.
		if lateSlow < time.Second {
			t.Errorf("the slow region's latest check was only %s late", lateSlow)
		}
		for r, n := range f.maxIn {
			if n > 4 {
				t.Errorf("%s had %d checks in flight, more than 4 workers", r, n)
			}
		}
		if f.maxIn["ap-south"] != 4 {
			t.Errorf("ap-south in flight at most %d, want 4", f.maxIn["ap-south"])
		}
		rep := NewReport(p, res)
		if rep.Regions[2].P50Ms != 400 || rep.Regions[0].MaxMs != 30 || rep.Totals.MaxLagMs < 1000 {
			t.Errorf("report latency %+v lag %.0f", rep.Regions, rep.Totals.MaxLagMs)
		}
	})
}

// A check that gets no answer within Options.Timeout is an error; the run
// still ends, a Timeout after its last check at most.
func TestRunTimeout(t *testing.T) {
	s := hand("regional", "eu-west")
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		begin := time.Now()
		f := newFake(begin, func(string) time.Duration { return time.Hour })
		res, err := Run(t.Context(), p, f, Options{Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Checks {
			if !errors.Is(r.Err, context.DeadlineExceeded) || r.Answer.Latency != 2*time.Second {
				t.Fatalf("%+v", r)
			}
		}
		if el := time.Since(begin); el != 2*time.Second {
			t.Errorf("run took %s", el)
		}
		rep := NewReport(p, res)
		if rep.Totals.Errors != 12 || rep.Totals.Admitted != 0 || rep.Totals.Under != 0 || rep.Regions[1].Errors != 12 {
			t.Errorf("%+v", rep.Totals)
		}
	})
}

// Cuts are applied at their times, healed at theirs; a target that cannot
// cut is refused unless cuts are ignored, and the report says so.
func TestRunCuts(t *testing.T) {
	s := Partition(DefaultParams())
	s.Cuts = append(s.Cuts, Cut{Region: "eu-west", From: 2500 * time.Millisecond, To: 5 * time.Second})
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		f := newFake(time.Now(), func(string) time.Duration { return 0 })
		if _, err := Run(t.Context(), p, f, Options{}); err != nil {
			t.Fatal(err)
		}
		want := []string{"1s cut ap-south", "2.5s cut eu-west", "3s heal ap-south", "5s heal eu-west"}
		if strings.Join(f.events, ",") != strings.Join(want, ",") {
			t.Errorf("events %v, want %v", f.events, want)
		}

		var plain Target = plainTarget{}
		if _, err := Run(t.Context(), p, plain, Options{}); !errors.Is(err, ErrCutsUnsupported) || !strings.Contains(err.Error(), `"cut" has 2 cuts`) {
			t.Errorf("Run without a Cutter: %v", err)
		}
		res, err := Run(t.Context(), p, plain, Options{IgnoreCuts: true})
		if err != nil || res.CutsEnforced {
			t.Fatalf("IgnoreCuts: %v %v", err, res.CutsEnforced)
		}
		var b strings.Builder
		if err := NewReport(p, res).WriteText(&b); err != nil || !strings.Contains(b.String(), "cuts NOT enforced") {
			t.Errorf("text: %v\n%s", err, b.String())
		}
	})
}

// restarter is a fakeTarget that restarts: each restart takes took (on
// the bubble's clock) plus its down time, or fails with fail.
type restarter struct {
	*fakeTarget
	took time.Duration
	fail error
}

func (r *restarter) Restart(ctx context.Context, x Restart) error {
	_ = r.event(fmt.Sprintf("restart %s/%d %s", x.Region, x.Node, cmp.Or(x.How, RestartGraceful)))
	if err := sleep(ctx, r.took+x.Down); err != nil {
		return err
	}
	_ = r.event(fmt.Sprintf("back %s/%d", x.Region, x.Node))
	return r.fail
}

// Restarts are applied in turn from their times while the checks keep
// their schedule: one due while the one before is under way waits for it.
// A target that cannot restart is refused unless restarts are ignored; a
// failed restart fails the run, naming it.
func TestRunRestarts(t *testing.T) {
	s := Steady(DefaultParams())
	s.Restarts = []Restart{
		{Region: "eu-west", At: 2 * time.Second, How: RestartKill, Down: 500 * time.Millisecond},
		{Region: "us-east", At: time.Second, Down: time.Second},
	}
	p, err := NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		f := &restarter{fakeTarget: newFake(time.Now(), func(string) time.Duration { return 0 }), took: 500 * time.Millisecond}
		res, err := Run(t.Context(), p, f, Options{Start: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"1s restart us-east/0 graceful", "2.5s back us-east/0", "2.5s restart eu-west/0 kill", "3.5s back eu-west/0"}
		if strings.Join(f.events, ",") != strings.Join(want, ",") {
			t.Errorf("events %v, want %v", f.events, want)
		}
		if !res.RestartsEnforced || len(res.Restarts) != 2 || res.Restarts[1].Began != 2500*time.Millisecond || res.Restarts[1].Back != 3500*time.Millisecond {
			t.Fatalf("restarts %v %+v", res.RestartsEnforced, res.Restarts)
		}
		for i, r := range res.Checks {
			if r.Sent != r.At {
				t.Fatalf("check %d sent at %s, planned %s: a restart held the schedule up", i, r.Sent, r.At)
			}
		}
		var b strings.Builder
		if err := NewReport(p, res).WriteText(&b); err != nil || !strings.Contains(b.String(), "restart eu-west node 0 (kill, down 500ms): stopped at 2.50 s, back at 3.50 s") {
			t.Errorf("text: %v\n%s", err, b.String())
		}

		var plain Target = plainTarget{}
		if _, err := Run(t.Context(), p, plain, Options{}); !errors.Is(err, ErrRestartsUnsupported) || !strings.Contains(err.Error(), `"steady" has 2 restarts`) {
			t.Errorf("Run without a Restarter: %v", err)
		}
		res, err = Run(t.Context(), p, plain, Options{IgnoreRestarts: true})
		if err != nil || res.RestartsEnforced || len(res.Restarts) != 0 {
			t.Fatalf("IgnoreRestarts: %v %v", err, res.RestartsEnforced)
		}
		b.Reset()
		if err := NewReport(p, res).WriteText(&b); err != nil || !strings.Contains(b.String(), "restarts NOT enforced") {
			t.Errorf("text: %v\n%s", err, b.String())
		}

		f.fail = errors.New("did not converge")
		if _, err := Run(t.Context(), p, f, Options{}); err == nil || !strings.Contains(err.Error(), "restart node 0 of us-east at 1s: did not converge") {
			t.Errorf("a failed restart: %v", err)
		}
	})
}

// A cancelled run returns the context's error, having healed its cuts.
func TestRunCancelled(t *testing.T) {
	p, err := NewPlan(Partition(DefaultParams()))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		f := newFake(time.Now(), func(string) time.Duration { return 10 * time.Millisecond })
		if _, err := Run(ctx, p, f, Options{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v", err)
		}
		if want := "1s cut ap-south,2s heal ap-south"; strings.Join(f.events, ",") != want {
			t.Errorf("events %v, want %s", f.events, want)
		}
	})
}

// Options are checked, naming the field.
func TestRunOptions(t *testing.T) {
	p, _ := NewPlan(Steady(DefaultParams()))
	for _, o := range []Options{{Workers: -1}, {Workers: 100_001}, {Timeout: -time.Second}} {
		var fe *FieldError
		if _, err := Run(t.Context(), p, plainTarget{}, o); !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "Options.") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// plainTarget allows everything and is no Cutter.
type plainTarget struct{}

func (plainTarget) Check(context.Context, string, string, int64) (Answer, error) {
	return Answer{Allowed: true}, nil
}
