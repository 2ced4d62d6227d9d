// Package scenario measures how a multi-region rate limiter admits against
// what one central limiter would have admitted (issue 19; the test plan of
// ../shared/research/multiregion.md, section 5).
//
// A [Scenario] names regions (with their weights), the round-trip times
// between them, one limit (algorithm, numbers and scope), the keys, how
// long the run lasts, what arrives in each region (a steady rate of checks
// spread over the keys, and floods of checks at a window's start), the
// partitions (a region cut off from the others for a while), each
// region's clock offset, and restarts of nodes (a node stopped gracefully
// or killed, down for a while, and started again under its name: several
// in turn are a rolling deploy, testdata/deploy.yaml). It loads from YAML ([Load], [Parse]) and is
// validated with errors naming the field ([FieldError]); [Steady], [Skew],
// [FloodAll], [Partition] and [ClockSkew] build the scenarios of issue 19 for
// any number of regions and round-trip time (testdata/ holds them for 3
// regions at 100 ms).
//
// [NewPlan] expands a scenario into a deterministic list of timed checks
// (the seed picks arrival times and keys). [Run] sends each check to a
// [Target] in its region at its time, in real time, with a bounded pool of
// workers per region, and records every answer and when it was sent; it
// applies the cuts through a target that is a [Cutter] and the restarts,
// one at a time while the checks go on, through a [Restarter] (a target
// that is neither refuses them: [ErrCutsUnsupported],
// [ErrRestartsUnsupported], unless the options skip them).
// [NewReport] feeds the same checks, in global time order, to an [Oracle]
// (one central limiter: a window.Store with the whole limit) and reports,
// per key and window: what the target admitted, the over-admission (what
// it admitted beyond the limit) and the under-admission (what it denied
// that the oracle allowed); per region the decision latency; and in total
// the cross-region messages per check, slice_exhausted and degraded
// answers and errors. [Model] is a Target that models the designs in
// memory (global slices, regional, exact), for tests and as the reference
// a cluster is compared with.
//
// Units: times in a scenario are offsets from the run's start (Go
// durations in YAML: "1s", "250ms"); hits, limits and bursts are counts of
// hits; the report gives latencies in ms and times in Unix ms.
//
// The package does no network I/O of its own: cmd/sluice's scenario
// command drives real nodes through a Target of its own, and package lab
// runs a scenario's regions as a cluster in one process (a Target that
// cuts and restarts).
package scenario
