package rpc

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/window"
)

// Metrics is a node's Prometheus metrics: an [Observer] for the request
// path plus a collector that reads the server's, the store's and the
// limits' counters at scrape time. Every name starts with sluice_; no
// label ever holds a key or an IP (limit names are labels only when they
// are configured limits; peers are member names).
type Metrics struct {
	reg *prometheus.Registry

	checks     *prometheus.CounterVec
	byName     sync.Map // name -> *[numOutcomes]prometheus.Counter, by Outcome
	fwdSeconds prometheus.Histogram
	fwdBatch   prometheus.Histogram
	sweep      prometheus.Histogram
	insecure   prometheus.Gauge

	mu     sync.Mutex
	server *Server
	store  *window.Store
	limits *limits.Source
	rls    *rls.Service
	node   *nodeInfo // nil until AttachNode
}

// nodeInfo is what AttachNode gave: the labels of sluice_node_info and
// the readiness test behind sluice_ready.
type nodeInfo struct {
	member, region, version string
	ready                   func() error
}

// NewMetrics returns Metrics registered in a registry of their own, with
// the Go runtime and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_checks_total",
			Help: `Checks answered to clients by this node, by limit name (configured limits; "(inline)" for the rest) and outcome (allowed, denied, shadow_denied, error, invalid).`,
		}, []string{"name", "outcome"}),
		fwdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_forward_duration_seconds",
			Help:    "Duration of calls that carried forwarded checks to their owners.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		fwdBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_forward_batch_size",
			Help:    "Checks per call to an owner (the batch size).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000},
		}),
		sweep: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_sweep_duration_seconds",
			Help:    "Duration of each sweep of idle keys.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
	}
	m.insecure = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_insecure",
		Help: "1 when the node is reachable from other hosts in plaintext without authentication (--insecure), else 0.",
	})
	m.reg.MustRegister(m.checks, m.fwdSeconds, m.fwdBatch, m.sweep, m.insecure, (*statsCollector)(m),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry to serve (e.g. with promhttp.HandlerFor).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Attach makes the collector read srv's, store's and src's counters (src
// may be nil). A node calls it once it has them.
func (m *Metrics) Attach(srv *Server, store *window.Store, src *limits.Source) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.server, m.store, m.limits = srv, store, src
}

// AttachRLS makes the collector read the Envoy rate limit service's
// counters too.
func (m *Metrics) AttachRLS(svc *rls.Service) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rls = svc
}

// AttachNode makes the collector report the node itself: sluice_node_info
// (always 1) labelled with its member name, region and version, and
// sluice_ready, 1 when ready returns nil and 0 otherwise, asked at every
// scrape (ready is the node's one readiness test, [Node.Ready]; nil: no
// sluice_ready). A node calls it once it exists.
func (m *Metrics) AttachNode(member, region, version string, ready func() error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.node = &nodeInfo{member: member, region: region, version: version, ready: ready}
}

// Checked implements [Observer].
func (m *Metrics) Checked(name string, outcome Outcome) {
	cs, ok := m.byName.Load(name)
	if !ok {
		var c [numOutcomes]prometheus.Counter
		for o := range c {
			c[o] = m.checks.WithLabelValues(name, Outcome(o).String())
		}
		cs, _ = m.byName.LoadOrStore(name, &c)
	}
	cs.(*[numOutcomes]prometheus.Counter)[outcome].Inc()
}

// Forwarded implements [Observer].
func (m *Metrics) Forwarded(_ string, checks int, took time.Duration, _ error) {
	m.fwdSeconds.Observe(took.Seconds())
	m.fwdBatch.Observe(float64(checks))
}

// ObserveSweep records one sweep's duration.
func (m *Metrics) ObserveSweep(took time.Duration) { m.sweep.Observe(took.Seconds()) }

// statsCollector turns the counters that Server, Store and limits keep as
// atomics into metrics at scrape time.
type statsCollector Metrics

var (
	descLocal        = prometheus.NewDesc("sluice_local_checks_total", "Checks decided by this node as owner that entered at this node.", nil, nil)
	descForwarded    = prometheus.NewDesc("sluice_forwarded_checks_total", "Checks sent to their owner on another node, by peer.", []string{"peer"}, nil)
	descFwdCalls     = prometheus.NewDesc("sluice_forward_calls_total", "Calls to peers carrying forwarded checks, by peer.", []string{"peer"}, nil)
	descFwdErrors    = prometheus.NewDesc("sluice_forward_errors_total", "Calls to peers that failed, by peer.", []string{"peer"}, nil)
	descNoConn       = prometheus.NewDesc("sluice_forward_no_connection_total", "Checks whose owner had no connection.", nil, nil)
	descReceived     = prometheus.NewDesc("sluice_received_checks_total", "Checks received from peers, decided here as owner.", nil, nil)
	descReceivedRPCs = prometheus.NewDesc("sluice_received_calls_total", "Calls received from peers.", nil, nil)
	descMembers      = prometheus.NewDesc("sluice_members", "Members in this node's ring, itself included.", nil, nil)
	descRingEpoch    = prometheus.NewDesc("sluice_ring_epoch", "Ring builds on this node that changed the ring's fingerprint, since it started.", nil, nil)
	descKeys         = prometheus.NewDesc("sluice_keys", "Keys holding state on this node.", nil, nil)
	descSwept        = prometheus.NewDesc("sluice_keys_swept_total", "Keys removed because they were back at full capacity (changes no decision).", nil, nil)
	descEvictedLive  = prometheus.NewDesc("sluice_keys_evicted_live_total", "Keys removed under --max-keys while still inside their window: each handed its client a fresh budget.", nil, nil)
	descKeysRefused  = prometheus.NewDesc("sluice_keys_refused_total", "New keys not admitted because the store was full under --on-key-cap=deny or their limit name held its --name-key-share: each such check was answered not allowed and degraded.", nil, nil)
	descReloads      = prometheus.NewDesc("sluice_limits_reloads_total", "Reloads of the named limits file, by result (ok, refused).", []string{"result"}, nil)
	descLimits       = prometheus.NewDesc("sluice_limits_configured", "Named limits in force.", nil, nil)
	descNodeInfo     = prometheus.NewDesc("sluice_node_info", "Always 1; the labels name this node: member (its member name), region (--region) and version.", []string{"member", "region", "version"}, nil)
	descRefundsOn    = prometheus.NewDesc("sluice_refunds_allowed", "1 when this node takes clients' refunds (negative hits, Envoy's is_negative_hits: serve --allow-refunds), else 0; every node of a cluster should say the same.", nil, nil)
	descReady        = prometheus.NewDesc("sluice_ready", "1 while the node is ready (GET /readyz answers 200, gRPC health SERVING), else 0: joining, ring settling, refused by the cluster (its name is taken) or leaving.", nil, nil)
	descHandOff      = []struct {
		desc *prometheus.Desc
		get  func(Stats) int64
	}{
		{prometheus.NewDesc("sluice_degraded_checks_total", "Checks answered per on_owner_unavailable because their owner could not be reached (under local, decided by the owner's stand-in holder and counted).", nil, nil), func(st Stats) int64 { return st.Degraded }},
		{prometheus.NewDesc("sluice_stand_in_admitted_hits_total", "Hits this node admitted in the stead of an unreachable owner (counted in its fallback window of the key, handed to the key's owner).", nil, nil), func(st Stats) int64 { return st.StandInAdmitted }},
		{prometheus.NewDesc("sluice_stand_in_leased_denied_checks_total", "Global checks of leased limits a stand-in denied while their owner in this region could not be reached (a stand-in holds none of the region's slice).", nil, nil), func(st Stats) int64 { return st.StandInLeasedDenied }},
		{prometheus.NewDesc("sluice_pauses_total", "Gaps in this node's run longer than its pause threshold (a frozen container or VM, SIGSTOP): each makes it pull its keys from the other members before it decides them again.", nil, nil), func(st Stats) int64 { return st.Pauses }},
		{prometheus.NewDesc("sluice_paused_denied_checks_total", "Checks denied after a pause: of this node's keys while their pull had not reached every other member, and stand-in checks right after it, whose copies may be stale (unknown means spent).", nil, nil), func(st Stats) int64 { return st.PausedDenied }},
		{prometheus.NewDesc("sluice_stand_in_forwarded_checks_total", "Checks this node sent to an unreachable owner's stand-in holder.", nil, nil), func(st Stats) int64 { return st.StandInForwarded }},
		{prometheus.NewDesc("sluice_stand_in_returned_keys_total", "Keys whose stand-in hits went to their owner (or into this node's window once it owned the key).", nil, nil), func(st Stats) int64 { return st.StandInReturned }},
		{prometheus.NewDesc("sluice_expired_checks_total", "Forwarded checks not applied because they reached this node, their owner, after the sender's deadline (the sender answered them without it).", nil, nil), func(st Stats) int64 { return st.Expired }},
		{prometheus.NewDesc("sluice_refunds_total", "Refunds applied here, as owner, that gave hits back: checks given back because another check of the same all-or-nothing request was denied, and clients' refunds (negative hits, Envoy's is_negative_hits).", nil, nil), func(st Stats) int64 { return st.Refunds }},
		{prometheus.NewDesc("sluice_refunds_refused_total", "Clients' refunds (negative hits) another node let in that this node, the key's owner, did not apply because its refunds are off (serve --allow-refunds): the nodes' settings differ.", nil, nil), func(st Stats) int64 { return st.RefundsRefused }},
		{prometheus.NewDesc("sluice_keys_moved_without_state_total", "Keys that changed owner without their state (a pull or hand-off failed or timed out): each may start afresh.", nil, nil), func(st Stats) int64 { return st.MovedWithoutState }},
		{prometheus.NewDesc("sluice_keys_owner_lost_total", "Keys first touched here as new owner whose previous owner left without a hand-off and with no replica: they start afresh.", nil, nil), func(st Stats) int64 { return st.OwnerLost }},
		{prometheus.NewDesc("sluice_replica_behind_total", "Key copies a replication send failed to deliver (sent again next interval).", nil, nil), func(st Stats) int64 { return st.ReplicaBehind }},
		{prometheus.NewDesc("sluice_handoff_timeouts_total", "Ring changes whose hand-off did not complete within --handoff-timeout.", nil, nil), func(st Stats) int64 { return st.HandOffTimeouts }},
		{prometheus.NewDesc("sluice_handoff_errors_total", "Hand-offs to a peer that failed (retried on the next ring change).", nil, nil), func(st Stats) int64 { return st.HandOffErrors }},
		{prometheus.NewDesc("sluice_handed_off_keys_total", "Keys whose state this node sent to a new owner.", nil, nil), func(st Stats) int64 { return st.HandedOff }},
		{prometheus.NewDesc("sluice_received_handoff_keys_total", "Keys merged from peers' hand-offs.", nil, nil), func(st Stats) int64 { return st.ReceivedHandOff }},
		{prometheus.NewDesc("sluice_pulls_total", "Keys pulled from their previous owner on first touch.", nil, nil), func(st Stats) int64 { return st.Pulls }},
		{prometheus.NewDesc("sluice_replica_takeovers_total", "Keys whose replica stood in for a lost owner.", nil, nil), func(st Stats) int64 { return st.ReplicaTakeovers }},
		{prometheus.NewDesc("sluice_replica_returned_total", "Keys taken over from a copy and handed back to the same owner process (out of the ring only for a moment): only the hits counted beyond the copy went back.", nil, nil), func(st Stats) int64 { return st.ReplicaReturned }},
		{prometheus.NewDesc("sluice_replicated_keys_total", "Key copies sent to successors.", nil, nil), func(st Stats) int64 { return st.Replicated }},
		{prometheus.NewDesc("sluice_reforwarded_checks_total", "Checks received as owner that this node's ring gives to another member, sent on once.", nil, nil), func(st Stats) int64 { return st.Reforwarded }},
		{prometheus.NewDesc("sluice_not_owner_applied_total", "Re-forwarded checks decided here although this node's ring names another owner.", nil, nil), func(st Stats) int64 { return st.NotOwnerApplied }},
		{prometheus.NewDesc("sluice_view_mismatch_total", "Forwarded requests whose sender's ring fingerprint differed from this node's.", nil, nil), func(st Stats) int64 { return st.ViewMismatch }},
		{prometheus.NewDesc("sluice_inflight_refused_total", "Check calls refused with RESOURCE_EXHAUSTED because the node had --max-inflight checks in flight.", nil, nil), func(st Stats) int64 { return st.InflightRefused }},
		{prometheus.NewDesc("sluice_handoff_refused_total", "Key states refused in peers' hand-offs: a sender that is not the key's previous owner, an old ring, or absurd or undecodable values. Nothing of them was merged.", nil, nil), func(st Stats) int64 { return st.HandOffRefused }},
		{prometheus.NewDesc("sluice_lease_requests_total", "Requests for more of a global limit this node sent for its region's slices (several regions).", nil, nil), func(st Stats) int64 { return st.LeaseRequests }},
		{prometheus.NewDesc("sluice_lease_grants_total", "Grants this node's allocators sent to regions.", nil, nil), func(st Stats) int64 { return st.LeaseGrants }},
		{prometheus.NewDesc("sluice_lease_granted_hits_total", "Hits grants raised this node's region's slices by.", nil, nil), func(st Stats) int64 { return st.LeaseGrantedHits }},
		{prometheus.NewDesc("sluice_lease_lowers_total", "Lowers (take back unused slice, or report) this node's allocators sent.", nil, nil), func(st Stats) int64 { return st.LeaseLowers }},
		{prometheus.NewDesc("sluice_lease_given_back_hits_total", "Hits regions gave back to this node's allocators' pools (acknowledged lowers and give-backs).", nil, nil), func(st Stats) int64 { return st.LeaseGivenBack }},
		{prometheus.NewDesc("sluice_lease_give_backs_total", "Give-backs this node sent unasked for its region: what it would not use of a window's slice, where other regions wanted more.", nil, nil), func(st Stats) int64 { return st.LeaseGiveBacks }},
		{prometheus.NewDesc("sluice_lease_stands_total", "Standing slices (what a region's windows start at, for several windows) this node's allocators set.", nil, nil), func(st Stats) int64 { return st.LeaseStands }},
		{prometheus.NewDesc("sluice_slice_exhausted_total", "Checks of global limits denied here because the region's slice was spent (the limit itself may not be).", nil, nil), func(st Stats) int64 { return st.SliceExhausted }},
		{prometheus.NewDesc("sluice_lease_messages_total", "Lease messages this node sent to other nodes.", nil, nil), func(st Stats) int64 { return st.LeaseMessages }},
		{prometheus.NewDesc("sluice_lease_calls_total", "Lease calls (batches of lease messages) this node made.", nil, nil), func(st Stats) int64 { return st.LeaseCalls }},
		{prometheus.NewDesc("sluice_lease_call_errors_total", "Lease calls that failed (their messages are sent or asked again, never applied twice).", nil, nil), func(st Stats) int64 { return st.LeaseCallErrors }},
		{prometheus.NewDesc("sluice_ring_mismatch_total", "Members seen with the same member set but another ring fingerprint (they disagree about owners).", nil, nil), func(st Stats) int64 { return st.RingMismatch }},
	}
	descPoolSlice  = prometheus.NewDesc("sluice_lease_slice_hits_total", "Hits of the slices this node's region held of a global limit, summed over the windows that ended, by limit name (configured limits; \"(inline)\" for the rest).", []string{"name"}, nil)
	descPoolUsed   = prometheus.NewDesc("sluice_lease_slice_used_hits_total", "Hits this node's region admitted of its slices of a global limit, summed over the windows that ended, by limit name.", []string{"name"}, nil)
	descPoolFree   = prometheus.NewDesc("sluice_lease_pool_free_hits_total", "Hits this node's allocators left in a global limit's pool, granted to no region, summed over the windows that ended, by limit name. Over all nodes: used / (slice + free) is the share of the limit admitted.", []string{"name"}, nil)
	descReplicas   = prometheus.NewDesc("sluice_replicas", "Copies of other owners' keys held on this node.", nil, nil)
	descRLS        = prometheus.NewDesc("sluice_rls_requests_total", "Envoy ShouldRateLimit requests answered, by overall code (ok, over_limit).", []string{"code"}, nil)
	descRLSPartial = prometheus.NewDesc("sluice_rls_partial_charges_total", "Envoy requests refused that left a descriptor charged (one answered degraded, which the node does not refund).", nil, nil)
	descRLSShadow  = prometheus.NewDesc("sluice_rls_global_shadow_mode_total", "Envoy requests over a limit answered OK because of --rls-shadow-mode (envoyproxy/ratelimit's global_shadow_mode).", nil, nil)
	descRLSLoads   = prometheus.NewDesc("sluice_rls_config_loads_total", "Loads of the RLS rule files, by result (ok; refused: the running rules stayed).", []string{"result"}, nil)
	descRLSDomains = prometheus.NewDesc("sluice_rls_domains", "Domains of the RLS rules in force.", nil, nil)
	descRLSRules   = prometheus.NewDesc("sluice_rls_rules", "RLS rules (rate_limit blocks) in force; 0: every Envoy request is OK.", nil, nil)
	descRLSRefunds = prometheus.NewDesc("sluice_rls_refunds_total", "Envoy refund descriptors (is_negative_hits) answered, by result: given_back, nothing (nothing counted in the window in force), failed (the key's owner unreachable or its refunds off: the hits stay counted), off (this node's refunds are off, serve --allow-refunds: the descriptor only peeked, as before refunds).", []string{"result"}, nil)
	// Per rule, as envoyproxy/ratelimit's ratelimit.service.rate_limit.<key>.* stats: one series per rule, never per value.
	rlsRuleLabels     = []string{"domain", "rule"}
	descRLSRuleTotal  = prometheus.NewDesc("sluice_rls_rule_total_hits_total", "Hits asked of an RLS rule (its full key, e.g. rl.foo_bar; <domain>.(override) for limits carried by requests).", rlsRuleLabels, nil)
	descRLSRuleOver   = prometheus.NewDesc("sluice_rls_rule_over_limit_hits_total", "Hits beyond an RLS rule's limit.", rlsRuleLabels, nil)
	descRLSRuleNear   = prometheus.NewDesc("sluice_rls_rule_near_limit_hits_total", "Hits within an RLS rule's limit but past --rls-near-limit-ratio of it.", rlsRuleLabels, nil)
	descRLSRuleWithin = prometheus.NewDesc("sluice_rls_rule_within_limit_hits_total", "Hits within an RLS rule's limit.", rlsRuleLabels, nil)
	descRLSRuleShadow = prometheus.NewDesc("sluice_rls_rule_shadow_mode_hits_total", "Hits beyond the limit of a shadow_mode RLS rule, let through.", rlsRuleLabels, nil)
)

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLocal, descForwarded, descFwdCalls, descFwdErrors, descNoConn,
		descReceived, descReceivedRPCs, descMembers, descRingEpoch, descKeys, descSwept, descEvictedLive, descKeysRefused, descReloads, descLimits,
		descRLS, descRLSPartial, descRLSShadow, descRLSLoads, descRLSDomains, descRLSRules, descRLSRefunds, descRLSRuleTotal, descRLSRuleOver,
		descRLSRuleNear, descRLSRuleWithin, descRLSRuleShadow, descReplicas, descPoolSlice, descPoolUsed, descPoolFree,
		descNodeInfo, descReady, descRefundsOn} {
		ch <- d
	}
	for _, h := range descHandOff {
		ch <- h.desc
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	srv, store, src, rlsSvc, node := c.server, c.store, c.limits, c.rls, c.node
	c.mu.Unlock()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	if node != nil {
		ch <- prometheus.MustNewConstMetric(descNodeInfo, prometheus.GaugeValue, 1, node.member, node.region, node.version)
		if node.ready != nil {
			ready := int64(0)
			if node.ready() == nil {
				ready = 1
			}
			gauge(descReady, ready)
		}
	}
	if srv != nil {
		st := srv.Stats()
		counter(descLocal, st.LocalChecks)
		counter(descNoConn, st.ForwardErrors-sumErrors(st.Peers))
		counter(descReceived, st.ReceivedChecks)
		counter(descReceivedRPCs, st.ReceivedRPCs)
		for name, p := range st.Peers {
			counter(descForwarded, p.Checks, name)
			counter(descFwdCalls, p.Batches, name)
			counter(descFwdErrors, p.Errors, name)
		}
		for _, h := range descHandOff {
			counter(h.desc, h.get(st))
		}
		gauge(descReplicas, int64(st.Replicas))
		refundsOn := int64(0)
		if st.AllowRefunds {
			refundsOn = 1
		}
		gauge(descRefundsOn, refundsOn)
		for name, p := range st.LeasePools {
			counter(descPoolSlice, p.SliceHits, name)
			counter(descPoolUsed, p.UsedHits, name)
			counter(descPoolFree, p.FreeHits, name)
		}
		v := srv.view.Load()
		gauge(descMembers, int64(len(v.members)))
		gauge(descRingEpoch, int64(v.epoch))
	}
	if store != nil {
		st := store.Stats()
		gauge(descKeys, int64(st.Keys))
		counter(descSwept, st.Swept)
		counter(descEvictedLive, st.EvictedLive)
		counter(descKeysRefused, st.Refused)
	}
	if src != nil {
		st := src.Stats()
		counter(descReloads, st.Reloads-st.Failures, "ok")
		counter(descReloads, st.Failures, "refused")
		gauge(descLimits, int64(st.Limits))
	}
	if rlsSvc != nil {
		st := rlsSvc.Stats()
		counter(descRLS, st.Requests-st.OverLimit, "ok")
		counter(descRLS, st.OverLimit, "over_limit")
		counter(descRLSPartial, st.PartialCharges)
		counter(descRLSShadow, st.ShadowOK)
		if st.ConfigLoads+st.ConfigLoadErrors > 0 {
			counter(descRLSLoads, st.ConfigLoads, "ok")
			counter(descRLSLoads, st.ConfigLoadErrors, "refused")
		}
		gauge(descRLSDomains, int64(st.Domains))
		gauge(descRLSRules, int64(st.Rules))
		counter(descRLSRefunds, st.RefundsGiven, "given_back")
		counter(descRLSRefunds, st.RefundsEmpty, "nothing")
		counter(descRLSRefunds, st.RefundsFailed, "failed")
		counter(descRLSRefunds, st.RefundsOff, "off")
		for _, r := range rlsSvc.RuleStats() {
			counter(descRLSRuleTotal, r.TotalHits, r.Domain, r.Rule)
			counter(descRLSRuleOver, r.OverLimit, r.Domain, r.Rule)
			counter(descRLSRuleNear, r.NearLimit, r.Domain, r.Rule)
			counter(descRLSRuleWithin, r.WithinLimit, r.Domain, r.Rule)
			counter(descRLSRuleShadow, r.ShadowMode, r.Domain, r.Rule)
		}
	}
}

func sumErrors(ps map[string]PeerStats) int64 {
	var n int64
	for _, p := range ps {
		n += p.Errors
	}
	return n
}
