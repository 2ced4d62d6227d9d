package rpc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// startNodeCfg starts a node from cfg (name, clock and join taken from
// it) with the test defaults of startNodeWith.
func startNodeCfg(t *testing.T, cfg NodeConfig) *testNode {
	t.Helper()
	return startNodeWith(t, cfg.Name, cfg.Clock, cfg, cfg.Join...)
}

const testLimits = `
limits:
  api:
    limit: 3
    window: 1m
    overrides:
      - key_prefix: "vip:"
        limit: 5
  signup:
    limit: 2
    window: 1h
    shadow: true
`

func mustParseLimits(t *testing.T, yaml string) *limits.Source {
	t.Helper()
	set, err := limits.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return limits.Static(set)
}

// named is a check that carries no numbers.
func named(name, key string) *sluicev1.RateLimitCheck {
	return &sluicev1.RateLimitCheck{Name: name, Key: key}
}

// Checks without numbers take the configured limit's (overrides by key
// prefix included), wherever the key's owner is: the node the client
// called resolves them and forwards the numbers, so the owners need no
// configuration. Shadow limits answer allowed and say so.
func TestNamedLimitsAcrossTheCluster(t *testing.T) {
	clock := windowClock()
	nodes := startInproc(t, NodeConfig{Name: "node1", Clock: clock, Limits: mustParseLimits(t, testLimits)},
		NodeConfig{Name: "node2", Clock: clock}, NodeConfig{Name: "node3", Clock: clock})
	entry := nodes[0]

	for _, tc := range []struct {
		prefix  string
		allowed int
	}{{"user:", 3}, {"vip:", 5}} {
		for _, owner := range []string{"node1", "node2", "node3"} {
			key := ""
			for i := 0; key == ""; i++ {
				if k := fmt.Sprint(tc.prefix, i); entry.Server().Owner("api", k) == owner {
					key = k
				}
			}
			allowed := 0
			for i := 0; i < tc.allowed+3; i++ {
				d := check(t, entry.client, named("api", key))
				if d.Limit != int64(tc.allowed) {
					t.Fatalf("%s (owner %s): limit %d, want %d", key, owner, d.Limit, tc.allowed)
				}
				if d.Allowed {
					allowed++
				}
			}
			if allowed != tc.allowed {
				t.Errorf("%s (owner %s): %d allowed, want %d", key, owner, allowed, tc.allowed)
			}
		}
	}

	// Inline numbers are the check's own, even under a configured name.
	inline := &sluicev1.RateLimitCheck{Name: "api", Key: "inline:1", Limit: 1, WindowMs: 60_000}
	if d := check(t, entry.client, inline); !d.Allowed || d.Limit != 1 {
		t.Fatalf("inline check: %v", d)
	}
	if d := check(t, entry.client, inline); d.Allowed {
		t.Fatalf("second inline check allowed: %v", d)
	}

	// Shadow: always allowed; the would-be denials are marked.
	for i := 1; i <= 4; i++ {
		d := check(t, entry.client, named("signup", "203.0.113.9"))
		if !d.Allowed || d.Shadow != (i > 2) || d.RetryAfter != 0 {
			t.Fatalf("shadow check %d: allowed=%v shadow=%v retry_after=%d, want allowed, shadow=%v, retry_after 0", i, d.Allowed, d.Shadow, d.RetryAfter, i > 2)
		}
	}

	// No numbers and no such limit: refused, naming the field.
	_, err := entry.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		named("api", "k"), named("nope", "k"),
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `checks[1].limit: must be > 0, got 0 (and no limit called "nope" is configured`) {
		t.Fatalf("unknown named limit: %v", err)
	}
	// A node without limits refuses a check without numbers the same way.
	_, err = nodes[1].client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{named("api", "k")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "checks[0].limit") {
		t.Fatalf("named check on a node without limits: %v", err)
	}
}

// A reload under load: the new numbers apply to the checks that come
// after it, and no check fails meanwhile.
func TestLimitsReloadUnderLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	write := func(limit int) {
		t.Helper()
		data := fmt.Sprintf("limits:\n  api:\n    limit: %d\n    window: 1h\n", limit)
		if err := os.WriteFile(path+".tmp", []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(10)
	src, err := limits.Open(path, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	nodes := startInproc(t, NodeConfig{Name: "node1", Limits: src}, NodeConfig{Name: "node2", Limits: src})

	var (
		wg       sync.WaitGroup
		failures atomic.Int64
		stop     = make(chan struct{})
	)
	for g := range 8 {
		wg.Go(func() {
			c := nodes[g%2].client
			for i := 0; i < 2000; i++ { // bounded: stops by itself
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
					{Name: "api", Key: fmt.Sprintf("g%d:%d", g, i), Hits: proto.Int64(1)},
				}})
				if err != nil || resp.Decisions[0].Error != "" || !resp.Decisions[0].Allowed {
					failures.Add(1)
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // let the load start
	write(1000)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	// Every check that starts after the reload sees the new numbers.
	d := check(t, nodes[1].client, named("api", "after-reload"))
	close(stop)
	wg.Wait()
	if d.Limit != 1000 {
		t.Fatalf("a check after the reload has limit %d, want 1000", d.Limit)
	}
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d checks failed during the reload", n)
	}
	// A bad file is refused and the running limits stay.
	if err := os.WriteFile(path, []byte("limits:\n  api:\n    limit: -3\n    window: 1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil {
		t.Fatal("a bad file was taken")
	}
	if d := check(t, nodes[0].client, named("api", "after-bad-file")); d.Limit != 1000 {
		t.Fatalf("after a refused reload the limit is %d, want 1000", d.Limit)
	}
}

var _ window.Clock = (*window.ManualClock)(nil)

// While two nodes' limits files differ (a rollout), a key keeps its
// owner's numbers whichever node a check enters by: no count is reset by
// checks alternating between the versions.
func TestNamedLimitsOwnerNumbersWin(t *testing.T) {
	clock := windowClock()
	nodes := startInproc(t, NodeConfig{Name: "a", Clock: clock,
		Limits: mustParseLimits(t, "limits:\n  api:\n    limit: 2\n    window: 1m\n")},
		NodeConfig{Name: "b", Clock: clock,
			Limits: mustParseLimits(t, "limits:\n  api:\n    limit: 2\n    window: 2m\n")})
	a, b := nodes[0], nodes[1]
	for _, owner := range []*inprocNode{a, b} {
		key := keyOwnedBy(t, a, "api", owner.Name())
		allowed := 0
		for i := 0; i < 8; i++ {
			entry := []*inprocNode{a, b}[i%2]
			if d := check(t, entry.client, named("api", key)); d.Allowed {
				allowed++
			}
		}
		if allowed != 2 {
			t.Errorf("key owned by %s: %d of 8 allowed through alternating entry nodes, want 2", owner.Name(), allowed)
		}
	}
}
