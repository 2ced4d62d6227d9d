package window

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"
)

// vectorFile is the format of testdata/vectors.json: each case is one key's
// sequence of checks, times in Unix ms.
type vectorFile struct {
	Cases []struct {
		Algorithm string `json:"algorithm"`
		Limit     int64  `json:"limit"`
		WindowMs  int64  `json:"window_ms"`
		Burst     int64  `json:"burst"`
		Steps     []struct {
			T          int64  `json:"t"`
			Hits       int64  `json:"hits"`
			Allowed    bool   `json:"allowed"`
			Remaining  int64  `json:"remaining"`
			ResetTime  int64  `json:"reset_time"`
			RetryAfter int64  `json:"retry_after"`
			Delay      *int64 `json:"delay"`
		} `json:"steps"`
	} `json:"cases"`
}

// ceilMs rounds a duration up to whole milliseconds, as the wire does.
func ceilMs(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// unixMsCeil rounds a time up to whole Unix milliseconds.
func unixMsCeil(t time.Time) int64 {
	ns := t.UnixNano()
	ms := ns / 1e6
	if ns%1e6 > 0 {
		ms++
	}
	return ms
}

// TestVectors replays every case of testdata/vectors.json (or of the file
// named by $SLUICE_VECTORS) step by step with an injected clock and checks
// every answer exactly.
func TestVectors(t *testing.T) {
	path := "../testdata/vectors.json"
	if p := os.Getenv("SLUICE_VECTORS"); p != "" {
		path = p
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vf vectorFile
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(vf.Cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	steps := 0
	for i, vc := range vf.Cases {
		name := fmt.Sprintf("%02d_%s_L%d_W%dms_B%d", i, vc.Algorithm, vc.Limit, vc.WindowMs, vc.Burst)
		t.Run(name, func(t *testing.T) {
			alg, err := ParseAlgorithm(vc.Algorithm)
			if err != nil {
				t.Fatal(err)
			}
			clock := NewManualClock(time.UnixMilli(0))
			s := NewStore(StoreConfig{Clock: clock})
			c := Check{Algorithm: alg, Limit: vc.Limit, Window: time.Duration(vc.WindowMs) * time.Millisecond, Burst: vc.Burst}
			for j, st := range vc.Steps {
				clock.Set(time.UnixMilli(st.T))
				c.Hits = st.Hits
				d, err := s.Apply("k", c, s.Now())
				if err != nil {
					t.Fatalf("step %d: %v", j, err)
				}
				got := fmt.Sprintf("allowed=%v remaining=%d reset_time=%d retry_after=%d", d.Allowed, d.Remaining, unixMsCeil(d.ResetTime), ceilMs(d.RetryAfter))
				want := fmt.Sprintf("allowed=%v remaining=%d reset_time=%d retry_after=%d", st.Allowed, st.Remaining, st.ResetTime, st.RetryAfter)
				if st.Delay != nil {
					got += fmt.Sprintf(" delay=%d", ceilMs(d.Delay))
					want += fmt.Sprintf(" delay=%d", *st.Delay)
				}
				if got != want {
					t.Errorf("step %d (t=%d hits=%d):\n got  %s\n want %s", j, st.T, st.Hits, got, want)
				}
				steps++
			}
		})
	}
	t.Logf("%d cases, %d steps from %s", len(vf.Cases), steps, path)
}
