package forward

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// tc is a trace context whose ids are made of b.
func tc(b byte) *sluicev1.TraceContext {
	tid, sid := make([]byte, 16), make([]byte, 8)
	for i := range tid {
		tid[i] = b
	}
	for i := range sid {
		sid[i] = b + 1
	}
	return &sluicev1.TraceContext{TraceId: tid, SpanId: sid, Flags: 1}
}

func checks(name string, n int) []*sluicev1.RateLimitCheck {
	var cs []*sluicev1.RateLimitCheck
	for i := range n {
		cs = append(cs, &sluicev1.RateLimitCheck{Key: fmt.Sprintf("%s%d", name, i)})
	}
	return cs
}

// A batch carries one trace-context run per request it gathered, in the
// order of their checks: a traced request's context with its number of
// checks, an untraced one's an empty run; a batch of untraced requests
// carries none, and a forward of its own carries its context alone.
func TestBatchCarriesEachRequestsTrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{delay: 2 * time.Hour}
		p := newFakePeer(f, Config{Sender: "test", Timeout: 5 * time.Hour, Batch: BatchConfig{MaxSize: 10, MaxWait: time.Hour}})
		defer p.batcher.close()
		ctx := context.Background()
		enq := func(tr *sluicev1.TraceContext, cs []*sluicev1.RateLimitCheck) *pending {
			q, err := p.batcher.enqueueTraced(ctx, time.Time{}, tr, cs...)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			return q
		}
		qs := []*pending{enq(tc(1), checks("first", 1))} // nothing in flight: it goes at once, alone
		qs = append(qs, enq(tc(10), checks("a", 2)), enq(nil, checks("b", 1)), enq(tc(30), checks("c", 1)))
		time.Sleep(time.Hour) // their wait is over: one batch
		synctest.Wait()
		qs = append(qs, enq(nil, checks("d", 1)), enq(nil, checks("e", 2)))
		time.Sleep(time.Hour)
		synctest.Wait()
		for _, q := range qs {
			if r := <-q.reply; r.err != nil {
				t.Fatal(r.err)
			}
		}
		if _, err := p.Forward(ctx, Request{Checks: checks("own", 3), NoBatching: true, Trace: tc(50)}); err != nil {
			t.Fatal(err)
		}
		run := func(b byte, n uint32) *sluicev1.TraceContext { r := tc(b); r.Checks = n; return r }
		want := [][]*sluicev1.TraceContext{
			{run(1, 1)},
			{run(10, 2), {Checks: 1}, run(30, 1)},
			nil,
			{run(50, 3)},
		}
		reqs := f.requests()
		if len(reqs) != len(want) {
			t.Fatalf("%d requests, want %d", len(reqs), len(want))
		}
		for i, req := range reqs {
			if len(req.Traces) != len(want[i]) {
				t.Fatalf("request %d carries %d runs, want %d: %v", i, len(req.Traces), len(want[i]), req.Traces)
			}
			for j, got := range req.Traces {
				if !proto.Equal(got, want[i][j]) {
					t.Errorf("request %d run %d: %v, want %v", i, j, got, want[i][j])
				}
			}
		}
	})
}
