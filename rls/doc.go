// Package rls serves Envoy's rate limit service protocol (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on top of
// sluice: Envoy, Istio, Contour, Emissary and Gloo can use a sluice
// cluster as their global rate limit service.
//
// Limits come from rule files in the YAML format that envoyproxy/ratelimit
// reads (see [Load] and docs/envoy.md): a domain, nested descriptors of
// key and optional value (a value with "*" is a wildcard), and a
// rate_limit of requests_per_unit per unit, with unlimited, name,
// replaces, unit_multiplier, shadow_mode, quota_mode, share_threshold and
// metadata. Rule files written for envoyproxy/ratelimit load unchanged;
// a [Source] reloads them while a node runs. [Options] give the peer's
// settings (SHADOW_MODE, QUOTA_MODE, RESPONSE_DYNAMIC_METADATA,
// LIMIT_RESPONSE_HEADERS_ENABLED, its way of counting, NEAR_LIMIT_RATIO);
// docs/envoy.md's table maps each to its flag.
//
// Each descriptor of a request that matches a rule becomes one sluice
// check: name = "rls" + the domain + the matched rule's path, key = the
// request's values, algorithm fixed_window, limit = requests_per_unit,
// window = unit x unit_multiplier. The checks are sent through a
// [Checker] (a node's *rpc.Server), which routes each to the key's owner
// like any other check, so every node of the cluster answers with the same
// counts.
//
// By default a request is charged to all its limited descriptors or to
// none (Options.IncrementWhenOverLimit counts as the peer does instead): its
// enforcing descriptors go in one batch that consumes, and the nodes
// decide a batch all or nothing (when one check is denied, the others
// that were allowed are given back and answered refunded), so no peek
// comes before the charge. A descriptor answered degraded (its owner
// unreachable, policy local) is not given back: a refused request that
// left one charged is counted in [Stats].PartialCharges. shadow_mode
// descriptors, which never refuse a request, are each counted in a batch
// of their own once the request is admitted, and only peeked at when it
// is refused.
//
// A descriptor with is_negative_hits (Envoy 1.38 on) is a refund when
// [Options].AllowRefunds is on (serve --allow-refunds): a check
// of negative hits that its key's owner gives back from the window in
// force, never below zero, before the request's other descriptors are
// decided; it never refuses its request (see [Service.ShouldRateLimit]).
// Envoy sends no time with it, so hits charged in a window that has ended
// are taken from the current one. Off (the default), such a descriptor
// only peeks, as before refunds.
//
// A rule file may set on_owner_unavailable (local, allow or deny) next to
// its domain, sluice's one addition to the format: every check of the
// domain carries it, and a node answers by it for a descriptor whose key's
// owner it cannot reach (deny: OVER_LIMIT).
package rls
