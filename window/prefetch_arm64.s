#include "textflag.h"

// func prefetchWrite(addr uintptr)
TEXT ·prefetchWrite(SB), NOSPLIT, $0-8
	MOVD addr+0(FP), R0
	PRFM (R0), PSTL1KEEP
	RET
