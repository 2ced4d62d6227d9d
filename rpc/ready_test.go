package rpc

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/sluicev1"

	"github.com/sluicehq/sluice/internal/testnet"
)

// healthServices are the services a node with RLS reports on.
var healthServices = []string{"", sluicev1.RateLimitService_ServiceDesc.ServiceName, rls.ServiceName}

// healthOf returns the status gRPC health gives for service, failing the
// test on an RPC error.
func healthOf(t *testing.T, hc healthpb.HealthClient, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health of %q: %v", service, err)
	}
	return resp.Status
}

// keyOwnedIn returns a key of limit name that owner owns on the ring of
// members (sorted names), as every node with those members places it.
func keyOwnedIn(t *testing.T, members []string, name, owner string) string {
	t.Helper()
	r, err := ring.New(members, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		k := "user:" + strconv.Itoa(i)
		if r.Owner(ring.Key(nil, name, k)) == owner {
			return k
		}
	}
	t.Fatalf("no key of %s is owned by %s", name, owner)
	return ""
}

// A node started with Join whose seed does not answer has not joined: gRPC
// health says NOT_SERVING for the overall service, sluice's and Envoy's
// (on Check and Watch), /readyz says joining, and a client check over
// gRPC, HTTP and Envoy RLS is refused with UNAVAILABLE and counts nothing.
// Once a seed answers at the address it was given, the node joins: health
// turns SERVING (the Watch stream sees it), /readyz 200, and a check
// through it draws on the budget the seed had already used up. When it
// leaves, health turns NOT_SERVING again.
func TestNotServingUntilJoined(t *testing.T) {
	clock := windowClock()
	seedAddr := testnet.DeadAddr(t) // nothing listens there yet
	rules, err := rls.Parse(rls.File{Name: "edge.yaml", Data: []byte(
		"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n")})
	if err != nil {
		t.Fatal(err)
	}
	lonely := startNodeCfg(t, NodeConfig{Name: "lonely", Clock: clock, HTTPAddr: "127.0.0.1:0",
		Join: []string{seedAddr}, SettleTime: 50 * time.Millisecond, RLS: rules})
	conn := dialConn(t, lonely.GRPCAddr())
	hc := healthpb.NewHealthClient(conn)
	envoy := rlsv3.NewRateLimitServiceClient(conn)
	wctx, stopWatch := context.WithTimeout(context.Background(), 40*time.Second)
	defer stopWatch()
	watch, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := watch.Recv()
		if err != nil || resp.Status != want {
			t.Fatalf("health watch: %v %v, want %s", resp, err, want)
		}
	}
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	for _, svc := range healthServices {
		if st := healthOf(t, hc, svc); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health of %q before joining: %s, want NOT_SERVING", svc, st)
		}
	}
	base := "http://" + lonely.HTTPAddr()
	if code, out := httpDo(t, "GET", base+"/readyz", ""); code != http.StatusServiceUnavailable || !strings.Contains(out, "joining") {
		t.Fatalf("/readyz before joining = %d %s", code, out)
	}

	members := []string{"lonely", "seed"}
	used := keyOwnedIn(t, members, "api", "seed")
	rc := func(key string) *sluicev1.RateLimitCheck {
		return &sluicev1.RateLimitCheck{Name: "api", Key: key, Hits: proto.Int64(1), Limit: 2, WindowMs: 60000}
	}
	_, err = lonely.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{rc(used)}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "not joined yet; ask another node") {
		t.Fatalf("gRPC check before joining: %v, want UNAVAILABLE: not joined yet", err)
	}
	code, out := httpDo(t, "POST", base+"/v1/check", `{"checks":[{"name":"api","key":"`+used+`","hits":1,"limit":2,"window_ms":60000}]}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(out, "not joined yet") {
		t.Fatalf("HTTP check before joining = %d %s, want 503", code, out)
	}
	rlsReq := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}}}}}
	if _, err := envoy.ShouldRateLimit(context.Background(), rlsReq); status.Code(err) != codes.Unavailable {
		t.Fatalf("RLS before joining: %v, want UNAVAILABLE", err)
	}
	if keys, st := lonely.Store().Len(), lonely.Server().Stats(); keys != 0 || st.LocalChecks != 0 || st.ForwardedChecks != 0 {
		t.Fatalf("before joining the node holds %d keys, decided %d checks, forwarded %d: want none", keys, st.LocalChecks, st.ForwardedChecks)
	}

	// The seed comes up where lonely looks for it: a cluster of one,
	// serving at once, which uses up the key.
	seed, err := StartNode(withTestRegions(NodeConfig{Name: "seed", GRPCAddr: "127.0.0.1:0", GossipAddr: seedAddr,
		Profile: cluster.Local, Clock: clock, LeaveTimeout: time.Second, Logger: testLogger()}))
	if err != nil {
		t.Fatalf("a seed on %s: %v", seedAddr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = seed.Close(ctx)
	})
	seedClient := dial(t, seed.GRPCAddr())
	if st := healthOf(t, healthpb.NewHealthClient(dialConn(t, seed.GRPCAddr())), ""); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the seed (a cluster of one) is %s, want SERVING", st)
	}
	for i := range 2 {
		if d := check(t, seedClient, rc(used)); !d.Allowed || d.Owner != "seed" {
			t.Fatalf("hit %d at the seed: %v, want allowed by seed", i+1, d)
		}
	}

	next(healthpb.HealthCheckResponse_SERVING) // lonely joined: its join retries every second
	for _, svc := range healthServices {
		if st := healthOf(t, hc, svc); st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q once joined: %s, want SERVING", svc, st)
		}
	}
	if code, out := httpDo(t, "GET", base+"/readyz", ""); code != http.StatusOK {
		t.Fatalf("/readyz once joined = %d %s", code, out)
	}
	if d := check(t, lonely.client, rc(used)); d.Allowed || d.Remaining != 0 || d.Owner != "seed" {
		t.Fatalf("the used-up key through lonely: %v, want denied by seed with 0 remaining", d)
	}
	own := keyOwnedIn(t, members, "api", "lonely")
	if d := check(t, lonely.client, rc(own)); !d.Allowed || d.Remaining != 1 || d.Owner != "lonely" {
		t.Fatalf("a key lonely owns: %v, want allowed by lonely with 1 remaining", d)
	}
	if resp, err := envoy.ShouldRateLimit(context.Background(), rlsReq); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("RLS once joined: %v %v, want OK", resp, err)
	}

	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		closed <- lonely.Close(ctx)
	}()
	next(healthpb.HealthCheckResponse_NOT_SERVING) // Close turns health off first
	stopWatch()                                    // or the graceful stop waits for the stream
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
}

// A node started without Join is a cluster of one: gRPC health says
// SERVING as soon as StartNode returns, /readyz agrees, and it answers
// checks as their owner. A service it does not report on is NOT_FOUND.
func TestClusterOfOneServesOnceStarted(t *testing.T) {
	n := startNodeCfg(t, NodeConfig{Name: "solo", Clock: windowClock(), HTTPAddr: "127.0.0.1:0"})
	hc := healthpb.NewHealthClient(dialConn(t, n.GRPCAddr()))
	for _, svc := range []string{"", sluicev1.RateLimitService_ServiceDesc.ServiceName} {
		if st := healthOf(t, hc, svc); st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %s, want SERVING", svc, st)
		}
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.ServiceName}); status.Code(err) != codes.NotFound {
		t.Errorf("health of the RLS service on a node without RLS: %v, want NOT_FOUND", err)
	}
	if code, out := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/readyz", ""); code != http.StatusOK || strings.TrimSpace(out) != "ready" {
		t.Fatalf("/readyz = %d %s", code, out)
	}
	d := check(t, n.client, &sluicev1.RateLimitCheck{Name: "api", Key: "user:42", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000})
	if !d.Allowed || d.Remaining != 9 || d.Owner != "solo" {
		t.Fatalf("check: %v, want allowed by solo with 9 remaining", d)
	}
}
