package rpc

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// adminLimits is the named limit the admin tests count under: 10 an hour.
func adminLimits(t *testing.T) *limits.Source {
	t.Helper()
	set, err := limits.Parse("limits.yaml", []byte("limits:\n  admin:\n    limit: 10\n    window: 1h\n    overrides:\n      - key_prefix: \"vip:\"\n        limit: 50\n"))
	if err != nil {
		t.Fatal(err)
	}
	return limits.Static(set)
}

// adminClient returns an AdminService client of n (plaintext, from
// loopback).
func adminClient(t *testing.T, n *testNode) sluicev1.AdminServiceClient {
	return sluicev1.NewAdminServiceClient(dialConn(t, n.GRPCAddr()))
}

// resetsCounted returns n's sluice_admin_resets_total{result}.
func resetsCounted(t *testing.T, n *testNode, result string) float64 {
	t.Helper()
	mfs, err := n.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != adminResetsName {
			continue
		}
		for _, m := range mf.GetMetric() {
			if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "result" && l.GetValue() == result }) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s{result=%q} not on %s's /metrics", adminResetsName, result, n.Name())
	return 0
}

// Done when (issue 22): a key filled to its limit through checks on the
// three nodes of a cluster (replication factor 1) and reset through the
// node that is neither its owner nor its replica is fresh on every node
// that may answer for it: the owner's window starts afresh (an inspect
// shows 0 counted, the full limit remaining), the replica's copy of 10
// hits is gone and the copy sent after is fresh, and once the owner is
// killed the member that takes the key over (from that copy) admits
// exactly the limit again: every allowed answer counted, before and
// after. The reset is counted on the node asked and answered complete,
// each node saying what it held before.
func TestAdminResetStartsAKeyAfreshOnEveryNode(t *testing.T) {
	clock := windowClock() // one fixed window of an hour for the whole test
	cfg := NodeConfig{ForwardTimeout: time.Second, HandOffTimeout: 40 * time.Second, Limits: adminLimits(t),
		Replication: ReplicationConfig{Factor: 1, Interval: 20 * time.Millisecond}}
	if regionsUnderTest != nil {
		t.Skip("with SLUICE_TEST_REGIONS a region of no node is configured: a reset is incomplete there (TestAdminResetInEveryRegion is this test's regions)")
	}
	nodes := []*testNode{startNodeWith(t, "node1", clock, cfg)}
	for _, name := range []string{"node2", "node3"} {
		nodes = append(nodes, startNodeWith(t, name, clock, cfg, nodes[0].GossipAddr()))
	}
	waitRingsAgreeOnKeys(t, nodes)
	byName := map[string]*testNode{}
	for _, n := range nodes {
		byName[n.Name()] = n
	}
	const key = "user:42"
	sk := string(ring.Key(nil, "admin", key))
	v := nodes[0].Server().view.Load()
	owner := byName[v.ring.Owner([]byte(sk))]
	replicaNode := byName[v.ring.SuccessorsOf(owner.Name(), 1)[0]]
	var entry *testNode
	for _, n := range nodes {
		if n != owner && n != replicaNode {
			entry = n
		}
	}
	t.Logf("owner %s, replica %s, reset through %s", owner.Name(), replicaNode.Name(), entry.Name())

	named := &sluicev1.RateLimitCheck{Name: "admin", Key: key}
	allowedOf := func(via []*testNode, n int) (allowed int) {
		for i := range n {
			if check(t, via[i%len(via)].client, named).Allowed {
				allowed++
			}
		}
		return allowed
	}
	if got := allowedOf(nodes, 13); got != 10 {
		t.Fatalf("before the reset: %d of 13 checks allowed, want the limit, 10", got)
	}
	eventually(t, "the replica's copy to hold the 10 hits", func() bool {
		e, ok := replicaNode.Server().replicas.Peek(sk)
		return ok && e.State.Describe(clock.Now()).Count == 10
	})

	resp, err := adminClient(t, entry).ResetKey(context.Background(), &sluicev1.ResetKeyRequest{Name: "admin", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Complete || resp.AnsweredBy != entry.Name() || len(resp.Regions) != 1 {
		t.Fatalf("reset: %v", resp)
	}
	rk := resp.Regions[0]
	if rk.Owner != owner.Name() || !slices.Equal(rk.Replicas, []string{replicaNode.Name()}) || len(rk.Nodes) != 3 {
		t.Fatalf("reset's region: %v", rk)
	}
	held := map[string]*sluicev1.KeyHolding{}
	for _, h := range rk.Nodes {
		if h.Error != "" {
			t.Fatalf("node %s: %s", h.Node, h.Error)
		}
		held[h.Node] = h
	}
	if h := rk.Nodes[0]; h.Node != owner.Name() || h.Role != "owner" || h.Window.GetCount() != 10 || h.Window.GetLimit() != 10 || h.Window.GetRemaining() != 0 ||
		h.Window.GetAlgorithm() != sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW || h.Window.GetWindowMs() != 3_600_000 {
		t.Fatalf("the owner held before the reset: %v", h)
	}
	if h := held[replicaNode.Name()]; h.Role != "replica" || h.Copy.GetCount() != 10 || h.CopyOwner != owner.Name() || h.Window != nil {
		t.Fatalf("the replica held before the reset: %v", h)
	}
	if h := held[entry.Name()]; h.Role != "member" || !holdsNothing(h) {
		t.Fatalf("the entry node held before the reset: %v", h)
	}
	if got := resetsCounted(t, entry, "complete"); got != 1 {
		t.Fatalf("%s complete on %s: %v, want 1", adminResetsName, entry.Name(), got)
	}

	// Fresh on the owner: nothing counted, the whole limit left.
	ins, err := adminClient(t, entry).InspectKey(context.Background(), &sluicev1.InspectKeyRequest{Name: "admin", Key: key, Replicas: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := ins.Regions[0]; r.Owner != owner.Name() || len(r.Nodes) != 2 || r.Nodes[0].Window.GetCount() != 0 || r.Nodes[0].Window.GetRemaining() != 10 || r.Nodes[1].Copy.GetCount() != 0 {
		t.Fatalf("inspect after the reset: %v", ins)
	}
	// The replica gets the fresh state from the replication loop (the
	// owner marked the key changed): a copy of nothing counted.
	eventually(t, "the replica's copy to be the fresh state", func() bool {
		e, ok := replicaNode.Server().replicas.Peek(sk)
		return ok && e.State.Describe(clock.Now()).Count == 0
	})

	// Fresh on the replica: the owner dies; the member that takes the key
	// over admits the whole limit.
	owner.Kill()
	survivors := slices.DeleteFunc(slices.Clone(nodes), func(n *testNode) bool { return n == owner })
	eventually(t, "the survivors to agree on a ring without the owner", func() bool { return ringsAgree(survivors) })
	allowed, deciders := 0, map[string]bool{}
	for i := range 15 {
		d := check(t, survivors[i%2].client, named)
		if d.Allowed {
			allowed++
		}
		deciders[d.Owner] = true
	}
	if allowed != 10 {
		t.Fatalf("after the owner died: %d of 15 checks allowed (decided by %v), want the full limit, 10", allowed, deciders)
	}
	if deciders[owner.Name()] {
		t.Fatalf("the dead owner decided checks: %v", deciders)
	}
}

// The admin API refuses bad input naming the field, answers a key no
// node holds with its owner and nothing else, and lists the named limits
// in force, on gRPC and on the HTTP face, to a caller on loopback of a
// node with no credential configured.
func TestAdminInspectValidateAndList(t *testing.T) {
	n := startNodeWith(t, "node1", windowClock(), NodeConfig{Limits: adminLimits(t), HTTPAddr: "127.0.0.1:0"})
	// With the node's codec, which sends a string that is not UTF-8 as it
	// is (gRPC's own refuses to).
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), codecDialOption)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := sluicev1.NewAdminServiceClient(conn)
	for _, tc := range []struct {
		name, key, field string
	}{
		{"", "k", "name"},
		{strings.Repeat("n", MaxNameBytes+1), "k", "name"},
		{"admin", "", "key"},
		{"admin", strings.Repeat("k", MaxKeyBytes+1), "key"},
		{"admin", "bad\xff", "key"},
	} {
		_, err := c.InspectKey(context.Background(), &sluicev1.InspectKeyRequest{Name: tc.name, Key: tc.key})
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+":") {
			t.Errorf("inspect %q %q: %v, want INVALID_ARGUMENT naming %s", tc.name, tc.key, err, tc.field)
		}
		_, err = c.ResetKey(context.Background(), &sluicev1.ResetKeyRequest{Name: tc.name, Key: tc.key})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("reset %q %q: %v, want INVALID_ARGUMENT", tc.name, tc.key, err)
		}
	}
	ins, err := c.InspectKey(context.Background(), &sluicev1.InspectKeyRequest{Name: "admin", Key: "nobody", AllMembers: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ins.Regions) != 1 || ins.Regions[0].Owner != "node1" || len(ins.Regions[0].Nodes) != 1 || !holdsNothing(ins.Regions[0].Nodes[0]) {
		t.Fatalf("a key nobody holds: %v", ins)
	}
	// An override's numbers: a vip key is limited at 50.
	check(t, n.client, &sluicev1.RateLimitCheck{Name: "admin", Key: "vip:1"})
	ins, err = c.InspectKey(context.Background(), &sluicev1.InspectKeyRequest{Name: "admin", Key: "vip:1"})
	if w := ins.GetRegions()[0].GetNodes()[0].GetWindow(); err != nil || w.GetLimit() != 50 || w.GetRemaining() != 49 || w.GetCount() != 1 {
		t.Fatalf("an override's key: %v, %v", ins, err)
	}

	list, err := c.ListLimits(context.Background(), &sluicev1.ListLimitsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Limits) != 1 || list.Limits[0].Name != "admin" || list.Limits[0].Numbers.GetLimit() != 10 || list.Limits[0].Numbers.GetWindowMs() != 3_600_000 ||
		len(list.Limits[0].Overrides) != 1 || list.Limits[0].Overrides[0].KeyPrefix != "vip:" || list.Limits[0].Overrides[0].Numbers.GetLimit() != 50 {
		t.Fatalf("ListLimits: %v", list)
	}

	// The HTTP face: the same calls under /v1/admin/.
	base := "http://" + n.HTTPAddr()
	get := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
		return resp.StatusCode, m
	}
	if code, m := get("GET", "/v1/admin/limits", ""); code != 200 || m["limits"].([]any)[0].(map[string]any)["name"] != "admin" {
		t.Fatalf("GET /v1/admin/limits: %d %v", code, m)
	}
	if code, m := get("POST", "/v1/admin/key/inspect", `{"name":"admin","key":"vip:1"}`); code != 200 || m["regions"].([]any)[0].(map[string]any)["owner"] != "node1" {
		t.Fatalf("POST /v1/admin/key/inspect: %d %v", code, m)
	}
	if code, m := get("POST", "/v1/admin/key/reset", `{"name":"admin","key":""}`); code != 400 || !strings.HasPrefix(m["message"].(string), "key:") {
		t.Fatalf("POST /v1/admin/key/reset of an empty key: %d %v", code, m)
	}
	if code, m := get("POST", "/v1/admin/key/reset", `{"name":"admin","key":"vip:1"}`); code != 200 || m["complete"] != true {
		t.Fatalf("POST /v1/admin/key/reset: %d %v", code, m)
	}
	if code, _ := get("GET", "/v1/admin/key/reset", ""); code != 405 {
		t.Fatalf("GET /v1/admin/key/reset: %d, want 405", code)
	}
	if d := check(t, n.client, &sluicev1.RateLimitCheck{Name: "admin", Key: "vip:1"}); d.Remaining != 49 {
		t.Fatalf("after the HTTP reset: remaining %d, want 49 (50, one hit)", d.Remaining)
	}
}

// On a node that authenticates clients by token, the admin API takes its
// admin token, on gRPC and HTTP, and refuses a check token (even "*") and
// no token with PERMISSION_DENIED naming what it needs; the admin token
// checks nothing.
func TestAdminTokensOnATokenNode(t *testing.T) {
	dir := t.TempDir()
	tokens, admins := filepath.Join(dir, "tokens"), filepath.Join(dir, "admin-tokens")
	const checkTok, adminTok = "check-token-0123456789", "admin-token-0123456789"
	if err := os.WriteFile(tokens, []byte(checkTok+" *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(admins, []byte(adminTok+" ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNodeWith(t, "node1", windowClock(), NodeConfig{Limits: adminLimits(t), TokenFile: tokens, AdminTokenFile: admins, HTTPAddr: "127.0.0.1:0"})
	c := adminClient(t, n)
	with := func(tok string) context.Context {
		if tok == "" {
			return context.Background()
		}
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	for _, tc := range []struct {
		tok  string
		want codes.Code
		msg  string
	}{
		{"", codes.PermissionDenied, "--admin-token-file"},
		{checkTok, codes.PermissionDenied, "not an admin's"},
		{adminTok, codes.OK, ""},
	} {
		_, err := c.ListLimits(with(tc.tok), &sluicev1.ListLimitsRequest{})
		if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("ListLimits with %q: %v, want %s %q", tc.tok, err, tc.want, tc.msg)
		}
	}
	_, err := n.client.Check(with(adminTok), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "admin", Key: "k"}}})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "admin API only") {
		t.Fatalf("a check with the admin token: %v", err)
	}
	for _, tc := range []struct {
		tok  string
		want int
	}{{"", 403}, {checkTok, 403}, {adminTok, 200}} {
		req, _ := http.NewRequest("GET", "http://"+n.HTTPAddr()+"/v1/admin/limits", nil)
		if tc.tok != "" {
			req.Header.Set("Authorization", "Bearer "+tc.tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET /v1/admin/limits with %q: %d, want %d", tc.tok, resp.StatusCode, tc.want)
		}
	}
}

// asOperator is the context of an admin call made from loopback on a node
// with no admin credential configured (the in-process harness's calls
// come from no address).
func asOperator() context.Context {
	return grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}})
}

// With regions, a reset reaches the key's owner in every region: a key
// used up under scope regional in each of two regions, under exact (in the
// home region) and under global (fixed slices), reset through the node of
// the second region, admits again in each region what it admitted first.
// A region with no live member makes the reset incomplete, saying so.
func TestAdminResetInEveryRegion(t *testing.T) {
	clock := windowClock()
	byRegion := startRegions(t, "a,b", 1, NodeConfig{Clock: clock, LeaseBase: 1})
	keys := []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "regional", Limit: 4, WindowMs: 3_600_000, Scope: sluicev1.Scope_SCOPE_REGIONAL},
		{Name: "api", Key: "exact", Limit: 5, WindowMs: 3_600_000, Scope: sluicev1.Scope_SCOPE_EXACT},
		{Name: "api", Key: "global", Limit: 6, WindowMs: 3_600_000, Scope: sluicev1.Scope_SCOPE_GLOBAL},
	}
	counts := func() map[string]int {
		out := map[string]int{}
		for _, rc := range keys {
			for _, r := range []string{"a", "b"} {
				got, _ := countAllowed(t, byRegion[r], rc, 8)
				out[rc.Key+"@"+r] = got
			}
		}
		return out
	}
	first := counts()
	want := map[string]int{"regional@a": 4, "regional@b": 4, "exact@a": 5, "exact@b": 0, "global@a": 3, "global@b": 3}
	for k, n := range want {
		if first[k] != n {
			t.Fatalf("before the reset: %v, want %v", first, want)
		}
	}
	svc := newAdminService(byRegion["b"][0].srv, nil, nil, "", nil)
	for _, rc := range keys {
		resp, err := svc.ResetKey(asOperator(), &sluicev1.ResetKeyRequest{Name: rc.Name, Key: rc.Key})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Complete || len(resp.Regions) != 2 || resp.Regions[0].Region != "b" || resp.Regions[1].Region != "a" ||
			resp.Regions[0].Owner != "b-1" || resp.Regions[1].Owner != "a-1" {
			t.Fatalf("reset of %s: %v", rc.Key, resp)
		}
	}
	if again := counts(); !maps.Equal(again, first) {
		t.Fatalf("after the reset: %v, want what the regions admitted first, %v", again, first)
	}
	// Region b's node gone: a reset through a is incomplete and says so.
	byRegion["b"][0].Kill()
	byRegion["a"][0].c.join()
	resp, err := newAdminService(byRegion["a"][0].srv, nil, nil, "", nil).ResetKey(asOperator(), &sluicev1.ResetKeyRequest{Name: "api", Key: "regional"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Complete || len(resp.Regions) != 2 || resp.Regions[1].Region != "b" || !strings.Contains(resp.Regions[1].Error, "no live member") || resp.Regions[0].Error != "" {
		t.Fatalf("a reset with region b down: %v", resp)
	}
}
