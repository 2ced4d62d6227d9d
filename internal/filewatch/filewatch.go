// Package filewatch calls a reload function when files change on disk, the
// way sluice reloads its limits file, certificates and tokens: it watches
// the files' directories with fsnotify (so a rename over a file, such as a
// Kubernetes Secret's or ConfigMap's "..data" swap, counts) and waits until
// the files have had no change for Quiet, but reloads at most MaxWait
// after the first change.
package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Timing of a reload after changes.
const (
	// Quiet is how long the files must have had no change: a writer
	// that writes a file in several steps is done by then.
	Quiet = 250 * time.Millisecond
	// MaxWait bounds the wait after the first change, however often
	// the files keep changing.
	MaxWait = time.Second
)

// Watch calls reload after files change (see the package documentation)
// until ctx is done, then returns nil. A path of files that is a
// directory stands for every file directly in it (created, written,
// renamed or removed). It calls onError (which may be
// nil) with the watcher's errors and goes on. It returns an error at once
// when a file's path cannot be made absolute or its directory cannot be
// watched (e.g. it does not exist).
func Watch(ctx context.Context, files []string, reload func(), onError func(error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	want := map[string]bool{}
	dirs := map[string]bool{}
	whole := map[string]bool{} // directories all of whose files count
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		if st, err := os.Stat(abs); err == nil && st.IsDir() {
			whole[abs], dirs[abs] = true, true
			continue
		}
		want[abs] = true
		dirs[filepath.Dir(abs)] = true
	}
	for d := range dirs {
		if err := w.Add(d); err != nil {
			return err
		}
	}
	var (
		debounce = time.NewTimer(time.Hour)
		pending  bool
		first    time.Time // the first change not yet reloaded
	)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if p, _ := filepath.Abs(ev.Name); !want[p] && !whole[filepath.Dir(p)] && filepath.Base(ev.Name) != "..data" {
				continue // another file of the directory (..data: a Secret's or ConfigMap's swap)
			}
			// Every change restarts the wait, up to MaxWait after the
			// first.
			if !pending {
				pending, first = true, time.Now()
			}
			debounce.Reset(min(Quiet, time.Until(first.Add(MaxWait))))
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if onError != nil {
				onError(err)
			}
		case <-debounce.C:
			if pending {
				pending = false
				reload()
			}
		}
	}
}
