package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/internal/poll"
)

// eventually waits up to 10 s for cond: gossip runs on its own timers,
// so this is the one place a test waits.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// startMock starts n nodes on one in-memory memberlist network: no ports.
func startMock(t *testing.T, n int) ([]*Cluster, []string) {
	t.Helper()
	net := &memberlist.MockNetwork{}
	transports := make([]*memberlist.MockTransport, n)
	for i := range transports {
		transports[i] = net.NewTransport(fmt.Sprintf("n%d", i+1))
	}
	var cs []*Cluster
	var addrs []string
	for i := 0; i < n; i++ {
		c, err := New(Config{
			Name:      fmt.Sprintf("n%d", i+1),
			GRPCAddr:  fmt.Sprintf("127.0.0.1:%d", 7070+i),
			Region:    "r1",
			Version:   "test",
			Profile:   Local,
			Transport: transports[i],
			Logger:    slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Shutdown() })
		cs = append(cs, c)
		addrs = append(addrs, c.GossipAddr())
	}
	return cs, addrs
}

func TestJoinMembersAndChanges(t *testing.T) {
	cs, addrs := startMock(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Drain the signal of the node's own join.
	select {
	case <-cs[0].Changes():
	default:
	}
	for _, c := range cs[1:] {
		if n, err := c.Join(ctx, addrs[:1]); err != nil || n != 1 {
			t.Fatalf("join: %d, %v", n, err)
		}
	}
	for _, c := range cs {
		eventually(t, "3 members on "+c.LocalName(), func() bool { return len(c.Members()) == 3 })
	}
	select {
	case <-cs[0].Changes():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signal after joins")
	}
	ms := cs[2].Members()
	for i, m := range ms {
		want := Member{Name: fmt.Sprintf("n%d", i+1), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i), GossipAddr: addrs[i], Region: "r1", Version: "test", State: Alive,
			Instance: cs[i].md.Instance}
		if m != want || len(m.Instance) != 16 {
			t.Errorf("member %d = %+v, want %+v", i, m, want)
		}
	}
	// A graceful leave is seen by the others.
	if err := cs[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cs[2].Leave(time.Second); err != nil { // idempotent
		t.Fatal(err)
	}
	eventually(t, "n3 gone from n1's view", func() bool { return len(cs[0].Members()) == 2 })
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{GRPCAddr: "127.0.0.1:1"}, "name"},
		{Config{Name: "a"}, "grpc_addr"},
		{Config{Name: "a", GRPCAddr: "x:1", BindAddr: "nope"}, "gossip_addr"},
		{Config{Name: "a", GRPCAddr: "x:1", BindAddr: "0.0.0.0:0"}, "advertise_addr"},
		{Config{Name: "a", GRPCAddr: "x:1", Profile: "moon"}, "profile"},
		{Config{Name: "a", GRPCAddr: strings.Repeat("x", 500)}, "metadata"},
	}
	for _, c := range cases {
		_, err := New(c.cfg)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want ErrConfig naming %q", c.cfg, err, c.want)
		}
	}
}

func TestMetaRoundTripAndRefusal(t *testing.T) {
	b, err := encodeMeta(metadata{GRPCAddr: "10.0.0.1:7070", Region: "eu", Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeMeta(b)
	if err != nil || m.GRPCAddr != "10.0.0.1:7070" || m.Region != "eu" || m.V != metaVersion {
		t.Fatalf("decode = %+v, %v", m, err)
	}
	for _, bad := range []string{``, `{}`, `{"v":2,"grpc":"a:1"}`, `{"v":1}`, `nope`} {
		if _, err := decodeMeta([]byte(bad)); !errors.Is(err, errMeta) {
			t.Errorf("decodeMeta(%q) = %v, want errMeta", bad, err)
		}
	}
}

// A flood of memberlist warnings and errors (one per bad packet, which
// anyone who reaches the gossip port can send) writes at most logBurst
// lines a window; the next window says how many were left out.
func TestStdLoggerLimitsFloods(t *testing.T) {
	var buf bytes.Buffer
	w := &slogWriter{l: slog.New(slog.NewTextHandler(&buf, nil)), window: 50 * time.Millisecond, burst: 3}
	l := log.New(w, "", 0)
	for range 1000 {
		l.Printf("[ERR] memberlist: discarding packet with unacceptable label: from=192.0.2.1:7946")
	}
	l.Printf("[DEBUG] memberlist: not limited") // below the handler's level anyway
	if got := strings.Count(buf.String(), "unacceptable label"); got != 3 {
		t.Fatalf("%d of 1000 flooded lines written, want 3:\n%s", got, buf.String())
	}
	time.Sleep(60 * time.Millisecond) // the next window
	l.Printf("[WARN] memberlist: after the flood")
	out := buf.String()
	if !strings.Contains(out, "left_out=997") || !strings.Contains(out, `msg="after the flood"`) {
		t.Fatalf("after the window: want left_out=997 and the new line:\n%s", out)
	}
}

func TestStdLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	l, _ := newStdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Printf("[WARN] memberlist: something odd")
	l.Printf("[DEBUG] memberlist: detail")
	l.Printf("no prefix")
	out := buf.String()
	for _, want := range []string{`level=WARN msg="something odd"`, `level=DEBUG msg=detail`, `level=INFO msg="no prefix"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %q:\n%s", want, out)
		}
	}
}

// The ring's fingerprint, member-set hash and epoch travel in the
// metadata: SetRing on one node shows in the others' Members, and the
// metadata stays far below memberlist's 512 bytes even with the longest
// address, a long region and version, and the largest epoch.
func TestSetRingGossipsTheRing(t *testing.T) {
	cs, addrs := startMock(t, 3)
	for _, c := range cs[1:] {
		if n, err := c.Join(context.Background(), addrs[:1]); err != nil || n != 1 {
			t.Fatalf("join: %d, %v", n, err)
		}
	}
	if err := cs[0].SetRing("0123456789abcdef", "fedcba9876543210", 7, time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ring in n1's metadata to reach the others", func() bool {
		for _, c := range cs[1:] {
			found := false
			for _, m := range c.Members() {
				if m.Name == "n1" && m.RingFingerprint == "0123456789abcdef" && m.RingMembers == "fedcba9876543210" && m.RingEpoch == 7 {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	})
	b, err := encodeMeta(metadata{
		GRPCAddr: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", Region: strings.Repeat("r", 64),
		Version: strings.Repeat("v", 64), RingFP: "0123456789abcdef", RingMembers: "fedcba9876543210", RingEpoch: ^uint64(0),
	})
	if err != nil || len(b) >= 512 {
		t.Fatalf("metadata of %d bytes (%v), want < 512", len(b), err)
	}
}
