package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// When every member leaves at once, a member's leave message may find no
// one left to carry it to: the others left while it waited. That is not
// an error. Here n1 sends nothing (its gossip and probes are an hour
// apart, so its leave message never goes out), and n2 leaves while n1
// waits: n1's wait times out with no other member alive, and Leave
// returns nil. Without the check, memberlist's "timeout waiting for leave
// broadcast" came back.
func TestLeaveWithNoOneLeftToTell(t *testing.T) {
	network := &memberlist.MockNetwork{}
	quiet := func(mc *memberlist.Config) {
		mc.GossipInterval, mc.ProbeInterval, mc.PushPullInterval = time.Hour, time.Hour, time.Hour
	}
	noProbes := func(mc *memberlist.Config) { mc.ProbeInterval = time.Hour } // n2 never pings n1 (an ack could carry n1's message)
	var cs []*Cluster
	for i, tune := range []func(*memberlist.Config){quiet, noProbes} {
		name := []string{"n1", "n2"}[i]
		c, err := New(Config{Name: name, GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i), Profile: Local,
			Transport: network.NewTransport(name), Logger: slog.New(slog.DiscardHandler), tune: tune})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Shutdown() })
		cs = append(cs, c)
	}
	if n, err := cs[1].Join(context.Background(), []string{cs[0].GossipAddr()}); err != nil || n != 1 {
		t.Fatalf("join: %d, %v", n, err)
	}
	eventually(t, "both to see two members", func() bool { return len(cs[0].Members()) == 2 && len(cs[1].Members()) == 2 })

	left := make(chan error, 1)
	go func() { left <- cs[0].Leave(time.Second) }()
	eventually(t, "n1 to have marked itself left", func() bool {
		for _, n := range cs[0].list.Members() {
			if n.Name == "n1" {
				return false
			}
		}
		return true
	})
	if err := cs[1].Leave(5 * time.Second); err != nil {
		t.Fatalf("n2 leave: %v", err)
	}
	if err := <-left; err != nil {
		t.Fatalf("n1 leave with no one left to tell = %v, want nil", err)
	}
}

// A leave message that did not spread while another member is still
// alive stays an error: that member was not told.
func TestLeaveUntoldMemberIsAnError(t *testing.T) {
	network := &memberlist.MockNetwork{}
	quiet := func(mc *memberlist.Config) {
		mc.GossipInterval, mc.ProbeInterval, mc.PushPullInterval = time.Hour, time.Hour, time.Hour
	}
	var cs []*Cluster
	for i, name := range []string{"n1", "n2"} {
		cfg := Config{Name: name, GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i), Profile: Local,
			Transport: network.NewTransport(name), Logger: slog.New(slog.DiscardHandler), tune: quiet}
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Shutdown() })
		cs = append(cs, c)
	}
	if n, err := cs[1].Join(context.Background(), []string{cs[0].GossipAddr()}); err != nil || n != 1 {
		t.Fatalf("join: %d, %v", n, err)
	}
	eventually(t, "n1 to see two members", func() bool { return len(cs[0].Members()) == 2 })
	if err := cs[0].Leave(100 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("leave with n2 alive and untold = %v, want memberlist's timeout", err)
	}
}

// memberlist closes its sockets before it stops its timers, so a gossip
// round during shutdown may log "use of closed network connection" at
// error: once the node is stopping its gossip that line is debug; before,
// and any other error, keeps its level.
func TestStdLoggerClosedConnectionAtShutdown(t *testing.T) {
	var buf bytes.Buffer
	l, w := newStdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	closed := "[ERR] memberlist: Failed to send gossip to 127.0.0.1:7948: write udp 127.0.0.1:7947->127.0.0.1:7948: use of closed network connection"
	l.Print(closed)
	w.closing.Store(true)
	l.Print(closed)
	l.Print("[ERR] memberlist: Failed to send gossip to 127.0.0.1:7948: write udp: no buffer space available")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"level=ERROR", "level=DEBUG", "level=ERROR"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d: %s, want %s", i, lines[i], w)
		}
	}
}
