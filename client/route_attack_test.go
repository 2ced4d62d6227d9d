package client_test

// Adversarial tests of RouteOwner (issue 23): tables a node may send,
// clocks a caller may inject, batches split by owner.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// hungListener accepts connections and never speaks; closed at cleanup.
func hungListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return l.Addr().String()
}

// Finding: a table the bounds admitted (10,000 members, 2^20 partitions,
// replication factor 1000) could take the client seconds to minutes and
// hundreds of MB to build (consistent sorts its whole ring after adding
// each member: 2,000 members at replication factor 20 took 2.8 s here),
// inline in the Check whose answer carried it, and even when its
// fingerprint is wrong (the ring is built before the fingerprint is
// compared). Such tables are now refused before any ring is built,
// naming the field.
func TestRouterRefusesATableTooCostlyToBuild(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members int
		rf      int32
		parts   int32
		want    string
	}{
		{"2000 members at the default replication factor", 2000, 0, 4000, "members: 2000 with replication_factor 0"},
		{"500 members at replication factor 20", 500, 20, 1000, "members: 500 with replication_factor 20"},
		{"100 members at replication factor 1000", 100, 1000, 1000, "members: 100 with replication_factor 1000"},
		{"2^20 partitions", 3, 20, 1 << 20, "partition_count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &sluicev1.RoutingTable{RingFingerprint: "0123456789abcdef", PartitionCount: tc.parts, ReplicationFactor: tc.rf,
				Load: 1.25, Hash: "xxhash64", Library: ring.Library}
			for i := range tc.members {
				rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: "m" + strconv.Itoa(i), GrpcAddr: "127.0.0.1:1"})
			}
			// Duplicates and empty names do not count: the ring ignores them.
			rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: "m0"}, &sluicev1.RouteMember{Name: ""})
			_, err := client.NewRouter(rt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
	// The largest table within the bound still routes: 228 members at the
	// default factor (the nodes' default 271 partitions hold 135).
	names := make([]string, 228)
	for i := range names {
		names[i] = "m" + strconv.Itoa(i)
	}
	rt := tableOf(t, names, ring.Config{PartitionCount: 1000}, map[string]string{})
	if _, err := client.NewRouter(rt); err != nil {
		t.Fatalf("228 members at the default factor: %v", err)
	}
}

// Finding: the owner's half of the timeout was measured with Config.Now,
// the clock the client documents as used only to skip failed nodes,
// against a deadline of the real clock. With an injected clock behind
// real time the owner's deadline was already past, so every owner-routed
// check failed at once and went to another node (routing silently off);
// with one ahead by the timeout or more, the owner got the whole timeout,
// and a hung owner failed the check instead of falling back.
func TestOwnerShareIgnoresAnInjectedClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		offset time.Duration
	}{{"behind", -time.Hour}, {"ahead", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startRoutedFake(t, "a"), startRoutedFake(t, "b")
			hung := hungListener(t)
			rt := tableOf(t, []string{"a", "b", "h"}, ring.Config{}, map[string]string{"a": a.addr, "b": b.addr, "h": hung})
			a.table.Store(rt)
			b.table.Store(rt)
			frozen := time.Now().Add(tc.offset)
			c := newClient(t, client.Config{Addrs: []string{a.addr}, Timeout: 2 * time.Second, FailureMode: client.FailClosed,
				Now: func() time.Time { return frozen }})
			ctx := context.Background()
			if _, err := c.Check(ctx, client.Check{Name: "api", Key: "first"}); err != nil || c.RoutingFingerprint() != rt.RingFingerprint {
				t.Fatal("no table", err)
			}
			d, err := c.Check(ctx, client.Check{Name: "api", Key: keyOf(t, rt, "b")})
			if err != nil || d.Owner != "b" {
				t.Fatalf("a key of the healthy owner b: %+v %v; want b's answer", d, err)
			}
			d, err = c.Check(ctx, client.Check{Name: "api", Key: keyOf(t, rt, "h")})
			if err != nil || d.Owner != "a" || d.Degraded {
				t.Fatalf("a key of the hung owner h: %+v %v; want a's answer within the timeout", d, err)
			}
		})
	}
}

// scriptFake answers each check by a function of its key: a decision, or
// an error for the whole call.
type scriptFake struct {
	sluicev1.UnimplementedRateLimitServiceServer
	name string
	addr string
	mu   sync.Mutex
	got  []string
	fn   func(key string, index int) (*sluicev1.Decision, error)
	rt   atomic.Pointer[sluicev1.RoutingTable] // sent as a node would, when set
}

func (f *scriptFake) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	resp := &sluicev1.CheckResponse{}
	for i, c := range req.Checks {
		d, err := f.fn(c.Key, i)
		if err != nil {
			return nil, err
		}
		resp.Decisions = append(resp.Decisions, d)
	}
	if t := f.rt.Load(); t != nil && req.RoutingFingerprint != "" && req.RoutingFingerprint != t.RingFingerprint {
		resp.Routes = t
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range req.Checks {
		f.got = append(f.got, c.Key)
	}
	return resp, nil
}

func (f *scriptFake) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func startScriptFake(t *testing.T, name string, fn func(key string, index int) (*sluicev1.Decision, error)) *scriptFake {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &scriptFake{name: name, addr: lis.Addr().String(), fn: fn}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

// Held: under FailClosed a batch split by owner fails only the checks
// whose owner could not decide them: the others stand, in order, and the
// undecided ones are not allowed. The checks of a hung owner fall back to
// the other node, which cannot reach that owner either (Error); those are
// answered not allowed, Degraded, with the call's error wrapping
// ErrUnavailable. CheckAll of the same checks fails as a whole.
func TestCheckBatchPartialFailureFailsOnlyTheChecksConcerned(t *testing.T) {
	hung := hungListener(t)
	var rt *sluicev1.RoutingTable
	var a *scriptFake
	a = startScriptFake(t, "a", func(key string, _ int) (*sluicev1.Decision, error) {
		r, _ := client.NewRouter(rt)
		if o, _ := r.Owner("api", key); o == "h" {
			return &sluicev1.Decision{Error: "owner unreachable", Owner: "h"}, nil
		}
		return &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9, Owner: "a"}, nil
	})
	rt = tableOf(t, []string{"a", "h"}, ring.Config{}, map[string]string{"a": a.addr, "h": hung})
	a.rt.Store(rt)
	c := newClient(t, client.Config{Addrs: []string{a.addr}, Timeout: 2 * time.Second, FailureMode: client.FailClosed})
	if _, err := c.Check(context.Background(), client.Check{Name: "api", Key: keyOf(t, rt, "a")}); err != nil || c.RoutingFingerprint() != rt.RingFingerprint {
		t.Fatal("no table", err)
	}
	ka, kh := keyOf(t, rt, "a"), keyOf(t, rt, "h")
	batch := []client.Check{{Name: "api", Key: ka}, {Name: "api", Key: kh}, {Name: "api", Key: ka}}
	ds, err := c.CheckBatch(context.Background(), batch)
	if !errors.Is(err, client.ErrUnavailable) || len(ds) != 3 {
		t.Fatalf("CheckBatch: %v, %d decisions", err, len(ds))
	}
	if !ds[0].Allowed || ds[0].Owner != "a" || !ds[2].Allowed || ds[1].Allowed || !ds[1].Degraded || ds[1].Cause == nil {
		t.Fatalf("decisions %+v: want a's two allowed around the undecided one", ds)
	}
	ds, err = c.CheckAll(context.Background(), batch)
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("CheckAll: %v", err)
	}
	for i, d := range ds {
		if d.Allowed {
			t.Fatalf("CheckAll decision %d allowed: %+v", i, d)
		}
	}
}

// tableFake answers every check allowed and always attaches the table
// next() gives (a hostile or flapping node).
type tableFake struct {
	sluicev1.UnimplementedRateLimitServiceServer
	name string
	next func() *sluicev1.RoutingTable
}

func (f *tableFake) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	resp := &sluicev1.CheckResponse{Routes: f.next()}
	for range req.Checks {
		resp.Decisions = append(resp.Decisions, &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9, Owner: f.name})
	}
	return resp, nil
}

func startTableFake(t *testing.T, name string, next func() *sluicev1.RoutingTable) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, &tableFake{name: name, next: next})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// Held: hostile tables never panic the client nor fail a check: duplicate
// member names at different addresses, empty names, addresses that are
// not host:port (or that never answer, or that refuse), a fingerprint
// that does not match, a NaN load, and two tables flapping at every
// answer, all under concurrent checks and batches, with Close in the
// middle (the goleak TestMain checks that nothing is left behind).
func TestHostileTablesNeverBreakTheClient(t *testing.T) {
	hung := hungListener(t)
	var self string
	good := func(names ...string) *sluicev1.RoutingTable {
		addrs := map[string]string{}
		for _, n := range names {
			addrs[n] = self
		}
		addrs["h"] = hung
		addrs["r"] = deadAddr(t)
		return tableOf(t, names, ring.Config{}, addrs)
	}
	var tables []*sluicev1.RoutingTable
	var mu sync.Mutex
	i := 0
	self = startTableFake(t, "a", func() *sluicev1.RoutingTable {
		mu.Lock()
		defer mu.Unlock()
		i++
		return tables[i%len(tables)]
	})
	dup := good("a", "b")
	dup.Members = append(dup.Members, &sluicev1.RouteMember{Name: "a", GrpcAddr: "not an address"}, &sluicev1.RouteMember{Name: "", GrpcAddr: "unix:///nonexistent"})
	wrongFP := good("a", "b")
	wrongFP.RingFingerprint = "ffffffffffffffff"
	nan := good("a", "b")
	nan.Load = float64(nanValue())
	bad := good("a", "b", "x")
	bad.Members[2].GrpcAddr = "[::1"
	mu.Lock()
	tables = []*sluicev1.RoutingTable{good("a", "h"), good("a", "r"), dup, wrongFP, nan, bad, good("a", "h", "r"), nil}
	mu.Unlock()
	for _, mode := range []client.FailureMode{client.FailOpen, client.FailClosed} {
		c, err := client.New(client.Config{Addrs: []string{self}, Timeout: 300 * time.Millisecond, FailureMode: mode, SkipFor: time.Millisecond, Logger: testcluster.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for k := range 60 {
					key := fmt.Sprintf("g%d-%d", g, k)
					var err error
					if k%3 == 0 {
						var ds []client.Decision
						ds, err = c.CheckBatch(context.Background(), []client.Check{{Name: "api", Key: key}, {Name: "api", Key: key + "x"}, {Name: "api", Key: key + "y"}})
						for _, d := range ds {
							if mode == client.FailClosed && d.Allowed && d.Degraded {
								t.Errorf("FailClosed answered an undecided check allowed: %+v", d)
							}
						}
					} else {
						var d client.Decision
						d, err = c.Check(context.Background(), client.Check{Name: "api", Key: key})
						if mode == client.FailClosed && d.Allowed && d.Degraded {
							t.Errorf("FailClosed answered an undecided check allowed: %+v", d)
						}
					}
					if err != nil && !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrClosed) {
						t.Errorf("check: %v", err)
					}
				}
			})
		}
		wg.Go(func() {
			for range 20 {
				_, _ = c.Check(context.Background(), client.Check{Name: "api", Key: "closer"})
			}
			c.Close()
		})
		wg.Wait()
		if _, err := c.Check(context.Background(), client.Check{Name: "api", Key: "after"}); !errors.Is(err, client.ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
}

// A node may refuse a check the client accepted (a named limit it does
// not have: InvalidArgument). Under RouteOwner CheckBatch has split the
// batch, so the other owners' parts were counted: their decisions are
// returned (answered, counted once), the refused part's checks are
// answered not allowed with the error as Cause, and the error names the
// check by its place in the batch, not in its part.
func TestCheckBatchRefusedPartNamesTheCheckAndKeepsTheOthers(t *testing.T) {
	var rt *sluicev1.RoutingTable
	refuse := func(key string, i int) (*sluicev1.Decision, error) {
		if strings.HasPrefix(key, "bad") {
			return nil, status.Errorf(codes.InvalidArgument, "checks[%d].name: no limit is configured under it", i)
		}
		return &sluicev1.Decision{Allowed: true, Limit: 10, Remaining: 9}, nil
	}
	a := startScriptFake(t, "a", refuse)
	b := startScriptFake(t, "b", refuse)
	rt = tableOf(t, []string{"a", "b"}, ring.Config{}, map[string]string{"a": a.addr, "b": b.addr})
	a.rt.Store(rt)
	b.rt.Store(rt)
	c := newClient(t, client.Config{Addrs: []string{a.addr}})
	if _, err := c.Check(context.Background(), client.Check{Name: "api", Key: "x"}); err != nil || c.RoutingFingerprint() != rt.RingFingerprint {
		t.Fatal("no table", err)
	}
	ka := keyOf(t, rt, "a")
	var kbad string
	for i := range 100000 {
		k := "bad" + strconv.Itoa(i)
		if c.Owner("api", k) == "b" {
			kbad = k
			break
		}
	}
	kb := keyOf(t, rt, "b")
	ds, err := c.CheckBatch(context.Background(), []client.Check{{Name: "api", Key: ka}, {Name: "api", Key: kb}, {Name: "api", Key: kbad}})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "checks[2].name") {
		t.Fatalf("error %v: want ErrInvalid naming checks[2].name", err)
	}
	if len(ds) != 3 || !ds[0].Allowed || ds[0].Cause != nil {
		t.Fatalf("decisions %+v: want a's check decided", ds)
	}
	if ds[2].Allowed || !errors.Is(ds[2].Cause, client.ErrInvalid) || ds[1].Allowed || !errors.Is(ds[1].Cause, client.ErrInvalid) {
		t.Fatalf("the refused part's checks: %+v, %+v; want not allowed with the error", ds[1], ds[2])
	}
	if got := a.keys(); len(got) != 2 || got[1] != ka { // the check that brought the table, and ka
		t.Errorf("a got %v", got)
	}
}

func nanValue() float64 {
	z := 0.0
	return z / z
}
