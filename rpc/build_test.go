package rpc

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// A node's build is in its /metrics (sluice_build_info, 1, labelled with
// the version, the revision and the Go version) and in its gossiped
// metadata: the other members list its version.
func TestBuildInfoInMetricsAndMembers(t *testing.T) {
	clock := windowClock()
	n1 := startNodeCfg(t, NodeConfig{Name: "node1", Clock: clock, HTTPAddr: "127.0.0.1:0", Version: "v9.9.9-test", Revision: "0123abcd"})
	n2 := startNodeCfg(t, NodeConfig{Name: "node2", Clock: clock, Version: "v9.9.8", Join: []string{n1.GossipAddr()}})
	waitRingAgrees(t, []*testNode{n1, n2})

	code, out := httpDo(t, "GET", "http://"+n1.HTTPAddr()+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	want := `sluice_build_info{goversion="` + runtime.Version() + `",revision="0123abcd",version="v9.9.9-test"} 1`
	if !strings.Contains(out, want+"\n") {
		t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(out, "sluice_build_info"))
	}

	resp, err := n2.client.Members(context.Background(), &sluicev1.MembersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range resp.Members {
		got[m.Name] = m.Version
	}
	if got["node1"] != "v9.9.9-test" || got["node2"] != "v9.9.8" {
		t.Fatalf("versions as node2 sees them: %v, want node1 v9.9.9-test, node2 v9.9.8", got)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
