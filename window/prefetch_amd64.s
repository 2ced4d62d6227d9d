#include "textflag.h"

// func prefetch(addr uintptr)
TEXT ·prefetch(SB), NOSPLIT, $0-8
	MOVQ addr+0(FP), AX
	PREFETCHT0 (AX)
	RET

// func prefetchw(addr uintptr)
TEXT ·prefetchw(SB), NOSPLIT, $0-8
	MOVQ addr+0(FP), AX
	// PREFETCHW (AX), which the Go assembler does not know: 0F 0D /1.
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	RET

// func cpuidExtECX() uint32
TEXT ·cpuidExtECX(SB), NOSPLIT, $0-4
	MOVL $0x80000000, AX
	XORL CX, CX
	CPUID
	CMPL AX, $0x80000001
	JCS none
	MOVL $0x80000001, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
none:
	MOVL $0, ret+0(FP)
	RET
