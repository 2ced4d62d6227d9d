//go:build e2e && linux

package e2e

// sysSetns is setns(2)'s number: package syscall has none for amd64.
const sysSetns = 308
