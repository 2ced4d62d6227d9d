package rpc

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// The test over real RPCs: with a key cap of 10000 and the default
// policy (deny), 20000 new keys in the victim's name within the window do
// not give an exhausted victim one extra admit. The new keys past the cap
// (or past the name's share) are answered not allowed and degraded, and
// counted in the stats and /metrics. Under evict the same kind of flood
// does give the victim a fresh budget.
func TestKeyCapFloodOverRPC(t *testing.T) {
	// checkEach: the victim is checked after every batch (its checks keep
	// it recently used, so even evict keeps it) or only after the flood.
	// untilEvicted: flood (up to 50 times flood) until the victim's state
	// is gone.
	run := func(cfg NodeConfig, flood int, checkEach, untilEvicted bool) (extra, refused int, n *testNode) {
		n = startNodeCfg(t, cfg)
		victim := inline("api", "victim")
		for range 3 {
			check(t, n.client, victim)
		}
		if check(t, n.client, victim).Allowed {
			t.Fatal("the victim is not exhausted after 3 hits of 3")
		}
		vk := string(ring.Key(nil, "api", "victim"))
		for b := 0; b < flood/MaxBatch || untilEvicted && b < 50*flood/MaxBatch; b++ {
			if _, held := n.Store().Get(vk); untilEvicted && !held {
				break
			}
			req := &sluicev1.CheckRequest{}
			for i := range MaxBatch {
				req.Checks = append(req.Checks, inline("api", fmt.Sprintf("attacker-%d-%d", b, i)))
			}
			resp, err := n.client.Check(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range resp.Decisions {
				switch {
				case d.Degraded && !d.Allowed:
					refused++
				case d.Degraded || !d.Allowed:
					t.Fatalf("a new key answered %v", d)
				}
			}
			if checkEach && check(t, n.client, victim).Allowed {
				extra++
			}
		}
		if check(t, n.client, victim).Allowed {
			extra++
		}
		return extra, refused, n
	}
	extra, refused, n := run(NodeConfig{Name: "deny", Clock: windowClock(), MaxKeys: 10_000, HTTPAddr: "127.0.0.1:0"}, 20_000, true, false)
	if extra != 0 {
		t.Fatalf("deny: the exhausted victim got %d extra admits", extra)
	}
	st := n.Server().Stats()
	// The inline names' share is half the cap (a little more: it is
	// rounded up per shard).
	if refused < 20_000-5_000-256 || st.KeysRefused != int64(refused) || st.EvictedLive != 0 || n.Store().Len() > 5_000+256+1 {
		t.Fatalf("deny: %d refused, stats %+v, %d keys held", refused, st, n.Store().Len())
	}
	if code, out := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", ""); code != 200 || !strings.Contains(out, fmt.Sprintf("sluice_keys_refused_total %d\n", refused)) {
		t.Fatalf("metrics: no sluice_keys_refused_total %d", refused)
	}
	extra, refused, n = run(NodeConfig{Name: "evict", Clock: windowClock(), MaxKeys: 10_000, OnKeyCap: window.KeyCapEvict, NameKeyShare: 100}, 20_000, false, true)
	if extra == 0 || refused != 0 || n.Server().Stats().EvictedLive == 0 {
		t.Fatalf("evict: %d extra admits, %d refused, stats %+v: the flood should evict the victim", extra, refused, n.Server().Stats())
	}
}

// The per-name share: a configured name that holds its share gets its new
// keys refused while another configured name still gets room; inline names
// all count as one.
func TestNameKeyShareOverRPC(t *testing.T) {
	src := mustParseLimits(t, testLimits)
	n := startNodeCfg(t, NodeConfig{Name: "node1", Clock: windowClock(), MaxKeys: 8192, NameKeyShare: 25, Limits: src})
	flood := func(name, prefix string, k int) (refused int) {
		req := &sluicev1.CheckRequest{}
		for i := range k {
			req.Checks = append(req.Checks, named(name, fmt.Sprint(prefix, i)))
		}
		resp, err := n.client.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range resp.Decisions {
			if d.Degraded {
				refused++
			}
		}
		return refused
	}
	// A share of 2048 keys: 8 per shard.
	if r := flood("api", "a", 1000) + flood("api", "b", 1000) + flood("api", "c", 1000) + flood("api", "d", 1000); r < 4000-2048-256 {
		t.Fatalf("api: %d of 4000 new keys refused over a share of 2048", r)
	}
	if r := flood("signup", "e", 300); r != 0 {
		t.Fatalf("signup: %d of 300 new keys refused while api holds only its share", r)
	}
	group := nameGroup(src)
	for _, tc := range []struct{ name, want string }{{"api", "api"}, {"signup", "signup"}, {"made-up", InlineName}, {"", InlineName}} {
		if got := group(string(ring.Key(nil, tc.name, "k"))); got != tc.want {
			t.Errorf("group of %q = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := group("\xff"); got != InlineName {
		t.Errorf("group of a bad encoding = %q", got)
	}
}
