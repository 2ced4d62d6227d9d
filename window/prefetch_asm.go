//go:build amd64 || arm64

package window

// prefetch asks the CPU to start loading the cache line at addr
// (PREFETCHT0 on amd64, PRFM PLDL1KEEP on arm64). It is a hint: it never
// faults, whatever addr is, and changes no memory.
//
//go:noescape
func prefetch(addr uintptr)
