//go:build !amd64 && !arm64

package window

// prefetch does nothing on this architecture (see prefetch_asm.go).
func prefetch(addr uintptr) {}
