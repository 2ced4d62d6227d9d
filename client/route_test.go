package client_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// tableOf is the routing table a node serves for a ring of names with
// cfg, each member at addrs[name].
func tableOf(t *testing.T, names []string, cfg ring.Config, addrs map[string]string) *sluicev1.RoutingTable {
	t.Helper()
	r, err := ring.New(names, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config()
	rt := &sluicev1.RoutingTable{
		RingFingerprint: r.Fingerprint(), PartitionCount: int32(c.PartitionCount), ReplicationFactor: int32(c.ReplicationFactor),
		Load: c.Load, Hash: "xxhash64", Library: ring.Library, Regions: c.Regions,
	}
	for _, n := range r.Members() {
		rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: n, GrpcAddr: addrs[n]})
	}
	return rt
}

// recipeMember and recipeHasher place keys from the routing table's
// documentation alone (sluice.proto, RoutingTable): consistent with
// bounded loads over the names each followed by '#', xxhash64, and the
// table's numbers; a client in another language does this.
type recipeMember string

func (m recipeMember) String() string { return string(m) + "#" }

type recipeHasher struct{}

func (recipeHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

func recipeOwner(c *consistent.Consistent, name, key string) string {
	b := []byte{}
	b = append(b, byte(len(name))) // names here are shorter than 128 bytes: one uvarint byte
	b = append(b, name...)
	b = append(b, key...)
	return string(c.LocateKey(b).(recipeMember))
}

// Done when: the client's placement agrees with the ring's for a large
// sample of keys and every partition count (from 2 per member to 600, for
// 1, 2, 3 and 5 members), and with a placement written from the table's
// documentation alone.
func TestRouterAgreesWithTheRingForEveryPartitionCount(t *testing.T) {
	keys := 64
	if testing.Short() {
		keys = 16
	}
	checked := 0
	for _, m := range []int{1, 2, 3, 5} {
		var names []string
		addrs := map[string]string{}
		for i := range m {
			n := fmt.Sprintf("node-%d", i+1)
			names = append(names, n)
			addrs[n] = fmt.Sprintf("10.0.0.%d:7070", i+1)
		}
		for p := 2 * m; p <= 600; p++ {
			cfg := ring.Config{PartitionCount: p}
			rt := tableOf(t, names, cfg, addrs)
			rr, err := client.NewRouter(rt)
			if err != nil {
				t.Fatalf("%d members, %d partitions: %v", m, p, err)
			}
			want, _ := ring.New(names, cfg)
			var ms []consistent.Member
			for _, n := range names {
				ms = append(ms, recipeMember(n))
			}
			recipe := consistent.New(ms, consistent.Config{Hasher: recipeHasher{}, PartitionCount: p,
				ReplicationFactor: int(rt.ReplicationFactor), Load: rt.Load})
			for k := range keys {
				key := "user:" + strconv.Itoa(k*7919+p)
				owner, addr := rr.Owner("api", key)
				if w := want.Owner(ring.Key(nil, "api", key)); owner != w {
					t.Fatalf("%d members, %d partitions, key %s: router says %s, ring %s", m, p, key, owner, w)
				}
				if r := recipeOwner(recipe, "api", key); owner != r {
					t.Fatalf("%d members, %d partitions, key %s: router says %s, the documented recipe %s", m, p, key, owner, r)
				}
				if addr != addrs[owner] {
					t.Fatalf("address %q for %s, want %q", addr, owner, addrs[owner])
				}
				checked++
			}
		}
	}
	t.Logf("%d placements agree", checked)
}

// A table the client cannot place identically is refused, naming the
// field: its checks then go to any node.
func TestRouterRefusesTablesItCannotPlace(t *testing.T) {
	good := func() *sluicev1.RoutingTable {
		return tableOf(t, []string{"a", "b", "c"}, ring.Config{}, map[string]string{"a": "h:1", "b": "h:2", "c": "h:3"})
	}
	for _, tc := range []struct {
		name, want string
		edit       func(*sluicev1.RoutingTable)
	}{
		{"another hash", "hash", func(rt *sluicev1.RoutingTable) { rt.Hash = "murmur3" }},
		{"another library", "library", func(rt *sluicev1.RoutingTable) { rt.Library = "buraksezer/consistent@v0.9.0" }},
		{"no members", "members", func(rt *sluicev1.RoutingTable) { rt.Members = nil }},
		{"another fingerprint", "ring_fingerprint", func(rt *sluicev1.RoutingTable) { rt.RingFingerprint = "0123456789abcdef" }},
		{"another load", "ring_fingerprint", func(rt *sluicev1.RoutingTable) { rt.Load = 1.5 }},
		{"too few partitions", "partition count", func(rt *sluicev1.RoutingTable) { rt.PartitionCount = 5 }},
		{"a billion partitions", "partition_count", func(rt *sluicev1.RoutingTable) { rt.PartitionCount = 1 << 30 }},
		{"a huge replication factor", "replication_factor", func(rt *sluicev1.RoutingTable) { rt.ReplicationFactor = 1 << 30 }},
		{"too many members", "members", func(rt *sluicev1.RoutingTable) {
			for i := range client.MaxRouteMembers {
				rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: "m" + strconv.Itoa(i)})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := good()
			tc.edit(rt)
			_, err := client.NewRouter(rt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
	if _, err := client.NewRouter(good()); err != nil {
		t.Fatalf("the unedited table: %v", err)
	}
}

// counter counts the Check calls a client makes, per target address.
type counter struct{ m sync.Map }

func (c *counter) option() grpc.DialOption {
	return grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == sluicev1.RateLimitService_Check_FullMethodName {
			v, _ := c.m.LoadOrStore(cc.Target(), new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

func (c *counter) get(addr string) int64 {
	v, ok := c.m.Load(addr)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func forwarded(nodes []*rpc.Node) int64 {
	var n int64
	for _, nd := range nodes {
		n += nd.Server().Stats().ForwardedChecks
	}
	return n
}

// Done when: on a real cluster the table the nodes serve places every key
// where the nodes do; after the first answer every check goes straight to
// its owner (no node forwards any), and a batch is split per owner.
func TestOwnerRouteSkipsTheHop(t *testing.T) {
	nodes := testcluster.Start(t, 3, testcluster.Options{})
	var calls counter
	c := newClient(t, client.Config{
		Addrs:       testcluster.Addrs(nodes),
		Timeout:     20 * time.Second, // a loaded machine is no outage
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), calls.option()},
	})
	ctx := context.Background()
	inline := &client.Limit{Limit: 1000, Window: time.Hour}
	if c.Owner("api", "x") != "" {
		t.Fatal("an owner before any table")
	}
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "first", Limit: inline}); err != nil {
		t.Fatal(err)
	}
	if fp := c.RoutingFingerprint(); fp != nodes[0].Server().RingFingerprint() {
		t.Fatalf("client's table %q, the nodes' ring %q", fp, nodes[0].Server().RingFingerprint())
	}
	for k := range 20000 {
		key := "user:" + strconv.Itoa(k)
		if got, want := c.Owner("api", key), nodes[k%3].Server().Owner("api", key); got != want {
			t.Fatalf("key %s: client places it on %s, node %s on %s", key, got, nodes[k%3].Name(), want)
		}
	}
	// The table a node serves through Routes is the one the answer brought.
	conn, err := grpc.NewClient(nodes[1].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt, err := sluicev1.NewRateLimitServiceClient(conn).Routes(ctx, &sluicev1.RoutesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rt.RingFingerprint != c.RoutingFingerprint() || len(rt.Members) != 3 || rt.Self != nodes[1].Name() || rt.Hash != "xxhash64" {
		t.Fatalf("Routes answered %+v", rt)
	}

	before := forwarded(nodes)
	byName := map[string]string{}
	for _, n := range nodes {
		byName[n.Name()] = n.GRPCAddr()
	}
	want := map[string]int64{}
	for _, n := range nodes {
		want[n.GRPCAddr()] = calls.get(n.GRPCAddr())
	}
	for k := range 300 {
		key := "u" + strconv.Itoa(k)
		d, err := c.Check(ctx, client.Check{Name: "api", Key: key, Limit: inline})
		if err != nil || !d.Allowed {
			t.Fatalf("check %d: %+v %v", k, d, err)
		}
		if d.Owner != c.Owner("api", key) {
			t.Fatalf("key %s decided by %s, the table's owner is %s", key, d.Owner, c.Owner("api", key))
		}
		want[byName[d.Owner]]++
	}
	for _, n := range nodes {
		if got := calls.get(n.GRPCAddr()); got != want[n.GRPCAddr()] {
			t.Errorf("node %s got %d calls, want %d (one per check it owns)", n.Name(), got, want[n.GRPCAddr()])
		}
	}
	if f := forwarded(nodes) - before; f != 0 {
		t.Fatalf("the nodes forwarded %d checks; want none", f)
	}

	// A batch of independent checks: one call per owner, none forwarded.
	var batch []client.Check
	for k := range 100 {
		batch = append(batch, client.Check{Name: "api", Key: "b" + strconv.Itoa(k), Limit: inline})
	}
	total := func() (n int64) {
		for _, nd := range nodes {
			n += calls.get(nd.GRPCAddr())
		}
		return n
	}
	callsBefore := total()
	ds, err := c.CheckBatch(ctx, batch)
	if err != nil || len(ds) != 100 {
		t.Fatalf("batch: %d decisions, %v", len(ds), err)
	}
	for i, d := range ds {
		if !d.Allowed || d.Owner != c.Owner("api", batch[i].Key) {
			t.Fatalf("batch check %d: %+v, owner by the table %s", i, d, c.Owner("api", batch[i].Key))
		}
	}
	if n := total() - callsBefore; n != 3 {
		t.Fatalf("the batch took %d calls, want 3 (one per owner)", n)
	}
	if f := forwarded(nodes) - before; f != 0 {
		t.Fatalf("the nodes forwarded %d checks of the batch; want none", f)
	}

	// Under RouteAny the same batch is one call, and the nodes forward.
	anyc := newClient(t, client.Config{Addrs: testcluster.Addrs(nodes), Timeout: 20 * time.Second, Route: client.RouteAny})
	if _, err := anyc.CheckBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if f := forwarded(nodes) - before; f < 50 {
		t.Fatalf("RouteAny: the nodes forwarded %d checks of 100; want about 67", f)
	}
	if anyc.Owner("api", "b1") != "" || anyc.RoutingFingerprint() != "" {
		t.Fatal("RouteAny keeps a table")
	}
}

// routedFake is a node that answers every check allowed, naming itself
// as owner, and serves a routing table it can be given.
type routedFake struct {
	sluicev1.UnimplementedRateLimitServiceServer
	name, addr string
	table      atomic.Pointer[sluicev1.RoutingTable]
	mu         sync.Mutex
	got        []string // the keys of the checks it was sent
	fps        []string // each call's routing fingerprint
}

func (f *routedFake) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	f.mu.Lock()
	f.fps = append(f.fps, req.RoutingFingerprint)
	resp := &sluicev1.CheckResponse{}
	for _, c := range req.Checks {
		f.got = append(f.got, c.Key)
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9, Owner: f.name})
	}
	f.mu.Unlock()
	if t := f.table.Load(); t != nil && req.RoutingFingerprint != "" && req.RoutingFingerprint != t.RingFingerprint {
		resp.Routes = t
	}
	return resp, nil
}

func (f *routedFake) Routes(context.Context, *sluicev1.RoutesRequest) (*sluicev1.RoutingTable, error) {
	return f.table.Load(), nil
}

func (f *routedFake) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func startRoutedFake(t *testing.T, name string) *routedFake {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &routedFake{name: name, addr: lis.Addr().String()}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

// keyOf returns a key of limit "api" that rt's ring places on owner.
func keyOf(t *testing.T, rt *sluicev1.RoutingTable, owner string) string {
	t.Helper()
	rr, err := client.NewRouter(rt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100000 {
		k := "k" + strconv.Itoa(i)
		if o, _ := rr.Owner("api", k); o == owner {
			return k
		}
	}
	t.Fatalf("no key on %s", owner)
	return ""
}

// Done when: a stale table is corrected within one answer. The client
// routes by a ring of a and b; the cluster grows c. The next answer (from
// the stale owner, which forwards) brings the new table, and the check
// after it goes straight to c.
func TestStaleTableIsCorrectedWithinOneAnswer(t *testing.T) {
	a, b, cc := startRoutedFake(t, "a"), startRoutedFake(t, "b"), startRoutedFake(t, "c")
	addrs := map[string]string{"a": a.addr, "b": b.addr, "c": cc.addr}
	old := tableOf(t, []string{"a", "b"}, ring.Config{}, addrs)
	grown := tableOf(t, []string{"a", "b", "c"}, ring.Config{}, addrs)
	for _, f := range []*routedFake{a, b, cc} {
		f.table.Store(old)
	}
	c := newClient(t, client.Config{Addrs: []string{a.addr, b.addr}, Timeout: 10 * time.Second})
	ctx := context.Background()
	// The first call has no table: it asks for one, and gets the old.
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "first"}); err != nil {
		t.Fatal(err)
	}
	if c.RoutingFingerprint() != old.RingFingerprint {
		t.Fatalf("table %q after the first answer, want %q", c.RoutingFingerprint(), old.RingFingerprint)
	}
	// A key that moves to c: under the old ring its owner is a or b.
	var key, staleOwner string
	oldRouter, _ := client.NewRouter(old)
	for i := range 100000 {
		k := "m" + strconv.Itoa(i)
		if o, _ := oldRouter.Owner("api", k); c.Owner("api", k) == o {
			newRouter, _ := client.NewRouter(grown)
			if no, _ := newRouter.Owner("api", k); no == "c" {
				key, staleOwner = k, o
				break
			}
		}
	}
	if key == "" {
		t.Fatal("no key moves to c")
	}
	for _, f := range []*routedFake{a, b, cc} {
		f.table.Store(grown)
	}
	stale := map[string]*routedFake{"a": a, "b": b}[staleOwner]
	n := len(stale.keys())
	d, err := c.Check(ctx, client.Check{Name: "api", Key: key})
	if err != nil || d.Owner != staleOwner || len(stale.keys()) != n+1 {
		t.Fatalf("the check by the stale table: %+v %v; want it at %s", d, err, staleOwner)
	}
	if c.RoutingFingerprint() != grown.RingFingerprint {
		t.Fatalf("table %q after the stale owner's answer, want the grown ring's %q", c.RoutingFingerprint(), grown.RingFingerprint)
	}
	d, err = c.Check(ctx, client.Check{Name: "api", Key: key})
	if err != nil || d.Owner != "c" {
		t.Fatalf("the next check: %+v %v; want it at c", d, err)
	}
	if got := cc.keys(); len(got) != 1 || got[0] != key {
		t.Fatalf("c got %v, want [%s]", got, key)
	}
}

// Done when: the client falls back to any node when the owner does not
// answer, within its timeout: the owner accepts connections and never
// answers; the check is answered by another node (not by the failure
// mode) inside Config.Timeout, and the next check of that owner's keys
// goes to the other node at once.
func TestFallsBackToAnyNodeWhenTheOwnerHangs(t *testing.T) {
	a := startRoutedFake(t, "a")
	hung := hungListener(t) // accepts, never speaks
	rt := tableOf(t, []string{"a", "h"}, ring.Config{}, map[string]string{"a": a.addr, "h": hung})
	a.table.Store(rt)
	c := newClient(t, client.Config{Addrs: []string{a.addr}, Timeout: 4 * time.Second, FailureMode: client.FailClosed})
	ctx := context.Background()
	if _, err := c.Check(ctx, client.Check{Name: "api", Key: "first"}); err != nil {
		t.Fatal(err)
	}
	key := keyOf(t, rt, "h")
	if c.Owner("api", key) != "h" {
		t.Fatalf("the table places %s on %q", key, c.Owner("api", key))
	}
	d, err := c.Check(ctx, client.Check{Name: "api", Key: key})
	if err != nil || d.Owner != "a" || d.Degraded {
		t.Fatalf("with the owner hung: %+v %v; want a's answer within the timeout", d, err)
	}
	n := len(a.keys())
	d, err = c.Check(ctx, client.Check{Name: "api", Key: key})
	if err != nil || d.Owner != "a" || len(a.keys()) != n+1 {
		t.Fatalf("the next check: %+v %v; want it straight at a", d, err)
	}
}

// Done when: a ring change in the middle of ring-aware load loses and
// doubles nothing. Ten keys of limit 100 (a token bucket refilling 100 a
// day: no refill during the test) get 2000 checks from 8 goroutines
// routed to their owners, while a fourth node joins (the client learns of
// it from an answer: it is not among the addresses it was given) and
// node1 leaves. Every allowed answer counts, degraded ones included, and
// each key admits exactly 100.
func TestRingChangeUnderOwnerRoutedLoadIsExact(t *testing.T) {
	nodes := testcluster.Start(t, 3, testcluster.Options{})
	var calls counter
	c := newClient(t, client.Config{
		Addrs:       testcluster.Addrs(nodes),
		Timeout:     20 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), calls.option()},
	})
	ctx := context.Background()
	limit := &client.Limit{Limit: 100, Window: 24 * time.Hour, Algorithm: client.TokenBucket}
	const keys, total = 10, 2000
	var (
		next    atomic.Int64
		allowed [keys]atomic.Int64
		errs    atomic.Int64
		wg      sync.WaitGroup
	)
	joined, left := make(chan struct{}), make(chan struct{})
	var node4 *rpc.Node
	for range 8 {
		wg.Go(func() {
			for {
				n := next.Add(1) - 1
				if n >= total {
					return
				}
				switch n {
				case 500:
					<-joined
				case 1200:
					<-left
				}
				k := int(n % keys)
				d, err := c.Check(ctx, client.Check{Name: "ring-change", Key: "user:" + strconv.Itoa(k), Limit: limit})
				if err != nil {
					errs.Add(1)
					continue
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
		})
	}
	// After about 400 checks a node joins, after about 1100 node1 leaves.
	for next.Load() < 400 {
		time.Sleep(time.Millisecond)
	}
	cfg := rpc.NodeConfig{Name: "node4", GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", Profile: cluster.Local,
		Logger: testcluster.Logger(), ForwardTimeout: 2 * time.Second, LeaveTimeout: time.Second,
		Join: []string{nodes[1].GossipAddr()}}
	node4, err := rpc.StartNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = node4.Close(cctx)
	})
	testcluster.WaitRingAgrees(t, append(append([]*rpc.Node(nil), nodes...), node4))
	close(joined)
	for next.Load() < 1100 {
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := nodes[0].Close(cctx); err != nil {
		t.Fatalf("node1 leaving: %v", err)
	}
	cancel()
	close(left)
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d checks failed", errs.Load())
	}
	for k := range keys {
		if got := allowed[k].Load(); got != 100 {
			t.Errorf("key user:%d: %d allowed, want exactly 100", k, got)
		}
	}
	if calls.get(node4.GRPCAddr()) == 0 {
		t.Errorf("no check went straight to node4, which joined: the client never routed by the grown table")
	}
	if c.RoutingFingerprint() != node4.Server().RingFingerprint() {
		t.Errorf("the client's table %s, the ring after the change %s", c.RoutingFingerprint(), node4.Server().RingFingerprint())
	}
}
