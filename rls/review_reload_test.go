package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/rls"
)

// reviewVersion is a rule file of version v: keys a, b and c of limit
// 1000*v+v a minute, each with metadata {v: "v", "k<key>": v}, and a key
// only this version has ("only<v>").
func reviewVersion(v int) string {
	rpu := 1000*v + v
	s := "domain: r\ndescriptors:\n"
	for _, k := range []string{"a", "b", "c", fmt.Sprintf("only%d", v)} {
		s += fmt.Sprintf("  - key: %s\n    metadata: {v: \"%d\", k%s: %d}\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", k, v, k, v, rpu)
	}
	return s
}

// reviewBad are rule files a reload must refuse: the rules in force stay.
var reviewBad = []string{
	"domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    bogus: 1\n",
	"domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
	"domain: r\ndescriptors:\n  - key: a\n  - key: a\n",
	"domain: r\ndescriptors: [\n",
	"",
	"domain: r\ndescriptors:\n  - key: a\n    metadata: {t: !!timestamp 2001-12-14t21:59:43.10-05:00}\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
}

// Holds (pinned, run with -race): while the rule file is rewritten
// (atomically: a rename) with good versions and bad ones, and reloaded
// both by Watch and by Reload in a loop, many concurrent ShouldRateLimit
// calls never panic, never race, and each answer comes whole from one
// version: every limited status says that version's requests_per_unit,
// its dynamic metadata is that version's merged metadata, its headers
// that version's limit, and the key only the other version has is not
// limited. A bad version is always refused, so no answer comes from it.
func TestReviewReloadRace(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "r.yaml")
	write := func(body string) {
		tmp := filepath.Join(dir, ".r.yaml.tmp") // a dot file: not a rule file
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Error(err)
		}
	}
	write(reviewVersion(1))
	src, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(nil, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler),
		DynamicMetadata: true, Headers: &rls.HeaderNames{}})
	s.Follow(src)

	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan error, 1)
	go func() { watchDone <- src.Watch(ctx) }()
	defer func() {
		cancel()
		if err := <-watchDone; err != nil {
			t.Error(err)
		}
	}()

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		answered [3]atomic.Int64 // by version
		reloads  atomic.Int64
	)
	wg.Go(func() { // the writer: good and bad versions, reloaded at once
		for i := 0; !stop.Load(); i++ {
			switch i % 4 {
			case 0:
				write(reviewVersion(2))
			case 2:
				write(reviewVersion(1))
			default:
				write(reviewBad[i/2%len(reviewBad)])
			}
			err := src.Reload()
			if (i%4 == 1 || i%4 == 3) && err == nil {
				t.Errorf("bad version %q reloaded", reviewBad[i/2%len(reviewBad)])
			}
			reloads.Add(1)
			time.Sleep(100 * time.Microsecond)
		}
	})
	wg.Go(func() { // readers of the statistics and the dump
		for !stop.Load() {
			_ = s.RuleStats()
			_ = s.Stats()
			_ = s.Config().Dump()
			time.Sleep(100 * time.Microsecond)
		}
	})
	// Each worker's own keys, at most 1000 requests each: under every
	// version's limit; until 200 reloads were made.
	const workers, most = 8, 1000
	var (
		reqs  sync.WaitGroup
		total atomic.Int64
	)
	for w := range workers {
		reqs.Go(func() {
			x := fmt.Sprint(w)
			for i := 0; i < most && (i < 50 || reloads.Load() < 200); i++ {
				total.Add(1)
				ds := []*ratelimitv3.RateLimitDescriptor{desc("a", x), desc("only1", x), desc("b", x), desc("only2", x), desc("c", x)}
				resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "r", Descriptors: ds})
				if err != nil {
					t.Errorf("worker %d request %d: %v", w, i, err)
					return
				}
				if v, msg := reviewWhole(resp); msg != "" {
					t.Errorf("worker %d request %d: %s: %v", w, i, msg, resp)
					return
				} else {
					answered[v].Add(1)
				}
			}
		})
	}
	reqs.Wait()
	stop.Store(true)
	wg.Wait()
	t.Logf("answered by version 1: %d, version 2: %d; %d reloads", answered[1].Load(), answered[2].Load(), reloads.Load())
	if st := s.Stats(); st.Requests != total.Load() || st.OverLimit != 0 || st.ConfigLoadErrors == 0 || st.ConfigLoads < 2 {
		t.Errorf("stats %+v", st)
	}
}

// reviewWhole returns the version every part of resp comes from, or why
// resp mixes versions.
func reviewWhole(resp *rlsv3.RateLimitResponse) (int, string) {
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 5 {
		return 0, "not OK, or not 5 statuses"
	}
	rpu := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	v := int(rpu / 1000)
	if v != 1 && v != 2 || rpu != uint32(1000*v+v) {
		return 0, fmt.Sprintf("requests_per_unit %d of no version", rpu)
	}
	for i, k := range []string{"a", "only1", "b", "only2", "c"} {
		limited := resp.Statuses[i].GetCurrentLimit() != nil
		switch {
		case k == "only1" || k == "only2":
			if want := k == fmt.Sprintf("only%d", v); limited != want {
				return 0, fmt.Sprintf("%s limited %v in version %d", k, limited, v)
			}
			if limited && resp.Statuses[i].GetCurrentLimit().GetRequestsPerUnit() != rpu {
				return 0, "two versions' limits"
			}
		case !limited || resp.Statuses[i].GetCurrentLimit().GetRequestsPerUnit() != rpu:
			return 0, "two versions' limits"
		}
	}
	md := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()
	if md["v"].GetStringValue() != fmt.Sprint(v) || len(md) != 5 {
		return 0, fmt.Sprintf("metadata %v in version %d", md, v)
	}
	for _, k := range []string{"a", "b", "c", fmt.Sprintf("only%d", v)} {
		if md["k"+k].GetNumberValue() != float64(v) {
			return 0, fmt.Sprintf("metadata k%s %v in version %d", k, md["k"+k], v)
		}
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == rls.DefaultLimitHeader && h.Value != fmt.Sprint(rpu) {
			return 0, fmt.Sprintf("header %s: %s in version %d", h.Key, h.Value, v)
		}
	}
	return v, ""
}
