package rls_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/rls"
)

// BenchmarkShouldRateLimit is the rate limit service's own cost for a
// request of two limited descriptors (a key per user, each admitted),
// decided on one in-memory store: matching, planning, the statuses and
// the statistics, with the store's work. Run with -benchmem.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := rls.Parse(rls.File{Name: "shop.yaml", Data: []byte(serviceRules)})
	if err != nil {
		b.Fatal(err)
	}
	ch := newStoreChecker()
	s := rls.NewService(cfg, ch, rls.Options{Clock: ch.clock, Logger: slog.New(slog.DiscardHandler)})
	reqs := make([]*rlsv3.RateLimitRequest, 4096)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("user", "u"+strconv.Itoa(i)), desc("week", "w"+strconv.Itoa(i))}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%4096 == 0 && i > 0 {
			b.StopTimer()
			ch.store = newStoreChecker().store // a fresh window for every key
			ch.calls = nil
			b.StartTimer()
		}
		if _, err := s.ShouldRateLimit(ctx, reqs[i%4096]); err != nil {
			b.Fatal(err)
		}
	}
}
