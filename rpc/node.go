package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/window"
)

// NodeConfig configures a whole node: gRPC server, gossip and windows.
type NodeConfig struct {
	// Name is the node's unique, stable member name. (Required)
	Name string
	// GRPCAddr is the host:port the gRPC server listens on; port 0 lets the
	// OS pick. Default "127.0.0.1:7070". (Optional)
	GRPCAddr string
	// GossipAddr is the host:port gossip listens on (TCP and UDP); port 0
	// lets the OS pick. Default "127.0.0.1:7946". (Optional)
	GossipAddr string
	// AdvertiseHost is the IP other members use to reach this node, for
	// gRPC and gossip alike; default the listening hosts. Required when a
	// listen address is a wildcard (0.0.0.0, ::). (Optional)
	AdvertiseHost string
	// Region is the node's region, e.g. "eu-west-1". Default "local".
	// With Regions it must be one of the list. (Optional)
	Region string
	// Regions is the cluster's region list (region.Parse of serve
	// --regions), the same on every node: the ring then holds this
	// region's members only, checks are decided in their region, and
	// global limits are split into slices (docs/regions.md). Members
	// whose list differs are refused (cluster.ErrRegions). nil: one
	// region, as before. (Optional)
	Regions *region.Config
	// LeaseBase is the fraction (0 < f <= 1) of a global limit (any
	// algorithm) the regions own as bases, split by weight; the rest is the
	// pool the key's allocator leases to the regions by demand; 1 turns
	// leases off (fixed slices for every algorithm). 0: DefaultLeaseBase
	// (0.5). (Optional)
	LeaseBase float64
	// Join lists gossip addresses (host:port) of members to join; empty
	// starts a cluster of one. Joining retries in the background until one
	// answers. (Optional)
	Join []string
	// Profile selects memberlist timings. Default cluster.LAN. (Optional)
	Profile cluster.Profile
	// Ring shapes the ring; every node must use the same. (Optional)
	Ring ring.Config
	// ForwardTimeout bounds a forward to a peer. Default 2 s. (Optional)
	ForwardTimeout time.Duration
	// Batch shapes the per-owner queues of forwarded checks: a batch goes
	// at Batch.MaxSize checks (default 1000) or Batch.MaxWait after its
	// first (default 200 us). (Optional)
	Batch BatchConfig
	// LeaveTimeout bounds the leave message in Close (after the hand-off).
	// Default 5 s. (Optional)
	LeaveTimeout time.Duration
	// HandOffTimeout bounds the hand-off of all this node's keys in Close,
	// and how long a new owner waits for keys moved to it (pulling each on
	// first touch meanwhile). Default 10 s. (Optional)
	HandOffTimeout time.Duration
	// Replication shapes the copies of this node's keys on the next
	// members of the ring: default 1 copy, sent every 100 ms. (Optional)
	Replication ReplicationConfig
	// SweepInterval is how often idle keys are removed. Default 5 s. (Optional)
	SweepInterval time.Duration
	// MaxKeys caps the keys this node holds state for; 0 means no cap (see
	// window.StoreConfig.MaxKeys). (Optional)
	MaxKeys int
	// OnKeyCap is what a new key past MaxKeys gets: window.KeyCapDeny (the
	// zero value: refused, answered not allowed and degraded) or
	// window.KeyCapEvict (another key is evicted). (Optional)
	OnKeyCap window.KeyCapPolicy
	// NameKeyShare is the share of MaxKeys, in percent (1..100), that the
	// keys of one limit name may hold; past it a new key of that name is
	// refused (under either policy), so one name cannot starve the others.
	// Every unconfigured (inline) name counts as one name. 0 means
	// DefaultNameKeyShare; 100 means no per-name share. (Optional)
	NameKeyShare int
	// GRPC bounds the gRPC server: message size, streams, keepalive,
	// connection age and checks in flight (see GRPCBounds). (Optional)
	GRPC GRPCBounds
	// HTTP bounds the HTTP face: timeouts and header size (see
	// HTTPBounds). (Optional)
	HTTP HTTPBounds
	// Clock is the owner's clock, the only one decisions use. Default the
	// system clock. (Optional)
	Clock window.Clock
	// Version is the sluice version, gossiped in metadata (members show
	// it) and exported as sluice_build_info's version label; at most 64
	// bytes of [A-Za-z0-9._+-]. (Optional)
	Version string
	// Revision is the commit the binary was built from, exported as
	// sluice_build_info's revision label. (Optional)
	Revision string
	// Logger receives the node's logs. Default slog.Default(). (Optional)
	Logger *slog.Logger
	// HTTPAddr is the host:port of the HTTP face (POST /v1/check,
	// GET /v1/members, /healthz, /readyz, /metrics; see NewHTTPHandler);
	// port 0 lets the OS pick; empty: no HTTP. (Optional)
	HTTPAddr string
	// Limits holds the named limits; nil: none. The node reads it on
	// every check; reloading it is the caller's (see limits.Source). (Optional)
	Limits *limits.Source
	// TracerProvider, when set, traces the forwards of checks to their
	// owners across batches: a span per forward sent (sluice.forward)
	// and per request received (sluice.forward.receive), each check's
	// trace context carried in the request (see docs/tracing.md); the
	// HTTP face takes its requests' W3C traceparent. The node's gRPC
	// calls are traced only by what ServerOptions and DialOptions add
	// (e.g. otelgrpc's stats handlers). nil: no spans, and forwards
	// carry no trace context. (Optional)
	TracerProvider trace.TracerProvider
	// ServerOptions are added to the gRPC server's options (e.g. a stats
	// handler for tracing). (Optional)
	ServerOptions []grpc.ServerOption
	// DialOptions are added to the options of connections to peers
	// (e.g. tracing; or, for tests and tools that simulate a network,
	// internal/wan's interceptors). (Optional)
	DialOptions []grpc.DialOption
	// GossipTransport, when set, carries gossip instead of sockets bound
	// on GossipAddr: for tests and tools that simulate a network (see
	// internal/wan). GossipAddr is then the transport's advertise address
	// (FinalAdvertiseAddr("", 0)), and AdvertiseHost does not apply to
	// gossip. Memberlist shuts it down when the node stops; if StartNode
	// fails, the caller does (it may be shut down already). (Optional)
	GossipTransport memberlist.Transport
	// GossipKeys, when set, encrypt and authenticate gossip (AES-256, each
	// 32 bytes, the first encrypts; see cluster.Config.Keys); rotate them
	// with Node.SetGossipKeys. (Optional)
	GossipKeys [][]byte
	// ClusterLabel marks this cluster's gossip so that another cluster on
	// the same network never merges with it. (Optional)
	ClusterLabel string
	// Insecure lets the node listen or advertise off loopback although it
	// gossips and serves in plaintext without authentication (see
	// protected mode in docs/security.md); it then says so in its log every
	// InsecureWarnEvery and in the metric sluice_insecure. On loopback it
	// changes nothing. (Optional)
	Insecure bool
	// SettleTime is how long membership must have been unchanged, once a
	// node started with Join has joined, before it first reports ready
	// (/readyz and gRPC health; see Node.Ready). A node started without
	// Join is ready at once. Default 1 s. (Optional)
	SettleTime time.Duration
	// PeerIdentity returns the member name a peer call's caller proved
	// (see ServerConfig.PeerIdentity); nil: none. (Optional)
	PeerIdentity func(ctx context.Context) (string, bool)
	// RLS, when set, serves Envoy's rate limit service (RLS v3) from these
	// rules on the gRPC port (see package rls and docs/envoy.md), gRPC
	// health answers for its service name and for "ratelimit" (as
	// envoyproxy/ratelimit's), and the HTTP face serves POST /json and GET
	// /healthcheck. (Optional)
	RLS *rls.Config
	// RLSSource, when set, serves Envoy's rate limit service as RLS does,
	// from the rules of this source, following its reloads (RLS is then
	// ignored). (Optional)
	RLSSource *rls.Source
	// RLSOptions are the rate limit service's settings (see rls.Options;
	// its Clock, Logger and AllowRefunds are the node's). (Optional)
	RLSOptions rls.Options
	// AllowRefunds lets callers give hits back: a check of negative hits
	// on Check and POST /v1/check (client.Refund), and an Envoy
	// descriptor with is_negative_hits (serve --allow-refunds). Off (the
	// default), negative hits are refused with INVALID_ARGUMENT naming
	// the field, an is_negative_hits descriptor only peeks, and the node,
	// as a key's owner, applies no client's refund another node let in
	// (see ServerConfig.AllowRefunds). On, a token refunds only with the
	// prefix "*" (a token limited to prefixes must not lift its own
	// limits); a client certificate may. Give every node the same
	// setting (sluice_refunds_allowed says each node's). (Optional)
	AllowRefunds bool
	// TLSCert and TLSKey are PEM files of this node's peer certificate
	// (its URI SAN spiffe://sluice/peer/NAME names this node, see
	// internal/certs) and key; TLSCA is a PEM bundle of the CA(s) that
	// sign peers and clients. Give all three or none. With them the gRPC
	// and HTTP ports serve TLS (1.2 at least), the node dials peers with
	// TLS 1.3 presenting its certificate, the peer API takes only callers
	// whose verified certificate names a current member, and a member
	// enters the ring only once this node has verified its certificate.
	// The files are reloaded when they change and on Node.ReloadTLS;
	// bad files keep the running ones. (Optional)
	TLSCert, TLSKey, TLSCA string
	// ClientAuth is how callers of the public API authenticate: mtls,
	// token or either; none authenticates nobody. Default mtls with TLS,
	// else token with a TokenFile, else none. (Optional)
	ClientAuth ClientAuth
	// TokenFile is a file of bearer tokens and the limit-name prefixes
	// each may check (see ParseTokens); reloaded with the TLS files. A
	// token over plaintext is refused unless it comes from loopback.
	// (Optional)
	TokenFile string
	// StateDir is a directory (created 0700 when absent) where the node
	// keeps its keys' state across a whole-cluster stop: a graceful
	// leave that no member can take the keys from writes them to the
	// file <name>.state there, and the next start reads them back before
	// it takes checks (see statedir.go and docs/persistence.md). A file
	// that is corrupt, truncated, of another format version or of another
	// node makes StartNode fail, naming the file. Empty: counts live in
	// memory only, and a whole-cluster stop loses them. (Optional)
	StateDir string
	// StateInterval, with StateDir, also writes a snapshot of the node's
	// keys every interval, so that a crash of the whole cluster loses at
	// most the hits of the last interval. 0: only a leave writes.
	// (Optional)
	StateInterval time.Duration
	// AdminTokenFile is a file of the admin API's tokens, one `TOKEN
	// [NAME]` a line (see ParseAdminTokens); reloaded with the TLS files.
	// They authorise the admin API only (inspect and reset keys, list
	// limits), never a check; a token of TokenFile never authorises the
	// admin API. Without it (and without TLS, whose admin certificates
	// authorise it too) the admin API answers loopback callers only, and
	// only on a node with no client authentication. (Optional)
	AdminTokenFile string

	hooks *testHooks // tests' seams; nil: none
}

// clientAuth returns cfg's client authentication mode with its default,
// or an error naming the setting when the mode lacks what it needs (see
// security.Settings.ClientAuthMode).
func (cfg NodeConfig) clientAuth() (ClientAuth, error) {
	return cfg.securitySettings().ClientAuthMode()
}

// Node is a running sluice node. Stop it with [Node.Close] (graceful) or
// [Node.Kill] (abrupt, as a crash looks to the others).
type Node struct {
	cfg      NodeConfig
	lis      net.Listener
	grpcAddr string // advertised
	grpc     *grpc.Server
	health   *health.Server
	cluster  *cluster.Cluster
	server   *Server
	store    *window.Store
	metrics  *Metrics
	http     *http.Server // nil without HTTPAddr
	httpAddr string
	log      *slog.Logger

	draining   atomic.Bool  // Close has begun
	lastChange atomic.Int64 // Unix ns of the last membership change seen

	// Readiness (see joinedCluster and Ready). joinOK: cluster.Join
	// returned success; joinApplied: the ring was rebuilt from a member
	// list read after that; joined and ready latch the first true answer
	// of joinedCluster and Ready.
	joinOK, joinApplied, joined, ready atomic.Bool
	joinDone                           chan struct{} // capacity 1: the join returned; rebuild the ring
	healthNames                        []string      // the services gRPC health reports on
	servingOnce                        sync.Once     // turns them SERVING

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	httpOnce  sync.Once
	closeErr  error
	failed    chan error    // receives the error that made the node give up
	publish   chan struct{} // capacity 1: the ring changed, gossip it
	refused   atomic.Bool   // the cluster refused the node (its name is taken): it hands nothing off

	rls *rls.Service // nil unless NodeConfig.RLS is set

	certs    *security.CertSource // nil without TLS
	tokens   *security.TokenSet   // nil without a token file
	auth     *security.Authenticator
	verifier *security.Verifier // nil without TLS
	admit    chan struct{}      // capacity 1: the verifier admitted a member

	state *stateDir // nil without StateDir

	adminTokens *security.AdminTokenSet // nil without an admin token file
}

// StartNode listens on cfg.GRPCAddr and cfg.GossipAddr, starts serving
// sluice.v1, gRPC health and server reflection, and starts joining cfg.Join
// in the background. gRPC health says NOT_SERVING until [Node.Ready] says
// the node is ready (at once for a node started without Join: a cluster
// of one), and client checks are refused with UNAVAILABLE until the node
// has joined. It returns an error naming the setting when cfg is invalid
// or an address cannot be bound.
func StartNode(cfg NodeConfig) (*Node, error) {
	// The steps, in an order that matters:
	//
	//  1. the config, defaulted and checked, the advertised host,
	//     security (protected mode, client auth, TLS and token files), and
	//     the state dir with its file read (StateDir): every refusal of
	//     the config comes before anything is bound;
	//  2. the gRPC and HTTP listeners: the advertised gRPC port is the
	//     bound one (the OS may pick it), and gossip advertises it;
	//  3. the core: windows, metrics and the Server (its loops start);
	//  4. the gossip cluster, not joined yet; the Server learns the
	//     instance it gossips;
	//  5. the Node with its gRPC server, health NOT_SERVING, and its
	//     readiness set into health and Server.Check before anything
	//     serves; the state file's keys go into the windows (or wait for
	//     the cluster, a snapshot: see statedir.go);
	//  6. the ring from the members gossip knows (setMembers), then the
	//     member watch that rebuilds it, and the rest of the background
	//     work;
	//  7. the HTTP face, the join, then gRPC; health turns SERVING at once
	//     for a cluster of one, else once the node is ready.
	//
	// From step 2 on, an error closes what the steps before it opened, the
	// last first (opened); from step 5 on nothing fails.
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("node", cfg.Name)
	host, err := advertise(cfg.GRPCAddr, cfg.AdvertiseHost)
	if err != nil {
		return nil, err
	}
	sec, err := loadSecurity(cfg, log)
	if err != nil {
		return nil, err
	}
	sd, saved, err := openStateDir(cfg, log)
	if err != nil {
		return nil, err
	}

	var opened closers
	lis, err := listen(cfg, host) // on an error it has closed what it bound
	if err != nil {
		return nil, err
	}
	opened.add(lis.close)
	c, err := newCore(cfg, sec, log)
	if err != nil {
		return nil, opened.closeAll(err)
	}
	opened.add(c.server.Close)
	cl, err := newCluster(cfg, lis.advertised, c.server)
	if err != nil {
		return nil, opened.closeAll(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	n := newNode(cfg, log, sec, lis, c, cl, cancel)
	n.state = sd
	n.restoreState(saved) // before anything serves
	n.startLoops(ctx)
	n.serveHTTP(lis.http)
	n.join(ctx)
	n.serveGRPC(ctx)
	n.stateStarted()
	log.Info("node started", "grpc_addr", n.grpcAddr, "gossip_addr", cl.GossipAddr(), "http_addr", n.httpAddr, "region", cfg.Region, "allow_refunds", cfg.AllowRefunds)
	return n, nil
}

// advertise returns the host other members should dial for a server bound
// to bind, given an optional advertise host.
func advertise(bind, host string) (string, error) {
	bh, _, err := net.SplitHostPort(bind)
	if err != nil {
		return "", fmt.Errorf("grpc_addr: %w", err)
	}
	if host != "" {
		if net.ParseIP(host) == nil {
			return "", fmt.Errorf("advertise_addr: %q is not an IP address", host)
		}
		return host, nil
	}
	if ip := net.ParseIP(bh); bh == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("advertise_addr: required when grpc_addr %q listens on all interfaces", bind)
	}
	return bh, nil
}

// watchMembers rebuilds the ring on every membership change and every
// member admitted after its certificate verified; it is the only
// goroutine that applies member lists once the node runs, so they apply
// in order.
func (n *Node) watchMembers(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.cluster.Changes():
		case <-n.admit: // the verifier admitted a member
		case <-n.joinDone: // the join returned: apply what it merged
		}
		afterJoin := n.joinOK.Load() // read before setMembers reads the members
		n.lastChange.Store(time.Now().UnixNano())
		n.setMembers()
		if afterJoin {
			n.joinApplied.Store(true)
		}
		n.syncHealth() // latches joinedCluster as soon as it holds
	}
}

// setMembers rebuilds the ring from the gossip's members (with TLS, only
// those whose certificate this node verified) and publishes the ring's
// fingerprint and epoch in this node's metadata.
func (n *Node) setMembers() {
	if h := n.server.hooks; h != nil && h.holdMembers.Load() {
		return // a test sets the members by hand
	}
	ms := n.cluster.Members()
	n.settleSnapshot(ms) // before a ring with others routes checks here
	if n.certs != nil {
		ms = n.admitted(ms)
	}
	_ = n.server.gossipMembers(ms)
	select {
	case n.publish <- struct{}{}:
	default:
	}
}

// publishRing gossips this node's ring fingerprint and epoch in its
// metadata after each ring change, off the membership path (an update
// waits for its broadcast to go out).
func (n *Node) publishRing(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.publish:
		}
		if n.server.leaving.Load() {
			continue
		}
		fp, mh, epoch := n.server.RingInfo()
		if err := n.cluster.SetRing(fp, mh, epoch, time.Second); err != nil {
			n.log.Debug("cannot publish the ring in the metadata", "error", err)
		}
		if err := n.cluster.SetSince(n.server.clusterSince(), time.Second); err != nil {
			n.log.Debug("cannot publish when the cluster began in the metadata", "error", err)
		}
	}
}

// Ready returns nil when the node should take traffic, else why not: it
// is leaving (Close has begun), the cluster refused it (its name is
// taken), it has not joined the cluster yet (see joinedCluster), or, for
// a node started with Join, membership changed less than SettleTime ago
// (the ring is settling: the others are still learning of this node).
// Once it has returned nil it does so until the node leaves: later
// membership changes are the ring's to handle (hand-offs), not a reason
// to send traffic elsewhere. It is the one test of readiness: /readyz
// reports it, gRPC health (the overall service "" and every service the
// node registers) says SERVING exactly when it returns nil, and a node
// that has not joined refuses client checks.
func (n *Node) Ready() error {
	switch {
	case n.draining.Load():
		return errors.New("draining: the node is leaving")
	case n.refused.Load():
		return errRefused
	case n.ready.Load():
		return nil
	}
	if err := n.joinedCluster(); err != nil {
		return err
	}
	if len(n.cfg.Join) > 0 {
		if since := time.Since(time.Unix(0, n.lastChange.Load())); since < n.cfg.SettleTime {
			return fmt.Errorf("ring settling: membership changed %s ago", since.Round(time.Millisecond))
		}
	}
	n.ready.Store(true)
	return nil
}

// Reasons joinedCluster gives.
var (
	errJoining   = errors.New("joining the cluster")
	errVerifying = errors.New("joining the cluster: checking members' certificates")
	errRefused   = errors.New("refused by the cluster: its name is taken")
)

// joinedCluster returns nil once the node has joined its cluster, else
// why not. A node started without Join is a cluster of one and has
// joined from the start. One started with Join has joined once its ring
// holds the membership it learned from another node: its join returned
// and the ring was rebuilt from a member list read after it, or a member
// joined through it (its ring holds another member); with TLS, also no
// member that gossip lists is left out of the ring while its certificate
// has not been checked yet. Until then the node would decide every key
// as its owner from a fresh window, so Server.Check refuses client checks
// (UNAVAILABLE: ask another node). Once nil, it stays nil; a node the
// cluster refused never joins.
func (n *Node) joinedCluster() error {
	switch {
	case n.refused.Load():
		return errRefused
	case n.joined.Load():
		return nil
	case !n.joinApplied.Load() && len(n.server.view.Load().members) < 2:
		return errJoining
	case n.certs != nil && n.verifying():
		return errVerifying
	}
	n.joined.Store(true)
	return nil
}

// verifying reports whether gossip lists a member that this node's ring
// leaves out and whose current incarnation has not failed to verify yet:
// its certificate is still to be checked (TLS; see security.Verifier).
func (n *Node) verifying() bool {
	inRing := map[string]bool{}
	v := n.server.view.Load()
	ms := v.members
	if v.all != nil {
		// With regions the ring holds this region's members only; the
		// others' are verified members all the same (all is built from
		// the admitted list).
		ms = v.all
	}
	for _, m := range ms {
		inRing[m.Name] = true
	}
	var outside []cluster.Member
	for _, m := range n.cluster.Members() {
		if !inRing[m.Name] {
			outside = append(outside, m)
		}
	}
	return n.verifier.Verifying(incarnations(outside))
}

// syncHealth turns every service gRPC health reports on SERVING once
// Ready returns nil, and reports whether it does. Nothing here turns them
// back: Close and a refusal do, through health.Server.Shutdown, which
// also ignores a later SERVING.
func (n *Node) syncHealth() bool {
	if n.Ready() != nil {
		return false
	}
	n.servingOnce.Do(func() {
		for _, name := range n.healthNames {
			n.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
		}
	})
	return true
}

// readyPoll is how often serveWhenReady asks Ready while the node is not
// ready (it also asks after each membership change).
const readyPoll = 50 * time.Millisecond

// serveWhenReady asks Ready every readyPoll until it returns nil (gRPC
// health then says SERVING) or ctx ends. It polls because a node can turn
// ready with no membership change to wake watchMembers: its settle time
// ends, or a member's certificate fails to verify (TLS).
func (n *Node) serveWhenReady(ctx context.Context) {
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for !n.syncHealth() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// readyHealth is a node's grpc.health.v1 service: health.Server's, with
// a Check that answers from Node.Ready at the time of the call, so that
// a probe and /readyz never disagree (Watch streams follow within
// readyPoll).
type readyHealth struct {
	*health.Server
	sync func() bool // Node.syncHealth
}

// Check implements grpc.health.v1.Health/Check: NOT_FOUND for a service
// the node does not report on, else SERVING exactly when Node.Ready
// returns nil.
func (h *readyHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	ready := h.sync()
	resp, err := h.Server.Check(ctx, req)
	if err == nil && !ready {
		resp = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}
	}
	return resp, err
}

// SetGossipKeys replaces the gossip keyring live (see cluster.SetKeys):
// keys[0] encrypts, all decrypt, keys not listed are removed. It fails on a
// node started without GossipKeys.
func (n *Node) SetGossipKeys(keys [][]byte) error { return n.cluster.SetKeys(keys) }

// streamWorkers is the number of long-lived goroutines that serve a node's
// gRPC calls (an idle one holds an 8 KiB stack).
const streamWorkers = 256

// HTTPAddr returns the host:port the HTTP face listens on ("" without one).
func (n *Node) HTTPAddr() string { return n.httpAddr }

// Metrics returns the node's metrics.
func (n *Node) Metrics() *Metrics { return n.metrics }

// Failed returns a channel that receives the error that made the node give
// up (e.g. cluster.ErrNameTaken); the node has then stopped gossip and
// health says NOT_SERVING. Close it still.
func (n *Node) Failed() <-chan error { return n.failed }

// Name returns the node's member name.
func (n *Node) Name() string { return n.cfg.Name }

// GRPCAddr returns the host:port this node advertises for gRPC.
func (n *Node) GRPCAddr() string { return n.grpcAddr }

// GossipAddr returns the host:port this node advertises for gossip.
func (n *Node) GossipAddr() string { return n.cluster.GossipAddr() }

// Server returns the node's gRPC service implementation.
func (n *Node) Server() *Server { return n.server }

// Store returns the node's windows.
func (n *Node) Store() *window.Store { return n.store }

// RLS returns the node's Envoy rate limit service (for its Stats), or nil
// when NodeConfig.RLS was not set.
func (n *Node) RLS() *rls.Service { return n.rls }

// Close stops the node gracefully (what SIGTERM does): health turns
// NOT_SERVING and the node stops taking checks, hands the state of all its
// keys to their next owners (bounded by HandOffTimeout and ctx), leaves the
// gossip (telling the others, bounded by LeaveTimeout), the gRPC and HTTP
// servers finish the calls in flight (bounded by ctx and 1 s), the keys
// that such calls decided here after the hand-off are handed off too
// (Server.FinishLeave), with StateDir the keys no member could take are
// written there (see keepState), and background work stops.
// It is idempotent and returns the first error. Keys no member could take
// (this node was the last, or every other member was leaving too: a
// whole cluster stopping at once) are no error: without StateDir it logs
// at info how many it drops.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.draining.Store(true)
		n.health.Shutdown()
		hto := n.cfg.HandOffTimeout
		if hto <= 0 {
			hto = DefaultHandOffTimeout
		}
		hctx, cancel := context.WithTimeout(ctx, hto)
		start := time.Now()
		var herr error
		if !n.refused.Load() {
			herr = n.server.Leave(hctx)
		}
		cancel()
		if n.server.leases != nil && !n.refused.Load() {
			// The region's only node: what it has not admitted of its
			// global slices goes back to the keys' allocators, which so
			// know exactly what the region admitted when it comes back.
			gctx, cancel := context.WithTimeout(ctx, hto)
			if k := n.server.leases.giveBackAll(gctx); k > 0 {
				n.log.Info("gave back the global slices not admitted: this node is its region's only member", "messages", k)
			}
			if k := n.server.leases.handOverAll(gctx); k > 0 {
				n.log.Info("handed the allocators' records over to the keys' next allocators", "messages", k)
			}
			cancel()
		}
		dropped := errors.Is(herr, ErrNoneToTake) // expected when the whole cluster stops
		switch {
		case dropped && n.state == nil:
			n.log.Info("keys dropped: no member can take them (every other member is leaving too, or none is left)", "keys", n.store.Len())
		case dropped: // keepState saves them in the state dir, and says so
		case herr != nil:
			n.log.Error("hand-off before leaving incomplete", "error", herr, "took", time.Since(start))
		default:
			n.log.Info("handed off all keys", "took", time.Since(start))
		}
		n.log.Info("leaving the cluster")
		err := n.cluster.Leave(n.cfg.LeaveTimeout)
		if err == nil && !dropped {
			err = herr
		}
		n.server.Drain()
		done := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			n.grpc.Stop()
			<-done
		}
		n.stopHTTP()
		var ferr error
		if herr == nil && !n.refused.Load() {
			// No call is in flight now: hand off what calls that began
			// before the hand-off decided here after it.
			fctx, cancel := context.WithTimeout(ctx, hto)
			if ferr = n.server.FinishLeave(fctx); ferr != nil {
				n.log.Error("hand-off of late keys incomplete", "error", ferr)
				if err == nil {
					err = ferr
				}
			}
			cancel()
		}
		n.keepState(errors.Join(herr, ferr)) // keys no member could take go to StateDir
		n.stop()
		n.closeErr = err
		n.log.Info("node stopped")
	})
	return n.closeErr
}

// Kill stops the node at once, without a leave message: to the others it
// looks like a crash. It is idempotent.
func (n *Node) Kill() {
	n.closeOnce.Do(func() {
		_ = n.cluster.Shutdown()
		n.server.Drain()
		n.grpc.Stop()
		n.stop()
	})
}

// stopHTTP shuts the HTTP server down (1 s for the requests in flight);
// it is idempotent.
func (n *Node) stopHTTP() {
	n.httpOnce.Do(func() {
		if n.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = n.http.Shutdown(ctx)
			cancel()
			_ = n.http.Close()
		}
	})
}

func (n *Node) stop() {
	n.draining.Store(true)
	n.stopHTTP()
	n.cancel()
	n.wg.Wait()
	st := n.server.Stats()
	for name, p := range st.Peers {
		mean, lat := 0.0, time.Duration(0)
		if p.Batches > 0 {
			mean, lat = float64(p.Checks)/float64(p.Batches), p.Latency/time.Duration(p.Batches)
		}
		n.log.Info("forwarded to peer", "peer", name, "calls", p.Batches, "checks", p.Checks,
			"mean_batch", fmt.Sprintf("%.2f", mean), "mean_latency", lat, "errors", p.Errors)
	}
	n.log.Info("routing totals", "local_checks", st.LocalChecks, "forwarded_checks", st.ForwardedChecks,
		"received_calls", st.ReceivedRPCs, "received_checks", st.ReceivedChecks)
	n.log.Info("hand-off totals", "handed_off", st.HandedOff, "received", st.ReceivedHandOff, "pulls", st.Pulls,
		"reforwarded", st.Reforwarded, "degraded", st.Degraded, "moved_without_state", st.MovedWithoutState,
		"owner_lost", st.OwnerLost, "replica_behind", st.ReplicaBehind, "replica_takeovers", st.ReplicaTakeovers, "replica_returned", st.ReplicaReturned,
		"evicted_live", st.EvictedLive, "ring_mismatch", st.RingMismatch)
	n.server.Close()
}

// reloadFiles lists the TLS and token files to watch.
func (n *Node) reloadFiles() []string {
	var out []string
	if n.certs != nil {
		out = append(out, n.cfg.TLSCert, n.cfg.TLSKey, n.cfg.TLSCA)
	}
	if n.tokens != nil {
		out = append(out, n.cfg.TokenFile)
	}
	if n.adminTokens != nil {
		out = append(out, n.cfg.AdminTokenFile)
	}
	return out
}

// ReloadTLS reads the TLS certificate, key and CA, the token file and
// the admin token file again (serve does it on SIGHUP; the node also does
// when the files change). New handshakes use what it read; connections
// already open keep theirs. A file that is missing, half written or does not parse keeps
// the running material, is logged, and its error is returned.
func (n *Node) ReloadTLS() error {
	var errs []error
	if n.certs != nil {
		errs = append(errs, n.certs.Reload())
	}
	if n.tokens != nil {
		errs = append(errs, n.tokens.Reload())
	}
	if n.adminTokens != nil {
		errs = append(errs, n.adminTokens.Reload())
	}
	return errors.Join(errs...)
}

// admitted returns this node and the members of ms whose current
// incarnation (name, gRPC address, instance) has presented this node's CA's
// peer certificate of its name; it asks the verifier to verify the others.
func (n *Node) admitted(ms []cluster.Member) []cluster.Member {
	ok := n.verifier.Admit(incarnations(ms))
	out := make([]cluster.Member, 0, len(ms))
	for i, m := range ms {
		if ok[i] {
			out = append(out, m)
		}
	}
	return out
}

// incarnations returns the incarnation of each of ms, as the verifier
// tells members apart.
func incarnations(ms []cluster.Member) []security.Member {
	out := make([]security.Member, len(ms))
	for i, m := range ms {
		out[i] = security.Member{Name: m.Name, Addr: m.GRPCAddr, Instance: m.Instance}
	}
	return out
}

// newVerifier returns the verifier of members' certificates (TLS): it
// dials the members gossip lists with cs and wakes watchMembers when it
// admitted one (watchMembers rebuilds the ring: one goroutine applies
// member lists, in order).
func (n *Node) newVerifier(cs *security.CertSource) *security.Verifier {
	return security.NewVerifier(security.VerifierConfig{
		Self:    n.cfg.Name,
		Members: func() []security.Member { return incarnations(n.cluster.Members()) },
		Verify:  cs.VerifyMember,
		OnAdmit: func() {
			select {
			case n.admit <- struct{}{}:
			default:
			}
		},
		Logger: n.log,
	})
}

// Unverified returns, by member name, how many times the certificate of
// each member gossip lists but this node has not admitted to its ring has
// failed to verify (TLS only; empty without TLS).
func (n *Node) Unverified() map[string]int {
	if n.verifier == nil {
		return map[string]int{}
	}
	return n.verifier.Failures()
}
