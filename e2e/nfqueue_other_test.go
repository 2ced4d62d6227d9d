//go:build e2e && linux && !amd64

package e2e

import "syscall"

// sysSetns is setns(2)'s number.
const sysSetns = syscall.SYS_SETNS
