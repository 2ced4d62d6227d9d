// Package rls serves Envoy's rate limit service protocol (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on top of
// sluice: Envoy, Istio, Contour, Emissary and Gloo can use a sluice
// cluster as their global rate limit service.
//
// Limits come from rule files in the YAML format that envoyproxy/ratelimit
// reads (see [Load] and docs/envoy.md): a domain, nested descriptors of
// key and optional value (a value with "*" is a wildcard), and a
// rate_limit of requests_per_unit per unit, with unlimited, name,
// replaces, unit_multiplier, shadow_mode and share_threshold. Rule files
// written for envoyproxy/ratelimit load unchanged.
//
// Each descriptor of a request that matches a rule becomes one sluice
// check: name = "rls" + the domain + the matched rule's path, key = the
// request's values, algorithm fixed_window, limit = requests_per_unit,
// window = unit x unit_multiplier. The checks are sent through a
// [Checker] (a node's *rpc.Server), which routes each to the key's owner
// like any other check, so every node of the cluster answers with the same
// counts.
//
// A request is charged to all its limited descriptors or to none: when it
// has more than one (or a rule of requests_per_unit 0 refuses it),
// [Service] first peeks at every one (hits 0; a fixed window's remaining
// is exactly what is left) and charges them only if all would pass. A concurrent request can still take
// the last hits between the peek and the charge; the descriptors already
// charged then stay charged (counted in [Stats].PartialCharges).
package rls
