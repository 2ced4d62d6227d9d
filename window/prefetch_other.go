//go:build !amd64 && !arm64

package window

// prefetchWrite does nothing on this architecture; on amd64 and arm64 it
// asks the CPU to start loading the cache line at addr for writing.
func prefetchWrite(addr uintptr) {}
