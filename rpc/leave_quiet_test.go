package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// levelRecords is a slog handler keeping each record's level, message and
// "keys" attribute.
type levelRecords struct {
	mu   sync.Mutex
	list []levelRecord
}

type levelRecord struct {
	level slog.Level
	msg   string
	keys  int64
	attrs string
}

func (r *levelRecords) Enabled(context.Context, slog.Level) bool { return true }
func (r *levelRecords) Handle(_ context.Context, rec slog.Record) error {
	lr := levelRecord{level: rec.Level, msg: rec.Message}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "keys" {
			lr.keys = a.Value.Int64()
		}
		lr.attrs += " " + a.String()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, lr)
	return nil
}
func (r *levelRecords) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *levelRecords) WithGroup(string) slog.Handler      { return r }

func (r *levelRecords) all() []levelRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]levelRecord(nil), r.list...)
}

// A whole cluster stopping at once (Ctrl-C on make run) has no member to
// hand its keys to: each node that still holds keys says how many it
// drops in one info line, Close returns no error, and nothing is logged
// at warn or error. make run logged, per node, a warning that the hand-off
// was retried, an error that it was incomplete ("ring: no members"), an
// error from memberlist about a closed connection and a warning from
// serve, "graceful leave incomplete". With a state dir the keys are saved
// instead, and each node says so once.
func TestWholeClusterStoppingAtOnceDropsKeysQuietly(t *testing.T) {
	t.Run("dropped", func(t *testing.T) {
		wholeClusterStopsQuietly(t, false, "keys dropped: no member can take them (every other member is leaving too, or none is left)")
	})
	t.Run("saved in the state dir", func(t *testing.T) {
		wholeClusterStopsQuietly(t, true, "keys saved for a restart: no member could take them")
	})
}

func wholeClusterStopsQuietly(t *testing.T, stateDir bool, saying string) {
	clock := windowClock()
	logs := make([]*levelRecords, 3)
	var nodes []*testNode
	for i := range logs {
		logs[i] = &levelRecords{}
		var join []string
		if i > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		cfg := NodeConfig{ForwardTimeout: 2 * time.Second, Logger: slog.New(logs[i])}
		if stateDir {
			cfg.StateDir = t.TempDir()
		}
		nodes = append(nodes, startNodeWith(t, fmt.Sprintf("node%d", i+1), clock, cfg, join...))
	}
	waitRingAgrees(t, nodes)
	var keys int
	for _, owner := range nodes {
		key := keyOwnedBy(t, nodes[0], "api", owner.Name())
		hits := int64(1)
		check(t, nodes[0].client, &sluicev1.RateLimitCheck{Name: "api", Key: key, Hits: &hits, Limit: 10, WindowMs: 3_600_000})
		keys++
	}
	var held int
	for _, n := range nodes {
		held += n.Store().Len()
	}
	if held != keys {
		t.Fatalf("the nodes hold %d keys, want %d", held, keys)
	}

	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs[i] = n.Close(ctx)
		})
	}
	wg.Wait()
	var dropped int64
	for i, n := range nodes {
		if errs[i] != nil {
			t.Errorf("%s: Close = %v, want nil", n.Name(), errs[i])
		}
		lines := 0
		for _, r := range logs[i].all() {
			if r.level >= slog.LevelWarn {
				t.Errorf("%s logged %s %q%s", n.Name(), r.level, r.msg, r.attrs)
			}
			if r.msg == saying {
				dropped += r.keys
				lines++
			}
		}
		if lines > 1 {
			t.Errorf("%s said %d times that it drops keys, want at most once", n.Name(), lines)
		}
	}
	if dropped != int64(keys) {
		t.Fatalf("the nodes said they dropped %d keys, want the %d they held", dropped, keys)
	}
}
