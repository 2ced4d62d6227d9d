package rpc

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A forward that reaches a node whose ring names another owner (the
// sender's ring was behind) is not counted there: the node sends it on
// once, marked reforwarded, and the owner decides; a reforwarded check is
// decided where it lands (never a third hop). Both cases are counted, and
// so is the sender's differing ring view.
func TestForwardToNonOwnerIsReforwardedOnce(t *testing.T) {
	nodes := startInprocCluster(t, 2, windowClock())
	k := keyOwnedBy(t, nodes[0], "refwd", "node2")
	peer1 := nodes[0].peer(t)
	rc := &sluicev1.RateLimitCheck{Name: "refwd", Key: k, Hits: proto.Int64(1), Limit: 5, WindowMs: 60000}

	resp, err := peer1.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "stale", RingFingerprint: "0000000000000000",
		Checks: []*sluicev1.RateLimitCheck{rc, rc}})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range resp.Decisions {
		if d.Owner != "node2" || !d.Allowed || d.Remaining != int64(4-i) || d.Degraded {
			t.Fatalf("decision %d: %+v, want node2 deciding, remaining %d", i, d, 4-i)
		}
	}
	st := nodes[0].Server().Stats()
	if st.Reforwarded != 2 || st.ViewMismatch != 1 || nodes[0].Store().Len() != 0 {
		t.Fatalf("node1: reforwarded %d, view mismatches %d, keys %d; want 2, 1, 0", st.Reforwarded, st.ViewMismatch, nodes[0].Store().Len())
	}

	// Marked reforwarded: node1 decides it although node2 owns the key.
	resp, err = peer1.Forward(context.Background(), &sluicev1.ForwardRequest{Sender: "node2", Reforwarded: true,
		RingFingerprint: nodes[0].Server().RingFingerprint(), Checks: []*sluicev1.RateLimitCheck{rc}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Decisions[0]; d.Owner != "node1" || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("reforwarded: %+v, want node1 deciding with remaining 4", d)
	}
	if st := nodes[0].Server().Stats(); st.NotOwnerApplied != 1 || st.Reforwarded != 2 || st.ViewMismatch != 1 {
		t.Fatalf("node1 after a reforwarded check: %+v", st)
	}
}

// Two nodes whose ring configs differ (partition count) have the same
// member set but different fingerprints: each warns and counts it once,
// having read the other's fingerprint from its metadata; both publish
// their epoch.
func TestRingMismatchIsReported(t *testing.T) {
	clock := windowClock()
	a := startNodeWith(t, "node1", clock, NodeConfig{})
	b := startNodeWith(t, "node2", clock, NodeConfig{Ring: ring.Config{PartitionCount: 101}}, a.GossipAddr())
	eventually(t, "both nodes to report the mismatch", func() bool {
		return a.Server().Stats().RingMismatch >= 1 && b.Server().Stats().RingMismatch >= 1
	})
	if a.Server().RingFingerprint() == b.Server().RingFingerprint() {
		t.Fatal("different partition counts gave one fingerprint")
	}
	if a.Server().Stats().RingEpoch == 0 || b.Server().Stats().RingEpoch == 0 {
		t.Fatal("ring epochs did not advance")
	}
	// Once reported, the same mismatch is not counted again on every
	// membership update.
	n := a.Server().Stats().RingMismatch
	_ = a.Server().SetMembers(a.cluster.Members())
	if got := a.Server().Stats().RingMismatch; got != n {
		t.Fatalf("mismatch counted again: %d -> %d", n, got)
	}
}

// When a key's owner cannot be reached, each check is answered per its
// on_owner_unavailable and marked degraded: allow admits, deny refuses,
// and local (the default) decides from this node's replica of the key, so
// the 7 hits the dead owner had counted (and replicated) still count.
func TestOwnerUnavailablePolicies(t *testing.T) {
	nodes := startInprocCluster(t, 2, windowClock())
	k := keyOwnedBy(t, nodes[0], "policy", "node2")
	rc := func(p sluicev1.OwnerUnavailablePolicy) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "policy", Key: k, Hits: proto.Int64(1), Limit: 10, WindowMs: 60000, OnOwnerUnavailable: p}
	}
	for range 7 {
		if d := check(t, nodes[0].client, rc(0)); !d.Allowed || d.Owner != "node2" || d.Degraded {
			t.Fatalf("before the kill: %+v", d)
		}
	}
	key := string(ring.Key(nil, "policy", k))
	eventually(t, "node1 to hold node2's replica of the key", func() bool {
		st, ok := nodes[0].Server().replicas.Get(key)
		return ok && !st.IsZero()
	})
	nodes[1].Kill()
	if d := check(t, nodes[0].client, rc(sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW)); !d.Allowed || !d.Degraded || d.Owner != "node1" {
		t.Fatalf("allow: %+v, want allowed and degraded", d)
	}
	if d := check(t, nodes[0].client, rc(sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY)); d.Allowed || !d.Degraded || d.Owner != "node1" {
		t.Fatalf("deny: %+v, want denied and degraded", d)
	}
	d := check(t, nodes[0].client, rc(sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED))
	// node1 may have seen node2 die meanwhile and taken the key over from
	// its replica: then the decision is its own, not degraded, and counts
	// the same.
	if !d.Allowed || d.Owner != "node1" || d.Remaining != 2 {
		t.Fatalf("local: %+v, want allowed by node1 with remaining 2 (7 replicated hits + this one)", d)
	}
	if st := nodes[0].Server().Stats(); st.Degraded < 2 {
		t.Fatalf("degraded answers counted: %d, want >= 2", st.Degraded)
	}
}
