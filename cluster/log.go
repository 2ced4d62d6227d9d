package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Warnings and errors from memberlist are rate limited: anyone who can
// reach the gossip port can make it log one line per bad packet
// (undecryptable, wrong label), so at most logBurst such lines are written
// per logWindow, and the number left out is logged when the next window
// opens. Debug and info lines are not limited.
const (
	logBurst  = 10
	logWindow = 10 * time.Second
)

// newStdLogger bridges memberlist's *log.Logger to slog: a line that starts
// with "[DEBUG]", "[INFO]", "[WARN]" or "[ERR]" becomes a record of that
// level, without the prefix; warnings and errors are rate limited (see
// logBurst). Once the writer's closing is set (the node is stopping its
// gossip), a warning or error about a closed connection is logged at
// debug: memberlist closes its sockets before it stops its timers, so a
// gossip round may still try one ("Failed to send gossip ... use of
// closed network connection").
func newStdLogger(l *slog.Logger) (*log.Logger, *slogWriter) {
	w := &slogWriter{l: l, window: logWindow, burst: logBurst}
	return log.New(w, "", 0), w
}

type slogWriter struct {
	l             *slog.Logger
	window        time.Duration
	burst         int
	closing       atomic.Bool // gossip is being shut down
	mu            sync.Mutex
	start         time.Time // of the current window
	written, left int       // warnings and errors written and left out in it
}

// closedConn is the text of net.ErrClosed, which memberlist's lines carry
// as text only.
var closedConn = []byte(net.ErrClosed.Error())

var levels = []struct {
	prefix []byte
	level  slog.Level
}{
	{[]byte("[DEBUG] "), slog.LevelDebug},
	{[]byte("[INFO] "), slog.LevelInfo},
	{[]byte("[WARN] "), slog.LevelWarn},
	{[]byte("[ERR] "), slog.LevelError},
	{[]byte("[ERROR] "), slog.LevelError},
}

func (w *slogWriter) Write(p []byte) (int, error) {
	msg := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, lv := range levels {
		if bytes.HasPrefix(msg, lv.prefix) {
			msg, level = msg[len(lv.prefix):], lv.level
			break
		}
	}
	if level >= slog.LevelWarn && w.closing.Load() && bytes.Contains(msg, closedConn) {
		level = slog.LevelDebug
	}
	if level >= slog.LevelWarn && !w.allow() {
		return len(p), nil
	}
	w.l.Log(context.Background(), level, string(bytes.TrimPrefix(msg, []byte("memberlist: "))))
	return len(p), nil
}

// allow reports whether a warning or error may be written now, and logs
// how many were left out of the window that just ended.
func (w *slogWriter) allow() bool {
	w.mu.Lock()
	now := time.Now()
	var left int
	if now.Sub(w.start) >= w.window {
		left = w.left
		w.start, w.written, w.left = now, 0, 0
	}
	ok := w.written < w.burst
	if ok {
		w.written++
	} else {
		w.left++
	}
	w.mu.Unlock()
	if left > 0 {
		w.l.Warn("gossip log lines left out (a flood of bad gossip packets or connections?)", "left_out", left, "window", w.window)
	}
	return ok
}
