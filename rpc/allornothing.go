package rpc

import (
	"context"
	"fmt"
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
// A client's refund (negative hits) in such a request is not one of its
// limits: it neither refuses the request nor is undone with it.
func (s *Server) allOrNothing(ctx context.Context, reqs []request, out []*sluicev1.Decision) {
	denied := false
	for i, d := range out {
		if reqs[i].isRefund() {
			continue
		}
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
		if reqs[i].isRefund() || !d.Allowed || d.Shadow || d.Degraded {
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

// refund gives back the hits of r at this node, the key's owner, as
// window.Store.Refund does (never below zero, per algorithm); refunds
// are applied whatever their deadline (a late one still only gives back
// what was counted).
//
// A node's refund (r.pb.RefundAtNs > 0) undoes a check this node applied
// at that Unix ns of its store's clock, and answers allowed and refunded
// when it gave something back (the answer goes to the node that asked).
//
// A client's refund (negative hits: r.refund) names no time (Envoy's
// is_negative_hits does not say when the hits were charged): it gives back
// check.Hits from the key as it is now, as a refund applied now would:
// from the window in force for the fixed and sliding windows (a refund
// whose hits were counted in a window that has ended is taken from the
// current one, floored at zero), and from a bucket's debt as of its last
// update (exact when no other check updates the key between the read of
// that time and the refund, else less). A leased or sliced global key is
// given back under its full limit, so that hits above the region's base
// still come back; hits above the key's capacity give back what it holds.
// It answers allowed (a refund is never refused),
// refunded when it gave something back, and the hits remaining after it
// (a peek, under the check's numbers).
//
// A client's refund is applied only where refunds are on
// (ServerConfig.AllowRefunds): the node a client calls refuses one when
// its own refunds are off (Check: INVALID_ARGUMENT), and the key's owner
// checks again here, so that a node whose refunds are off never applies
// one that a node with them on let in (see refundOff).
func (s *Server) refund(storeKey []byte, r *request) *sluicev1.Decision {
	c := r.check
	now := s.store.Now()
	at := time.Unix(0, r.pb.RefundAtNs)
	client := r.pb.RefundAtNs == 0
	if client && !s.allowRefunds {
		return s.refundOff(r)
	}
	if client {
		at = now
		if r.full > c.Limit {
			c.Limit = r.full
		}
		if r.fullBurst > c.Burst {
			c.Burst = r.fullBurst
		}
		// More than the key can hold gives back what it holds (Refund
		// gives nothing back for hits no check could have consumed).
		c.Hits = min(c.Hits, c.Capacity())
		if isBucket(c.Algorithm) {
			if st, ok := s.store.Get(string(storeKey)); ok {
				if u := st.Describe(now).Start; !u.IsZero() && !u.After(now) {
					at = u
				}
			}
		}
	}
	ok, err := s.store.Refund(storeKey, c, at, now)
	if err != nil {
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: err.Error()}
	}
	if ok {
		s.stats.refunds.Add(1)
		if s.replication.Factor > 0 {
			s.dirty.Add(storeKey)
		}
	}
	if !client {
		return &sluicev1.Decision{Allowed: ok, Limit: c.Limit, Owner: s.name, Refunded: ok}
	}
	peek := c
	peek.Hits = 0 // consumes nothing and stores no state
	pd, err := s.store.ApplyBytes(storeKey, peek, now)
	if err != nil {
		return &sluicev1.Decision{Limit: c.Limit, Owner: s.name, Error: err.Error()}
	}
	return &sluicev1.Decision{Allowed: true, Refunded: ok, Limit: c.Limit, Remaining: pd.Remaining,
		ResetTime: unixMsCeil(pd.ResetTime), Owner: s.name}
}

// refundOffLogEvery spaces the warnings of refundOff.
const refundOffLogEvery = time.Minute

// refundOff answers a client's refund that reached this node, the key's
// owner, whose refunds are off, from a node whose refunds are on (this
// node's own Check refuses them): not applied, answered with an error
// naming this node and the flag, counted in Stats.RefundsRefused
// (sluice_refunds_refused_total) and logged at warning at most once a
// minute, since it means the nodes' --allow-refunds differ.
func (s *Server) refundOff(r *request) *sluicev1.Decision {
	s.stats.refundsRefused.Add(1)
	now := time.Now().UnixNano()
	if last := s.refundOffLogged.Load(); now-last >= int64(refundOffLogEvery) && s.refundOffLogged.CompareAndSwap(last, now) {
		s.log.Warn("a client's refund let in by another node was not applied: refunds are off on this node, the key's owner; give every node the same --allow-refunds",
			"refused_so_far", s.stats.refundsRefused.Load())
	}
	return &sluicev1.Decision{Limit: r.check.Limit, Owner: s.name,
		Error: fmt.Sprintf("refund not applied: refunds are off at %s, the key's owner (serve --allow-refunds)", s.name)}
}
