// Package window holds sluice's rate-limit algorithms and the in-memory store
// of per-key state that the owner of a key keeps.
//
// It is the pure core of sluice: it imports only the standard library, does no
// I/O and reads no clock of its own. Every decision is a function of the stored
// state, the check and an explicit "now" (see [Store.Apply]); the [Clock]
// interface is only a shorthand for callers that want real time.
//
// # Algorithms
//
// Let L = limit, W = window, B = burst (default L), h = hits, t = now. All
// arithmetic is exact integer arithmetic on nanoseconds, with 128-bit
// intermediate products, so no float rounding ever decides a request and
// nothing overflows for L, B up to [MaxLimit] (2^53) and W up to [MaxWindow]
// (366 days).
//
//   - [FixedWindow]: windows aligned to the Unix epoch, start = floor(t/W)*W.
//     Allowed iff count+h <= L. A documented property of the algorithm: up to
//     2L hits can be admitted across one window edge.
//   - [SlidingWindow]: the weighted two-window counter described by Cloudflare
//     ("How we built rate limiting capable of scaling to millions of domains",
//     blog.cloudflare.com, 2017): estimate = p*(W-e)/W + c with p the previous
//     window's count, c the current one's and e = t - start. Allowed iff
//     p*(W-e) + (c+h)*W <= L*W.
//   - [TokenBucket]: a bucket of B tokens refilled continuously at L per W,
//     starting full. Allowed iff tokens >= h. It is equivalent to GCRA, the
//     Generic Cell Rate Algorithm of ITU-T I.371 (see also Brandur Leach,
//     "Rate limiting, cells, and GCRA", brandur.org, 2015).
//   - [LeakyBucket]: a queue of room B drained at L per W (the "leaky bucket
//     as a meter" of ITU-T I.371, as in nginx limit_req with burst). Allowed
//     iff level+h <= B; an allowed check also gets a delay: how long until the
//     queue ahead of it has drained.
//
// # Shared rules
//
//   - Rejected checks consume nothing.
//   - hits = 0 is a peek: it consumes nothing, and Allowed tells whether one
//     more hit would be allowed now.
//   - hits above the capacity (L for the windows, B for the buckets) is over
//     limit with RetryAfter = [RetryNever] and consumes nothing.
//   - Remaining rounds down; ResetTime, RetryAfter and Delay are exact to the
//     nanosecond, rounded up (callers that speak milliseconds round up again).
//   - A change of limit or burst on a live key keeps what was consumed and
//     applies the new numbers (remaining = new capacity - consumed, floored at
//     0); a bucket refills at the limit of the last check that consumed
//     hits. A change of window or algorithm starts the key afresh, but only
//     once a check under the new numbers consumes hits: a check that
//     consumes nothing (a peek, a refused check) never changes a key's state.
//   - Time going backwards (a now earlier than the key's last update) is
//     treated as no time passing: it never refills a bucket or reopens a
//     window.
//
// # Refunds
//
// [Store.Refund] gives back the hits of an allowed check, for a request
// whose checks must all be consumed or none: when one is denied, the
// others are refunded. It names the check and the time it was applied at.
// A refund never takes a count below zero, never creates state, leaves a
// state built for another algorithm or window alone (the key started
// afresh since), and never lets a key admit more than it would have had
// the refunded check been refused; where it cannot tell how much of the
// check is still counted, it gives back less.
//
//   - [FixedWindow]: the hits come off the count of the window they were
//     applied in, if that window is still the current one; once it has
//     ended, nothing (its count no longer matters).
//   - [SlidingWindow]: off the current window's count if they were applied
//     in it, off the previous window's if they were applied in that one (it
//     still weighs in the estimate), nothing if earlier.
//   - [TokenBucket], [LeakyBucket]: off the debt (hits consumed and not yet
//     refilled, times W), h*W less what can have drained between the check
//     and the key's last update, floored at 0: exact when the key was not
//     updated after the check (in particular when the refund comes at once),
//     less otherwise, as the store cannot tell whose hits the drain took.
//
// The windows' refunds are exact: the key ends as if the check had been
// refused (every other check decided as it was), unless the clock went
// backwards or the key was removed or reset in between. Refund a check
// at most once: the store cannot tell a second refund from the first.
package window
