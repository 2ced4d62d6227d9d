// Package pause freezes a key's owner the way a process-pause fault does
// (a long GC pause, a frozen VM or container, kill -STOP: Jepsen's
// process-pause nemesis) and checks that no key admits beyond its limit
// (issue 36).
//
// Its test builds the sluice binary, starts three `sluice serve`
// processes on 127.0.0.1 joined to each other, and in every repetition
// spends part of the limit of fresh keys owned by one node, lets the
// copies catch up, stops that node with SIGSTOP while checks go on
// through the other two, resumes it with SIGCONT and sends checks both
// straight to it and through the others, counting every allowed answer
// (degraded ones included). Two kinds of pause: longer than failure
// detection (the others declare the node dead and take its keys over)
// and shorter (the stand-in holders decide meanwhile).
//
// It runs only with SLUICE_PAUSE=1 (it takes minutes):
//
//	SLUICE_PAUSE=1 go test ./scenario/pause/ -run TestPausedOwner -v -timeout 30m
//
// A repetition takes about 13-15 s (long) and 8.5 s (short) on two
// cores; the default 10 of each about 4 minutes. Settings, all optional:
//
//	SLUICE_PAUSE_REPS             repetitions of each kind (default 10; issue 36 asks for 50, about 19 minutes)
//	SLUICE_PAUSE_KINDS            long,short (default both)
//	SLUICE_PAUSE_RATE             checks a second during and after the pause (default 48, over 4 keys)
//	SLUICE_PAUSE_PROFILE          the nodes' --profile (default lan, serve's default)
//	SLUICE_PAUSE_FORWARD_TIMEOUT  the nodes' --forward-timeout (default 2s, serve's default)
//	SLUICE_PAUSE_SHORT            the short pause (default 1.5 x the forward timeout)
//	SLUICE_PAUSE_HOLD             how long a long pause goes on once both others dropped the node (default 2s)
//	SLUICE_PAUSE_LOGDIR           keep the nodes' logs in this directory
//	SLUICE_PAUSE_VERBOSE          log the traced answers of every key, not only of those over the limit
package pause
