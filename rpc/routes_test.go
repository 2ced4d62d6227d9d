package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// Every node serves the same routing table for one ring: its members with
// the addresses they advertise, the ring's config and fingerprint; a
// check answers with the table only when the client routed it by another.
func TestRoutesServeTheRingAndCorrectStaleClients(t *testing.T) {
	nodes := startCluster(t, 3, windowClock())
	ctx := context.Background()
	addrs := map[string]string{}
	for _, n := range nodes {
		addrs[n.Name()] = n.GRPCAddr()
	}
	var first *sluicev1.RoutingTable
	for _, n := range nodes {
		rt, err := n.client.Routes(ctx, &sluicev1.RoutesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if rt.Self != n.Name() || rt.RingFingerprint != n.Server().RingFingerprint() || rt.Hash != RouteHash ||
			rt.Library != ring.Library || rt.PartitionCount != ring.DefaultPartitionCount ||
			rt.ReplicationFactor != ring.DefaultReplicationFactor || rt.Load != ring.DefaultLoad || len(rt.Members) != 3 {
			t.Fatalf("%s's table: %v", n.Name(), rt)
		}
		for i, m := range rt.Members {
			if m.GrpcAddr != addrs[m.Name] || (i > 0 && rt.Members[i-1].Name >= m.Name) {
				t.Fatalf("%s's table lists %v", n.Name(), rt.Members)
			}
		}
		// The ring a client builds from it places keys as the node does.
		r, err := ring.New([]string{rt.Members[0].Name, rt.Members[1].Name, rt.Members[2].Name},
			ring.Config{PartitionCount: int(rt.PartitionCount), ReplicationFactor: int(rt.ReplicationFactor), Load: rt.Load, Regions: rt.Regions})
		if err != nil || r.Fingerprint() != rt.RingFingerprint {
			t.Fatalf("a ring from the table: %v, fingerprint %s, want %s", err, r.Fingerprint(), rt.RingFingerprint)
		}
		if first == nil {
			first = rt
		} else if rt.RingFingerprint != first.RingFingerprint || !proto.Equal(rt.Members[0], first.Members[0]) {
			t.Fatalf("%s serves %v, node1 %v", n.Name(), rt, first)
		}
	}

	rc := &sluicev1.RateLimitCheck{Name: "routes", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000}
	for _, tc := range []struct {
		fp        string
		wantTable bool
	}{
		{"", false},                    // a client that routes nothing
		{first.RingFingerprint, false}, // a fresh table
		{"-", true},                    // no table yet
		{"0123456789abcdef", true},     // a stale table
	} {
		resp, err := nodes[1].client.Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc}, RoutingFingerprint: tc.fp})
		if err != nil || len(resp.Decisions) != 1 || !resp.Decisions[0].Allowed {
			t.Fatalf("fingerprint %q: %v %v", tc.fp, resp, err)
		}
		if got := resp.Routes != nil; got != tc.wantTable || (got && resp.Routes.RingFingerprint != first.RingFingerprint) {
			t.Fatalf("fingerprint %q: routes %v, want a table: %v", tc.fp, resp.Routes, tc.wantTable)
		}
	}
	// Four checks, each counted once, whatever the fingerprint said.
	if d := check(t, nodes[2].client, rc); d.Remaining != 5 {
		t.Fatalf("remaining %d after 5 checks, want 5", d.Remaining)
	}
}

// GET /v1/routes answers the table in JSON; another method gets 405.
func TestHTTPRoutes(t *testing.T) {
	n := startInproc(t, NodeConfig{Name: "node1", HTTPAddr: "127.0.0.1:0"})[0]
	code, out := n.httpDo(t, "GET", "http://"+n.HTTPAddr()+"/v1/routes", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/routes = %d %s", code, out)
	}
	var rt sluicev1.RoutingTable
	if err := protojson.Unmarshal([]byte(out), &rt); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rt.Self != "node1" || len(rt.Members) != 1 || rt.Members[0].GrpcAddr != n.GRPCAddr() || rt.RingFingerprint == "" {
		t.Fatalf("GET /v1/routes: %s", out)
	}
	if code, out := n.httpDo(t, "POST", "http://"+n.HTTPAddr()+"/v1/routes", "{}"); code != http.StatusMethodNotAllowed || !strings.Contains(out, "use GET") {
		t.Fatalf("POST /v1/routes = %d %s", code, out)
	}
}
