package window

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sethvargo/go-limiter/memorystore"
)

// The hot path, against github.com/sethvargo/go-limiter's memorystore (a
// token bucket per key behind one map) at the same key counts, in one run:
//
//	go test ./window -run '^$' -bench . -benchmem -count 5
//
// Keys are chosen uniformly at random (xorshift, one stream per goroutine)
// from keys that already hold state, so every check is on an existing key.
// BenchmarkApply builds each key's bytes in a buffer the goroutine reuses,
// the way a node holds the key of a request it has just decoded: the key is
// hot in cache and only the limiter's own memory is cold.
// BenchmarkApplyStoredKeys instead reads each key from a slice of n strings,
// so both limiters also pay the benchmark's own cache misses on the key.

var benchKeyCounts = []int{1, 100_000, 1_000_000}

const benchKeyPrefix = "api\x00user:"

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = benchKeyPrefix + strconv.Itoa(i)
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

// benchWorker is one benchmark goroutine's PRNG and key buffer, on cache
// lines of its own. The PRNG is written on every check: when two
// goroutines' states shared a line (8-byte heap objects sit side by side),
// every check of the parallel runs paid a coherence miss, and whether they
// did changed from run to run (sluice measured 124 ns, then 232 ns, on the
// same code).
type benchWorker struct {
	_   [64]byte
	r   xorshift
	buf [64]byte
	_   [64]byte
}

func newBenchWorker() *benchWorker { return &benchWorker{r: newRand()} }

// limiter is one limiter under test, filled with keys.
type limiter struct {
	// take checks a key held in a string; takeBytes one held in a buffer
	// the caller reuses. The key already holds state.
	take      func(key string)
	takeBytes func(key []byte)
}

// newLimiters returns, by name, functions that make each limiter filled
// with keys.
func newLimiters(b *testing.B, keys []string) []struct {
	name string
	make func() limiter
} {
	return []struct {
		name string
		make func() limiter
	}{
		{"sluice", func() limiter {
			s := NewStore(StoreConfig{})
			c := Check{Algorithm: TokenBucket, Limit: 1 << 40, Window: time.Second, Hits: 1}
			for _, k := range keys {
				_, _ = s.Apply(k, c, s.Now())
			}
			return limiter{
				take:      func(k string) { _, _ = s.Apply(k, c, s.Now()) },
				takeBytes: func(k []byte) { _, _ = s.ApplyNow(k, c) },
			}
		}},
		{"go-limiter", func() limiter {
			s, err := memorystore.New(&memorystore.Config{Tokens: 1 << 40, Interval: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close(context.Background()) })
			ctx := context.Background()
			for _, k := range keys {
				_, _, _, _, _ = s.Take(ctx, k)
			}
			return limiter{
				take: func(k string) { _, _, _, _, _ = s.Take(ctx, k) },
				// Take keeps its key only when the key is new, and
				// every key here already holds state: a string over the
				// buffer is safe and allocates nothing.
				takeBytes: func(k []byte) {
					_, _, _, _, _ = s.Take(ctx, unsafe.String(unsafe.SliceData(k), len(k)))
				},
			}
		}},
	}
}

// runLimiters runs serial and parallel sub-benchmarks for every limiter
// at every key count; one is one check, given the goroutine's PRNG and
// buffer.
func runLimiters(b *testing.B, one func(l *limiter, keys []string, r *xorshift, buf []byte)) {
	for _, n := range benchKeyCounts {
		keys := benchKeys(n)
		for _, impl := range newLimiters(b, keys) {
			var l *limiter // made on first use, so -bench filters skip the setup
			for _, mode := range []string{"serial", "parallel"} {
				b.Run(fmt.Sprintf("%s/keys=%d/%s", impl.name, n, mode), func(b *testing.B) {
					if l == nil {
						v := impl.make()
						l = &v
					}
					b.ReportAllocs()
					if mode == "serial" {
						w := newBenchWorker()
						for b.Loop() {
							one(l, keys, &w.r, w.buf[:0])
						}
						return
					}
					b.RunParallel(func(pb *testing.PB) {
						w := newBenchWorker()
						for pb.Next() {
							one(l, keys, &w.r, w.buf[:0])
						}
					})
				})
			}
			l = nil
			runtime.GC()
		}
	}
}

// requestCheck is one check of BenchmarkApply and BenchmarkApplyVersus: a
// random existing key built in a reused buffer, the way a node holds the
// key of a request it has just decoded.
func requestCheck(l *limiter, keys []string, r *xorshift, buf []byte) {
	buf = append(buf[:0], benchKeyPrefix...)
	l.takeBytes(strconv.AppendUint(buf, r.next()%uint64(len(keys)), 10))
}

func BenchmarkApply(b *testing.B) { runLimiters(b, requestCheck) }

func BenchmarkApplyStoredKeys(b *testing.B) {
	runLimiters(b, func(l *limiter, keys []string, r *xorshift, _ []byte) {
		l.take(keys[r.next()%uint64(len(keys))])
	})
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
