package limits

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// Source holds the current Set of one limits file and reloads it. It is
// safe for concurrent use; readers get the current Set with
// [Source.Current] and never see a half-loaded one.
type Source struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[Set]
	mu   sync.Mutex // serializes reloads

	reloads, failures atomic.Int64
	lastOK            atomic.Int64 // Unix ns of the last successful load
}

// Open loads the limits file at path and returns a Source holding it. It
// returns the file's error (wrapping [ErrInvalid] for bad contents) and
// no Source when the file cannot be loaded: a node does not start on a bad
// file. log receives reload messages (default slog.Default()).
func Open(path string, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	set, err := Load(path)
	if err != nil {
		return nil, err
	}
	s := &Source{path: path, log: log}
	s.cur.Store(set)
	s.lastOK.Store(time.Now().UnixNano())
	return s, nil
}

// Static returns a Source that always holds set (for tests and embedding);
// Reload on it is a no-op.
func Static(set *Set) *Source {
	s := &Source{log: slog.Default()}
	s.cur.Store(set)
	return s
}

// Current returns the Set in force. A nil Source holds no limits.
func (s *Source) Current() *Set {
	if s == nil {
		return nil
	}
	return s.cur.Load()
}

// Path returns the file the Source reads ("" for a static Source).
func (s *Source) Path() string { return s.path }

// SourceStats counts a Source's reloads.
type SourceStats struct {
	// Reloads counts reload attempts, Failures the ones refused.
	Reloads, Failures int64
	// LastSuccess is when the Set in force was loaded.
	LastSuccess time.Time
	// Limits is how many limits the Set in force has.
	Limits int
}

// Stats returns the Source's counters.
func (s *Source) Stats() SourceStats {
	return SourceStats{
		Reloads: s.reloads.Load(), Failures: s.failures.Load(),
		LastSuccess: time.Unix(0, s.lastOK.Load()), Limits: len(s.Current().Names()),
	}
}

// Reload reads the file again and, if it parses, swaps it in atomically:
// checks already being decided keep the Set they started with. A bad file
// is refused with its error (naming the line) and the running Set stays;
// so is a file without a limits: key (empty, or caught half-written) while
// limits are in force: `limits: {}` removes them all.
func (s *Source) Reload() error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reloads.Add(1)
	set, err := Load(s.path)
	if err == nil && !set.declared && len(s.Current().names) > 0 {
		err = fmt.Errorf("%w: %s: no limits: key (an empty or half-written file?); write `limits: {}` to remove every limit", ErrInvalid, s.path)
	}
	if err != nil {
		s.failures.Add(1)
		s.log.Error("limits file refused; the running limits stay", "file", s.path, "error", err)
		return err
	}
	s.cur.Store(set)
	s.lastOK.Store(time.Now().UnixNano())
	s.log.Info("limits reloaded", "file", s.path, "limits", len(set.names))
	return nil
}

// Watch reloads the file whenever it changes on disk, until ctx is done.
// It watches the file's directory, so a file replaced by rename (as editors
// and Kubernetes ConfigMaps do) is seen too; it reloads once the file has
// had no change for 250 ms (at most a second after a change), so a file
// written in several steps is read whole. It returns an error only when the watch cannot start.
func (s *Source) Watch(ctx context.Context) error {
	if s.path == "" {
		<-ctx.Done()
		return nil
	}
	return filewatch.Watch(ctx, []string{s.path}, func() { _ = s.Reload() }, func(err error) {
		s.log.Warn("watching the limits file", "file", s.path, "error", err)
	})
}
