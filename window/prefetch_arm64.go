package window

// prefetchWrite executes PRFM PSTL1KEEP: it asks the CPU to start loading
// the cache line at addr into this core's cache for writing. It is a hint:
// it never faults, whatever addr is, and changes no memory.
//
//go:noescape
func prefetchWrite(addr uintptr)
