package rpc

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/rls"
)

// Holds (pinned, run with -race): a node following an rls.Source
// answers POST /json while the rule file is rewritten with good and bad
// versions and reloaded, and /metrics is scraped (the per-rule series
// are read while requests count them): no panic, no race, every /json
// answer from one version (limit 1001 or 2002 on both its descriptors),
// and the load counters and per-rule series are exported.
func TestReviewRLSReloadUnderLoadOnANode(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "r.yaml")
	version := func(rpu int) string {
		return fmt.Sprintf("domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: %d}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu, rpu)
	}
	write := func(body string) {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Error(err)
		}
	}
	write(version(1001))
	src, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n := startNodeWith(t, "reload", windowClock(), NodeConfig{HTTPAddr: "127.0.0.1:0", RLSSource: src})
	base := "http://" + n.HTTPAddr()

	var (
		stop    atomic.Bool
		reloads atomic.Int64
		bg      sync.WaitGroup
	)
	bg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			switch i % 3 {
			case 0:
				write(version(2002))
			case 1:
				write("domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 7}\n    oops: 1\n")
			case 2:
				write(version(1001))
			}
			_ = src.Reload()
			reloads.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	})
	bg.Go(func() {
		for !stop.Load() {
			if code, body := httpDo(t, "GET", base+"/metrics", ""); code != 200 {
				t.Errorf("/metrics: %d %s", code, body)
				return
			}
		}
	})
	var reqs sync.WaitGroup
	for w := range 6 {
		reqs.Go(func() {
			for i := 0; i < 900 && (i < 30 || reloads.Load() < 100); i++ {
				body := fmt.Sprintf(`{"domain":"r","descriptors":[{"entries":[{"key":"a","value":"%d"}]},{"entries":[{"key":"b","value":"%d"}]}]}`, w, w)
				code, out := reviewPost(t, nil, base+"/json", "", body)
				if code != 200 {
					t.Errorf("/json: %d %s", code, out)
					return
				}
				var resp rlsv3.RateLimitResponse
				if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
					t.Errorf("%s: %v", out, err)
					return
				}
				a, b := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), resp.Statuses[1].GetCurrentLimit().GetRequestsPerUnit()
				if a != b || (a != 1001 && a != 2002) {
					t.Errorf("one answer, two versions (or a bad one): limits %d and %d", a, b)
					return
				}
			}
		})
	}
	reqs.Wait()
	stop.Store(true)
	bg.Wait()
	_, metrics := httpDo(t, "GET", base+"/metrics", "")
	for _, want := range []string{`sluice_rls_config_loads_total{result="refused"}`, `sluice_rls_config_loads_total{result="ok"}`,
		`sluice_rls_rule_total_hits_total{domain="r",rule="r.a"}`, `sluice_rls_rule_within_limit_hits_total{domain="r",rule="r.b"}`, `sluice_rls_domains 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	t.Logf("%d reloads", reloads.Load())
}
