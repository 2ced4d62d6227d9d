package window

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// BenchmarkApplyVersus measures sluice and go-limiter in alternating
// rounds, so that both see the same machine. On a shared VM the speed of
// memory moves by 1.5x to 3x from one minute to the next (the 100000-key
// go-limiter figure of BenchmarkApply read 245, 390 and 490 ns in three
// runs within ten minutes), and two separate benchmark lines compare two
// moments more than two limiters. Here each round is versusRound checks
// per goroutine on one limiter, then the same on the other, many times a
// second; the goroutines (one for serial, GOMAXPROCS for parallel) start
// each round together and its wall time is charged to its limiter. It
// reports both figures in ns per check (as RunParallel's ns/op: wall time
// over all checks) and their ratio, go-limiter over sluice ("x-faster":
// above 1, sluice is faster). The checks are those of BenchmarkApply
// (requestCheck), the clock read on every check.
//
//	go test ./window -run '^$' -bench ApplyVersus -count 5
func BenchmarkApplyVersus(b *testing.B) {
	for _, n := range benchKeyCounts {
		keys := benchKeys(n)
		impls := newLimiters(b, keys) // the parent's b: go-limiter is closed at its end
		var ls []limiter              // made on first use, so -bench filters skip the setup
		for _, mode := range []string{"serial", "parallel"} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, mode), func(b *testing.B) {
				if ls == nil {
					for _, impl := range impls {
						ls = append(ls, impl.make())
					}
				}
				workers := 1
				if mode == "parallel" {
					workers = runtime.GOMAXPROCS(0)
				}
				wall, checks := runVersus(b, ls, keys, workers)
				per := func(i int) float64 { return float64(wall[i].Nanoseconds()) / float64(checks) }
				b.ReportMetric(per(0), "sluice-ns/check")
				b.ReportMetric(per(1), "go-limiter-ns/check")
				b.ReportMetric(per(1)/per(0), "x-faster")
				b.ReportMetric(0, "ns/op") // the loop's own time is both limiters'
			})
		}
		ls = nil
		runtime.GC()
	}
}

// versusRound is how many checks each goroutine makes on one limiter
// before all switch to the other: long enough that starting a round
// together costs under 1 %, short enough (about 0.1 to 1 ms) that a change
// of the machine's speed falls on both limiters alike.
const versusRound = 100_000

// runVersus makes about b.N checks on each of ls[0] and ls[1] in
// alternating rounds over workers goroutines and returns the wall time
// charged to each and the checks made on each.
func runVersus(b *testing.B, ls []limiter, keys []string, workers int) ([2]time.Duration, int) {
	rounds := max(1, b.N/(versusRound*workers))
	var (
		wall  [2]time.Duration
		start = make([]chan int, workers)
		done  = make(chan struct{}, workers)
		wg    sync.WaitGroup
	)
	for w := range workers {
		start[w] = make(chan int, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			bw := newBenchWorker()
			for which := range start[w] {
				for range versusRound {
					requestCheck(&ls[which], keys, &bw.r, bw.buf[:0])
				}
				done <- struct{}{}
			}
		}()
	}
	b.ResetTimer()
	for r := range 2 * rounds {
		which := r % 2
		t0 := time.Now()
		for w := range workers {
			start[w] <- which
		}
		for range workers {
			<-done
		}
		wall[which] += time.Since(t0)
	}
	b.StopTimer()
	for w := range workers {
		close(start[w])
	}
	wg.Wait()
	return wall, rounds * versusRound * workers
}
