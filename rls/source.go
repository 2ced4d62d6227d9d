package rls

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// Source holds the rules loaded from one path (a rule file or a directory
// of them) and reloads them, as the node's named limits are reloaded: a
// good load is swapped in atomically, a bad one is refused with its error
// and the rules in force stay. It is safe for concurrent use.
type Source struct {
	path string
	opts LoadOptions
	log  *slog.Logger
	cur  atomic.Pointer[Config]
	mu   sync.Mutex // serializes reloads and the callbacks' list
	subs []func(*Config)

	loads, failures atomic.Int64
	lastOK          atomic.Int64 // Unix ns of the last good load
}

// Open loads the rules at path with opts and returns a Source holding
// them, or the load's *ConfigError and no Source: a node does not start on
// a bad rule file, nor on rule files that give no rule or sit where they
// are not read (see [LoadOptions.Load]; an empty directory starts). log
// receives reload messages (default slog.Default()).
func Open(path string, opts LoadOptions, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	cfg, err := opts.Load(path)
	if err != nil {
		return nil, err
	}
	s := &Source{path: path, opts: opts, log: log}
	s.cur.Store(cfg)
	s.loads.Add(1)
	s.lastOK.Store(time.Now().UnixNano())
	return s, nil
}

// Current returns the rules in force.
func (s *Source) Current() *Config { return s.cur.Load() }

// Path returns the path the rules are read from.
func (s *Source) Path() string { return s.path }

// LastLoad returns when the rules in force were loaded.
func (s *Source) LastLoad() time.Time { return time.Unix(0, s.lastOK.Load()) }

// onLoad calls f with the rules in force now and after every good reload.
func (s *Source) onLoad(f func(*Config)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs = append(s.subs, f)
	f(s.cur.Load())
}

// Reload reads the rules again and, when they load, puts them in force
// atomically: requests already answering keep the rules they started
// with. A bad file is refused with its *ConfigError (naming the file and
// line), logged at error, counted in [Stats].ConfigLoadErrors, and the
// rules in force stay; so are rule files that give no rule at all, or
// sit below the directory where they are not read (see
// [LoadOptions.Load]). A directory emptied of rule files is loaded: no
// rules, every request OK (logged at warning).
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg, err := s.opts.Load(s.path)
	if err != nil {
		s.failures.Add(1)
		s.log.Error("rls rules refused; the running rules stay", "path", s.path, "error", err)
		return err
	}
	had := len(s.cur.Load().domains)
	s.cur.Store(cfg)
	s.loads.Add(1)
	s.lastOK.Store(time.Now().UnixNano())
	for _, f := range s.subs {
		f(cfg)
	}
	if had > 0 && len(cfg.domains) == 0 {
		s.log.Warn("rls rules reloaded with no domain: every request is OK", "path", s.path)
	} else {
		s.log.Info("rls rules reloaded", "path", s.path, "domains", strings.Join(cfg.Domains(), ","), "files", len(cfg.files), "rules", len(cfg.rules))
	}
	return nil
}

// Watch reloads the rules whenever the file, or a file of the directory,
// changes on disk, until ctx is done (see internal/filewatch: renames such
// as a ConfigMap's swap count; a reload waits for 250 ms of quiet, at most
// a second). It returns an error only when the watch cannot start.
func (s *Source) Watch(ctx context.Context) error {
	return filewatch.Watch(ctx, []string{s.path}, func() { _ = s.Reload() }, func(err error) {
		s.log.Warn("watching the rls rules", "path", s.path, "error", err)
	})
}
