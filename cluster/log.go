package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// newStdLogger bridges memberlist's *log.Logger to slog: a line that starts
// with "[DEBUG]", "[INFO]", "[WARN]" or "[ERR]" becomes a record of that
// level, without the prefix.
func newStdLogger(l *slog.Logger) *log.Logger {
	return log.New(slogWriter{l}, "", 0)
}

type slogWriter struct{ l *slog.Logger }

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

func (w slogWriter) Write(p []byte) (int, error) {
	msg := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, lv := range levels {
		if bytes.HasPrefix(msg, lv.prefix) {
			msg, level = msg[len(lv.prefix):], lv.level
			break
		}
	}
	w.l.Log(context.Background(), level, string(bytes.TrimPrefix(msg, []byte("memberlist: "))))
	return len(p), nil
}
