package rpc

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// errExpired answers a forwarded check that came after its sender's
// deadline: nothing of it was applied.
const errExpired = "the check came after its sender's deadline; not applied"

// errNotDecided answers a forwarded check that a leaving node could not
// pass on to the key's next owner, or a reforwarded one that reached it
// (it decides none: its windows went to the keys' next owners): nothing of
// it was applied, and the sender answers it as a check whose owner it
// could not reach.
const errNotDecided = "the receiver is leaving and could not pass the check on; not applied"

// allOrNothing makes a request's checks consume all or none: when one of
// them was denied (or could not be decided), every other one that consumed
// hits gets them back, from the window they were counted in, at the key's
// owner (a refund, routed like a check: window.Store.Refund), and is
// answered refunded (allowed false, remaining as before it). A shadow
// check's would-be denial denies nothing, so it refunds nothing. Checks
// answered degraded are not refunded (their owner could not be reached):
// they stay counted, and the key may deny early by their hits.
//
// It applies to a Check request that sets all_or_nothing, which every
// caller carrying one request's limits does (the client's CheckAll, the
// middleware with several limits, sluice proxy's rules, the RLS face): a
// refused request must not spend its other limits (a denied login still
// charging the per-IP limit locks out the next honest try). It is not the
// default, because a Check request is also how callers batch independent
// checks (many users' checks in one call, sluice bench's batched load):
// there one user's denial must not refund another's admission.
// A refund may briefly deny a concurrent request that would have passed
// (its hits were counted until the refund landed); it never admits one that
// would not have been admitted had the refunded check never been made.
func (s *Server) allOrNothing(ctx context.Context, reqs []request, out []*sluicev1.Decision) {
	denied := false
	for i, d := range out {
		if d.Error != "" || (!d.Allowed && !reqs[i].shadow) {
			denied = true
			break
		}
	}
	if !denied {
		return
	}
	var (
		refunds []request
		idx     []int
	)
	for i, d := range out {
		if !d.Allowed || d.Shadow || d.Degraded {
			// A degraded answer's hits were counted without the owner
			// (or by a stand-in): they stay counted, and it stays
			// allowed; the request is refused by the other check.
			continue
		}
		r := reqs[i]
		if d.AppliedAtNs > 0 && r.check.Hits > 0 {
			r.pb = proto.CloneOf(r.pb)
			r.pb.RefundAtNs = d.AppliedAtNs
			r.pb.NoBatching = false
			refunds = append(refunds, r)
			idx = append(idx, i)
		}
		d.Allowed, d.Refunded, d.RetryAfter, d.Delay = false, true, 0, 0
		if d.AppliedAtNs > 0 {
			d.Remaining = min(d.Remaining+r.check.Hits, r.check.Capacity())
		}
	}
	if len(refunds) == 0 {
		return
	}
	pending := make([]int, len(refunds))
	for j := range pending {
		pending[j] = j
	}
	rout := make([]*sluicev1.Decision, len(refunds))
	failed := s.route(ctx, s.view.Load(), refunds, pending, rout)
	for _, f := range failed {
		// The hits stay counted: the key denies early by them.
		s.log.Debug("refund not delivered; its hits stay counted", "owner", f.owner, "error", f.err)
	}
}

// refund gives back the hits of r, a refund of a check this node applied
// as the key's owner at r.pb.RefundAtNs (its store's clock); refunds are
// applied whatever their deadline (a late one still only gives back what
// was counted).
func (s *Server) refund(storeKey []byte, r *request) *sluicev1.Decision {
	c := r.check
	ok, err := s.store.Refund(storeKey, c, time.Unix(0, r.pb.RefundAtNs), s.store.Now())
	if err != nil {
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: err.Error()}
	}
	if ok {
		s.stats.refunds.Add(1)
		if s.replication.Factor > 0 {
			s.dirty.Add(storeKey)
		}
	}
	return &sluicev1.Decision{Allowed: ok, Limit: c.Limit, Owner: s.name, Refunded: ok}
}
