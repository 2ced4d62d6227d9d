package window

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
)

// The hot path, against github.com/sethvargo/go-limiter's memorystore (a
// token bucket per key behind one map) at the same key counts, in one run:
//
//	go test ./window -run '^$' -bench . -benchmem -count 5
//
// Keys are chosen uniformly at random (xorshift, one stream per goroutine)
// from keys that already hold state, so every check is on an existing key.

var benchKeyCounts = []int{1, 100_000, 1_000_000}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("api\x00user:%d", i)
	}
	return keys
}

// xorshift is a tiny PRNG for picking keys without locks or allocation.
type xorshift uint64

func (x *xorshift) next() uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return uint64(*x)
}

var seedCounter atomic.Uint64

func newRand() xorshift { return xorshift(0x9E3779B97F4A7C15 ^ seedCounter.Add(1)*0xBF58476D1CE4E5B9) }

// taker is one check on a key, the way each limiter does it.
type taker func(key string)

func BenchmarkApply(b *testing.B) {
	for _, n := range benchKeyCounts {
		keys := benchKeys(n)
		impls := []struct {
			name string
			make func() taker
		}{
			{"sluice", func() taker {
				s := NewStore(StoreConfig{})
				c := Check{Algorithm: TokenBucket, Limit: 1 << 40, Window: time.Second, Hits: 1}
				for _, k := range keys {
					_, _ = s.Apply(k, c, s.Now())
				}
				return func(k string) { _, _ = s.Apply(k, c, s.Now()) }
			}},
			{"go-limiter", func() taker {
				s, err := memorystore.New(&memorystore.Config{Tokens: 1 << 40, Interval: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = s.Close(context.Background()) })
				ctx := context.Background()
				for _, k := range keys {
					_, _, _, _, _ = s.Take(ctx, k)
				}
				return func(k string) { _, _, _, _, _ = s.Take(ctx, k) }
			}},
		}
		for _, impl := range impls {
			var take taker // made on first use, so -bench filters skip the setup
			setup := func() {
				if take == nil {
					take = impl.make()
				}
			}
			b.Run(fmt.Sprintf("%s/keys=%d/serial", impl.name, n), func(b *testing.B) {
				setup()
				r := newRand()
				b.ReportAllocs()
				for b.Loop() {
					take(keys[r.next()%uint64(n)])
				}
			})
			b.Run(fmt.Sprintf("%s/keys=%d/parallel", impl.name, n), func(b *testing.B) {
				setup()
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					r := newRand()
					for pb.Next() {
						take(keys[r.next()%uint64(n)])
					}
				})
			})
			take = nil
			runtime.GC()
		}
	}
}

// BenchmarkBytesPerKey reports the heap each limiter holds per live key at
// 1000000 keys, not counting the keys' own bytes (they are allocated
// before the baseline is read and shared with the limiter).
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 1_000_000
	keys := benchKeys(n)
	measure := func(b *testing.B, fill func() (any, func())) {
		var before, after runtime.MemStats
		for b.Loop() {
			runtime.GC()
			runtime.ReadMemStats(&before)
			x, done := fill()
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(x)
			done()
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/key")
	}
	b.Run("sluice", func(b *testing.B) {
		measure(b, func() (any, func()) {
			s := NewStore(StoreConfig{})
			c := Check{Algorithm: TokenBucket, Limit: 100, Window: time.Minute, Hits: 1}
			now := s.Now()
			for _, k := range keys {
				_, _ = s.Apply(k, c, now)
			}
			return s, func() {}
		})
	})
	b.Run("go-limiter", func(b *testing.B) {
		measure(b, func() (any, func()) {
			s, _ := memorystore.New(&memorystore.Config{Tokens: 100, Interval: time.Minute})
			ctx := context.Background()
			for _, k := range keys {
				_, _, _, _, _ = s.Take(ctx, k)
			}
			return s, func() { _ = s.Close(ctx) }
		})
	})
}
