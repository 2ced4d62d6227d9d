package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/poll"
)

// A write and a rename over the file each reload once, writes in quick
// succession reload once, and another file of the directory reloads
// nothing.
func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(file, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	var reloads atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, []string{file}, func() { reloads.Add(1) }, nil) }()
	time.Sleep(100 * time.Millisecond) // let the watcher start

	for i := range 5 { // one burst of writes: one reload
		if err := os.WriteFile(file, []byte{byte('b' + i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "a reload after the writes", func() bool { return reloads.Load() >= 1 })
	time.Sleep(2 * MaxWait)
	if got := reloads.Load(); got != 1 {
		t.Fatalf("%d reloads after one burst of writes, want 1", got)
	}

	next := filepath.Join(dir, "limits.yaml.new")
	if err := os.WriteFile(next, []byte("z"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * MaxWait)
	if got := reloads.Load(); got != 1 {
		t.Fatalf("another file of the directory reloaded: %d reloads, want 1", got)
	}
	if err := os.Rename(next, file); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "a reload after the rename", func() bool { return reloads.Load() == 2 })

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watch returned %v after its context ended, want nil", err)
	}
}

// A directory that does not exist is an error at once.
func TestWatchMissingDirectory(t *testing.T) {
	err := Watch(context.Background(), []string{filepath.Join(t.TempDir(), "no", "such", "file")}, func() {}, nil)
	if err == nil {
		t.Fatal("Watch of a file in a missing directory: no error")
	}
}
