package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// table returns the routing table a node of a 3-member ring on the given
// addresses would serve.
func table(t *testing.T, names, addrs []string) *sluicev1.RoutingTable {
	t.Helper()
	cfg := ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}
	rg, err := ring.New(names, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt := &sluicev1.RoutingTable{RingFingerprint: rg.Fingerprint(), PartitionCount: 271, ReplicationFactor: 20, Load: 1.25,
		Hash: "xxhash64", Library: ring.Library}
	for i, n := range names {
		rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: n, GrpcAddr: addrs[i]})
	}
	return rt
}

func TestOwnerTableMapsMembersToConnections(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	names := []string{"n1", "n2", "n3"}
	ot := &ownerTarget{sluiceTarget: &sluiceTarget{addrs: addrs, names: names}}
	// The table lists the members in another order than -addrs.
	rt := table(t, []string{"n3", "n1", "n2"}, []string{addrs[2], addrs[0], addrs[1]})
	tb, err := ot.build(rt)
	if err != nil {
		t.Fatal(err)
	}
	if tb.fp != rt.RingFingerprint || tb.node["n1"] != 0 || tb.node["n2"] != 1 || tb.node["n3"] != 2 {
		t.Fatalf("table %+v", tb)
	}
	// Owners agree with a ring built the same way.
	rg, _ := ring.New(names, ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25})
	for _, k := range []string{"k0", "k1", "k99999", "w4k3"} {
		if got, want := tb.ring.Owner(ring.Key(nil, "tw_w1", k)), rg.Owner(ring.Key(nil, "tw_w1", k)); got != want {
			t.Errorf("owner of %s: %s, want %s", k, got, want)
		}
	}
}

func TestOwnerTableRefusesWhatItCannotRebuild(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	names := []string{"n1", "n2", "n3"}
	ot := &ownerTarget{sluiceTarget: &sluiceTarget{addrs: addrs, names: names}}
	for _, tc := range []struct {
		name string
		edit func(*sluicev1.RoutingTable)
		want string
	}{
		{"fingerprint", func(rt *sluicev1.RoutingTable) { rt.RingFingerprint = "0000000000000000" }, "fingerprint"},
		{"partitions", func(rt *sluicev1.RoutingTable) { rt.PartitionCount = 272 }, "fingerprint"},
		{"hash", func(rt *sluicev1.RoutingTable) { rt.Hash = "fnv" }, "hash"},
		{"library", func(rt *sluicev1.RoutingTable) { rt.Library = "buraksezer/consistent@v0.9.0" }, "library"},
		{"address", func(rt *sluicev1.RoutingTable) { rt.Members[1].GrpcAddr = "127.0.0.1:9" }, "not one of -addrs"},
		{"name", func(rt *sluicev1.RoutingTable) { rt.Members[0].GrpcAddr, rt.Members[1].GrpcAddr = addrs[1], addrs[0] }, "-names calls"},
	} {
		rt := table(t, names, addrs)
		tc.edit(rt)
		if _, err := ot.build(rt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
