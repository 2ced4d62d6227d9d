package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// The in-process harness. The tests about a node's logic (validation,
// named limits, fail modes, late checks, forwarding and what it counts,
// forged hand-offs, redaction) run on Servers made with NewServer, each
// serving sluice.v1 (the public and the peer API, with a node's codec and
// gRPC bounds) on a bufconn listener of its own and dialing the others'
// listeners: no gossip and no sockets. The test sets the membership, at
// once (inprocCluster.join); nothing waits for rings to agree.
//
// The tests about the running system (StartNode, gossip, TLS, tokens,
// protected mode, readiness, leaving, restarts, the servers' transport
// bounds) keep startNode, and so do the tests of how StartNode wires a
// NodeConfig setting into the node (key caps, max in-flight, request
// size bounds, metrics, peer identity): the harness makes a node the way
// StartNode does (see start), but a copy of that wiring would only test
// itself.

// inprocAddr is the gRPC address of name's listener: gRPC's passthrough
// resolver hands "name" to the harness's dialer, which connects it to the
// listener.
func inprocAddr(name string) string { return "passthrough:///" + name }

// inprocCluster is a set of in-process nodes that reach each other through
// their bufconn listeners (see inprocAddr).
type inprocCluster struct {
	t     testing.TB
	mu    sync.Mutex
	lis   map[string]*bufconn.Listener // by member name; gone once killed
	nodes []*inprocNode
}

// newInproc returns an empty in-process cluster; its nodes stop when the
// test ends.
func newInproc(t testing.TB) *inprocCluster {
	return &inprocCluster{t: t, lis: map[string]*bufconn.Listener{}}
}

// dial connects to the listener of the member called addr (the address
// passthrough gives the dialer), as a TCP dial to a host's port would.
func (c *inprocCluster) dial(ctx context.Context, addr string) (net.Conn, error) {
	c.mu.Lock()
	l, ok := c.lis[addr]
	c.mu.Unlock()
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: "bufconn", Err: fmt.Errorf("no listener for %q", addr)}
	}
	return l.DialContext(ctx)
}

// dialer is the dial option of every connection into the cluster.
func (c *inprocCluster) dialer() grpc.DialOption { return grpc.WithContextDialer(c.dial) }

// inprocHonours lists the NodeConfig fields the harness honours; the
// others (gossip, TLS, tokens, readiness...) need a running node: a test
// that sets one belongs on startNode.
var inprocHonours = []string{"Name", "Clock", "TracerProvider", "Ring", "ForwardTimeout", "Batch", "HandOffTimeout",
	"Replication", "SweepInterval", "MaxKeys", "OnKeyCap", "NameKeyShare", "GRPC", "HTTP", "HTTPAddr",
	"Limits", "ServerOptions", "DialOptions", "Logger", "PeerIdentity", "hooks", "Region", "Regions", "LeaseBase", "AllowRefunds"}

// start adds a node made from cfg as StartNode makes one (the store with
// cfg's key cap and per-name share, the Server with cfg's limits and
// metrics as its observer, the gRPC server with the node's codec and
// cfg.GRPC's bounds, a sweeper, the HTTP face when cfg.HTTPAddr is set:
// its address is ignored, the face is served on a bufconn listener too),
// without gossip, joining, TLS, client auth, health or stream workers; no
// member list is changed (see join). The node's client is connected. A
// decideOwned hook set with hookDecideOwned applies, as in startNodeWith.
// A NodeConfig field the harness cannot honour fails the test.
func (c *inprocCluster) start(cfg NodeConfig) *inprocNode {
	t := c.t
	t.Helper()
	cv := reflect.ValueOf(cfg)
	for i := range cv.NumField() {
		if f := cv.Type().Field(i).Name; !cv.Field(i).IsZero() && !slices.Contains(inprocHonours, f) {
			t.Fatalf("inproc: NodeConfig.%s needs a running node (startNode)", f)
		}
	}
	if cfg.Name == "" {
		t.Fatal("inproc: a node needs a name")
	}
	cfg = withTestRegions(cfg)
	if cfg.ForwardTimeout == 0 {
		cfg.ForwardTimeout = 2 * time.Second // as startNode
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	if cfg.hooks == nil {
		cfg.hooks = &testHooks{decideOwned: decideOwnedHook}
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	log := cfg.Logger.With("node", cfg.Name)
	// As StartNode builds them (newCore), but dialing the others through
	// their bufconn listeners.
	cfg.DialOptions = append([]grpc.DialOption{c.dialer()}, cfg.DialOptions...)
	core, err := newCore(cfg, secured{}, log)
	if err != nil {
		t.Fatal(err)
	}
	store, metrics, srv := core.store, core.metrics, core.server
	sopts := slices.Concat([]grpc.ServerOption{codecServerOption}, windowServerOptions, cfg.GRPC.serverOptions(), cfg.ServerOptions)
	gs := grpc.NewServer(sopts...)
	sluicev1.RegisterRateLimitServiceServer(gs, srv)
	sluicev1.RegisterPeerServiceServer(gs, srv)
	sluicev1.RegisterAdminPeerServiceServer(gs, adminPeer{s: srv})
	lis := bufconn.Listen(1 << 20)
	n := &inprocNode{c: c, name: cfg.Name, region: cfg.Region, srv: srv, store: store, metrics: metrics, gs: gs, lis: lis}
	c.mu.Lock()
	if _, dup := c.lis[cfg.Name]; dup {
		c.mu.Unlock()
		t.Fatalf("inproc: two nodes named %s", cfg.Name)
	}
	c.lis[cfg.Name] = lis
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Go(func() { _ = gs.Serve(lis) })
	n.wg.Go(func() { store.RunSweeper(ctx, cfg.SweepInterval, nil) })
	if cfg.HTTPAddr != "" {
		h, err := NewHTTPHandler(HTTPConfig{Server: srv, Metrics: metrics})
		if err != nil {
			t.Fatal(err)
		}
		n.httpLis = bufconn.Listen(1 << 20)
		n.httpSrv = cfg.HTTP.Apply(&http.Server{Handler: h})
		n.httpClient = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return n.httpLis.DialContext(ctx) },
		}}
		n.wg.Go(func() { _ = n.httpSrv.Serve(n.httpLis) })
	}
	t.Cleanup(n.stop)
	n.client = sluicev1.NewRateLimitServiceClient(n.conn(t))
	return n
}

// members returns the cluster's live nodes as a member list (all alive, at
// their inprocAddr), sorted by name.
func (c *inprocCluster) members() []cluster.Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ms []cluster.Member
	for _, n := range c.nodes {
		if _, live := c.lis[n.name]; live {
			ms = append(ms, cluster.Member{Name: n.name, GRPCAddr: inprocAddr(n.name), Region: n.region, State: cluster.Alive,
				Since: n.srv.clusterSince()})
		}
	}
	slices.SortFunc(ms, func(a, b cluster.Member) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// join gives every live node the member list of all live nodes, as gossip
// does once it has converged, and connects each to its peers: afterwards
// their rings agree and a first forward does not wait for a connection.
func (c *inprocCluster) join() {
	c.t.Helper()
	ms := c.members()
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	for _, n := range nodes {
		if !slices.ContainsFunc(ms, func(m cluster.Member) bool { return m.Name == n.name }) {
			continue // killed
		}
		if err := n.srv.SetMembers(ms); err != nil {
			c.t.Fatalf("%s: SetMembers: %v", n.name, err)
		}
	}
	for _, n := range nodes {
		for name, p := range n.srv.view.Load().peers {
			if err := connectPeer(p.Client()); err != nil {
				c.t.Fatalf("%s cannot reach %s: %v", n.name, name, err)
			}
		}
	}
}

// connectPeer opens a peer stream over c and ends it, sending nothing:
// c's connection is then up (a node's connections to its peers are dialed
// lazily; in a gossip cluster they are often up by the time the rings
// agree, so a test's first forward would not pay for the handshake).
// Nothing is counted on either side.
func connectPeer(c sluicev1.PeerServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.ForwardStream(ctx)
	if err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("a peer stream ended with %v, want EOF", err)
	}
	return nil
}

// startInproc starts one in-process node per config (in order) and joins
// them: their rings agree when it returns.
func startInproc(t testing.TB, cfgs ...NodeConfig) []*inprocNode {
	t.Helper()
	c := newInproc(t)
	out := make([]*inprocNode, len(cfgs))
	for i, cfg := range cfgs {
		out[i] = c.start(cfg)
	}
	c.join()
	return out
}

// startInprocCluster is startCluster in process: n nodes named
// node1..nodeN sharing clock (forward timeout 2 s), joined.
func startInprocCluster(t testing.TB, n int, clock window.Clock) []*inprocNode {
	t.Helper()
	cfgs := make([]NodeConfig, n)
	for i := range cfgs {
		cfgs[i] = NodeConfig{Name: fmt.Sprintf("node%d", i+1), Clock: clock}
	}
	return startInproc(t, cfgs...)
}

// startInprocNode is startNode in process: one node called name, alone.
func startInprocNode(t testing.TB, name string, clock window.Clock) *inprocNode {
	t.Helper()
	return startInproc(t, NodeConfig{Name: name, Clock: clock})[0]
}

// inprocNode is one node of an inprocCluster and a client connected to it
// (client: the public API).
type inprocNode struct {
	c       *inprocCluster
	name    string
	region  string
	srv     *Server
	store   *window.Store
	metrics *Metrics
	gs      *grpc.Server
	lis     *bufconn.Listener
	client  sluicev1.RateLimitServiceClient

	httpLis    *bufconn.Listener // nil without an HTTP face
	httpSrv    *http.Server
	httpClient *http.Client

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	killed   sync.Once
	stopOnce sync.Once
}

func (n *inprocNode) Name() string         { return n.name }
func (n *inprocNode) Server() *Server      { return n.srv }
func (n *inprocNode) Store() *window.Store { return n.store }
func (n *inprocNode) Metrics() *Metrics    { return n.metrics }

// GRPCAddr returns the node's address in the cluster (see inprocAddr).
func (n *inprocNode) GRPCAddr() string { return inprocAddr(n.name) }

// HTTPAddr returns a host:port for URLs of the node's HTTP face; only the
// node's httpDo and httpClient reach it.
func (n *inprocNode) HTTPAddr() string { return n.name + ".inproc:80" }

// conn opens a plaintext connection to the node with opts (as dialConn
// does to a node's address), closed when the test ends.
func (n *inprocNode) conn(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), n.c.dialer()}, opts...)
	conn, err := grpc.NewClient(n.GRPCAddr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// peer returns a client of the node's peer API (as dialPeer does).
func (n *inprocNode) peer(t testing.TB) sluicev1.PeerServiceClient {
	return sluicev1.NewPeerServiceClient(n.conn(t))
}

// httpDo is httpDo against the node's HTTP face (url's host is ignored).
func (n *inprocNode) httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	if n.httpClient == nil {
		t.Fatalf("%s has no HTTP face (set HTTPAddr)", n.name)
	}
	return httpDoWith(t, n.httpClient, method, url, body)
}

// Kill stops the node at once, as a crash looks to the others' forwards:
// its listener and connections close, and nothing answers at its address
// any more. No member list changes (there is no gossip to tell). It is
// idempotent.
func (n *inprocNode) Kill() {
	n.killed.Do(func() {
		n.c.mu.Lock()
		delete(n.c.lis, n.name)
		n.c.mu.Unlock()
		n.srv.Drain()
		n.gs.Stop()
		n.stop()
	})
}

// stop stops what start started; it is idempotent.
func (n *inprocNode) stop() {
	n.stopOnce.Do(func() {
		if n.httpSrv != nil {
			n.httpClient.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if err := n.httpSrv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				_ = n.httpSrv.Close()
			}
			cancel()
		}
		n.srv.Drain()
		n.gs.Stop()
		n.cancel()
		n.wg.Wait()
		n.srv.Close()
	})
}

// peek sends rc with no hits through c and returns the decision (what
// peekRemaining reads of a *testNode).
func peek(t *testing.T, c sluicev1.RateLimitServiceClient, rc *sluicev1.RateLimitCheck) *sluicev1.Decision {
	t.Helper()
	p := proto.CloneOf(rc)
	p.Hits = proto.Int64(0)
	return check(t, c, p)
}
