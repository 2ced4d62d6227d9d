package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/rpc/sluicev1gw"
	"github.com/sluicehq/sluice/window"
)

// The admin API (admin.proto, docs/admin.md): an operator inspects a key,
// resets it, or lists the limits in force, through any node.
//
// A reset reaches every node that may answer for the key, region by
// region: the node asked sends KeyAdmin RESET to the key's owner in each
// region (on its ring of the region); the owner first pulls the key's
// state if it moved to it and has not come yet (as a check would), then
// tells every other member of its region to DROP the key, and only then
// drops its own holdings. DROP (on any node) waits while the key's
// stand-in hits are on their way to their owner, then takes away the
// node's stand-in window of the key, its replica copy, its away window
// (scope exact outside the home region), and starts its own window of the
// key afresh (custody.Custody.Reset: a state of the same algorithm and
// window with nothing counted, which the replication loop then sends to
// the replicas, so that a copy of the old state still in flight is
// replaced within an interval). The owner drops last so that stand-in
// hits handed to it by a member before that member's DROP ended are
// dropped with its own. When the owner cannot be reached, the node asked
// tells the region's other members itself, and the answer is incomplete.
//
// What a reset cannot reach is in docs/admin.md: checks in flight, a
// hand-off or pull of the key under way, a node no one can reach, and the
// leases between regions (slices and the allocator's records stay; each
// region's count starts afresh).

// AdminToken is one token of an admin token file (NodeConfig.AdminTokenFile):
// Name labels it in logs, Token is the secret.
type AdminToken = security.AdminToken

// ParseAdminTokens reads an admin token file: one token a line, `TOKEN
// [NAME]` ('#' starts a comment), each at least 16 bytes. Errors name the
// file and line. See security.ParseAdminTokens.
func ParseAdminTokens(file string, data []byte) ([]AdminToken, error) {
	return security.ParseAdminTokens(file, data)
}

// rlsPath is the path of the node's RLS rules ("" without a source).
func (cfg NodeConfig) rlsPath() string {
	if cfg.RLSSource == nil {
		return ""
	}
	return cfg.RLSSource.Path()
}

// adminResetsName is the metric that counts resets.
const adminResetsName = "sluice_admin_resets_total"

// registerAdmin registers the admin API (AdminService, authorised by auth)
// and its node-to-node half (AdminPeerService) on gs, and the reset
// counter in m (nil: none). rlsSvc and rlsPath are the node's Envoy rate
// limit service and its rules' path (nil and "": none).
func registerAdmin(gs grpc.ServiceRegistrar, s *Server, auth *security.Authenticator, rlsSvc *rls.Service, rlsPath string, m *Metrics) {
	sluicev1.RegisterAdminServiceServer(gs, newAdminService(s, auth, rlsSvc, rlsPath, m))
	sluicev1.RegisterAdminPeerServiceServer(gs, adminPeer{s: s})
}

// adminService implements sluicev1.AdminServiceServer for one node, on the
// gRPC port and behind the HTTP gateway alike. Each call is authorised
// by auth (see security.Authenticator.AuthorizeAdmin) before anything
// else.
type adminService struct {
	sluicev1.UnimplementedAdminServiceServer
	s       *Server
	auth    *security.Authenticator
	rls     *rls.Service // nil: no RLS
	rlsPath string
	resets  *prometheus.CounterVec // nil: not counted
}

// newAdminService returns the admin API of s. A nil auth authorises as a
// node with no client authentication and no admin credential (loopback
// only).
func newAdminService(s *Server, auth *security.Authenticator, rlsSvc *rls.Service, rlsPath string, m *Metrics) *adminService {
	if auth == nil {
		auth = security.NewAuthenticator(security.AuthConfig{Mode: ClientAuthNone})
	}
	return &adminService{s: s, auth: auth, rls: rlsSvc, rlsPath: rlsPath, resets: adminResets(m)}
}

// adminResets returns the counter of resets in m's registry, registering
// it the first time (the gRPC port and the HTTP face share it); nil for a
// nil m.
func adminResets(m *Metrics) *prometheus.CounterVec {
	if m == nil {
		return nil
	}
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: adminResetsName,
		Help: "Keys reset by an operator through this node (admin API ResetKey), by result: complete (every node reached) or incomplete.",
	}, []string{"result"})
	if err := m.Registry().Register(cv); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		return nil
	}
	cv.WithLabelValues("complete")
	cv.WithLabelValues("incomplete")
	return cv
}

// checkAdminKey validates an admin call's name and key as a check's are.
func checkAdminKey(name, key string) error {
	switch {
	case name == "":
		return invalidArgument(&fieldError{"name", "must not be empty"})
	case len(name) > MaxNameBytes:
		return invalidArgument(&fieldError{"name", fmt.Sprintf("must be at most %d bytes, got %d", MaxNameBytes, len(name))})
	case !utf8.ValidString(name):
		return invalidArgument(&fieldError{"name", "must be valid UTF-8"})
	case key == "":
		return invalidArgument(&fieldError{"key", "must not be empty"})
	case len(key) > MaxKeyBytes:
		return invalidArgument(&fieldError{"key", fmt.Sprintf("must be at most %d bytes, got %d", MaxKeyBytes, len(key))})
	case !utf8.ValidString(key):
		return invalidArgument(&fieldError{"key", "must be valid UTF-8"})
	}
	return nil
}

// regionTarget is a key in one region, on this node's ring of it.
type regionTarget struct {
	region   string // "" without regions
	ring     *ring.Ring
	owner    string
	replicas []string
	members  []string // every member of the region's ring, sorted (the ring's own: read only)
}

// regionTargets returns the key (storeKey) in every region under v: this
// node's region first, then the others in the list's order; a region
// without a live member has a nil ring.
func (s *Server) regionTargets(v *view, storeKey []byte) []regionTarget {
	one := func(name string, r *ring.Ring) regionTarget {
		t := regionTarget{region: name, ring: r}
		if r == nil {
			return t
		}
		t.owner = r.Owner(storeKey)
		if s.replication.Factor > 0 {
			t.replicas = r.SuccessorsOf(t.owner, s.replication.Factor)
		}
		t.members = r.Members() // sorted; read only
		return t
	}
	if s.regions == nil {
		return []regionTarget{one("", v.ring)}
	}
	out := []regionTarget{one(s.region, v.ring)}
	for _, reg := range s.regions.Regions() {
		if reg.Name != s.region {
			out = append(out, one(reg.Name, v.rings[reg.Name]))
		}
	}
	return out
}

// role is what the region's ring makes member for the key.
func (t regionTarget) role(member string) string {
	switch {
	case member == t.owner:
		return "owner"
	case slices.Contains(t.replicas, member):
		return "replica"
	}
	return "member"
}

// InspectKey implements AdminService.InspectKey.
func (a *adminService) InspectKey(ctx context.Context, req *sluicev1.InspectKeyRequest) (*sluicev1.InspectKeyResponse, error) {
	if _, err := a.auth.AuthorizeAdmin(ctx); err != nil {
		return nil, err
	}
	if err := checkAdminKey(req.GetName(), req.GetKey()); err != nil {
		return nil, err
	}
	s := a.s
	if err := s.adminJoined(); err != nil {
		return nil, err
	}
	storeKey := ring.Key(nil, req.Name, req.Key)
	v := s.view.Load()
	resp := &sluicev1.InspectKeyResponse{Name: req.Name, Key: req.Key, AnsweredBy: s.name}
	for _, t := range s.regionTargets(v, storeKey) {
		rk := &sluicev1.RegionKey{Region: t.region, Owner: t.owner, Replicas: t.replicas}
		resp.Regions = append(resp.Regions, rk)
		if t.ring == nil {
			rk.Error = "no live member of the region is known to " + s.name
			continue
		}
		ask := []string{t.owner}
		switch {
		case req.AllMembers:
			for _, m := range t.members {
				if m != t.owner {
					ask = append(ask, m)
				}
			}
		case req.Replicas:
			ask = append(ask, t.replicas...)
		}
		hs := s.askEach(ctx, v, ask, sluicev1.KeyAdminOp_KEY_ADMIN_OP_READ, req.Name, req.Key)
		for i, h := range hs {
			h.Role = t.role(h.Node)
			// Every member was asked: show only those that hold something
			// (the owner and the replicas asked for always).
			if i > 0 && req.AllMembers && !(req.Replicas && h.Role == "replica") && holdsNothing(h) {
				continue
			}
			rk.Nodes = append(rk.Nodes, h)
		}
	}
	return resp, nil
}

// holdsNothing reports whether h says its node holds nothing of the key
// (and was reached).
func holdsNothing(h *sluicev1.KeyHolding) bool {
	return h.Error == "" && h.Window == nil && h.Copy == nil && h.StandIn == nil && h.Away == nil
}

// ResetKey implements AdminService.ResetKey.
func (a *adminService) ResetKey(ctx context.Context, req *sluicev1.ResetKeyRequest) (*sluicev1.ResetKeyResponse, error) {
	who, err := a.auth.AuthorizeAdmin(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkAdminKey(req.GetName(), req.GetKey()); err != nil {
		return nil, err
	}
	s := a.s
	if err := s.adminJoined(); err != nil {
		return nil, err
	}
	if s.leaving.Load() {
		return nil, status.Error(codes.Unavailable, "sluice: "+errLeaving.Error()+"; ask another node")
	}
	storeKey := ring.Key(nil, req.Name, req.Key)
	v := s.view.Load()
	resp := &sluicev1.ResetKeyResponse{Name: req.Name, Key: req.Key, AnsweredBy: s.name, Complete: true}
	targets := s.regionTargets(v, storeKey)
	rks := make([]*sluicev1.RegionKey, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { rks[i] = s.resetInRegion(ctx, v, t, req.Name, req.Key) })
	}
	wg.Wait()
	nodes := 0
	for _, rk := range rks {
		resp.Regions = append(resp.Regions, rk)
		if rk.Error != "" {
			resp.Complete = false
		}
		for _, h := range rk.Nodes {
			nodes++
			if h.Error != "" {
				resp.Complete = false
			}
		}
	}
	result := "complete"
	if !resp.Complete {
		result = "incomplete"
	}
	if a.resets != nil {
		a.resets.WithLabelValues(result).Inc()
	}
	// Never the key: its name and a fingerprint (an HMAC under a key of
	// this process) at most.
	level := slog.LevelInfo
	if !resp.Complete {
		level = slog.LevelWarn
	}
	s.log.Log(ctx, level, "key reset by an operator", "name", req.Name, "key_fingerprint", KeyFingerprint(storeKey),
		"by", who, "result", result, "nodes", nodes)
	return resp, nil
}

// adminJoined refuses an admin call about a key while this node has not
// joined its cluster: alone, its ring names it the owner of every key,
// and its answer would say nothing of the cluster's.
func (s *Server) adminJoined() error {
	if s.joined != nil && !s.joined() {
		return status.Error(codes.Unavailable, "sluice: not joined yet; ask another node")
	}
	return nil
}

// resetInRegion resets the key in region t: through its owner (KeyAdmin
// RESET), or, when the owner cannot be reached, by telling the region's
// other members to drop it from here.
func (s *Server) resetInRegion(ctx context.Context, v *view, t regionTarget, name, key string) *sluicev1.RegionKey {
	rk := &sluicev1.RegionKey{Region: t.region, Owner: t.owner, Replicas: t.replicas}
	if t.ring == nil {
		rk.Error = "no live member of the region is known to " + s.name + ": nothing reset there (a node of it that is only cut off keeps what it holds)"
		return rk
	}
	var hs []*sluicev1.KeyHolding
	var err error
	if t.owner == s.name {
		hs = s.resetAsOwner(ctx, name, key)
	} else {
		hs, err = s.keyAdminCall(ctx, v, t.owner, sluicev1.KeyAdminOp_KEY_ADMIN_OP_RESET, name, key, 3*s.forwardTimeout)
	}
	if err != nil {
		// The owner did not answer: tell the others from here. What the
		// owner holds stays (it may be down: then it holds nothing).
		others := slices.DeleteFunc(slices.Clone(t.members), func(m string) bool { return m == t.owner })
		hs = append([]*sluicev1.KeyHolding{{Node: t.owner, Region: t.region, Error: "owner not reached: " + err.Error()}},
			s.askEach(ctx, v, others, sluicev1.KeyAdminOp_KEY_ADMIN_OP_DROP, name, key)...)
	}
	for _, h := range hs {
		h.Role = t.role(h.Node)
	}
	rk.Nodes = hs
	return rk
}

// resetAsOwner resets the key as its owner in this node's region: it
// makes sure the key's state is here if it moved here (a pull, as for a
// check), tells every other member of the region to drop the key, then
// drops its own holdings (see the top of this file). It returns its own
// holding first, then the others'.
func (s *Server) resetAsOwner(ctx context.Context, name, key string) []*sluicev1.KeyHolding {
	v := s.view.Load()
	storeKey := ring.Key(nil, name, key)
	if mi := s.custody.Awaiting(v.ring, storeKey); mi != nil {
		s.settle(ctx, v, mi, storeKey) // a failed pull: what comes later was counted before the reset
	}
	var others []string
	for _, m := range v.ring.Members() {
		if m != s.name {
			others = append(others, m)
		}
	}
	sort.Strings(others)
	hs := s.askEach(ctx, v, others, sluicev1.KeyAdminOp_KEY_ADMIN_OP_DROP, name, key)
	own := s.dropKey(ctx, name, key)
	s.log.Debug("key reset as its owner", "name", name, "key_fingerprint", KeyFingerprint(storeKey), "members", len(others))
	return append([]*sluicev1.KeyHolding{own}, hs...)
}

// askEach asks each member of names (this node answers itself) to do op
// on the key, in parallel, and returns one holding per name in names'
// order (error set for a member that did not answer).
func (s *Server) askEach(ctx context.Context, v *view, names []string, op sluicev1.KeyAdminOp, name, key string) []*sluicev1.KeyHolding {
	out := make([]*sluicev1.KeyHolding, len(names))
	var wg sync.WaitGroup
	for i, m := range names {
		if m == s.name {
			out[i] = s.keyAdminHere(ctx, op, name, key)[0]
			continue
		}
		wg.Go(func() {
			timeout := s.forwardTimeout
			if op == sluicev1.KeyAdminOp_KEY_ADMIN_OP_DROP {
				timeout *= 2 // a drop first waits up to the forward timeout for stand-in hits on their way
			}
			hs, err := s.keyAdminCall(ctx, v, m, op, name, key, timeout)
			switch {
			case err != nil:
				out[i] = &sluicev1.KeyHolding{Node: m, Error: err.Error()}
			case len(hs) == 0:
				out[i] = &sluicev1.KeyHolding{Node: m, Error: "answered with nothing"}
			default:
				out[i] = hs[0]
				out[i].Node = m
			}
		})
	}
	wg.Wait()
	return out
}

// keyAdminCall calls KeyAdmin op on member, bounded by timeout.
func (s *Server) keyAdminCall(ctx context.Context, v *view, member string, op sluicev1.KeyAdminOp, name, key string, timeout time.Duration) ([]*sluicev1.KeyHolding, error) {
	p := v.peers[member]
	if p == nil || p.Conn() == nil {
		return nil, fmt.Errorf("no connection to %s", member)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := sluicev1.NewAdminPeerServiceClient(p.Conn()).KeyAdmin(ctx, &sluicev1.KeyAdminRequest{Sender: s.name, Op: op, Name: name, Key: key})
	if err != nil {
		return nil, fmt.Errorf("%s: %s", status.Code(err), status.Convert(err).Message())
	}
	return resp.Nodes, nil
}

// keyAdminHere does op on the key at this node (see KeyAdminOp).
func (s *Server) keyAdminHere(ctx context.Context, op sluicev1.KeyAdminOp, name, key string) []*sluicev1.KeyHolding {
	switch op {
	case sluicev1.KeyAdminOp_KEY_ADMIN_OP_RESET:
		return s.resetAsOwner(ctx, name, key)
	case sluicev1.KeyAdminOp_KEY_ADMIN_OP_DROP:
		return []*sluicev1.KeyHolding{s.dropKey(ctx, name, key)}
	}
	return []*sluicev1.KeyHolding{s.keyHolding(name, key)}
}

// regionName is this node's region in answers ("" without regions).
func (s *Server) regionName() string {
	if s.regions == nil {
		return ""
	}
	return s.region
}

// keyHolding returns what this node holds of the key now, changing
// nothing.
func (s *Server) keyHolding(name, key string) *sluicev1.KeyHolding {
	k := string(ring.Key(nil, name, key))
	now := s.store.Now()
	h := &sluicev1.KeyHolding{Node: s.name, Region: s.regionName()}
	if st, ok := s.store.Get(k); ok {
		h.Window = s.keyWindow(name, key, st, now)
	}
	if e, ok := s.replicas.Peek(k); ok {
		h.Copy, h.CopyOwner = s.keyWindow(name, key, e.State, now), e.Owner
	}
	s.fbMu.Lock()
	if e, ok := s.fbBase[k]; ok {
		if cur, held := s.fallback.Get(k); held {
			h.StandIn = s.keyWindow(name, key, window.Subtract(cur, e.base), now)
		}
	}
	s.fbMu.Unlock()
	if s.awayWindows != nil {
		if st, ok := s.awayWindows.Get(k); ok {
			h.Away = s.keyWindow(name, key, st, now)
		}
	}
	return h
}

// dropKey drops everything this node holds of the key (see the top of
// this file) and returns what it held. It first waits, up to ctx's end,
// while the key is on its way out of this node (its stand-in hits being
// handed to the owner, or a push), so that what left reaches its owner
// before the owner drops its own.
func (s *Server) dropKey(ctx context.Context, name, key string) *sluicev1.KeyHolding {
	storeKey := ring.Key(nil, name, key)
	k := string(storeKey)
	wctx, cancel := context.WithTimeout(ctx, s.forwardTimeout)
	_ = s.custody.WaitOutgoing(wctx, k) // on a timeout: drop all the same
	cancel()
	now := s.store.Now()
	h := &sluicev1.KeyHolding{Node: s.name, Region: s.regionName()}
	s.fbMu.Lock()
	if e, ok := s.fbBase[k]; ok {
		if cur, held := s.fallback.Get(k); held {
			h.StandIn = s.keyWindow(name, key, window.Subtract(cur, e.base), now)
		}
		s.dropEntryLocked(k)
	}
	s.fbMu.Unlock()
	if e, ok := s.replicas.Take(k); ok {
		h.Copy, h.CopyOwner = s.keyWindow(name, key, e.State, now), e.Owner
	}
	if s.awayWindows != nil {
		if st, ok := s.awayWindows.Take(k); ok {
			h.Away = s.keyWindow(name, key, st, now)
		}
	}
	if st, ok := s.custody.Reset(k, now); ok {
		h.Window = s.keyWindow(name, key, st, now)
		if s.replication.Factor > 0 {
			s.dirty.Add(storeKey) // the replicas get the fresh state
		}
	}
	if !holdsNothing(h) {
		s.log.Debug("key dropped for an operator's reset", "name", name, "key_fingerprint", KeyFingerprint(storeKey))
	}
	return h
}

// keyWindow describes st, a state of the key, at now; with the limit
// configured under name for key (when it is of st's algorithm and window,
// and not split into regions' slices) its limit and what a peek would
// find remaining.
func (s *Server) keyWindow(name, key string, st window.State, now time.Time) *sluicev1.KeyWindow {
	d := st.Describe(now)
	kw := &sluicev1.KeyWindow{
		Algorithm: sluicev1.Algorithm(d.Algorithm), WindowMs: d.Window.Milliseconds(),
		WindowStart: d.Start.UnixMilli(), Count: d.Count, PreviousCount: d.Previous,
		ResetTime: unixMsCeil(d.Reset), Rate: d.Rate,
	}
	l, ok := s.limits.Current().Resolve(name, key)
	if !ok || l.Algorithm != d.Algorithm || l.Window != d.Window {
		return kw
	}
	if s.regions.Multi() && s.regions.Resolve(l.Scope) == region.Global {
		return kw // counted against the region's slice, not the limit
	}
	if pd, err := st.Peek(window.Check{Algorithm: l.Algorithm, Limit: l.Limit, Window: l.Window, Burst: l.Burst}, now); err == nil {
		kw.Limit, kw.Remaining = l.Limit, pd.Remaining
	}
	return kw
}

// ListLimits implements AdminService.ListLimits.
func (a *adminService) ListLimits(ctx context.Context, _ *sluicev1.ListLimitsRequest) (*sluicev1.ListLimitsResponse, error) {
	if _, err := a.auth.AuthorizeAdmin(ctx); err != nil {
		return nil, err
	}
	resp := &sluicev1.ListLimitsResponse{AnsweredBy: a.s.name, RlsConfig: a.rlsPath}
	if src := a.s.limits; src != nil {
		resp.LimitsFile = src.Path()
	}
	set := a.s.limits.Current()
	for _, name := range set.Names() {
		n := set.Get(name)
		nl := &sluicev1.NamedLimit{Name: n.Name, Numbers: limitNumbers(n.Default)}
		for _, o := range n.Overrides {
			nl.Overrides = append(nl.Overrides, &sluicev1.LimitOverride{KeyPrefix: o.KeyPrefix, Numbers: limitNumbers(o.Limit)})
		}
		resp.Limits = append(resp.Limits, nl)
	}
	if a.rls != nil {
		cfg := a.rls.Config()
		rules := cfg.Rules()
		sort.SliceStable(rules, func(i, j int) bool { return rules[i].FullKey < rules[j].FullKey })
		for _, r := range rules {
			resp.RlsRules = append(resp.RlsRules, &sluicev1.RLSRule{
				Domain: r.Domain, FullKey: r.FullKey, Name: r.Name, RequestsPerUnit: r.RequestsPerUnit,
				Unit: r.Unit.String(), UnitMultiplier: r.UnitMultiplier, Unlimited: r.Unlimited,
				ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode, File: r.File, Line: int32(r.Line), CheckName: r.CheckName(),
			})
		}
		resp.RlsDump = cfg.Dump()
	}
	return resp, nil
}

// limitNumbers is l on the wire.
func limitNumbers(l limits.Limit) *sluicev1.LimitNumbers {
	return &sluicev1.LimitNumbers{
		Algorithm: sluicev1.Algorithm(l.Algorithm), Limit: l.Limit, WindowMs: l.Window.Milliseconds(), Burst: l.Burst,
		Shadow: l.Shadow, OnOwnerUnavailable: l.OnOwnerUnavailable.String(), Scope: sluicev1.Scope(l.Scope),
	}
}

// adminPeer implements sluicev1.AdminPeerServiceServer for one node (see
// KeyAdminOp): called by its peers only (with TLS, the interceptor takes
// only a member's peer certificate, as for PeerService).
type adminPeer struct {
	sluicev1.UnimplementedAdminPeerServiceServer
	s *Server
}

// KeyAdmin implements AdminPeerService.KeyAdmin. It is terminal: a RESET
// tells the region's members to DROP, which goes nowhere further.
func (p adminPeer) KeyAdmin(ctx context.Context, req *sluicev1.KeyAdminRequest) (*sluicev1.KeyAdminResponse, error) {
	if err := checkAdminKey(req.GetName(), req.GetKey()); err != nil {
		return nil, err
	}
	switch req.GetOp() {
	case sluicev1.KeyAdminOp_KEY_ADMIN_OP_READ, sluicev1.KeyAdminOp_KEY_ADMIN_OP_DROP:
	case sluicev1.KeyAdminOp_KEY_ADMIN_OP_RESET:
		if p.s.leaving.Load() {
			// Its windows are being handed off: the sender tells the
			// members itself.
			return nil, status.Error(codes.Unavailable, "sluice: "+errLeaving.Error())
		}
	default:
		return nil, invalidArgument(&fieldError{"op", fmt.Sprintf("want READ, RESET or DROP, got %s", req.GetOp())})
	}
	return &sluicev1.KeyAdminResponse{Nodes: p.s.keyAdminHere(ctx, req.Op, req.Name, req.Key)}, nil
}

var (
	_ sluicev1.AdminServiceServer     = (*adminService)(nil)
	_ sluicev1.AdminPeerServiceServer = adminPeer{}
)

// adminHTTP returns the admin API on the HTTP face (see NewHTTPHandler):
// a gateway of its own, so that nothing but the admin routes is served
// under security.AdminHTTPPrefix, behind the authenticator's record of
// each request's caller (security.Authenticator.AdminHTTPHandler).
func adminHTTP(cfg HTTPConfig) (http.Handler, error) {
	svc := newAdminService(cfg.Server, cfg.auth, cfg.RLS, cfg.rlsPath, cfg.Metrics)
	gw := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{},
	}), runtime.WithRoutingErrorHandler(routingError))
	if err := sluicev1gw.RegisterAdminServiceHandlerServer(context.Background(), gw, svc); err != nil {
		return nil, fmt.Errorf("http gateway: %w", err)
	}
	return svc.auth.AdminHTTPHandler(gw), nil
}
