// Package leaktest makes a package's tests fail when a goroutine of ours
// outlives them (go.uber.org/goleak), ignoring the goroutines that
// hashicorp/memberlist itself can leave behind after Shutdown: a probe still
// waiting for an ack whose timer was cleared, and (in-memory transport) a
// delivery to a node already gone.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyTestMain runs the tests of m, then fails (exit code 1) if
// goroutines other than the runtime's and memberlist's are left. Call it
// from TestMain.
func VerifyTestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*MockTransport).WriteToAddress"),
	)
}
