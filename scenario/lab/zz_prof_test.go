package lab

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/scenario"
)

func TestZZLoadProfile(t *testing.T) {
	if os.Getenv("ZZ") == "" {
		t.Skip()
	}
	s, err := scenario.Load("../testdata/load.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := scenario.NewPlan(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Start(ctx, Config{Plan: p, NodesPerRegion: 1, LeaseBase: lb()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tg, err := l.Target("load."+time.Now().Format("150405"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	res, err := scenario.Run(ctx, p, tg, scenario.Options{Workers: 256})
	if err != nil {
		t.Fatal(err)
	}
	rep := scenario.NewReport(p, res)
	t.Logf("p50 %.2f p99 %.2f", rep.Totals.P50Ms, rep.Totals.P99Ms)
	hist := map[int64]int{}
	slow := map[int64]int{}
	for _, c := range res.Checks {
		wall := res.Start.Add(c.Sent)
		off := wall.UnixNano() % int64(time.Second) / int64(50*time.Millisecond)
		hist[off]++
		if c.Answer.Latency > 5*time.Millisecond {
			slow[off]++
		}
	}
	for i := int64(0); i < 20; i++ {
		t.Logf("offset %4d ms: checks %5d, >5ms %4d", i*50, hist[i], slow[i])
	}
}

func lb() float64 {
	if os.Getenv("LB") == "1" {
		return 1
	}
	return 0
}
