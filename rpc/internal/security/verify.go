package security

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// The verifier's timings.
const (
	// verifyEvery is how often Run verifies the members not admitted yet
	// when nothing asks it to sooner.
	verifyEvery = 500 * time.Millisecond
	// verifyTimeout bounds one member's verification (dial and handshake).
	verifyTimeout = 2 * time.Second
	// retryFirst is the wait after a member's first failure; it doubles
	// with each further failure up to retryMax.
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// Member is one incarnation of a member at one address, as gossip lists
// it: a member that restarts (a new Instance) or moves (a new Addr) is a
// new incarnation and is verified again.
type Member struct {
	// Name is the member name its peer certificate must carry.
	Name string
	// Addr is its gRPC address (host:port), where it is dialed.
	Addr string
	// Instance is its gossiped instance id (new at every start).
	Instance string
}

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Self is this node's member name: always admitted, never dialed.
	// (Required)
	Self string
	// Members returns the members gossip lists now (this node among
	// them). (Required)
	Members func() []Member
	// Verify checks that the server at addr (host:port) presents the peer
	// certificate of the member called name, within ctx: nil or why not
	// (CertSource.VerifyMember). (Required)
	Verify func(ctx context.Context, name, addr string) error
	// OnAdmit is called by Run after a pass that admitted one or more
	// members (the node then rebuilds its ring); it must not block.
	// (Optional)
	OnAdmit func()
	// Logger receives a line for each member admitted and each one
	// refused. Default slog.Default(). (Optional)
	Logger *slog.Logger
}

// Verifier admits members into a node's ring once their certificates
// verified (TLS): Run verifies (VerifierConfig.Verify: dials, with TLS
// 1.3) each member gossip lists that is not admitted yet, checking that
// it presents the node's CA's peer certificate of its name; Admit filters
// member lists down to the admitted ones. A member
// that fails is retried with a backoff (1 s doubling to 30 s) while
// gossip lists it; the ring never includes it meanwhile. A new
// incarnation of a member (see Member) is verified afresh. It is safe for
// concurrent use.
type Verifier struct {
	cfg  VerifierConfig
	now  func() time.Time // time.Now; tests set it
	kick chan struct{}    // capacity 1: members to verify

	mu         sync.Mutex
	verified   map[string]Member       // member name -> the incarnation whose certificate was verified
	unverified map[string]*verifyState // member name -> failed verifications of its current incarnation
}

// verifyState counts the failed verifications of one incarnation.
type verifyState struct {
	member Member
	fails  int
	next   time.Time // no attempt before
	err    error
}

// NewVerifier returns a Verifier that has admitted no member but
// cfg.Self; start its Run.
func NewVerifier(cfg VerifierConfig) *Verifier {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Verifier{cfg: cfg, now: time.Now, kick: make(chan struct{}, 1),
		verified: map[string]Member{}, unverified: map[string]*verifyState{}}
}

// Admit returns, for each of ms (index by index), whether it is admitted:
// it is this node, or its certificate verified for this incarnation. It
// forgets what it knew of members not in ms, and asks Run to verify the
// others.
func (v *Verifier) Admit(ms []Member) []bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]bool, len(ms))
	pending := false
	present := map[string]bool{}
	for i, m := range ms {
		present[m.Name] = true
		if m.Name == v.cfg.Self || v.verified[m.Name] == m {
			out[i] = true
			continue
		}
		pending = true
	}
	for name := range v.verified {
		if !present[name] {
			delete(v.verified, name)
		}
	}
	for name := range v.unverified {
		if !present[name] {
			delete(v.unverified, name)
		}
	}
	if pending {
		select {
		case v.kick <- struct{}{}:
		default:
		}
	}
	return out
}

// Verifying reports whether one of outside (members gossip lists that the
// ring leaves out) has a current incarnation that has not failed to
// verify yet: its certificate is still to be checked.
func (v *Verifier) Verifying(outside []Member) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range outside {
		if st := v.unverified[m.Name]; st == nil || st.member != m {
			return true
		}
	}
	return false
}

// Failures returns, by member name, how many times the certificate of the
// current incarnation of each member not admitted has failed to verify
// (members Admit last saw, that failed at least once).
func (v *Verifier) Failures() map[string]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]int, len(v.unverified))
	for name, st := range v.unverified {
		out[name] = st.fails
	}
	return out
}

// Run verifies the members not yet admitted, every 500 ms and whenever
// Admit met one, until ctx is done; after a pass that admitted any it
// calls OnAdmit. Each verification is bounded by 2 s.
func (v *Verifier) Run(ctx context.Context) {
	tick := time.NewTicker(verifyEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-v.kick:
		case <-tick.C:
		}
		if v.pass(ctx) && v.cfg.OnAdmit != nil {
			v.cfg.OnAdmit()
		}
	}
}

// pass verifies each member gossip lists that is neither this node,
// admitted, nor waiting for its retry, and reports whether it admitted
// any.
func (v *Verifier) pass(ctx context.Context) bool {
	admittedAny := false
	for _, m := range v.cfg.Members() {
		v.mu.Lock()
		st := v.unverified[m.Name]
		skip := m.Name == v.cfg.Self || v.verified[m.Name] == m || (st != nil && st.member == m && v.now().Before(st.next))
		v.mu.Unlock()
		if skip {
			continue
		}
		vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
		err := v.cfg.Verify(vctx, m.Name, m.Addr)
		cancel()
		v.mu.Lock()
		if err == nil {
			v.verified[m.Name] = m
			delete(v.unverified, m.Name)
			admittedAny = true
			v.cfg.Logger.Info("member certificate verified; admitted to the ring", "member", m.Name, "addr", m.Addr)
		} else if ctx.Err() == nil {
			if st == nil || st.member != m {
				st = &verifyState{member: m}
				v.unverified[m.Name] = st
				v.cfg.Logger.Warn("member not admitted to the ring: its certificate did not verify", "member", m.Name, "addr", m.Addr, "error", err)
			} else {
				v.cfg.Logger.Debug("member certificate still does not verify", "member", m.Name, "error", err)
			}
			st.fails++
			st.err = err
			st.next = v.now().Add(min(retryFirst<<min(st.fails-1, 5), retryMax))
		}
		v.mu.Unlock()
	}
	return admittedAny
}
