// Package cluster is sluice's membership: who is in the cluster, at which
// addresses, in which region. It wraps hashicorp/memberlist (SWIM gossip:
// Das, Gupta and Motivala, "SWIM: Scalable Weakly-consistent Infection-style
// Process Group Membership Protocol", 2002) and lets none of its types out:
// callers see [Member] snapshots from [Cluster.Members] and a coalescing
// signal on [Cluster.Changes] that tells them to take a new snapshot.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Profile selects memberlist's timing.
type Profile string

// Profiles.
const (
	// LAN: memberlist.DefaultLANConfig, failure detection in about a
	// second or two. The default.
	LAN Profile = "lan"
	// WAN: memberlist.DefaultWANConfig, for links with high latency.
	WAN Profile = "wan"
	// Local: memberlist.DefaultLocalConfig, for one host (tests).
	Local Profile = "local"
)

// Config configures a Cluster. Build a new one for every Cluster.
type Config struct {
	// Name is this node's name, unique and stable in the cluster; the ring
	// places keys by it. (Required)
	Name string
	// BindAddr is the gossip address to listen on (TCP and UDP), host:port;
	// port 0 lets the OS pick. Default "127.0.0.1:7946". (Optional)
	BindAddr string
	// AdvertiseHost is the host other members reach this node's gossip at;
	// default: the host of BindAddr (required when that is a wildcard
	// address such as 0.0.0.0). (Optional)
	AdvertiseHost string
	// GRPCAddr is the host:port other members reach this node's gRPC
	// server at; it travels in the node's metadata. (Required)
	GRPCAddr string
	// Region is a free-form region label carried in the metadata, e.g.
	// "eu-west-1". Default "local". (Optional)
	Region string
	// Regions is the fingerprint of the cluster's region list
	// (region.Config's Fingerprint, 16 hex digits; "" for none), carried
	// in the metadata. A member whose fingerprint differs is refused, both
	// ways, with a message naming it: a join through it fails, so that
	// nodes that would divide limits differently never form one cluster.
	// (Optional)
	Regions string
	// Version is the sluice version carried in the metadata. (Optional)
	Version string
	// Profile selects memberlist timings. Default LAN. (Optional)
	Profile Profile
	// Logger receives membership events and memberlist's own log lines.
	// Default: slog.Default(). (Optional)
	Logger *slog.Logger
	// Keys, when set, encrypt and authenticate all gossip with AES-256-GCM
	// (memberlist's keyring): each key KeySize bytes, Keys[0] encrypts,
	// all decrypt; a node without one of them cannot join or be heard.
	// Rotate them live with [Cluster.SetKeys]. (Optional)
	Keys [][]byte
	// Label, when set, marks every gossip packet and stream; nodes with
	// another label (another cluster on the same network) are ignored, so
	// two clusters never merge. At most 255 bytes. (Optional)
	Label string
	// ReconnectInterval is how often this node tries to join one member
	// that was declared dead (not one that left), so that the two sides of
	// a healed network partition merge again. Default 5 s. (Optional)
	ReconnectInterval time.Duration
	// ReconnectTimeout is how long a dead member is tried again before it
	// is forgotten. Default 24 h. (Optional)
	ReconnectTimeout time.Duration
	// tune, when set, adjusts memberlist's config last (tests: shorter
	// timers).
	tune func(*memberlist.Config)
	// Transport replaces memberlist's network transport, e.g. with a
	// memberlist.MockNetwork transport in tests; BindAddr is then ignored.
	// (Optional)
	Transport memberlist.Transport
	// Since is this node's start, ms since the Unix epoch on its clock:
	// what it says of when its cluster began until it meets earlier
	// members (see Member.Since). 0: not said. (Optional)
	Since int64
}

// State is a member's liveness as this node sees it.
type State string

// States.
const (
	Alive   State = "alive"
	Suspect State = "suspect"
)

// Member is one node of the cluster, as gossiped.
type Member struct {
	// Name is the node's unique name.
	Name string
	// GRPCAddr is the host:port of the node's gRPC server.
	GRPCAddr string
	// GossipAddr is the host:port of the node's gossip listener.
	GossipAddr string
	// Region is the node's region label.
	Region string
	// Version is the node's sluice version.
	Version string
	// State is Alive or Suspect (dead and departed nodes are not members).
	State State
	// RingFingerprint is the fingerprint of the node's ring, RingMembers
	// the hash of its member set, and RingEpoch its count of ring builds
	// that changed the fingerprint, as last gossiped; empty (0) until the
	// node published them with [Cluster.SetRing].
	RingFingerprint, RingMembers string
	RingEpoch                    uint64
	// Instance is random per process start: a node restarted under the
	// same name has another.
	Instance string
	// Since is when the member's cluster began as far as it knows (ms
	// since the Unix epoch, on its clock; 0: not said): see
	// Config.Since and Cluster.SetSince.
	Since int64
}

// Errors.
var (
	// ErrConfig wraps every error that refuses a Config.
	ErrConfig = errors.New("cluster: invalid config")
	// ErrJoin: no seed could be joined.
	ErrJoin = errors.New("cluster: join failed")
	// ErrNameTaken: the cluster already has a live member of this node's
	// name at another address. The node must not take part: names decide
	// ownership.
	ErrNameTaken = errors.New("cluster: name taken")
	// ErrRegions: a member's region list differs from this node's; it is
	// refused (and a join through it fails).
	ErrRegions = errors.New("cluster: region lists differ")
)

// Cluster is this node's membership in a cluster. It is safe for
// concurrent use.
type Cluster struct {
	name    string
	list    *memberlist.Memberlist
	log     *slog.Logger
	logw    *slogWriter // memberlist's log, told when gossip shuts down
	changes chan struct{}
	closed  atomic.Bool
	refused atomic.Int64 // members refused for bad names or metadata
	mu      sync.Mutex   // serializes Leave and Shutdown
	// joined is set once a join succeeded; until then a name conflict
	// means this node is the newcomer (conflict holds the other's address).
	joined   atomic.Bool
	conflict atomic.Pointer[string]
	// regions is the fingerprint of this node's region list (Config.Regions).
	regions string
	// regionsRefused is set when, before this node joined, a member list
	// to merge held a member with another region list: Join fails.
	regionsRefused atomic.Pointer[error]
	// oldSelf is set when a join attempt was refused because another
	// process of this name was alive or suspect (see NotifyMerge).
	oldSelf atomic.Pointer[oldSelf]
	// selfBefore is set when, before this node joined, a member list to
	// merge held this node's name (another process of it, in any state:
	// see KnownBefore).
	selfBefore atomic.Bool
	instance   string // this process's instance id (md.Instance; immutable)
	// nameTakenAfter: how long another process of this name may stay alive
	// (not suspect) in the cluster's view before Join gives up with
	// ErrNameTaken: a crashed one turns suspect within a few probe
	// intervals.
	nameTakenAfter time.Duration

	delegate delegate
	metaMu   sync.Mutex // serializes SetRing
	md       metadata   // guarded by metaMu

	// nodes holds copies of the live nodes, made in the event callbacks
	// (which memberlist calls with its node lock held): memberlist's own
	// Members returns pointers it later writes to without our lock.
	nodesMu sync.Mutex
	nodes   map[string]memberlist.Node

	gossipAddr string
	keyring    *memberlist.Keyring // nil: gossip in plaintext
	reconnect  *reconnector
}

// New starts gossip on cfg.BindAddr as a cluster of one. Join others with
// [Cluster.Join]. It returns an error wrapping [ErrConfig] for a bad cfg,
// or memberlist's error when it cannot listen.
func New(cfg Config) (*Cluster, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: name: required", ErrConfig)
	}
	if cfg.GRPCAddr == "" {
		return nil, fmt.Errorf("%w: grpc_addr: required", ErrConfig)
	}
	if cfg.Region == "" {
		cfg.Region = "local"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := CheckName(cfg.Name); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	instance := hex.EncodeToString(nonce[:])
	meta, err := encodeMeta(metadata{GRPCAddr: cfg.GRPCAddr, Region: cfg.Region, Version: cfg.Version, Instance: instance, Regions: cfg.Regions, Since: cfg.Since})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	var mc *memberlist.Config
	switch cfg.Profile {
	case LAN, "":
		mc = memberlist.DefaultLANConfig()
	case WAN:
		mc = memberlist.DefaultWANConfig()
	case Local:
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("%w: profile: unknown %q (want lan, wan or local)", ErrConfig, cfg.Profile)
	}
	mc.Name = cfg.Name
	if len(cfg.Label) > 255 {
		return nil, fmt.Errorf("%w: cluster_label: at most 255 bytes, got %d", ErrConfig, len(cfg.Label))
	}
	mc.Label = cfg.Label
	var keyring *memberlist.Keyring
	if len(cfg.Keys) > 0 {
		if keyring, err = newKeyring(cfg.Keys); err != nil {
			return nil, err
		}
		mc.Keyring = keyring
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	// A node that comes back under its name at a new address (a restart
	// after a crash) is accepted as soon as the old one has been declared
	// dead (it stopped answering probes), instead of memberlist's default
	// (never, until the dead node is forgotten). While the old one is
	// still alive or suspect the newcomer is refused (ErrNameTaken).
	mc.DeadNodeReclaimTime = time.Millisecond
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
	} else {
		if cfg.BindAddr == "" {
			cfg.BindAddr = "127.0.0.1:7946"
		}
		host, port, err := splitHostPort(cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("%w: gossip_addr: %v", ErrConfig, err)
		}
		mc.BindAddr, mc.BindPort = host, port
		mc.AdvertisePort = port
		adv := cfg.AdvertiseHost
		if adv == "" {
			adv = host
		}
		if ip := net.ParseIP(adv); ip == nil || ip.IsUnspecified() {
			return nil, fmt.Errorf("%w: advertise_addr: %q is not an IP address other members can reach (set it when gossip_addr binds all interfaces)", ErrConfig, adv)
		}
		mc.AdvertiseAddr = adv
	}
	c := &Cluster{name: cfg.Name, log: cfg.Logger.With("node", cfg.Name), changes: make(chan struct{}, 1),
		nodes: map[string]memberlist.Node{}, keyring: keyring, reconnect: newReconnector(cfg.ReconnectInterval, cfg.ReconnectTimeout),
		regions: cfg.Regions, instance: instance,
		md: metadata{GRPCAddr: cfg.GRPCAddr, Region: cfg.Region, Version: cfg.Version, Instance: instance, Regions: cfg.Regions, Since: cfg.Since}}
	c.delegate.meta.Store(&meta)
	mc.Delegate = &c.delegate
	mc.Alive = (*admission)(c)
	mc.Merge = (*admission)(c)
	mc.Events = &events{c: c}
	mc.Conflict = &conflicts{c: c}
	mc.Logger, c.logw = newStdLogger(c.log.With("component", "memberlist"))
	if cfg.tune != nil {
		cfg.tune(mc)
	}
	c.nameTakenAfter = 5 * mc.ProbeInterval
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.BindAddr, err)
	}
	c.list = list
	go c.reconnectLoop()
	ln := list.LocalNode() // read once: memberlist rewrites it on metadata updates
	c.gossipAddr = net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port)))
	return c, nil
}

// Join contacts the seeds (host:port gossip addresses) and merges their view
// of the cluster into this node's, retrying every second until at least one
// seed answers or ctx is done. It returns the number of seeds reached, an
// error wrapping [ErrRegions] when a seed's cluster has another region
// list, an error wrapping [ErrNameTaken] when the cluster already has a live member
// of this node's name (the caller must then stop without a leave message,
// which would remove the other), or an error wrapping [ErrJoin] with the
// last failure when ctx ends first.
func (c *Cluster) Join(ctx context.Context, seeds []string) (int, error) {
	if len(seeds) == 0 {
		c.joined.Store(true)
		return 0, nil
	}
	c.reconnect.setSeeds(seeds)
	var aliveSince time.Time // when a join was first refused for an alive process of this name
	for attempt := 1; ; attempt++ {
		c.oldSelf.Store(nil)
		n, err := c.list.Join(seeds)
		if rerr := c.regionsRefused.Load(); rerr != nil && n == 0 {
			return 0, *rerr
		}
		if other := c.conflict.Load(); other != nil {
			return 0, fmt.Errorf("%w: a member named %q is already alive at %s; every node needs a unique name", ErrNameTaken, c.name, *other)
		}
		if old := c.oldSelf.Load(); old != nil && n == 0 {
			// A restart under this name: the old process crashed, and the
			// cluster has not declared it dead yet. One that stays alive
			// (answering probes) is another node of this name.
			if old.state != "alive" {
				aliveSince = time.Time{}
			} else if aliveSince.IsZero() {
				aliveSince = time.Now()
			}
			if !aliveSince.IsZero() && time.Since(aliveSince) >= c.nameTakenAfter {
				return 0, fmt.Errorf("%w: a member named %q has been alive at %s for %s; every node needs a unique name", ErrNameTaken, c.name, old.addr, c.nameTakenAfter)
			}
			c.log.Warn("another process of this name is still in the cluster; waiting until it is declared dead before joining (a restart after a crash)",
				"other_addr", old.addr, "other_state", old.state, "attempt", attempt)
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("%w: %v (a process of this name is still %s at %s)", ErrJoin, ctx.Err(), old.state, old.addr)
			case <-time.After(time.Second):
			}
			continue
		}
		if n > 0 {
			c.joined.Store(true)
			c.log.Info("joined cluster", "seeds_reached", n, "members", c.list.NumMembers())
			return n, nil
		}
		// Seeds started together with this node may not listen yet: the
		// first attempts failing is expected, so only later ones warn.
		level := slog.LevelInfo
		if attempt > 5 {
			level = slog.LevelWarn
		}
		c.log.Log(ctx, level, "join failed, retrying", "seeds", seeds, "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %v (last error: %v)", ErrJoin, ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// Instance returns this node's instance id: random per process start,
// gossiped in its metadata (see Member.Instance).
func (c *Cluster) Instance() string { return c.md.Instance }

// LocalName returns this node's name.
func (c *Cluster) LocalName() string { return c.name }

// GossipAddr returns the host:port this node advertises for gossip.
func (c *Cluster) GossipAddr() string { return c.gossipAddr }

// Members returns a snapshot of the live members (alive or suspect), this
// node included, sorted by name. A member whose metadata cannot be decoded
// is left out (and logged): it cannot be forwarded to.
func (c *Cluster) Members() []Member {
	c.nodesMu.Lock()
	nodes := make([]memberlist.Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.nodesMu.Unlock()
	out := make([]Member, 0, len(nodes))
	for _, n := range nodes {
		m, err := toMember(&n)
		if err != nil {
			c.log.Warn("ignoring member with bad metadata", "member", n.Name, "error", err)
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Changes returns a channel that receives a value after the member set or a
// member's metadata changed. Signals coalesce (capacity 1): on each, take a
// fresh [Cluster.Members] snapshot. It is never closed.
func (c *Cluster) Changes() <-chan struct{} { return c.changes }

func (c *Cluster) signal() {
	select {
	case c.changes <- struct{}{}:
	default:
	}
}

// Leave tells the other members that this node is leaving, waiting up to
// timeout for the message to spread, then stops gossip. It is idempotent.
// A message that could not spread because every other member left (or was
// found dead) meanwhile, as when a whole cluster stops at once, is no
// error: no one was left to tell.
func (c *Cluster) Leave(timeout time.Duration) error {
	c.reconnect.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil
	}
	err := c.list.Leave(timeout)
	if err != nil && !c.othersAlive() {
		c.log.Debug("leave message not spread: no other member left to tell", "error", err)
		err = nil
	}
	c.closed.Store(true)
	c.logw.closing.Store(true)
	if serr := c.list.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// othersAlive reports whether gossip knows another member that has not
// left and is not dead.
func (c *Cluster) othersAlive() bool {
	for _, n := range c.list.Members() {
		if n.Name != c.name {
			return true
		}
	}
	return false
}

// Shutdown stops gossip without a leave message (others will see this node
// fail). It is idempotent.
func (c *Cluster) Shutdown() error {
	c.reconnect.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	c.logw.closing.Store(true)
	return c.list.Shutdown()
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q in %q", p, addr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

func toMember(n *memberlist.Node) (Member, error) {
	md, err := decodeMeta(n.Meta)
	if err != nil {
		return Member{}, err
	}
	st := Alive
	if n.State == memberlist.StateSuspect {
		st = Suspect
	}
	return Member{
		Name:       n.Name,
		GRPCAddr:   md.GRPCAddr,
		GossipAddr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))),
		Region:     md.Region,
		Version:    md.Version,
		State:      st,

		RingFingerprint: md.RingFP,
		RingMembers:     md.RingMembers,
		RingEpoch:       md.RingEpoch,
		Instance:        md.Instance,
		Since:           md.Since,
	}, nil
}

// SetSince lowers the time this node says its cluster began (ms since
// the Unix epoch: see Member.Since) to since and gossips the update,
// waiting up to timeout for it to go out; a later time than the one it
// says changes nothing. It returns an error once gossip has stopped.
func (c *Cluster) SetSince(since int64, timeout time.Duration) error {
	return c.updateMeta(timeout, func(md *metadata) bool {
		if since <= 0 || (md.Since != 0 && md.Since <= since) {
			return false
		}
		md.Since = since
		return true
	})
}

// SetRing publishes this node's ring (fingerprint, member-set hash and
// epoch) in its metadata and gossips the update, waiting up to timeout for
// it to go out. Nothing is sent when they did not change. It returns an
// error when the metadata would be too large or gossip has stopped.
func (c *Cluster) SetRing(fingerprint, membersHash string, epoch uint64, timeout time.Duration) error {
	return c.updateMeta(timeout, func(md *metadata) bool {
		if md.RingFP == fingerprint && md.RingMembers == membersHash && md.RingEpoch == epoch {
			return false
		}
		md.RingFP, md.RingMembers, md.RingEpoch = fingerprint, membersHash, epoch
		return true
	})
}

// updateMeta applies change to a copy of this node's metadata and, when it
// reports a change, gossips the result, waiting up to timeout for it to go
// out. It returns an error when the metadata would be too large or gossip
// has stopped (the metadata then stays as it was).
func (c *Cluster) updateMeta(timeout time.Duration, change func(*metadata) bool) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	md := c.md
	if !change(&md) {
		return nil
	}
	b, err := encodeMeta(md)
	if err != nil {
		return err
	}
	if c.closed.Load() {
		return errors.New("cluster: gossip stopped")
	}
	c.md = md
	c.delegate.meta.Store(&b)
	return c.list.UpdateNode(timeout)
}

// delegate serves this node's metadata; sluice gossips no user data.
type delegate struct{ meta atomic.Pointer[[]byte] }

func (d *delegate) NodeMeta(limit int) []byte {
	m := *d.meta.Load()
	if len(m) > limit {
		return nil // cannot happen: encodeMeta bounds the size
	}
	return m
}
func (d *delegate) NotifyMsg([]byte)                    {}
func (d *delegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (d *delegate) LocalState(bool) []byte              { return nil }
func (d *delegate) MergeRemoteState(buf []byte, _ bool) {}

// events turns memberlist's callbacks into a log line and a coalesced
// signal. memberlist calls them with its node lock held, so they must not
// block.
type events struct{ c *Cluster }

func (e *events) NotifyJoin(n *memberlist.Node) {
	e.c.log.Info("member joined", "member", n.Name, "addr", n.Address())
	e.c.record(n)
	e.c.reconnect.alive(n.Name)
	e.c.signal()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	// No state: memberlist does not keep n.State up to date (it read 0,
	// alive, for every member that left).
	e.c.log.Info("member left", "member", n.Name, "addr", n.Address())
	if n.Name != e.c.name {
		e.c.reconnect.left(n)
	}
	e.c.nodesMu.Lock()
	delete(e.c.nodes, n.Name)
	e.c.nodesMu.Unlock()
	e.c.signal()
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	e.c.log.Debug("member updated", "member", n.Name, "addr", n.Address())
	e.c.record(n)
	e.c.signal()
}

// record keeps a copy of n (its Meta copied too). memberlist holds its
// node lock while it calls the event callbacks, so n is stable here.
func (c *Cluster) record(n *memberlist.Node) {
	cp := *n
	cp.Meta = slices.Clone(n.Meta)
	cp.Addr = slices.Clone(n.Addr)
	c.nodesMu.Lock()
	c.nodes[n.Name] = cp
	c.nodesMu.Unlock()
}

// conflicts hears of two live nodes with one name at different addresses.
type conflicts struct{ c *Cluster }

func (d *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name != d.c.name {
		d.c.log.Error("two members claim one name; the later one is ignored", "member", existing.Name,
			"addr", existing.Address(), "other_addr", other.Address())
		return
	}
	addr := other.Address()
	if !d.c.joined.Load() {
		d.c.conflict.Store(&addr) // this node is the newcomer: Join fails
		return
	}
	d.c.log.Error("another node claims this node's name; it is refused", "other_addr", addr)
}

// admission keeps members with a bad name or bad metadata out: memberlist
// asks it before it takes in an alive message (a member joining, or one
// updating its metadata: the update is then ignored) and before it merges
// another node's member list (a join through it then fails). Such a
// member never enters Members, hence never the ring.
type admission Cluster

func (a *admission) admit(n *memberlist.Node) error {
	if n.Name == a.name {
		return nil // this node: its own metadata is encoded by encodeMeta
	}
	err := CheckName(n.Name)
	if err == nil {
		var md metadata
		md, err = decodeMeta(n.Meta)
		if err == nil && md.Regions != a.regions {
			err = fmt.Errorf("%w: member %q has region list %s, this node %s: every node needs the same --regions (names, weights and order)", ErrRegions, n.Name, fpOrNone(md.Regions), fpOrNone(a.regions))
			if !a.joined.Load() {
				a.regionsRefused.Store(&err)
			}
		}
	}
	if err != nil {
		a.refused.Add(1)
		name := n.Name
		if len(name) > 64 {
			name = name[:64] + "..."
		}
		a.log.Warn("refusing a member with bad metadata", "member", fmt.Sprintf("%q", name), "error", err)
	}
	return err
}

// fpOrNone describes a region list's fingerprint for a message.
func fpOrNone(fp string) string {
	if fp == "" {
		return "(none: a single region)"
	}
	return "fingerprint " + fp
}

// NotifyAlive implements memberlist.AliveDelegate.
func (a *admission) NotifyAlive(n *memberlist.Node) error { return a.admit(n) }

// NotifyMerge implements memberlist.MergeDelegate. Before this node has
// joined, a member list that holds another process of this node's name
// (another gossip address) that is still alive or suspect is refused: a
// restarted node waits until the cluster has declared its old process
// dead (Join retries meanwhile), so that two processes never decide the
// same keys and the cluster never ignores a newcomer it thinks is the old
// one (memberlist drops the alive messages of a name whose old address is
// not yet dead).
func (a *admission) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if n.Name == a.name && !a.joined.Load() {
			// Another process of this name (not this one, which an
			// earlier attempt of this join may have told the peer of).
			if md, err := decodeMeta(n.Meta); err != nil || md.Instance != a.instance {
				a.selfBefore.Store(true)
			}
		}
		if n.Name == a.name && !a.joined.Load() && n.Address() != a.gossipAddr &&
			(n.State == memberlist.StateAlive || n.State == memberlist.StateSuspect) {
			st := "alive"
			if n.State == memberlist.StateSuspect {
				st = "suspect"
			}
			a.oldSelf.Store(&oldSelf{addr: n.Address(), state: st})
			return fmt.Errorf("%w: another process of this name is %s at %s", errOldSelf, st, n.Address())
		}
		if err := a.admit(n); err != nil {
			return fmt.Errorf("member %q: %w", n.Name, err)
		}
	}
	return nil
}

// KnownBefore reports whether the cluster this node joined knew another
// process of its name (alive, suspect, dead or gone: memberlist keeps a
// departed member for GossipToTheDeadTime, 30 s on a LAN) when it
// joined: an earlier process of this node ran in the cluster.
func (c *Cluster) KnownBefore() bool { return c.selfBefore.Load() }

// errOldSelf refuses a join while another process of this node's name is
// alive or suspect in the cluster's view.
var errOldSelf = errors.New("cluster: name still held")

// oldSelf is the other process of this node's name that refused its last
// join attempt, as the seed saw it.
type oldSelf struct{ addr, state string }

// Refused returns how many times a member's alive message or a member list
// to merge was refused for a bad name or bad metadata.
func (c *Cluster) Refused() int64 { return c.refused.Load() }

var (
	_ memberlist.AliveDelegate    = (*admission)(nil)
	_ memberlist.MergeDelegate    = (*admission)(nil)
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*events)(nil)
	_ memberlist.ConflictDelegate = (*conflicts)(nil)
)
