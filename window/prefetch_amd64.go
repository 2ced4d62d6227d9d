package window

// prefetch executes PREFETCHT0: it asks the CPU to start loading the
// cache line at addr. It is a hint: it never faults, whatever addr is, and
// changes no memory.
//
//go:noescape
func prefetch(addr uintptr)

// prefetchw executes PREFETCHW, which loads the line at addr for writing
// (exclusive in this core's cache, other copies invalidated). Only CPUs
// that report PRFCHW may run it ([hasPrefetchW]).
//
//go:noescape
func prefetchw(addr uintptr)

// cpuidExtECX returns ECX of CPUID leaf 0x80000001, or 0 when the CPU has
// no such leaf.
func cpuidExtECX() uint32

// hasPrefetchW reports whether the CPU has PREFETCHW: CPUID leaf
// 0x80000001, ECX bit 8 (PRFCHW, which Linux shows as 3dnowprefetch). AMD
// has had it since the K8 and Intel since Broadwell.
var hasPrefetchW = cpuidExtECX()&(1<<8) != 0

// prefetchWrite asks the CPU to start loading the cache line at addr for
// writing: with PREFETCHW where the CPU has it, so that the write that
// follows finds the line already owned by this core (a line another core
// wrote last would otherwise be fetched once to read and once more to
// write), else with PREFETCHT0. It is a hint: it never faults, whatever
// addr is, and changes no memory.
func prefetchWrite(addr uintptr) {
	if hasPrefetchW {
		prefetchw(addr)
	} else {
		prefetch(addr)
	}
}
