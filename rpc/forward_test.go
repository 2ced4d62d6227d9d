package rpc

import (
	"cmp"
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// bufServers starts a Server for each name on an in-process cluster (see
// inprocCluster: each serves on a bufconn listener of its own, no
// sockets, no gossip), with a store of at most 1000 keys: a member's
// GRPCAddr is bufAddr(name). Their member lists are the test's to set.
func bufServers(t testing.TB, names ...string) map[string]*Server {
	t.Helper()
	c := newInproc(t)
	out := map[string]*Server{}
	for _, name := range names {
		out[name] = c.start(NodeConfig{Name: name, Clock: windowClock(), MaxKeys: 1000, NameKeyShare: 100}).Server()
	}
	return out
}

// bufAddr is the address of name's listener in bufServers.
func bufAddr(name string) string { return inprocAddr(name) }

// bufMembers returns the members names, at their bufServers addresses.
func bufMembers(names ...string) []cluster.Member {
	ms := make([]cluster.Member, len(names))
	for i, n := range names {
		ms[i] = cluster.Member{Name: n, GRPCAddr: bufAddr(n), Region: testRegion(), State: cluster.Alive}
	}
	return ms
}

// One forward path: a batched forward (the default) carries the sender's
// ring fingerprint and epoch, so an owner whose ring differs counts the
// sender's view as mismatched (sluice_view_mismatch_total); and a check
// the owner sends on (reforwarded) is counted in its peer stats like any
// forward.
func TestBatchedForwardCarriesRingAndReforwardIsCounted(t *testing.T) {
	ss := bufServers(t, "node1", "node2", "node3")
	// node1's ring lacks node3; node2's and node3's have it.
	if err := ss["node1"].SetMembers(bufMembers("node1", "node2")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node2", "node3"} {
		if err := ss[n].SetMembers(bufMembers("node1", "node2", "node3")); err != nil {
			t.Fatal(err)
		}
	}
	if ss["node1"].RingFingerprint() == ss["node2"].RingFingerprint() {
		t.Fatal("two member sets, one fingerprint")
	}
	// stay: node2's under both rings; moves: node2's under node1's ring,
	// node3's under node2's.
	var stay, moves string
	for i := 0; stay == "" || moves == ""; i++ {
		k := "user:" + strconv.Itoa(i)
		if ss["node1"].Owner("fwd", k) != "node2" {
			continue
		}
		switch ss["node2"].Owner("fwd", k) {
		case "node2":
			stay = cmp.Or(stay, k)
		case "node3":
			moves = cmp.Or(moves, k)
		}
	}
	check := func(k string) *sluicev1.Decision {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := ss["node1"].Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
			{Name: "fwd", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}}}) // batched: no no_batching
		if err != nil {
			t.Fatal(err)
		}
		return resp.Decisions[0]
	}

	if d := check(stay); !d.Allowed || d.Owner != "node2" || d.Degraded {
		t.Fatalf("a key node2 owns: %+v", d)
	}
	st := ss["node2"].Stats()
	if st.ReceivedRPCs != 1 || st.ViewMismatch != 1 {
		t.Fatalf("node2 received %d calls, counted %d view mismatches; want 1, 1 (the batch carries node1's ring)", st.ReceivedRPCs, st.ViewMismatch)
	}
	if p := ss["node1"].Stats().Peers["node2"]; p.Batches != 1 || p.Checks != 1 || p.Errors != 0 {
		t.Fatalf("node1's stats of node2: %+v", p)
	}

	if d := check(moves); !d.Allowed || d.Owner != "node3" || d.Degraded {
		t.Fatalf("a key node2 sends on to node3: %+v", d)
	}
	st = ss["node2"].Stats()
	if st.Reforwarded != 1 || st.ViewMismatch != 2 {
		t.Fatalf("node2 reforwarded %d, counted %d view mismatches; want 1, 2", st.Reforwarded, st.ViewMismatch)
	}
	if p := st.Peers["node3"]; p.Batches != 1 || p.Checks != 1 || p.Errors != 0 || p.Latency <= 0 || st.ForwardRPCs != 1 {
		t.Fatalf("node2's stats of node3: %+v, %d forward calls; want the reforward counted: 1 call, 1 check", p, st.ForwardRPCs)
	}
	if st := ss["node3"].Stats(); st.ReceivedRPCs != 1 || st.ViewMismatch != 0 || st.NotOwnerApplied != 0 {
		t.Fatalf("node3 received %d calls, %d view mismatches, %d decided not as owner; want 1, 0, 0", st.ReceivedRPCs, st.ViewMismatch, st.NotOwnerApplied)
	}
}
