package cluster

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
)

// rogueDelegate gossips fixed metadata.
type rogueDelegate struct{ meta []byte }

func (d *rogueDelegate) NodeMeta(int) []byte                 { return d.meta }
func (d *rogueDelegate) NotifyMsg([]byte)                    {}
func (d *rogueDelegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (d *rogueDelegate) LocalState(bool) []byte              { return nil }
func (d *rogueDelegate) MergeRemoteState(buf []byte, _ bool) {}

// A node with a bad name or bad metadata (speaking memberlist itself, on
// the in-memory network) never becomes a member: the sluice node refuses
// to merge it in when it joins and ignores its alive messages after, and a
// good node that joins later sees the good members only.
func TestBadMetadataNeverJoins(t *testing.T) {
	// Every transport is made before any node runs: MockNetwork's maps
	// are not safe for adding a transport while others look peers up
	// (the race detector caught it once).
	network := &memberlist.MockNetwork{}
	goodT, good2T := network.NewTransport("good1"), network.NewTransport("good2")
	var rogueT []*memberlist.MockTransport
	for i := range 11 {
		rogueT = append(rogueT, network.NewTransport(fmt.Sprint("rogue", i)))
	}
	good, err := New(Config{Name: "good1", GRPCAddr: "127.0.0.1:7070", Region: "r1", Version: "v1.0.0", Profile: Local,
		Transport: goodT, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = good.Shutdown() })
	long := strings.Repeat("x", 400)
	rogues := []struct{ name, meta string }{
		{"v2", `{"v":2,"grpc":"10.0.0.9:7070","region":"r1"}`},
		{"no-grpc", `{"v":1,"region":"r1"}`},
		{"bad-port", `{"v":1,"grpc":"10.0.0.9:0","region":"r1"}`},
		{"bad-host", `{"v":1,"grpc":"evil host!:7070","region":"r1"}`},
		{"bad-region", `{"v":1,"grpc":"10.0.0.9:7070","region":"r1\n[ERROR] forged log line"}`},
		{"bad-version", `{"v":1,"grpc":"10.0.0.9:7070","region":"r1","version":"` + long[:100] + `"}`},
		{"bad-ring", `{"v":1,"grpc":"10.0.0.9:7070","region":"r1","rf":"not hex at all!"}`},
		{"not-json", `nope`},
		{"too-big", `{"v":1,"grpc":"10.0.0.9:7070","region":"r1","version":"` + long + `"}`},
		{"bad name", `{"v":1,"grpc":"10.0.0.9:7070","region":"r1"}`},
		{strings.Repeat("n", 129), `{"v":1,"grpc":"10.0.0.9:7070","region":"r1"}`},
	}
	if len(rogues) != len(rogueT) {
		t.Fatalf("%d rogues, %d transports", len(rogues), len(rogueT))
	}
	for i, r := range rogues {
		mc := memberlist.DefaultLocalConfig()
		mc.Name = r.name
		mc.Transport = rogueT[i]
		mc.Delegate = &rogueDelegate{meta: []byte(r.meta)}
		mc.Logger = log.New(io.Discard, "", 0)
		ml, err := memberlist.Create(mc)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		t.Cleanup(func() { _ = ml.Shutdown() })
		// The rogue's side of the push/pull completes (it hears of the
		// good node), but the good node refuses to merge the rogue in.
		_, _ = ml.Join([]string{good.GossipAddr()})
	}
	// A good node joins after the rogues: once it is a member, gossip has
	// had every chance to spread them; none is a member anywhere.
	good2, err := New(Config{Name: "good2", GRPCAddr: "127.0.0.1:7071", Region: "r1", Version: "v1.0.0", Profile: Local,
		Transport: good2T, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = good2.Shutdown() })
	if _, err := good2.Join(t.Context(), []string{good.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	names := func(c *Cluster) []string {
		var out []string
		for _, m := range c.Members() {
			out = append(out, m.Name)
		}
		return out
	}
	eventually(t, "good2 to see good1", func() bool { return slices.Equal(names(good2), []string{"good1", "good2"}) })
	eventually(t, "good1 to see good2", func() bool { return slices.Equal(names(good), []string{"good1", "good2"}) })
	if got := good.list.NumMembers(); got != 2 {
		t.Fatalf("memberlist holds %d nodes, want 2: a rogue got in", got)
	}
	if good.Refused() < int64(len(rogues)) {
		t.Fatalf("%d refusals counted for %d rogues", good.Refused(), len(rogues))
	}
}

// A node refuses to start with metadata the others would refuse.
func TestOwnBadMetadataRefusedAtStart(t *testing.T) {
	network := &memberlist.MockNetwork{}
	for _, cfg := range []Config{
		{Name: "a b", GRPCAddr: "127.0.0.1:7070", Region: "r1"},
		{Name: "n", GRPCAddr: "127.0.0.1:7070", Region: "eu west"},
		{Name: "n", GRPCAddr: "127.0.0.1", Region: "r1"},
	} {
		cfg.Profile, cfg.Transport, cfg.Logger = Local, network.NewTransport(cfg.Name), slog.New(slog.DiscardHandler)
		if c, err := New(cfg); err == nil {
			_ = c.Shutdown()
			t.Errorf("%+v: started", cfg)
		}
	}
}
