package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"

	"github.com/sluicehq/sluice/internal/filewatch"
)

// The steps of StartNode, in its order.

// withDefaults returns cfg with its defaults filled in, or an error naming
// the setting that is invalid. It opens nothing.
func (cfg NodeConfig) withDefaults() (NodeConfig, error) {
	if cfg.Name == "" {
		return cfg, errors.New("name: required (a unique, stable member name)")
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:7070"
	}
	if cfg.GossipTransport != nil {
		ip, port, err := cfg.GossipTransport.FinalAdvertiseAddr("", 0)
		if err != nil {
			return cfg, fmt.Errorf("gossip transport: %w", err)
		}
		cfg.GossipAddr = net.JoinHostPort(ip.String(), strconv.Itoa(port))
	}
	if cfg.GossipAddr == "" {
		cfg.GossipAddr = "127.0.0.1:7946"
	}
	if cfg.Region == "" {
		cfg.Region = "local"
	}
	if err := checkRegions(cfg.Regions, cfg.Region); err != nil {
		return cfg, err
	}
	if cfg.LeaveTimeout <= 0 {
		cfg.LeaveTimeout = 5 * time.Second
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SettleTime <= 0 {
		cfg.SettleTime = time.Second
	}
	if cfg.NameKeyShare < 0 || cfg.NameKeyShare > 100 {
		return cfg, fmt.Errorf("name_key_share: must be in 1..100 (percent), got %d", cfg.NameKeyShare)
	}
	if cfg.NameKeyShare == 0 {
		cfg.NameKeyShare = DefaultNameKeyShare
	}
	if cfg.StateInterval < 0 {
		return cfg, fmt.Errorf("state_interval: must be >= 0, got %s", cfg.StateInterval)
	}
	if cfg.StateInterval > 0 && cfg.StateDir == "" {
		return cfg, errors.New("state_interval: needs state_dir (where the snapshots go)")
	}
	cfg.GRPC = cfg.GRPC.withDefaults()
	return cfg, nil
}

// secured is what loadSecurity read: how callers of the public API
// authenticate, and the TLS material and tokens they do it with.
type secured struct {
	mode   ClientAuth
	certs  *security.CertSource    // nil without TLS
	tokens *security.TokenSet      // nil without a token file
	admin  *security.AdminTokenSet // nil without an admin token file
}

// loadSecurity refuses cfg in protected mode (see protectedMode), settles
// the client authentication mode, and reads the TLS files and the token
// file. It binds nothing, and what it returns needs no closing.
func loadSecurity(cfg NodeConfig, log *slog.Logger) (secured, error) {
	if err := protectedMode(cfg); err != nil {
		return secured{}, err
	}
	mode, err := cfg.clientAuth()
	if err != nil {
		return secured{}, err
	}
	sec := secured{mode: mode}
	if cfg.TLSCert != "" {
		// The certificate must be this node's, now and on every reload.
		files := security.CertFiles{Cert: cfg.TLSCert, Key: cfg.TLSKey, CA: cfg.TLSCA}
		if sec.certs, err = security.NewCertSource(files, cfg.Name, log.With("component", "tls")); err != nil {
			return secured{}, err
		}
	}
	if cfg.TokenFile != "" {
		if sec.tokens, err = security.NewTokenSet(cfg.TokenFile, log.With("component", "tokens")); err != nil {
			return secured{}, err
		}
	}
	if cfg.AdminTokenFile != "" {
		if sec.admin, err = security.NewAdminTokenSet(cfg.AdminTokenFile, log.With("component", "admin")); err != nil {
			return secured{}, err
		}
	}
	return sec, nil
}

// listeners are the sockets listen bound.
type listeners struct {
	grpc       net.Listener
	advertised string       // the gRPC host:port others dial: the advertised host, the bound port
	http       net.Listener // nil without HTTPAddr
}

// close closes the listeners; for a StartNode that fails after listen.
func (l listeners) close() {
	l.grpc.Close()
	if l.http != nil {
		l.http.Close()
	}
}

// listen binds cfg.GRPCAddr and, when set, cfg.HTTPAddr; host is the
// advertised gRPC host. On an error it has closed what it bound.
func listen(cfg NodeConfig, host string) (listeners, error) {
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return listeners{}, fmt.Errorf("grpc_addr: %w", err)
	}
	// The advertised port is the bound one (the OS may have picked it).
	l := listeners{grpc: lis, advertised: net.JoinHostPort(host, strconv.Itoa(lis.Addr().(*net.TCPAddr).Port))}
	if cfg.HTTPAddr != "" {
		if l.http, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			lis.Close()
			return listeners{}, fmt.Errorf("http_addr: %w", err)
		}
	}
	return l, nil
}

// core is the node's state and the service on it.
type core struct {
	store   *window.Store
	metrics *Metrics
	server  *Server
}

// newCore builds the windows, the metrics and the Server (whose
// background loops it starts), and attaches the metrics to them. A
// StartNode that fails after it closes the Server.
func newCore(cfg NodeConfig, sec secured, log *slog.Logger) (core, error) {
	storeCfg := window.StoreConfig{Clock: cfg.Clock, MaxKeys: cfg.MaxKeys, OnKeyCap: cfg.OnKeyCap}
	if cfg.MaxKeys > 0 && cfg.NameKeyShare < 100 {
		storeCfg.MaxKeysPerGroup = max(cfg.MaxKeys*cfg.NameKeyShare/100, 1)
		storeCfg.Group = nameGroup(cfg.Limits)
	}
	store := window.NewStore(storeCfg)
	metrics := NewMetrics()
	metrics.setBuild(cfg.Version, cfg.Revision)
	// With TLS a peer proves its member name by its certificate; the
	// hand-off checks that the sender it names is the caller.
	peerIdentity := cfg.PeerIdentity
	if peerIdentity == nil && sec.certs != nil {
		peerIdentity = security.PeerName
	}
	srv, err := NewServer(ServerConfig{
		Name: cfg.Name, Store: store, Ring: cfg.Ring, Regions: cfg.Regions, Region: cfg.Region, LeaseBase: cfg.LeaseBase,
		ForwardTimeout: cfg.ForwardTimeout, Batch: cfg.Batch, Logger: log.With("component", "rpc"),
		Limits: cfg.Limits, Observer: metrics, DialOptions: cfg.DialOptions,
		HandOffTimeout: cfg.HandOffTimeout, Replication: cfg.Replication,
		PeerCredentials: security.PeerCredentials(sec.certs),
		MaxInflight:     max(cfg.GRPC.MaxInflight, 0), PeerIdentity: peerIdentity, hooks: cfg.hooks,
		TracerProvider: cfg.TracerProvider, AllowRefunds: cfg.AllowRefunds,
	})
	if err != nil {
		return core{}, err
	}
	metrics.Attach(srv, store, cfg.Limits)
	return core{store: store, metrics: metrics, server: srv}, nil
}

// newCluster starts gossip on cfg.GossipAddr, advertising advertised for
// gRPC (it does not join yet), and gives srv the instance it gossips.
func newCluster(cfg NodeConfig, advertised string, srv *Server) (*cluster.Cluster, error) {
	cl, err := cluster.New(cluster.Config{
		Name: cfg.Name, BindAddr: cfg.GossipAddr, AdvertiseHost: cfg.AdvertiseHost,
		GRPCAddr: advertised, Region: cfg.Region, Regions: cfg.Regions.Fingerprint(), Version: cfg.Version,
		Profile: cfg.Profile, Logger: cfg.Logger, Keys: cfg.GossipKeys, Label: cfg.ClusterLabel,
		Transport: cfg.GossipTransport, Since: srv.clusterSince(),
	})
	if err != nil {
		return nil, err
	}
	inst := cl.Instance()
	srv.instance.Store(&inst)
	srv.knownBefore = cl.KnownBefore
	return cl, nil
}

// grpcFace is the gRPC server newGRPCServer built, and its health.
type grpcFace struct {
	server *grpc.Server
	health *health.Server
	ready  *readyHealth // the health service; its sync is set once the Node exists
	names  []string     // the services health reports on
	rls    *rls.Service // nil unless cfg.RLS is set
}

// newGRPCServer builds the gRPC server (stream workers, codec, bounds,
// TLS, the callers' authentication) and registers sluice.v1, gRPC health,
// Envoy's RLS when cfg.RLS is set, and server reflection. Every service
// health reports on says NOT_SERVING. It serves nothing yet.
func newGRPCServer(cfg NodeConfig, sec secured, auth *security.Authenticator, c core, log *slog.Logger) grpcFace {
	// Stream workers serve RPCs on long-lived goroutines instead of a new
	// goroutine (and a new, growing stack) per RPC. gRPC starts a fresh
	// goroutine whenever every worker is busy, and a check waiting on its
	// owner keeps its worker busy, so there must be about as many workers
	// as checks in flight: with one per CPU, most RPCs grew a stack (10 %
	// of a node's CPU under spread load, 3 % with streamWorkers).
	sopts := slices.Concat([]grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers), codecServerOption}, windowServerOptions, cfg.GRPC.serverOptions())
	if sec.certs != nil {
		ca := tls.VerifyClientCertIfGiven // token or either: a call may come without one
		if sec.mode == ClientAuthMTLS {
			ca = tls.RequireAndVerifyClientCert
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(sec.certs.ServerConfig(ca, []string{"h2"}))))
	}
	if sec.certs != nil || sec.tokens != nil {
		sopts = append(sopts, grpc.ChainUnaryInterceptor(auth.UnaryInterceptor), grpc.ChainStreamInterceptor(auth.StreamInterceptor))
	}
	gs := grpc.NewServer(append(sopts, cfg.ServerOptions...)...)
	hs := health.NewServer()
	healthNames := []string{"", sluicev1.RateLimitService_ServiceDesc.ServiceName}
	rh := &readyHealth{Server: hs}
	sluicev1.RegisterRateLimitServiceServer(gs, c.server)
	sluicev1.RegisterPeerServiceServer(gs, c.server)
	healthpb.RegisterHealthServer(gs, rh)
	var rlsSvc *rls.Service
	if cfg.RLS != nil || cfg.RLSSource != nil {
		opts := cfg.RLSOptions
		opts.Clock, opts.Logger = cfg.Clock, log.With("component", "rls")
		opts.AllowRefunds = cfg.AllowRefunds // the node's Check takes them or refuses them
		rlsSvc = rls.NewService(cfg.RLS, c.server, opts)
		if cfg.RLSSource != nil {
			rlsSvc.Follow(cfg.RLSSource)
		}
		rlsSvc.Register(gs)
		c.metrics.AttachRLS(rlsSvc)
		healthNames = append(healthNames, rls.ServiceName, rls.HealthName)
	}
	registerAdmin(gs, c.server, auth, rlsSvc, cfg.rlsPath(), c.metrics)
	for _, name := range healthNames { // health.NewServer starts "" at SERVING
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	reflection.Register(gs)
	return grpcFace{server: gs, health: hs, ready: rh, names: healthNames, rls: rlsSvc}
}

// newNode builds the Node around what the steps before it made, with the
// authenticator of callers and the gRPC server (newGRPCServer), and wires
// its readiness into gRPC health and Server.Check. Nothing serves or runs
// yet; cancel stops what the steps after it start.
func newNode(cfg NodeConfig, log *slog.Logger, sec secured, lis listeners, c core, cl *cluster.Cluster, cancel context.CancelFunc) *Node {
	auth := security.NewAuthenticator(security.AuthConfig{Mode: sec.mode, TLS: sec.certs != nil, Tokens: sec.tokens, IsMember: c.server.isMember, HasNumbers: hasNumbers,
		AdminTokens: sec.admin, Refunds: cfg.AllowRefunds})
	g := newGRPCServer(cfg, sec, auth, c, log)
	n := &Node{cfg: cfg, lis: lis.grpc, grpcAddr: lis.advertised, grpc: g.server, health: g.health,
		cluster: cl, server: c.server, store: c.store, metrics: c.metrics, log: log, cancel: cancel, failed: make(chan error, 1),
		publish: make(chan struct{}, 1), certs: sec.certs, tokens: sec.tokens, adminTokens: sec.admin, auth: auth,
		admit:    make(chan struct{}, 1),
		joinDone: make(chan struct{}, 1), healthNames: g.names}
	if sec.certs != nil {
		n.verifier = n.newVerifier(sec.certs)
	}
	n.lastChange.Store(time.Now().UnixNano())
	if len(cfg.Join) == 0 {
		n.joined.Store(true) // a cluster of one: nothing to join
	}
	// Set before anything serves: health asks Ready, and Check refuses
	// client checks until the node has joined.
	g.ready.sync = n.syncHealth
	c.server.joined = func() bool { return n.joinedCluster() == nil }
	c.metrics.AttachNode(cfg.Name, cfg.Region, cfg.Version, n.Ready)
	n.rls = g.rls
	return n
}

// startLoops builds the ring from the members gossip knows so far, then
// starts the background work until ctx ends: the member watch, the
// verifier of members' certificates (TLS), the watch of the TLS and token
// files, the ring's publishing, the insecure warning (Insecure off
// loopback) and the sweeper of idle keys.
func (n *Node) startLoops(ctx context.Context) {
	n.setMembers()
	n.wg.Go(func() { n.watchMembers(ctx) })
	if n.certs != nil {
		n.wg.Go(func() { n.verifier.Run(ctx) })
	}
	if files := n.reloadFiles(); len(files) > 0 {
		n.wg.Go(func() {
			onError := func(err error) { n.log.Warn("watching TLS and token files", "error", err) }
			if err := filewatch.Watch(ctx, files, func() { _ = n.ReloadTLS() }, onError); err != nil {
				n.log.Warn("not watching the TLS and token files; reload them with SIGHUP", "error", err)
			}
		})
	}
	n.wg.Go(func() { n.publishRing(ctx) })
	secure := n.cfg
	secure.Insecure = false
	if setting, addr := exposed(n.cfg); setting != "" && protectedMode(secure) != nil {
		n.metrics.insecure.Set(1)
		n.wg.Go(func() { security.WarnInsecure(ctx, n.log, setting, addr) })
	}
	n.wg.Go(func() {
		n.store.RunSweeper(ctx, n.cfg.SweepInterval, func(_ int, took time.Duration) { n.metrics.ObserveSweep(took) })
	})
	if n.state != nil && n.cfg.StateInterval > 0 {
		n.wg.Go(func() { n.stateLoop(ctx) })
	}
}

// serveHTTP serves the HTTP face on lis (nil: no HTTP face), with TLS
// when the node has it, and sets n.http and n.httpAddr.
func (n *Node) serveHTTP(lis net.Listener) {
	if lis == nil {
		return
	}
	h, err := NewHTTPHandler(HTTPConfig{Server: n.server, Ready: n.Ready, Metrics: n.metrics, RLS: n.rls, auth: n.auth, rlsPath: n.cfg.rlsPath()})
	if err != nil { // cannot happen: the gateway's registration does not fail
		n.log.Error("no HTTP face", "error", err)
		return
	}
	if n.cfg.TracerProvider != nil {
		h = withTraceContext(h)
	}
	n.http = n.cfg.HTTP.Apply(&http.Server{Handler: h, ErrorLog: httpErrorLog(n.log)})
	if n.certs != nil {
		// Any mode: /healthz and /readyz stay open to probes
		// without a certificate; the handler checks the rest.
		n.http.TLSConfig = n.certs.ServerConfig(tls.VerifyClientCertIfGiven, []string{"h2", "http/1.1"})
		lis = tls.NewListener(lis, n.http.TLSConfig)
	}
	n.httpAddr = lis.Addr().String()
	n.wg.Go(func() {
		if err := n.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "error", err)
		}
	})
}

// join joins cfg.Join in the background (retrying until one answers or
// ctx ends; with no Join the node is a cluster of one). A join that
// returns has watchMembers rebuild the ring from what it merged; a
// cluster that refuses the node's name makes it give up (see Failed).
func (n *Node) join(ctx context.Context) {
	n.wg.Go(func() {
		_, err := n.cluster.Join(ctx, n.cfg.Join)
		if err == nil {
			n.joinOK.Store(true)
			select { // watchMembers rebuilds the ring from what the join merged
			case n.joinDone <- struct{}{}:
			default:
			}
		}
		switch {
		case errors.Is(err, cluster.ErrNameTaken), errors.Is(err, cluster.ErrRegions):
			n.refused.Store(true)
			// Stop gossip without a leave message: a leave under this
			// name would remove the other, rightful member.
			n.log.Error("refusing to take part in the cluster", "error", err)
			n.health.Shutdown()
			_ = n.cluster.Shutdown()
			n.failed <- err
		case err != nil && ctx.Err() == nil:
			n.log.Error("could not join the cluster", "error", err)
		}
	})
}

// serveGRPC serves gRPC on the node's listener, and turns health SERVING
// at once when the node is ready (a cluster of one), else once it is
// (serveWhenReady, until ctx ends).
func (n *Node) serveGRPC(ctx context.Context) {
	n.wg.Go(func() {
		if err := n.grpc.Serve(n.lis); err != nil {
			n.log.Error("grpc server stopped", "error", err)
		}
	})
	if !n.syncHealth() { // a cluster of one serves at once
		n.wg.Go(func() { n.serveWhenReady(ctx) })
	}
}

// closers are what StartNode has opened so far, for an error after.
type closers []func()

// add pushes f, to be run by closeAll.
func (c *closers) add(f func()) { *c = append(*c, f) }

// closeAll runs the closers, the last added first, and returns err.
func (c closers) closeAll(err error) error {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
	return err
}
