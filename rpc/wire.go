package rpc

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// Bounds on a request, beyond the window package's bounds on the numbers.
const (
	// MaxBatch is the most checks one Check or Forward call may carry.
	MaxBatch = 1000
	// MaxNameBytes is the longest limit name, in bytes.
	MaxNameBytes = 256
	// MaxKeyBytes is the longest key, in bytes. Keys that long are
	// rare (an id, an HMAC of an IP); the bound keeps a flood of long keys
	// from multiplying a node's memory per key.
	MaxKeyBytes = 512
)

// maxWindowMs is window.MaxWindow in milliseconds.
const maxWindowMs = int64(window.MaxWindow / time.Millisecond)

// fieldError is a bad field of one request, named as on the wire, e.g.
// "checks[2].limit".
type fieldError struct {
	field, reason string
}

func (e *fieldError) Error() string { return e.field + ": " + e.reason }

// invalidArgument turns a fieldError into an INVALID_ARGUMENT status whose
// message names the field and whose details carry a BadRequest.
func invalidArgument(fe *fieldError) error {
	st := status.New(codes.InvalidArgument, fe.Error())
	if d, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.field, Description: fe.reason}},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// request is one validated check: the window's numbers plus where it goes.
type request struct {
	name, key string
	check     window.Check
	pb        *sluicev1.RateLimitCheck // to forward: as received, or with a named limit's numbers filled in
	named     bool                     // name is a configured limit (its numbers may be the check's own)
	shadow    bool                     // the configured limit is in shadow mode
	// deadline is the Unix ns after which the check's sender no longer
	// waits for its answer (ForwardRequest.deadline_unix_ns); 0: none.
	// A check is not applied after it.
	deadline int64
	// Regions (see applyScopes): the limit's configured scope (from
	// limits.yaml), the scope that applies, and for a global limit sliced
	// here, the full limit (check.Limit is then the region's slice; 0: not
	// sliced); noSlice marks a slice of 0.
	cfgScope, scope region.Scope
	full            int64
	noSlice         bool
	// leased marks a global fixed-window check whose slice follows demand
	// (leases.go; check.Limit is then the region's base); zeroBase marks
	// a base of 0 (a stand-in then admits nothing).
	leased, zeroBase bool
	// fullBurst is a leased bucket's whole capacity (check.Burst is then
	// the base's share of it).
	fullBurst int64
	// refund marks a client's refund (hits < 0 on the wire): check.Hits
	// hits are given back at the key's owner, not consumed (see
	// Server.refund).
	refund bool
}

// isRefund reports whether r gives hits back instead of consuming them: a
// client's refund (negative hits) or a node's refund of a check of an
// all-or-nothing request (refund_at_ns).
func (r *request) isRefund() bool { return r.refund || r.pb.RefundAtNs != 0 }

// parseChecks validates a batch and converts it; a check without numbers
// takes those of the limit set configures under its name (set may be nil:
// none configured). fromPeer says the batch was forwarded by a peer: a
// check it marked named then takes this node's configured numbers for the
// name when it has them, else those it carries. It returns a *fieldError
// for the first bad field. A check of negative hits is a client's refund
// (see parseBatch for a client's batch on a node whose refunds are off).
func parseChecks(pbs []*sluicev1.RateLimitCheck, set *limits.Set, fromPeer bool) ([]request, *fieldError) {
	return parseBatch(pbs, set, fromPeer, true)
}

// refundsOff is what a refused negative hits adds to its reason.
const refundsOff = " (refunds are off: serve --allow-refunds)"

// parseBatch is parseChecks; refunds says whether negative hits are a
// client's refund (serve --allow-refunds): when false they are refused
// as before refunds existed, "checks[i].hits: must be >= 0, got N"
// (with refundsOff added). A peer's batch is parsed with refunds: its
// owner decides whether it applies a refund (see Server.refund).
func parseBatch(pbs []*sluicev1.RateLimitCheck, set *limits.Set, fromPeer, refunds bool) ([]request, *fieldError) {
	switch {
	case len(pbs) == 0:
		return nil, &fieldError{"checks", "at least one check is required"}
	case len(pbs) > MaxBatch:
		return nil, &fieldError{"checks", fmt.Sprintf("at most %d checks per call, got %d", MaxBatch, len(pbs))}
	}
	out := make([]request, len(pbs))
	for i, pb := range pbs {
		r, fe := parseOne(pb, set, fromPeer, refunds)
		if fe != nil {
			fe.field = fmt.Sprintf("checks[%d].%s", i, fe.field)
			return nil, fe
		}
		out[i] = r
	}
	return out, nil
}

// hasNumbers reports whether c carries numbers of its own (limit,
// window_ms, burst or algorithm) rather than naming a configured limit.
func hasNumbers(c *sluicev1.RateLimitCheck) bool {
	return c.GetLimit() != 0 || c.GetWindowMs() != 0 || c.GetBurst() != 0 || c.GetAlgorithm() != sluicev1.Algorithm_ALGORITHM_UNSPECIFIED
}

// parseCheck validates one check; the fieldError names the field alone.
// Negative hits are a client's refund.
func parseCheck(pb *sluicev1.RateLimitCheck, set *limits.Set, fromPeer bool) (request, *fieldError) {
	return parseOne(pb, set, fromPeer, true)
}

// parseOne is parseCheck; refunds false refuses negative hits (see
// parseBatch).
func parseOne(pb *sluicev1.RateLimitCheck, set *limits.Set, fromPeer, refunds bool) (request, *fieldError) {
	if pb == nil {
		return request{}, &fieldError{"name", "must not be empty"}
	}
	// proto.Unmarshal refuses strings that are not UTF-8; the node's codec
	// (vtCodec) does not, so the strings it uses are checked here.
	switch {
	case !utf8.ValidString(pb.Name):
		return request{}, &fieldError{"name", "must be valid UTF-8"}
	case !utf8.ValidString(pb.Key):
		return request{}, &fieldError{"key", "must be valid UTF-8"}
	case !fromPeer && pb.RefundAtNs != 0:
		return request{}, &fieldError{"refund_at_ns", fmt.Sprintf("is for nodes only (a refund of another check); must be 0 from a client, got %d", pb.RefundAtNs)}
	case pb.OnOwnerUnavailable < 0 || pb.OnOwnerUnavailable > sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY:
		return request{}, &fieldError{"on_owner_unavailable", fmt.Sprintf("unknown policy %d (want 0..3: unspecified, local, allow, deny)", pb.OnOwnerUnavailable)}
	case pb.RefundAtNs < 0:
		return request{}, &fieldError{"refund_at_ns", fmt.Sprintf("must be >= 0, got %d", pb.RefundAtNs)}
	case pb.Scope < 0 || pb.Scope > sluicev1.Scope_SCOPE_EXACT:
		return request{}, &fieldError{"scope", fmt.Sprintf("unknown scope %d (want 0..3: unspecified, global, regional, exact)", pb.Scope)}
	}
	var named, shadow bool
	l, configured := set.Resolve(pb.Name, pb.Key)
	noNumbers := !hasNumbers(pb)
	switch {
	case fromPeer:
		// The sender filled in a named limit's numbers (Named): this
		// node's own numbers for the name win, so that a key keeps one
		// set of numbers, its owner's, while nodes' files differ.
		if configured && pb.Named {
			pb = withNumbers(pb, l)
		}
	case configured && noNumbers:
		named, shadow = true, l.Shadow
		pb = withNumbers(pb, l) // forwarded with the numbers, marked Named
	case configured:
		named = true // inline numbers: the check's own limit, never shadow
	case noNumbers && pb.Name != "" && len(pb.Name) <= MaxNameBytes:
		return request{}, &fieldError{"limit", fmt.Sprintf("must be > 0, got 0 (and no limit called %q is configured to take the numbers from)", pb.Name)}
	}
	copied := !fromPeer && configured && noNumbers // withNumbers made pb a copy
	if !fromPeer && !noNumbers && pb.Named {
		pb = proto.CloneOf(pb)
		pb.Named = false // only nodes set it, on checks they filled in
		copied = true
	}
	// A check under a configured name takes the limit's policy (the key's
	// override's, if any) when it leaves on_owner_unavailable unspecified
	// or sends a weaker one, with or without numbers of its own: the
	// operator says how the name's checks fail, and a caller may make that
	// stricter (deny over local over allow), never weaker (issue 38: a
	// caller's allow turned a configured deny into fail-open). It is
	// resolved here, on the node the client called (which answers when the
	// owner cannot be reached), and forwarded in the check; a peer's check
	// keeps what its sender resolved.
	if !fromPeer && configured {
		var policy sluicev1.OwnerUnavailablePolicy
		switch l.OnOwnerUnavailable {
		case limits.OwnerUnavailableLocal:
			policy = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL
		case limits.OwnerUnavailableAllow:
			policy = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW
		case limits.OwnerUnavailableDeny:
			policy = sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY
		}
		if policy != sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_UNSPECIFIED && policyStrictness(policy) > policyStrictness(pb.OnOwnerUnavailable) {
			if !copied { // never change the caller's message
				pb = proto.CloneOf(pb)
			}
			pb.OnOwnerUnavailable = policy
		}
	}
	switch {
	case pb.Name == "":
		return request{}, &fieldError{"name", "must not be empty"}
	case len(pb.Name) > MaxNameBytes:
		return request{}, &fieldError{"name", fmt.Sprintf("must be at most %d bytes, got %d", MaxNameBytes, len(pb.Name))}
	case pb.Key == "":
		return request{}, &fieldError{"key", "must not be empty"}
	case len(pb.Key) > MaxKeyBytes:
		return request{}, &fieldError{"key", fmt.Sprintf("must be at most %d bytes, got %d", MaxKeyBytes, len(pb.Key))}
	// Range-check window_ms before it is scaled to ns, where a large
	// negative value would wrap around to a positive one.
	case pb.WindowMs <= 0 && named:
		return request{}, &fieldError{"window_ms", fmt.Sprintf("must be > 0, got %d (give limit and window_ms, or no numbers at all to take those of the configured limit %q)", pb.WindowMs, pb.Name)}
	case pb.WindowMs <= 0:
		return request{}, &fieldError{"window_ms", fmt.Sprintf("must be > 0, got %d", pb.WindowMs)}
	case pb.WindowMs > maxWindowMs:
		return request{}, &fieldError{"window_ms", fmt.Sprintf("must be <= %d (366 days), got %d", maxWindowMs, pb.WindowMs)}
	}
	alg := window.Algorithm(pb.Algorithm)
	switch {
	case pb.Algorithm == sluicev1.Algorithm_ALGORITHM_UNSPECIFIED:
		alg = window.FixedWindow
	case pb.Algorithm < 0 || pb.Algorithm > sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET:
		return request{}, &fieldError{"algorithm", fmt.Sprintf("unknown algorithm %d", pb.Algorithm)}
	}
	hits := int64(1) // unset: one hit
	refund := false
	if pb.Hits != nil {
		hits = *pb.Hits
	}
	if hits < 0 && refunds {
		// A refund: -hits hits given back (see Server.refund). The
		// numbers are those of the check that consumed them. (Refunds
		// off, c.Validate refuses negative hits below, as it did before
		// refunds existed.)
		if hits == math.MinInt64 {
			return request{}, &fieldError{"hits", fmt.Sprintf("a refund gives back at most %d hits, got %d", int64(math.MaxInt64), hits)}
		}
		hits, refund = -hits, true
	}
	c := window.Check{
		Algorithm: alg,
		Limit:     pb.Limit,
		Window:    time.Duration(pb.WindowMs) * time.Millisecond,
		Burst:     pb.Burst,
		Hits:      hits,
	}
	if err := c.Validate(); err != nil {
		var fe *window.FieldError
		if !errors.As(err, &fe) {
			return request{}, &fieldError{"checks", err.Error()}
		}
		reason := fe.Reason
		if named && (fe.Field == "limit" || fe.Field == "window") {
			reason += fmt.Sprintf(" (give limit and window_ms, or no numbers at all to take those of the configured limit %q)", pb.Name)
		}
		if fe.Field == "hits" && hits < 0 {
			reason += refundsOff
		}
		return request{}, &fieldError{fe.Field, reason}
	}
	return request{name: pb.Name, key: pb.Key, check: c, pb: pb, named: named, shadow: shadow, cfgScope: l.Scope, refund: refund}, nil
}

// toProto converts a window decision to the wire, rounding times up to
// whole milliseconds.
func toProto(d window.Decision, owner string) *sluicev1.Decision {
	return &sluicev1.Decision{
		Allowed:    d.Allowed,
		Limit:      d.Limit,
		Remaining:  d.Remaining,
		ResetTime:  unixMsCeil(d.ResetTime),
		RetryAfter: msCeil(d.RetryAfter),
		Delay:      msCeil(d.Delay),
		Owner:      owner,
	}
}

// msCeil returns d in whole milliseconds rounded up; window.RetryNever (and
// any negative duration) becomes -1. It does not overflow: the longest
// duration (window saturates waits at about 292 years) gives its ms.
func msCeil(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// unixMsCeil returns t as Unix milliseconds rounded up.
func unixMsCeil(t time.Time) int64 {
	ns := t.UnixNano()
	ms := ns / int64(time.Millisecond)
	if ns%int64(time.Millisecond) > 0 {
		ms++
	}
	return ms
}

// withNumbers returns a copy of pb carrying the numbers of l, marked
// Named.
func withNumbers(pb *sluicev1.RateLimitCheck, l limits.Limit) *sluicev1.RateLimitCheck {
	pb = proto.CloneOf(pb)
	pb.Limit, pb.WindowMs, pb.Burst = l.Limit, l.Window.Milliseconds(), l.Burst
	pb.Algorithm = sluicev1.Algorithm(l.Algorithm)
	pb.Named = true
	return pb
}

// policyStrictness orders the on_owner_unavailable policies by how little
// they admit while a key's owner cannot be reached: unspecified (the
// caller left it to the limit) 0, allow 1, local (the stand-in's count)
// 2, deny 3.
func policyStrictness(p sluicev1.OwnerUnavailablePolicy) int {
	switch p {
	case sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_ALLOW:
		return 1
	case sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_LOCAL:
		return 2
	case sluicev1.OwnerUnavailablePolicy_OWNER_UNAVAILABLE_DENY:
		return 3
	}
	return 0
}
