// Package rpc is a sluice node's gRPC face: the public RateLimitService
// (Check, Members), the PeerService that nodes forward checks over, and the
// routing of each check to the owner of its key on the ring.
//
// It keeps the faces and the composition; each concern has a room of its
// own under rpc/internal, and no room imports rpc:
//
//   - custody: the keys this node owns (decisions under the gate, tombs,
//     take-outs, moving-in, takeovers); pure, no sockets;
//   - ringview: member list to ring (epochs, history, departed members);
//     pure, time passed in;
//   - handoff: moving key state (push loop, leave, pulls, the HandOff and
//     Pull receivers and their vetting);
//   - forward: peer connections and the one forward path (batcher, peer
//     stream, per-peer stats);
//   - replica: copies on successors;
//   - security: client auth, tokens, TLS, peer identity, member
//     verification, protected mode.
//
// Rooms talk through small interfaces their consumer owns (handoff.Node,
// handoff.StandIns, replica.View, forward.Observer...).
//
// # Lock order
//
// the pause detector's mu (pause.go) → setMu (SetMembers, Leave, memberLeaving) → custody's gate → custody's mu
// → fbMu (the stand-in windows) → a replica shard lock → window.Store
// shard locks, each step skippable (e.g. a stand-in decision takes fbMu,
// then a replica shard lock). ringview's, forward's and the replica store's
// locks are leaves: nothing is called with them held (replica.Store.Orphans
// calls its callbacks with no lock held). See package custody for the
// rules of the gate.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/custody"
	"github.com/sluicehq/sluice/rpc/internal/forward"
	"github.com/sluicehq/sluice/rpc/internal/handoff"
	"github.com/sluicehq/sluice/rpc/internal/pause"
	"github.com/sluicehq/sluice/rpc/internal/replica"
	"github.com/sluicehq/sluice/rpc/internal/ringview"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// DefaultForwardTimeout bounds one forward to a peer when
// ServerConfig.ForwardTimeout is 0.
const DefaultForwardTimeout = 2 * time.Second

// ServerConfig configures a Server.
type ServerConfig struct {
	// Name is this node's member name; a check whose key the ring gives to
	// Name is decided here and never forwarded. (Required)
	Name string
	// Store holds the windows of the keys this node owns. (Required)
	Store *window.Store
	// Ring shapes the ring; every node must use the same. (Optional)
	Ring ring.Config
	// Regions is the cluster's region list, the same on every node; nil:
	// one region (every member in the ring). With a list, the ring holds
	// the members of Region only, checks are decided in the region they
	// entered (or, scope exact, in the home region), and global limits
	// are split into per-region slices (see package region). (Optional)
	Regions *region.Config
	// Region is this node's region; with Regions it must be in the list.
	// (Optional)
	Region string
	// ForwardTimeout bounds one forward to a peer. Default 2 s. (Optional)
	ForwardTimeout time.Duration
	// Logger for routing events. Default slog.Default(). (Optional)
	Logger *slog.Logger
	// DialOptions are added to the options of peer connections (e.g.
	// transport credentials); default plaintext. (Optional)
	DialOptions []grpc.DialOption
	// Batch shapes the per-owner queues of forwarded checks. (Optional)
	Batch BatchConfig
	// Limits holds the named limits that checks without numbers take
	// theirs from; nil: none. (Optional)
	Limits *limits.Source
	// Observer is told of every answered check and every peer call, for
	// metrics; nil: nobody. (Optional)
	Observer Observer
	// HandOffTimeout bounds how long this node, as a key's new owner,
	// waits for keys that moved to it (pulling each on first touch
	// meanwhile), and how long a hand-off to one peer may take.
	// Default 10 s. (Optional)
	HandOffTimeout time.Duration
	// Replication shapes the copies of this node's keys on the next
	// members of the ring. (Optional)
	Replication ReplicationConfig
	// PeerCredentials, when set, gives the transport credentials of the
	// connection to the member called name (TLS verifying that the server
	// is that member); they replace the plaintext default. (Optional)
	PeerCredentials func(name string) credentials.TransportCredentials
	// MaxInflight bounds the checks Check works on at once; a call that
	// would go over it is refused with RESOURCE_EXHAUSTED and counted in
	// Stats.InflightRefused. 0: no bound. (Optional)
	MaxInflight int
	// PeerIdentity returns the member name a peer call's caller proved
	// (e.g. by its verified certificate), or false when the transport
	// proves none. When it returns a name, a hand-off whose sender field
	// names another member is refused. nil: no transport identity; the
	// sender field is checked against the ring alone. (Optional)
	PeerIdentity func(ctx context.Context) (string, bool)

	// LeaseBase is the fraction of a global limit the regions
	// own as bases (see NodeConfig.LeaseBase). 0: DefaultLeaseBase.
	// (Optional)
	LeaseBase float64
	// TracerProvider, when set, traces forwards: a span per forward
	// sent and per request received, the trace context of each check
	// carried to its owner in the request (docs/tracing.md). nil: no
	// spans, and requests carry no trace context. (Optional)
	TracerProvider trace.TracerProvider
	// AllowRefunds lets clients give hits back (a check of negative hits:
	// a refund, see Server.refund; serve --allow-refunds). Off (the
	// default), Check refuses negative hits with INVALID_ARGUMENT naming
	// the field, and this node, as a key's owner, applies no client's
	// refund that another node let in (answered with an error, counted in
	// Stats.RefundsRefused). A node's own refunds of an all-or-nothing
	// request are applied either way. Every node of a cluster should
	// have the same setting. (Optional)
	AllowRefunds bool

	hooks *testHooks // tests' seams; nil: none
}

// Server implements sluicev1.RateLimitServiceServer and
// sluicev1.PeerServiceServer for one node. It is safe for concurrent use.
// Create it with [NewServer], then call [Server.SetMembers] on every
// membership change.
type Server struct {
	sluicev1.UnimplementedRateLimitServiceServer
	sluicev1.UnimplementedPeerServiceServer

	name    string
	store   *window.Store
	ringCfg ring.Config
	regions *region.Config // nil: one region
	region  string
	// awayWindows decide, degraded, the exact checks that entered here
	// while the home region could not be reached (policy local); nil
	// without several regions. See awayDecide.
	awayWindows *window.Store
	// leases move global limits' capacity between regions
	// (see leases.go); nil without several regions.
	leases         *leases
	forwardTimeout time.Duration
	log            *slog.Logger
	dialOpts       []grpc.DialOption
	batch          BatchConfig
	limits         *limits.Source
	obs            Observer
	handOffTimeout time.Duration
	replication    ReplicationConfig
	peerCreds      func(name string) credentials.TransportCredentials
	// allowRefunds: clients may give hits back (ServerConfig.AllowRefunds).
	allowRefunds bool
	// refundOffLogged is the Unix ns of the last warning of a client's
	// refund refused here as owner (see refund).
	refundOffLogged atomic.Int64

	// pause watches this node's run for gaps (see pause.go).
	pause *pause.Detector

	view atomic.Pointer[view]
	// rings makes the ring of each member list (see package ringview);
	// its writers are serialized by setMu.
	rings *ringview.Tracker
	setMu sync.Mutex // serializes SetMembers, Leave and memberLeaving

	leaving atomic.Bool // set by Leave: the ring excludes this node
	// joined, set by StartNode before serving, reports whether the node
	// has joined its cluster (Node.joinedCluster); nil: always.
	joined func() bool
	// hooks are tests' seams (nil outside tests; see testHooks).
	hooks *testHooks
	// handingOff is closed when Leave's first hand-off pass has ended (set
	// by Leave before leaving is; nil before).
	handingOff atomic.Pointer[chan struct{}]
	// custody keeps the keys this node owns (see package custody for
	// its gate and the lock order).
	custody *custody.Custody
	// handoff moves key state in and out of this node (see package
	// handoff): the push loop, pulls, a leave's hand-off, the receivers.
	handoff  *handoff.Mover
	replicas *replica.Store
	dirty    *replica.DirtySet
	fallback *window.Store // windows of degraded (owner unavailable) decisions; see standin.go
	fbMu     sync.Mutex    // guards fbBase and fbGen, and orders the fallback windows' changes
	fbBase   map[string]*standInEntry
	fbGen    uint64
	fbKeys   atomic.Int64 // len(fbBase)
	flushMu  sync.Mutex   // one flushStandIns at a time
	// standInSignal asks the stand-in loop to hand on stand-in hits now.
	standInSignal chan struct{}
	instance      atomic.Pointer[string] // this node's gossiped instance id
	// knownBefore reports whether the cluster knew another process of
	// this node's name when it joined (cluster.Cluster.KnownBefore; nil
	// without gossip: no).
	knownBefore func() bool
	lastInput   []cluster.Member // the member list SetMembers was last given; guarded by setMu
	bgCancel    context.CancelFunc
	bg          sync.WaitGroup

	stats     counters
	peerStats *forward.Stats // Forward calls per peer
	inflight  inflight

	draining  chan struct{} // closed by Drain
	drainOnce sync.Once

	retired *forward.Retired // peers left the ring, connection closing after a grace

	peerIdentity func(context.Context) (string, bool)
	// tracer makes the forwards' spans (see tracing.go); nil: tracing off.
	tracer trace.Tracer
	// senderClocks: member name -> *senderClock, the estimate of its clock
	// that forwarded deadlines are read on (see deadlineHere).
	senderClocks sync.Map
}

// view is what routing needs, swapped whole on each membership change.
type view struct {
	ring    *ring.Ring
	members []cluster.Member // sorted by name
	// home is the home region's ring, for exact checks, when this node
	// is in another region (nil otherwise, or when no home member is
	// live); all is every member of every region (Members lists them).
	home *ring.Ring
	all  []cluster.Member
	// rings are the other regions' rings (by region; a region without a
	// live member has none): a key's owner there, for leases.
	rings map[string]*ring.Ring
	peers map[string]*forward.Peer // by member name, this node excluded
	epoch uint64                   // ring builds that changed the fingerprint
	// bootstrap marks the view a Server starts with (a ring of itself
	// alone, before it heard of any member): it owned nothing yet.
	bootstrap bool
	// routes is the view's routing table for clients, built on first use
	// (see Server.routingTable).
	routes atomic.Pointer[sluicev1.RoutingTable]
}

// counters count routing events; read them with Server.Stats.
type counters struct {
	localChecks, forwardedChecks, noConnection, receivedRPCs, receivedChecks atomic.Int64

	reforwarded, notOwnerApplied, viewMismatch, ringMismatch                                          atomic.Int64
	degraded, replicaBehind, replicated                                                               atomic.Int64
	standInAdmitted, standInReturned, standInForwarded, standInLeased, pausedDenied, expired, refunds atomic.Int64
	refundsRefused                                                                                    atomic.Int64
}

// PeerStats counts the Forward calls made to one peer: of every kind
// (batched, no_batching, re-forwarded, sent to a stand-in).
type PeerStats struct {
	// Batches is the number of Forward calls; Checks the checks they carried
	// (Checks/Batches is the mean batch size).
	Batches, Checks int64
	// Errors is the number of calls that failed.
	Errors int64
	// Latency is the total time spent in those calls.
	Latency time.Duration
}

// Stats is a snapshot of a Server's routing counters.
type Stats struct {
	// LocalChecks: checks this node decided as owner, entered here.
	LocalChecks int64
	// ForwardedChecks: checks sent to their owner on another node.
	ForwardedChecks int64
	// ForwardRPCs: Forward calls made to peers (all peers' Batches).
	ForwardRPCs int64
	// ForwardErrors: Forward calls that failed, and checks whose owner had
	// no connection.
	ForwardErrors int64
	// ReceivedRPCs: Forward calls received from peers.
	ReceivedRPCs int64
	// ReceivedChecks: checks received in those calls.
	ReceivedChecks int64
	// Peers: Forward calls per peer, by member name.
	Peers map[string]PeerStats

	// RingEpoch: ring builds on this node that changed the fingerprint.
	RingEpoch uint64
	// Reforwarded: checks received as owner that this node's ring gives to
	// another member, or checks of a key whose ring changed while this node
	// was about to decide them, sent on to the owner once (never further).
	Reforwarded int64
	// NotOwnerApplied: re-forwarded checks decided here although this
	// node's ring names another owner (rings disagreed for a moment).
	NotOwnerApplied int64
	// ViewMismatch: forwarded requests whose sender's ring fingerprint
	// differed from this node's.
	ViewMismatch int64
	// RingMismatch: times a member was seen with the same member set but
	// another ring fingerprint (a different ring config or library): the
	// two disagree about owners. Logged at Warn.
	RingMismatch int64
	// Degraded: checks answered per on_owner_unavailable because their
	// owner could not be reached. Each may hand a client extra budget.
	Degraded int64
	// MovedWithoutState: keys that moved here, or were to move from here,
	// whose state could not be moved (a pull or a leave's hand-off
	// failed, or the hand-off timed out): each may start afresh.
	MovedWithoutState int64
	// OwnerLost: keys first touched here as new owner whose previous owner
	// left the ring without a hand-off and with no replica: they start
	// afresh.
	OwnerLost int64
	// ReplicaBehind: key copies a replication send failed to deliver (sent
	// again next interval); a crash meanwhile loses their latest hits.
	ReplicaBehind int64
	// EvictedLive: keys removed under MaxKeys inside their window (from
	// window.StoreStats): each handed its client a fresh budget.
	EvictedLive int64
	// HandOffTimeouts: ring changes whose hand-off did not complete within
	// the hand-off timeout.
	HandOffTimeouts int64
	// HandedOff: keys whose state this node sent to a new owner (pushed or
	// pulled); ReceivedHandOff: keys merged from peers' hand-offs.
	HandedOff, ReceivedHandOff int64
	// HandOffErrors: hand-offs to a peer that failed (retried on the next
	// ring change; the keys stay here meanwhile).
	HandOffErrors int64
	// Pulls: keys pulled on first touch while a hand-off was incomplete.
	Pulls int64
	// ReplicaTakeovers: keys whose replica stood in for a lost owner.
	ReplicaTakeovers int64
	// ReplicaReturned: keys taken over from a copy and handed back to the
	// same owner process (it was out of the ring only for a moment, a
	// flap): only the hits counted here beyond the copy went back.
	ReplicaReturned int64
	// Replicated: key copies sent to successors; Replicas: copies held now.
	Replicated int64
	Replicas   int

	// KeysRefused: new keys not admitted because the store was full under
	// the deny key-cap policy or their name held its share (from
	// window.StoreStats.Refused); each such check was answered not
	// allowed and degraded.
	KeysRefused int64
	// InflightRefused: Check calls refused with RESOURCE_EXHAUSTED because
	// the node had MaxInflight checks in flight.
	InflightRefused int64
	// HandOffRefused: key states refused in peers' hand-offs (a sender
	// that is not a member or could not hand the key off, an old ring, or
	// absurd or undecodable values; nothing of them was merged), and keys
	// of pulls refused because their sender is not a member.
	HandOffRefused int64
	// StandInAdmitted: hits this node admitted in the stead of an
	// unreachable owner (degraded answers under the local policy), each
	// counted in its fallback window of the key; StandInForwarded: checks
	// this node sent to an unreachable owner's stand-in holder;
	// StandInReturned: keys whose stand-in hits went to their owner (or
	// into this node's own window once it owned the key);
	// StandInLeasedDenied: leased global checks a stand-in denied (it
	// holds none of the region's slice: unknown means spent).
	StandInAdmitted, StandInForwarded, StandInReturned, StandInLeasedDenied int64
	// Pauses: the gaps in this node's run taken for pauses (a frozen
	// process; see pause.go), each followed by a relearn of its keys;
	// PausedDenied: checks denied after a pause, of its keys because a
	// pull of the key did not reach every other member, and of other
	// members' keys it would have decided in their stead from copies that
	// may be stale.
	Pauses, PausedDenied int64
	// Expired: forwarded checks this node, as owner, did not apply because
	// they came after the sender's deadline (the sender answered them
	// without it).
	Expired int64
	// Refunds: refunds applied here as owner that gave hits back: of
	// checks given back because another check of the same request was
	// denied (all or nothing), and clients' refunds (negative hits).
	Refunds int64
	// RefundsRefused: clients' refunds (negative hits) that another node
	// let in and this node, the key's owner, did not apply because
	// refunds are off here (ServerConfig.AllowRefunds): the nodes'
	// --allow-refunds differ.
	RefundsRefused int64
	// AllowRefunds is this node's ServerConfig.AllowRefunds.
	AllowRefunds bool
	// Leases (several regions; leases.go): LeaseRequests this node sent
	// for its region's slices; LeaseGrants its allocators sent, and
	// LeaseGrantedHits the hits grants raised its region's slices by;
	// LeaseLowers its allocators sent and LeaseAcks they received, and
	// LeaseGivenBack the hits those acks returned to the pools;
	// LeaseStands the standing slices its allocators set (each a Stand
	// message to a region, acknowledged); LeaseGiveBacks the give-backs
	// this node sent unasked for its region (what it would not use of a
	// window's slice, where others wanted more; their hits count in
	// LeaseGivenBack at the allocator);
	// SliceExhausted the leased checks denied here because the region's
	// slice was spent; LeaseMessages and LeaseCalls the messages and
	// Lease calls this node sent to other nodes (LeaseReplies the replies
	// it answered other nodes' calls with), LeaseCallErrors the
	// calls that failed (their messages are lost: sent again or asked
	// again, never applied twice).
	LeaseRequests, LeaseGrants, LeaseGrantedHits, LeaseLowers, LeaseAcks, LeaseGivenBack, LeaseStands, LeaseGiveBacks, SliceExhausted int64
	LeaseMessages, LeaseReplies, LeaseCalls, LeaseCallErrors                                                                          int64
	// LeasePools are the lease figures by limit name (a configured
	// limit's name, InlineName for the rest): see PoolStats. Nil without
	// leases.
	LeasePools map[string]PoolStats
}

// Stats returns the routing counters.
func (s *Server) Stats() Stats {
	pauses, _ := s.pause.Pauses()
	st := Stats{
		LocalChecks:     s.stats.localChecks.Load(),
		ForwardedChecks: s.stats.forwardedChecks.Load(),
		ForwardErrors:   s.stats.noConnection.Load(),
		ReceivedRPCs:    s.stats.receivedRPCs.Load(),
		ReceivedChecks:  s.stats.receivedChecks.Load(),
		Peers:           s.peerStatsSnapshot(),

		RingEpoch:           s.view.Load().epoch,
		Reforwarded:         s.stats.reforwarded.Load(),
		NotOwnerApplied:     s.stats.notOwnerApplied.Load(),
		ViewMismatch:        s.stats.viewMismatch.Load(),
		RingMismatch:        s.stats.ringMismatch.Load(),
		Degraded:            s.stats.degraded.Load(),
		MovedWithoutState:   s.handoff.Counters.MovedWithoutState.Load(),
		OwnerLost:           s.handoff.Counters.OwnerLost.Load(),
		ReplicaBehind:       s.stats.replicaBehind.Load(),
		EvictedLive:         s.store.Stats().EvictedLive,
		KeysRefused:         s.store.Stats().Refused,
		InflightRefused:     s.inflight.refused.Load(),
		HandOffRefused:      s.handoff.Counters.Refused.Load(),
		HandOffTimeouts:     s.custody.Stats().HandOffTimeouts,
		HandedOff:           s.handoff.Counters.HandedOff.Load(),
		ReceivedHandOff:     s.handoff.Counters.Received.Load(),
		HandOffErrors:       s.handoff.Counters.Errors.Load(),
		Pulls:               s.handoff.Counters.Pulls.Load(),
		ReplicaTakeovers:    s.handoff.Counters.Takeovers.Load(),
		ReplicaReturned:     s.custody.Stats().ReplicaReturned,
		Replicated:          s.stats.replicated.Load(),
		Replicas:            s.replicas.Len(),
		StandInAdmitted:     s.stats.standInAdmitted.Load(),
		StandInForwarded:    s.stats.standInForwarded.Load(),
		StandInLeasedDenied: s.stats.standInLeased.Load(),
		Pauses:              pauses,
		PausedDenied:        s.stats.pausedDenied.Load(),
		StandInReturned:     s.stats.standInReturned.Load() + s.handoff.Counters.StandInReturned.Load(),
		Expired:             s.stats.expired.Load(),
		Refunds:             s.stats.refunds.Load(),
		RefundsRefused:      s.stats.refundsRefused.Load(),
		AllowRefunds:        s.allowRefunds,
	}
	if l := s.leases; l != nil {
		st.LeaseRequests, st.LeaseGrants, st.LeaseGrantedHits = l.st.requests.Load(), l.st.grants.Load(), l.st.grantedHits.Load()
		st.LeaseLowers, st.LeaseAcks, st.LeaseGivenBack = l.st.lowers.Load(), l.st.acks.Load(), l.st.givenBack.Load()
		st.SliceExhausted, st.LeaseStands, st.LeaseGiveBacks = l.st.exhausted.Load(), l.st.stands.Load(), l.st.giveBacks.Load()
		st.LeaseMessages, st.LeaseCalls, st.LeaseCallErrors = l.st.sent.Load(), l.st.calls.Load(), l.st.callErrors.Load()
		st.LeaseReplies = l.st.replied.Load()
		st.LeasePools = l.poolStats()
	}
	for _, p := range st.Peers {
		st.ForwardRPCs += p.Batches
		st.ForwardErrors += p.Errors
	}
	return st
}

func (s *Server) peerStatsSnapshot() map[string]PeerStats {
	out := map[string]PeerStats{}
	for name, c := range s.peerStats.Snapshot() {
		out[name] = PeerStats{Batches: c.Batches, Checks: c.Checks, Errors: c.Errors, Latency: c.Latency}
	}
	return out
}

// NewServer returns a Server whose ring holds only itself, and starts its
// background hand-off and replication loops (stopped by [Server.Close]).
// It returns an error when Name or Store is missing or the ring config is
// invalid.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Name == "" {
		return nil, errors.New("rpc: name is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("rpc: store is required")
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = DefaultForwardTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HandOffTimeout <= 0 {
		cfg.HandOffTimeout = DefaultHandOffTimeout
	}
	if err := checkRegions(cfg.Regions, cfg.Region); err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	cfg.Ring.Regions = cfg.Regions.Fingerprint()
	s := &Server{
		regions:        cfg.Regions,
		region:         cfg.Region,
		hooks:          cfg.hooks,
		inflight:       inflight{max: int64(max(cfg.MaxInflight, 0))},
		peerIdentity:   cfg.PeerIdentity,
		name:           cfg.Name,
		store:          cfg.Store,
		ringCfg:        cfg.Ring,
		forwardTimeout: cfg.ForwardTimeout,
		log:            cfg.Logger,
		batch:          cfg.Batch.WithDefaults(),
		limits:         cfg.Limits,
		obs:            cfg.Observer,
		retired:        forward.NewRetired(),
		peerStats:      forward.NewStats(cfg.Observer),
		draining:       make(chan struct{}),
		handOffTimeout: cfg.HandOffTimeout,
		replication:    cfg.Replication.WithDefaults(),
		replicas:       replica.NewStore(),
		dirty:          replica.NewDirtySet(),
		// Degraded answers while an owner is unreachable: a fresh budget
		// for an evicted key there is no worse than the degraded answer.
		fallback:      window.NewStore(window.StoreConfig{Clock: storeClock{cfg.Store}, MaxKeys: 100_000, OnKeyCap: window.KeyCapEvict}),
		fbBase:        map[string]*standInEntry{},
		standInSignal: make(chan struct{}, 1),
		custody: custody.New(custody.Config{Self: cfg.Name, Store: cfg.Store, HandOffTimeout: cfg.HandOffTimeout,
			Logger: cfg.Logger, Hooks: cfg.hooks.custodyHooks()}),
		dialOpts:     slices.Concat([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), codecDialOption}, WindowDialOptions(), cfg.DialOptions),
		peerCreds:    cfg.PeerCredentials,
		allowRefunds: cfg.AllowRefunds,
		pause:        pause.New(pauseThreshold(cfg.ForwardTimeout), time.Now()),
	}
	rings, err := ringview.New(cfg.Name, cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	if cfg.Regions != nil {
		rings.SetRegion(cfg.Region)
	}
	if cfg.Regions.Multi() && cfg.Region != cfg.Regions.Home() {
		s.awayWindows = window.NewStore(window.StoreConfig{Clock: storeClock{cfg.Store}, MaxKeys: 100_000, OnKeyCap: window.KeyCapEvict})
	}
	s.rings = rings
	if cfg.Regions.Multi() {
		if cfg.LeaseBase < 0 || cfg.LeaseBase > 1 {
			return nil, fmt.Errorf("rpc: lease base: must be in (0, 1], got %v", cfg.LeaseBase)
		}
		s.leases = newLeases(s, cfg.LeaseBase)
	}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	r, _ := rings.Ring()
	s.view.Store(&view{ring: r, members: []cluster.Member{{Name: cfg.Name, State: cluster.Alive}}, bootstrap: true})
	ctx, cancel := context.WithCancel(context.Background())
	s.bgCancel = cancel
	s.handoff = s.newMover()
	s.bg.Go(func() { s.handoff.Run(ctx) })
	s.bg.Go(func() { s.standInLoop(ctx) })
	s.bg.Go(func() { s.pauseLoop(ctx) })
	if s.awayWindows != nil {
		s.bg.Go(func() { s.awayWindows.RunSweeper(ctx, 0, nil) })
	}
	if s.leases != nil {
		s.bg.Go(func() { s.leases.run(ctx) })
	}
	if s.replication.Factor > 0 {
		s.bg.Go(func() { s.replicateLoop(ctx) })
	}
	return s, nil
}

// SetMembers rebuilds the ring and the peer connections from the full
// member list and swaps them in; lookups never wait for it. This node is
// always a member, listed or not. Connections to members that are gone or
// moved are closed after the forward timeout, so calls in flight finish.
// When the ring cannot be built (e.g. more members than partitions) it
// keeps the old view and returns the error.
//
// The order of its steps matters, under setMu:
//
//  1. ringview makes the ring of the list (leaving and departing members
//     out, the epoch, the history and departed members);
//  2. the peer connections for the ring's members (dialed lazily);
//  3. custody learns of a changed ring (what moves here, tombs of keys no
//     longer owned), and the copies of departed members' keys that move
//     here are taken over, BEFORE the view is swapped, so that a check
//     routed by the new ring finds what it awaits and those copies;
//  4. the view is swapped: checks route by the new ring from here on;
//  5. connections no longer in the view retire after the forward timeout;
//  6. mismatching rings are warned about;
//  7. the push loop hands off what this node no longer owns, and the
//     stand-in loop hands on what it admitted for others (after the swap:
//     a push works under the view it reads).
func (s *Server) SetMembers(members []cluster.Member) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	return s.setMembersLocked(members)
}

// gossipMembers is SetMembers for a member list gossip brings. While a
// test sets the members by hand (testHooks.holdMembers) it does nothing:
// checked under setMu, so a list read before the test's hold cannot land
// after the test's own list and undo it.
func (s *Server) gossipMembers(members []cluster.Member) error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	if h := s.hooks; h != nil && h.holdMembers.Load() {
		return nil
	}
	return s.setMembersLocked(members)
}

// setMembersLocked is SetMembers with setMu held.
func (s *Server) setMembersLocked(members []cluster.Member) error {
	old := s.view.Load()
	s.lastInput = slices.Clone(members)
	leaving := s.leaving.Load()
	up, err := s.rings.Apply(viewMembers(members), s.instanceID(), leaving, time.Now())
	if err != nil {
		s.log.Error("cannot build ring; keeping the old one", "members", len(members), "error", err)
		return fmt.Errorf("rpc: %w", err)
	}
	if up.Empty {
		return nil
	}
	ms := membersNamed(members, up.Names, s.name)
	others := s.regionRings(old.rings, members)
	var home *ring.Ring
	if s.regions.Multi() && s.region != s.regions.Home() {
		home = others[s.regions.Home()]
	}
	peers := s.dialPeers(old.peers, ms, otherMembers(others, members))
	if up.Changed && !leaving {
		s.custody.RingChanged(up.Prev, up.Ring, time.Now())
		// The copies of departed members' keys that are this node's now
		// stand in for their state before the new ring routes a check of
		// them here (the push loop, which takes over the rest, runs after).
		s.handoff.TakeOverOwn(up.Ring)
	}
	s.view.Store(&view{ring: up.Ring, members: ms, peers: peers, epoch: up.Epoch, bootstrap: s.rings.Bootstrap(),
		home: home, all: s.membersOf(members), rings: others})
	if !leaving && s.replication.Factor > 0 && !up.Changed && restartedMember(old.members, ms, s.name) {
		// A member of the ring is another process than before (it was
		// restarted before the cluster declared the old one dead, so the
		// ring did not change and the replication loop does not copy
		// every key again): the copies it held went with the old
		// process. Every key this node owns is copied again, so that a
		// copy of an unchanged key is not missing when its owner dies
		// next (issue 35: two nodes per region killed in turn lost the
		// keys' counts that way).
		r := up.Ring
		s.bg.Go(func() { s.recopy(r) })
	}
	if s.leases != nil {
		s.leases.viewChanged(s.view.Load())
	}
	for name, p := range old.peers {
		if peers[name] != p {
			go s.retire(p, s.forwardTimeout) // off the membership path
		}
	}
	s.warnMismatches(up.Mismatches)
	if up.Changed {
		s.log.Info("ring rebuilt", "members", len(ms), "fingerprint", up.Ring.Fingerprint(), "epoch", up.Epoch)
		if !leaving {
			s.signalPush()
		}
		s.signalStandIn()
	}
	if up.Restarted && !up.Changed && !leaving {
		// Its old process's copies here go to the new one (orphans),
		// also when the ring did not change on the way.
		s.signalPush()
	}
	return nil
}

// viewMembers is what ringview needs of ms.
func viewMembers(ms []cluster.Member) []ringview.Member {
	out := make([]ringview.Member, len(ms))
	for i, m := range ms {
		out[i] = ringview.Member{Name: m.Name, Instance: m.Instance, Region: m.Region, RingMembers: m.RingMembers,
			RingFingerprint: m.RingFingerprint, Version: m.Version}
	}
	return out
}

// membersNamed returns the members of ms named in names (sorted), in that
// order; self, when named and not listed, as an alive member.
func membersNamed(ms []cluster.Member, names []string, self string) []cluster.Member {
	out := make([]cluster.Member, 0, len(names))
	for _, name := range names {
		i := slices.IndexFunc(ms, func(m cluster.Member) bool { return m.Name == name })
		if i < 0 {
			out = append(out, cluster.Member{Name: self, State: cluster.Alive})
			continue
		}
		out = append(out, ms[i])
	}
	return out
}

// isMember reports whether name is this node or in the member list the
// ring was last built from (with TLS, only members whose certificate this
// node verified).
func (s *Server) isMember(name string) bool {
	_, ok := s.rings.Instance(name)
	return ok
}

// memberInstance returns member's gossiped instance id as of the last
// member list ("" if unknown or not a member).
func (s *Server) memberInstance(name string) string {
	inst, _ := s.rings.Instance(name)
	return inst
}

// memberLeaving takes name out of the ring: it said it has handed off all
// its keys and is leaving (gossip may tell of it late, or, if its leave
// message is lost, only after failure detection). Only the member's
// gossiped instance counts: an impostor under its name is ignored.
func (s *Server) memberLeaving(name, instance string) {
	s.setMu.Lock()
	var inst string
	found := false
	for _, m := range s.lastInput {
		if m.Name == name {
			inst, found = m.Instance, true
		}
	}
	if !found || name == s.name || instance == "" || inst != instance {
		s.setMu.Unlock()
		return
	}
	s.rings.Departing(name, inst)
	in := s.lastInput
	s.setMu.Unlock()
	_ = s.SetMembers(in)
}

// Drain ends the peer streams this server answers, so that a graceful stop
// of the gRPC server does not wait for peers to hang up. It is idempotent.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Close stops the background loops and closes every peer connection. The
// Server must not be used after.
func (s *Server) Close() {
	s.bgCancel()
	s.bg.Wait()
	s.setMu.Lock()
	defer s.setMu.Unlock()
	v := s.view.Load()
	s.view.Store(&view{ring: v.ring, members: v.members, epoch: v.epoch})
	for _, p := range v.peers {
		p.Close()
	}
	s.retired.Close()
}

// Owner returns the name of the member that owns (name, key) under this
// node's current ring.
func (s *Server) Owner(name, key string) string {
	return s.view.Load().ring.Owner(ring.Key(nil, name, key))
}

// RingFingerprint returns the fingerprint of this node's current ring.
func (s *Server) RingFingerprint() string { return s.view.Load().ring.Fingerprint() }

// Check implements RateLimitService.Check: it validates the batch, decides
// the checks this node owns, forwards the others to their owners (owners
// in parallel; see forward) and answers in request order.
func (s *Server) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	if s.joined != nil && !s.joined() { // alone, it would decide every key from a fresh window
		return nil, status.Error(codes.Unavailable, "sluice: not joined yet; ask another node")
	}
	reqs, fe := parseBatch(req.GetChecks(), s.limits.Current(), false, s.allowRefunds)
	if fe != nil {
		if s.obs != nil {
			for range min(len(req.GetChecks()), MaxBatch) {
				s.obs.Checked(InlineName, OutcomeInvalid)
			}
		}
		return nil, invalidArgument(fe)
	}
	if s.leaving.Load() {
		return nil, status.Error(codes.Unavailable, "sluice: "+errLeaving.Error()+"; ask another node")
	}
	if err := s.inflight.acquire(len(reqs)); err != nil {
		return nil, err
	}
	defer s.inflight.release(len(reqs))
	s.applyScopes(reqs, false)
	out := make([]*sluicev1.Decision, len(reqs))
	pending := make([]int, 0, len(reqs))
	for i := range reqs {
		if reqs[i].noSlice && !reqs[i].isRefund() {
			out[i] = s.sliceDenial(&reqs[i])
			continue
		}
		pending = append(pending, i)
	}
	// A failed forward is retried once if the view changed meanwhile: the
	// key may have moved, possibly to this node. The view's pointer is
	// compared on purpose: every SetMembers, Leave and Close stores a new
	// view, so a view that is still the same one means no membership
	// change at all (not even a peer's new address, which a retry would
	// dial), while the ring's own identity is its epoch (see
	// custody.Custody.Decide).
	for attempt := 0; len(pending) > 0; attempt++ {
		v := s.view.Load()
		failed := s.route(ctx, v, reqs, pending, out)
		if len(failed) == 0 || attempt == 1 || s.view.Load() == v {
			if len(failed) > 0 {
				s.answerUnavailable(ctx, reqs, failed, out)
			}
			break
		}
		pending = pending[:0]
		for _, f := range failed {
			pending = append(pending, f.index)
		}
	}
	if len(reqs) > 1 && req.GetAllOrNothing() {
		s.allOrNothing(ctx, reqs, out)
	}
	for i, d := range out {
		r := &reqs[i]
		d.AppliedAtNs = 0 // for peers only
		s.regionAnswer(r, d)
		if r.isRefund() {
			continue // not a check: nothing admitted or denied
		}
		outcome := OutcomeAllowed
		switch {
		case d.Error != "":
			outcome = OutcomeError
		case d.Refunded:
			outcome = OutcomeDenied // another check of the request denied it
		case !d.Allowed && r.shadow:
			// Shadow mode: report the would-be denial, deny nothing.
			d.Allowed, d.Shadow, d.RetryAfter = true, true, 0
			outcome = OutcomeShadowDenied
		case !d.Allowed:
			outcome = OutcomeDenied
		}
		if s.obs != nil {
			name := InlineName
			if r.named {
				name = r.name
			}
			s.obs.Checked(name, outcome)
		}
	}
	return &sluicev1.CheckResponse{Decisions: out, Routes: s.routesFor(req, s.view.Load())}, nil
}

// failure is a check whose owner could not be reached.
type failure struct {
	index      int
	owner, err string
}

// route decides or forwards the checks reqs[i] for i in idx under view v,
// writing decisions into out, and returns the checks it could not get
// decided.
func (s *Server) route(ctx context.Context, v *view, reqs []request, idx []int, out []*sluicev1.Decision) []failure {
	var (
		remote, given byOwner
		buf           []byte
		failed        []failure
	)
	for k, i := range idx {
		r := &reqs[i]
		buf = ring.Key(buf[:0], r.name, r.key)
		if s.regions != nil && s.crossRegion(r) {
			// Exact: the key's owner in the home region decides.
			if v.home == nil {
				failed = append(failed, failure{index: i, owner: "home region " + s.regions.Home(), err: "no live member in the home region " + s.regions.Home()})
				continue
			}
			remote.add(v.home.Owner(buf), idx, k)
			continue
		}
		owner := v.ring.Owner(buf)
		if owner == s.name {
			if to := s.custody.TombFor(buf); to != "" {
				// A peer pulled the key: this ring is behind. The key's
				// state is there; it decides. (decideOwned checks again
				// under its gate; here such checks go in one call per peer.)
				given.add(to, idx, k)
				continue
			}
			out[i] = s.decideOwned(ctx, v, buf, *r, true)
			s.stats.localChecks.Add(1)
			continue
		}
		remote.add(owner, idx, k)
	}
	if given.firstIs != nil {
		s.reforward(ctx, v, given.first, reqs, given.firstIs, out)
		for to, is := range given.more {
			s.reforward(ctx, v, to, reqs, is, out)
		}
	}
	switch {
	case remote.firstIs == nil:
		return failed
	case remote.more == nil && len(failed) == 0: // the common case: no goroutine needed
		return s.forward(ctx, v.peers[remote.first], remote.first, reqs, remote.firstIs, out)
	}
	return append(failed, s.forwardAll(ctx, v, reqs, &remote, out)...)
}

// forwardAll forwards the checks of remote to their owners in parallel,
// one goroutine per owner (see forward), and returns those that could not
// be decided.
func (s *Server) forwardAll(ctx context.Context, v *view, reqs []request, remote *byOwner, out []*sluicev1.Decision) []failure {
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed []failure
	)
	to := func(owner string, is []int) {
		wg.Go(func() {
			if fs := s.forward(ctx, v.peers[owner], owner, reqs, is, out); len(fs) > 0 {
				mu.Lock()
				failed = append(failed, fs...)
				mu.Unlock()
			}
		})
	}
	to(remote.first, remote.firstIs)
	for owner, is := range remote.more {
		to(owner, is)
	}
	wg.Wait()
	return failed
}

// byOwner groups the indexes of a request's checks by the member each
// goes to, in their order, without a map while they all go to one member
// (the common case: one check, or a batch of keys of one owner), and
// without a slice of its own while that member's indexes are a prefix of
// the request's (idx, which it then shares). The zero value is empty.
type byOwner struct {
	first   string
	firstIs []int            // first's indexes: idx[:len(firstIs)] while prefix
	prefix  bool             // firstIs is a prefix of idx
	more    map[string][]int // the members after first
}

// add adds idx[k], whose check goes to member o. The indexes idx[:k] were
// added before it, in order.
func (g *byOwner) add(o string, idx []int, k int) {
	switch {
	case g.firstIs == nil:
		g.first = o
		if g.prefix = k == 0; g.prefix {
			g.firstIs = idx[:1:1]
		} else {
			g.firstIs = []int{idx[k]}
		}
	case o == g.first:
		if g.prefix && k == len(g.firstIs) {
			g.firstIs = idx[: k+1 : k+1]
			return
		}
		g.prefix = false
		g.firstIs = append(g.firstIs, idx[k]) // a prefix's capacity is its length: this copies it
	default:
		if g.more == nil {
			g.more = make(map[string][]int)
		}
		g.more[o] = append(g.more[o], idx[k])
	}
}

// forward gets the checks reqs[i], i in is, decided by their owner p and
// writes the decisions into out; it returns the checks that could not be
// decided, each with its error. They go through the owner's batcher
// together, in their order (so the owner applies them in request order),
// batched with other requests' checks; when one of them is marked
// no_batching they go at once in one call of their own. Either way nothing
// waits longer than the forward timeout (plus the batch wait).
func (s *Server) forward(ctx context.Context, p *forward.Peer, owner string, reqs []request, is []int, out []*sluicev1.Decision) []failure {
	fail := func(err error) []failure {
		fs := make([]failure, len(is))
		for j, i := range is {
			fs[j] = failure{index: i, owner: owner, err: err.Error()}
		}
		return fs
	}
	if p == nil {
		s.stats.noConnection.Add(1)
		return fail(fmt.Errorf("owner %s: no connection to it", owner))
	}
	s.stats.forwardedChecks.Add(int64(len(is)))
	batch := true
	for _, i := range is {
		batch = batch && !reqs[i].pb.NoBatching
	}
	// The owner gets at most the forward timeout (Forward's bound), and
	// at most half the time the caller has left: the other half is for a
	// stand-in's answer should the owner not answer, so that no check is
	// counted for an answer the caller no longer waits for.
	by := firstDeadline(reqs, is)
	if d, ok := ctx.Deadline(); ok {
		if half := time.Now().Add(time.Until(d) / 2); by.IsZero() || half.Before(by) {
			by = half
		}
	}
	ds, err := s.peerForward(ctx, p, forward.Request{Checks: checksOf(reqs, is), By: by, NoBatching: !batch})
	if err != nil {
		return fail(err)
	}
	return s.answered(owner, is, ds, out)
}

// answered writes the owner's decisions ds of the checks reqs[i], i in is,
// into out, and returns those the owner did not apply because they reached
// it after their deadline, or because it is leaving and could not pass them
// on: to the sender they are checks whose owner could not be reached.
func (s *Server) answered(owner string, is []int, ds []*sluicev1.Decision, out []*sluicev1.Decision) []failure {
	var late []failure
	for j, i := range is {
		if e := ds[j].Error; e == errExpired || e == errNotDecided {
			late = append(late, failure{index: i, owner: owner, err: "owner " + owner + ": " + e})
			continue
		}
		out[i] = ds[j]
	}
	return late
}

// firstDeadline returns the earliest deadline (this node's clock) of the
// checks reqs[i], i in is, that came from a peer with one (the first
// sender waits no longer); the zero time when none did. Forwards pass it
// as forward.Request.By, which the forward timeout bounds too.
func firstDeadline(reqs []request, is []int) time.Time {
	var dl int64
	for _, i := range is {
		if d := reqs[i].deadline; d != 0 && (dl == 0 || d < dl) {
			dl = d
		}
	}
	if dl == 0 {
		return time.Time{}
	}
	return time.Unix(0, dl)
}

// checksOf returns the checks reqs[i], i in is, as they go on the wire.
func checksOf(reqs []request, is []int) []*sluicev1.RateLimitCheck {
	checks := make([]*sluicev1.RateLimitCheck, len(is))
	for j, i := range is {
		checks[j] = reqs[i].pb
	}
	return checks
}

// decideOwned decides a check of a key this node owns under v: when the
// key moved here and its state has not arrived yet, it first pulls it.
// The decision is made under decideGate's read lock, and only if v's ring
// is still this node's and no peer has pulled the key: hand-offs and pulls
// take keys out under its write lock, so a hit either lands in the state
// they carry away or is not made here. When the ring changed meanwhile
// (reroute), the check goes to the key's owner under the new ring (marked
// reforwarded: it decides there), or is decided here again if that is this
// node. Without reroute (a reforwarded check, which must not make a third
// hop) it is decided here all the same, and handed off after.
func (s *Server) decideOwned(ctx context.Context, v *view, storeKey []byte, r request, reroute bool) *sluicev1.Decision {
	for {
		if h := s.hooks; h != nil && h.decideOwned != nil {
			h.decideOwned(s, storeKey)
		}
		s.checkPause()
		if mi := s.custody.Awaiting(v.ring, storeKey); mi != nil && !s.settle(ctx, v, mi, storeKey) {
			if mi.Stale && r.isRefund() {
				// The key's state is not here yet: a refund now would
				// give back from nothing.
				return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: "the key's state is not here yet; refund not applied"}
			}
			if mi.Stale {
				// It paused, and a member did not answer the key's pull:
				// unknown means spent.
				s.stats.pausedDenied.Add(1)
				return s.unknownDenial(r, s.store.Now())
			}
			if d := s.unsettledDecide(ctx, v, mi, storeKey, r); d != nil {
				return d
			}
		}
		s.foldStandIn(storeKey)
		var (
			d   *sluicev1.Decision
			now *view
		)
		decided, moved, to := s.custody.Decide(storeKey, v.epoch, func() uint64 {
			now = s.view.Load()
			return now.epoch
		}, !reroute, func() { d = s.decide(storeKey, &r) })
		if decided {
			if moved && now.ring.Owner(storeKey) != s.name {
				s.signalPush() // the key is no longer this node's
			}
			return d
		}
		owner := now.ring.Owner(storeKey)
		if owner == s.name && to == "" {
			v = now
			continue
		}
		if owner == s.name {
			owner = to
		}
		out := make([]*sluicev1.Decision, 1)
		s.reforward(ctx, now, owner, []request{r}, []int{0}, out)
		return out[0]
	}
}

// testHooks are the seams tests reach a node through, given in the
// unexported hooks field of NodeConfig or ServerConfig (nil: none, as
// outside tests).
type testHooks struct {
	// decideOwned, when set, runs as a check of a key this node owns
	// under the view its call took is about to be decided (before any
	// pull of its state).
	decideOwned func(s *Server, storeKey []byte)
	// holdMembers, set by tests that call SetMembers by hand, makes the
	// node ignore gossip's member lists meanwhile.
	holdMembers atomic.Bool
	// custody, when set, are the seams of the node's custody (see
	// custody.Hooks).
	custody *custody.Hooks
}

// custodyHooks returns h's custody seams (nil: none, as for a nil h).
func (h *testHooks) custodyHooks() *custody.Hooks {
	if h == nil {
		return nil
	}
	return h.custody
}

// decide applies one validated check to this node's store at the store's
// clock, and marks the key for replication when it changed.
func (s *Server) decide(storeKey []byte, r *request) *sluicev1.Decision {
	c := r.check
	if r.isRefund() {
		return s.refund(storeKey, r)
	}
	if r.noSlice {
		return s.sliceDenial(r)
	}
	if r.deadline != 0 && time.Now().UnixNano() > r.deadline {
		// The sender no longer waits for this answer (it answered the
		// check without it): applying it would count it behind its back.
		s.stats.expired.Add(1)
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: errExpired}
	}
	if r.leased {
		return s.leases.decide(storeKey, r, s.store.Now())
	}
	return s.applyOwned(storeKey, c, s.store.Now())
}

// applyOwned applies c to this node's window of storeKey at now, marks the
// key for replication when it changed, and answers as owner.
func (s *Server) applyOwned(storeKey []byte, c window.Check, now time.Time) *sluicev1.Decision {
	d, err := s.store.ApplyBytes(storeKey, c, now)
	if err != nil { // cannot happen: checks are validated on entry
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: err.Error()}
	}
	if d.Allowed && c.Hits > 0 && s.replication.Factor > 0 {
		s.dirty.Add(storeKey)
	}
	pd := toProto(d, s.name)
	if d.Allowed && c.Hits > 0 && !d.NoRoom {
		pd.AppliedAtNs = now.UnixNano()
	}
	// A new key the store had no room for (key cap, or its name's share)
	// was refused: not an answer of the key's window.
	pd.Degraded = d.NoRoom
	return pd
}

// restartedMember reports whether a member of now other than self was in
// before under another instance (another process of its name).
func restartedMember(before, now []cluster.Member, self string) bool {
	inst := make(map[string]string, len(before))
	for _, m := range before {
		inst[m.Name] = m.Instance
	}
	for _, m := range now {
		if old, ok := inst[m.Name]; ok && m.Name != self && m.Instance != "" && old != "" && old != m.Instance {
			return true
		}
	}
	return false
}

// recopy marks every key this node owns under ring r as changed, so that
// the replication loop copies it to its replicas.
func (s *Server) recopy(r *ring.Ring) {
	for k := range s.store.All() {
		if r.Owner([]byte(k)) == s.name {
			s.dirty.Add([]byte(k))
		}
	}
}

// storeClock reads the clock of a store, so the fallback windows share
// the owner windows' clock.
type storeClock struct{ s *window.Store }

func (c storeClock) Now() time.Time { return c.s.Now() }

// Forward implements PeerService.Forward. It is terminal: it decides every
// check here, whatever this node's ring says, so a check is never forwarded
// in a loop. A peer's input is validated like a client's.
func (s *Server) Forward(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	return s.receive(ctx, req, true)
}

// forwarded decides a forwarded request (Forward, and each request of
// ForwardStream).
func (s *Server) forwarded(ctx context.Context, req *sluicev1.ForwardRequest) (*sluicev1.ForwardResponse, error) {
	reqs, fe := parseChecks(req.GetChecks(), s.limits.Current(), true) // the sender filled in named limits' numbers
	if fe != nil {
		return nil, invalidArgument(fe)
	}
	s.applyScopes(reqs, true)
	s.stats.receivedRPCs.Add(1)
	s.stats.receivedChecks.Add(int64(len(reqs)))
	v := s.view.Load()
	if req.RingFingerprint != "" && req.RingFingerprint != v.ring.Fingerprint() {
		s.stats.viewMismatch.Add(1)
	}
	out := make([]*sluicev1.Decision, len(reqs))
	var (
		buf   []byte
		moved map[string][]int // owner under this node's ring -> checks
	)
	if dl := s.deadlineHere(req.Sender, req.DeadlineUnixNs, req.SentUnixNs, time.Now()); dl > 0 {
		for i := range reqs {
			reqs[i].deadline = dl
		}
	}
	if req.StandIn {
		// The sender could not reach the keys' owner: decide as owner
		// where this node's ring already gives it the key, else in the
		// owner's stead from this node's copy (never a further hop).
		for i := range reqs {
			r := &reqs[i]
			buf = ring.Key(buf[:0], r.name, r.key)
			owner := v.ring.Owner(buf)
			// A member pulled the key from here (as its new owner, or
			// this node's copy and stand-in hits): its checks are that
			// member's to decide now.
			to := s.custody.TombFor(buf)
			switch {
			case s.leaving.Load():
				// Its windows are being handed off: the sender decides.
				out[i] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: errLeaving.Error()}
			case r.deadline != 0 && time.Now().UnixNano() > r.deadline:
				s.stats.expired.Add(1)
				out[i] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: errExpired}
			case to != "" && !req.Reforwarded:
				if moved == nil {
					moved = map[string][]int{}
				}
				moved[to] = append(moved[to], i)
			case owner == s.name:
				out[i] = s.decideOwned(ctx, v, buf, *r, false)
			case r.isRefund():
				out[i] = &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name, Error: "a refund is its owner's to apply"}
			default:
				// Also when this node's ring already gives the key to a
				// third member (the owner's death reached it first): that
				// member decides the key only once it has pulled it from
				// here (copy and stand-in hits), so until then this node
				// decides for it. (Sent there now, the check would be
				// decided before the key's state had come.)
				out[i] = s.standInDecide(buf, *r, req.UnreachableOwner)
			}
		}
		for owner, is := range moved {
			s.reforward(ctx, v, owner, reqs, is, out)
		}
		return &sluicev1.ForwardResponse{Decisions: out}, nil
	}
	var undecided []int // reforwarded checks that reached this node while it leaves
	for i, r := range reqs {
		buf = ring.Key(buf[:0], r.name, r.key)
		owner := v.ring.Owner(buf)
		if owner == s.name {
			if to := s.custody.TombFor(buf); to != "" && !req.Reforwarded {
				owner = to
			}
		}
		switch {
		case owner == s.name:
			out[i] = s.decideOwned(ctx, v, buf, r, !req.Reforwarded)
		case req.Reforwarded && s.leaving.Load():
			// The sender's ring still names this node, which has handed
			// the key off (or is handing it off): its window here is
			// gone, and a decision from it would admit the key's budget
			// again (its count reaching the owner only with FinishLeave).
			// Nor may it make a third hop. Answered below, undecided.
			undecided = append(undecided, i)
		case req.Reforwarded:
			// The sender was the owner under the first node's ring and
			// names this node under its own (or gave the key to this
			// node): decide here, never a third hop. When the owner under
			// this ring is a third member, hand the key to it.
			s.stats.notOwnerApplied.Add(1)
			out[i] = s.decide(buf, &r)
			if owner != req.Sender {
				s.signalPush()
			}
		default:
			if moved == nil {
				moved = map[string][]int{}
			}
			moved[owner] = append(moved[owner], i)
		}
	}
	for owner, is := range moved {
		s.reforward(ctx, v, owner, reqs, is, out)
	}
	if len(undecided) > 0 {
		// Once this node's hand-off pass is over, every member has
		// heard it is done and taken it out of its ring: the sender then
		// answers these as checks whose owner it could not reach, and,
		// this node being gone from its ring, sends them to the key's
		// owner under it, which holds the key's state.
		s.awaitLeaveHandOff(ctx)
		for _, i := range undecided {
			out[i] = &sluicev1.Decision{Limit: reqs[i].check.Limit, Owner: s.name, Error: errNotDecided}
		}
	}
	return &sluicev1.ForwardResponse{Decisions: out}, nil
}

// reforward sends checks this node received as owner, but whose owner
// under its own ring is owner (or that a peer pulled), on to it once,
// marked reforwarded so that it decides them whatever its ring says (in a
// call of their own, off the peer stream: see forward.Peer.Forward). When owner cannot be reached the
// checks are answered per their on_owner_unavailable policy.
func (s *Server) reforward(ctx context.Context, v *view, owner string, reqs []request, is []int, out []*sluicev1.Decision) {
	s.awaitLeaveHandOff(ctx)
	s.stats.reforwarded.Add(int64(len(is)))
	var err error
	if p := v.peers[owner]; p == nil {
		err = fmt.Errorf("owner %s: no connection to it", owner)
	} else {
		var ds []*sluicev1.Decision
		ds, err = s.peerForward(ctx, p, forward.Request{Checks: checksOf(reqs, is), By: firstDeadline(reqs, is), Reforwarded: true})
		if err == nil {
			if late := s.answered(owner, is, ds, out); len(late) > 0 {
				s.answerUnavailable(ctx, reqs, late, out)
			}
			return
		}
	}
	// The ring may have changed meanwhile (the owner left it, or this
	// node now owns the key): decide here if so, else per the policy.
	now := s.view.Load()
	var (
		buf   []byte
		fails []failure
	)
	if s.leaving.Load() {
		// A leaving node decides nothing itself (what it would count
		// could not reach the key's owner once the others have taken it
		// out of their rings): the sender gets the checks back undecided
		// and answers them as checks whose owner it could not reach.
		for _, i := range is {
			out[i] = &sluicev1.Decision{Limit: reqs[i].check.Limit, Owner: s.name, Error: errNotDecided}
		}
		return
	}
	for _, i := range is {
		// A refund is never applied here: the owner may have applied it
		// with only its answer lost.
		if now.ring.Fingerprint() != v.ring.Fingerprint() && !reqs[i].isRefund() {
			buf = ring.Key(buf[:0], reqs[i].name, reqs[i].key)
			if now.ring.Owner(buf) == s.name && s.custody.TombFor(buf) == "" {
				out[i] = s.decideOwned(ctx, now, buf, reqs[i], false)
				continue
			}
		}
		s.log.Debug("re-forward failed", "owner", owner, "error", err)
		fails = append(fails, failure{index: i, owner: owner, err: err.Error()})
	}
	if len(fails) > 0 {
		s.answerUnavailable(ctx, reqs, fails, out)
	}
}

// awaitLeaveHandOff holds a check that a leaving node sends on to its
// key's next owner until Leave's hand-off pass has ended, for at most half
// the forward timeout: the next owner decides a reforwarded check at once,
// so it must already hold the key's state, which is in this node's store or
// on its way until the pass ends (else both counts would be merged there:
// one hit admitted twice).
func (s *Server) awaitLeaveHandOff(ctx context.Context) {
	ch := s.handingOff.Load()
	if ch == nil {
		return
	}
	select {
	case <-*ch:
		return
	default:
	}
	t := time.NewTimer(s.forwardTimeout / 2)
	defer t.Stop()
	select {
	case <-*ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// warnMismatches warns, and counts, each member newly seen with the same
// member set as this node's ring but another ring fingerprint: the two
// were built with different ring configs or library versions and disagree
// on owners.
func (s *Server) warnMismatches(ms []ringview.Mismatch) {
	for _, m := range ms {
		s.stats.ringMismatch.Add(1)
		s.log.Warn("RING MISMATCH: a member has the same members but another ring fingerprint; owners disagree (check partition count, load, replication factor and sluice version on every node)",
			"member", m.Member, "its_fingerprint", m.Theirs, "our_fingerprint", m.Ours,
			"its_version", m.Version, "ring_library", ring.Library)
	}
}

// RingInfo returns this node's ring fingerprint, the hash of its member
// set (see ring.Ring.MembersHash) and its ring epoch, as gossiped in the
// node's metadata.
func (s *Server) RingInfo() (fingerprint, membersHash string, epoch uint64) {
	v := s.view.Load()
	return v.ring.Fingerprint(), v.ring.MembersHash(), v.epoch
}

// Members implements RateLimitService.Members.
func (s *Server) Members(ctx context.Context, _ *sluicev1.MembersRequest) (*sluicev1.MembersResponse, error) {
	v := s.view.Load()
	shares := v.ring.Shares()
	resp := &sluicev1.MembersResponse{
		Self:            s.name,
		RingFingerprint: v.ring.Fingerprint(),
		PartitionCount:  int32(v.ring.Config().PartitionCount),
	}
	ms := v.members
	if v.all != nil {
		ms = v.all
	}
	for _, m := range ms {
		resp.Members = append(resp.Members, &sluicev1.Member{
			Name: m.Name, GrpcAddr: m.GRPCAddr, GossipAddr: m.GossipAddr, Region: m.Region,
			State: string(m.State), RingShare: shares[m.Name], Version: m.Version,
		})
	}
	return resp, nil
}

var (
	_ sluicev1.RateLimitServiceServer = (*Server)(nil)
	_ sluicev1.PeerServiceServer      = (*Server)(nil)
)
