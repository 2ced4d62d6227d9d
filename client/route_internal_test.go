package client

import (
	"log/slog"
	"strconv"
	"testing"

	"google.golang.org/grpc/connectivity"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// routeTable is a node's routing table for a ring of names, each at
// addrs[name].
func routeTable(t *testing.T, names []string, addrs map[string]string) *sluicev1.RoutingTable {
	t.Helper()
	r, err := ring.New(names, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config()
	rt := &sluicev1.RoutingTable{RingFingerprint: r.Fingerprint(), PartitionCount: int32(c.PartitionCount),
		ReplicationFactor: int32(c.ReplicationFactor), Load: c.Load, Hash: "xxhash64", Library: ring.Library}
	for _, n := range r.Members() {
		rt.Members = append(rt.Members, &sluicev1.RouteMember{Name: n, GrpcAddr: addrs[n]})
	}
	return rt
}

// open returns the connections of c that are not shut down.
func openConns(c *Client) []string {
	c.routing.mu.Lock()
	defer c.routing.mu.Unlock()
	var out []string
	for addr, n := range c.routing.byAddr {
		if n.conn.GetState() != connectivity.Shutdown {
			out = append(out, addr)
		}
	}
	return out
}

// Finding: install checked Close only before taking the routing lock, so
// a table installed by an answer that arrived as Close ran dialed its
// members after Close had closed every connection: those were never
// closed. The interleaving is forced: Close runs whole between install's
// first check and its lock.
func TestInstallAfterCloseDialsNothing(t *testing.T) {
	c, err := New(Config{Addrs: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rt := routeTable(t, []string{"a", "b"}, map[string]string{"a": "127.0.0.1:2", "b": "127.0.0.1:3"})
	c.Close()
	// install checked Close before Close ran, then waited for the lock,
	// which Close's closeConns held: it goes on now.
	c.routing.mu.Lock()
	c.installLocked(rt)
	c.routing.mu.Unlock()
	if open := openConns(c); len(open) != 0 {
		t.Fatalf("connections open after Close: %v", open)
	}
	if c.table.Load() != nil {
		t.Fatal("a table installed after Close")
	}
}

// Finding: every address a table named was dialed and kept until Close,
// though only the last tablesKept tables route: a node whose members move
// (pods rescheduled with new IPs), or a hostile one sending a table of
// new addresses with every answer, grew the client by 3 goroutines and
// about 8 KB per address without bound (10,000 members a table). The
// connections of addresses no kept table names are now closed.
func TestTablesOfNewAddressesDoNotAccumulateConnections(t *testing.T) {
	c, err := New(Config{Addrs: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var last *sluicev1.RoutingTable
	for i := range 50 {
		addrs := map[string]string{}
		var names []string
		for j := range 3 {
			n := "n" + strconv.Itoa(i*3+j)
			names = append(names, n)
			addrs[n] = "127.0.0.1:" + strconv.Itoa(20000+i*3+j)
		}
		names = append(names, "given") // a member at a given address stays
		addrs["given"] = "127.0.0.1:1"
		last = routeTable(t, names, addrs)
		c.install(last)
	}
	if c.RoutingFingerprint() != last.RingFingerprint {
		t.Fatal("the last table is not the one in use")
	}
	open := openConns(c)
	if want := 1 + tablesKept*3; len(open) != want {
		t.Fatalf("%d connections open after 50 tables of 3 new addresses, want %d (the given one and those of the %d tables kept)", len(open), want, tablesKept)
	}
	if len(c.routing.byAddr) != len(open) {
		t.Fatalf("%d nodes kept, %d open", len(c.routing.byAddr), len(open))
	}
	if c.nodes[0].conn.GetState() == connectivity.Shutdown {
		t.Fatal("a given address's connection was closed")
	}
	// The current table's owners still route.
	for _, m := range last.Members {
		if c.table.Load().owners[m.Name] == nil || c.table.Load().owners[m.Name].conn.GetState() == connectivity.Shutdown {
			t.Fatalf("member %s of the current table has no open connection", m.Name)
		}
	}
}
