// Package syncbuf holds Buffer, for tests whose writers and readers run in
// different goroutines: the log sink of several nodes, the output of a
// command read while it runs.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects what several goroutines write, in the order the writes
// take its lock. The zero value is an empty Buffer ready to use; it must
// not be copied after first use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p and returns len(p); the error is always nil.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
