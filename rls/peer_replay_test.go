package rls_test

// The tests of this file replay envoyproxy/ratelimit's own test cases and
// integration scripts (the peer, at the commit named in
// testdata/envoyproxy-ratelimit/ORIGIN.md) on its unchanged rule files,
// each on 1 node and on 3 nodes called round-robin (peer_cluster_test.go),
// with a manual clock. Each case names the peer's test or script it comes
// from. Where sluice answers otherwise on purpose, the case asserts
// sluice's answer and says why.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rls"
)

// replayDir holds the peer's files, each at its path in the peer's
// repository.
const replayDir = "testdata/envoyproxy-ratelimit"

// replayPath returns where the peer's file rel (its path in
// envoyproxy/ratelimit) is.
func replayPath(rel string) string { return filepath.Join(replayDir, filepath.FromSlash(rel)) }

func replayRead(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(replayPath(rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// replayParse loads the peer's rule files rels, in order, each named by
// its path in the peer's repository.
func replayParse(t *testing.T, opts rls.LoadOptions, rels ...string) (*rls.Config, error) {
	t.Helper()
	var files []rls.File
	for _, rel := range rels {
		files = append(files, rls.File{Name: rel, Data: replayRead(t, rel)})
	}
	return opts.Parse(files...)
}

func replayConfig(t *testing.T, rels ...string) *rls.Config {
	t.Helper()
	cfg, err := replayParse(t, rls.LoadOptions{}, rels...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The peer's rule files the cases use.
const (
	replayExample   = "examples/ratelimit/config/example.yaml"
	replayExamples  = "examples/ratelimit/config"
	replayBasic     = "test/config/basic_config.yaml"
	replayMetadata  = "test/config/metadata.yaml"
	replayShadow    = "test/config/shadowmode_config.yaml"
	replayMerge1    = "test/config/merge_domain_key1.yaml"
	replayMerge2    = "test/config/merge_domain_key2.yaml"
	replayIntConfig = "test/integration/runtime/current/ratelimit/config"
	replayIntReload = "test/integration/runtime/current/ratelimit/reload.yaml"
)

func replayDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	out := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// replayReq is the peer's common.NewRateLimitRequest: a request of domain
// with hits_addend hits (0: unset, one hit).
func replayReq(domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}
}

const (
	replayOK     = rlsv3.RateLimitResponse_OK
	replayOver   = rlsv3.RateLimitResponse_OVER_LIMIT
	replaySecond = rlsv3.RateLimitResponse_RateLimit_SECOND
	replayMinute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	replayHour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	replayDay    = rlsv3.RateLimitResponse_RateLimit_DAY
)

// replayReset is the peer's utils.CalculateReset: unit - now % unit,
// in whole seconds.
func replayReset(now time.Time, unit rlsv3.RateLimitResponse_RateLimit_Unit) *durationpb.Duration {
	sec := map[rlsv3.RateLimitResponse_RateLimit_Unit]int64{replaySecond: 1, replayMinute: 60, replayHour: 3600, replayDay: 86400}[unit]
	return &durationpb.Duration{Seconds: sec - now.Unix()%sec}
}

// replayStatus is a limited descriptor's status as the peer's
// newDescriptorStatus (test/integration/integration_test.go) builds it,
// with the peer's duration_until_reset at now.
func replayStatus(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32, now time.Time) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining: remaining, DurationUntilReset: replayReset(now, unit)}
}

// replayNone is the status of a descriptor no rule matches.
func replayNone() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: replayOK}
}

// replayResp is a response of overall code and statuses.
func replayResp(code rlsv3.RateLimitResponse_Code, sts ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: sts}
}

// replayExpect fails when got is not want (the peer's
// common.AssertProtoEqual).
func replayExpect(t *testing.T, what string, got, want proto.Message) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Errorf("%s:\n got  %s\n want %s", what, prototext.Format(got), prototext.Format(want))
	}
}

// replayCodes returns the statuses' codes, O for OK and X for OVER_LIMIT.
func replayCodes(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	for _, st := range resp.GetStatuses() {
		b.WriteString(map[rlsv3.RateLimitResponse_Code]string{replayOK: "O", replayOver: "X"}[st.GetCode()])
	}
	return b.String()
}

// replayJSON is a Struct written as JSON, as the peer's
// TestRatelimitToMetadata (src/service/ratelimit_test.go) writes its
// expectations.
func replayJSON(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// replaySend sends the same request n times and returns the overall
// codes, O for OK and X for OVER_LIMIT.
func replaySend(t *testing.T, r *replayRig, n int, req *rlsv3.RateLimitRequest) string {
	t.Helper()
	var b strings.Builder
	for range n {
		b.WriteString(map[rlsv3.RateLimitResponse_Code]string{replayOK: "O", replayOver: "X"}[r.call(t, req).GetOverallCode()])
	}
	return b.String()
}

// The copied files are the peer's, unchanged: each file's SHA-256 is the
// one ORIGIN.md lists (taken from the peer's repository), and every file
// of the directory is listed.
func TestPeerFilesUnchanged(t *testing.T) {
	origin, err := os.ReadFile(filepath.Join(replayDir, "ORIGIN.md"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^([0-9a-f]{64})  (\S+)$`)
	listed := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(origin))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			listed[m[2]] = m[1]
		}
	}
	if len(listed) < 17 || listed["LICENSE"] == "" {
		t.Fatalf("ORIGIN.md lists %d files (want the 17 copied, LICENSE among them)", len(listed))
	}
	if !strings.Contains(string(origin), "https://github.com/envoyproxy/ratelimit") ||
		!strings.Contains(string(origin), "f2fb15770f7fd1c88ca6c3a1b58ee513917ace96") {
		t.Error("ORIGIN.md does not name the repository and commit")
	}
	for rel, want := range listed {
		sum := sha256.Sum256(replayRead(t, rel))
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: SHA-256 %s, ORIGIN.md lists %s: the peer's files are copied unchanged", rel, got, want)
		}
	}
	err = filepath.WalkDir(replayDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(replayDir, path)
		if rel = filepath.ToSlash(rel); rel != "ORIGIN.md" && listed[rel] == "" {
			t.Errorf("%s is not listed in ORIGIN.md", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if lic := string(replayRead(t, "LICENSE")); !strings.Contains(lic, "Apache License") || !strings.Contains(lic, "Version 2.0") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
}

// The peer's example rule directory, examples/ratelimit/config (what its
// docker-compose examples and integration-test/scripts run on), loads
// unchanged: every rule as the peer's config Dump writes it (its
// rateLimitDescriptor.dump in src/config/config_impl.go), quota_mode and
// metadata included.
func TestPeerExampleConfigLoads(t *testing.T) {
	cfg, err := rls.Load(replayPath(replayExamples))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Domains(); !slices.Equal(got, []string{"mongo_cps", "rl"}) {
		t.Errorf("domains %v", got)
	}
	// The peer's Dump of the directory, line by line; sluice's Dump writes
	// the same line, then its additions (name, unlimited, file and line).
	peerDump := []string{
		"mongo_cps.database_users: unit=SECOND requests_per_unit=500, shadow_mode: false, quota_mode: false",
		"mongo_cps.database_default: unit=SECOND requests_per_unit=500, shadow_mode: false, quota_mode: false",
		"rl.category_account: unit=MINUTE requests_per_unit=4, shadow_mode: false, quota_mode: false",
		"rl.source_cluster_proxy.destination_cluster_bkthomps: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
		"rl.source_cluster_proxy.destination_cluster_mock: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false",
		"rl.source_cluster_proxy.destination_cluster_override: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
		"rl.source_cluster_proxy.destination_cluster_fake: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
		"rl.foo: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
		"rl.foo.bar: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
		"rl.foo.bar_bkthomps: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false",
		"rl.foo.bar_banned: unit=MINUTE requests_per_unit=0, shadow_mode: false, quota_mode: false",
		"rl.foo.baz: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false",
		"rl.foo.baz_not-so-shady: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
		"rl.foo.baz_shady: unit=MINUTE requests_per_unit=3, shadow_mode: true, quota_mode: false",
		"rl.foo.bay: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
		"rl.unspec: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false",
		"rl.qux: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
		"rl.service_service_1: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: true",
		"rl.service_service_2: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: true",
	}
	dump := strings.Split(strings.TrimSuffix(cfg.Dump(), "\n"), "\n")
	if len(dump) != len(peerDump) {
		t.Errorf("%d rules dumped, the peer dumps %d:\n%s", len(dump), len(peerDump), cfg.Dump())
	}
	for _, want := range peerDump {
		if !slices.ContainsFunc(dump, func(l string) bool {
			return strings.HasPrefix(l, want+" @ ") || strings.HasPrefix(l, want+", ")
		}) {
			t.Errorf("no dump line %q", want)
		}
	}
	// quota_mode and metadata, as the peer's multiservice-tokenquota.sh
	// relies on them.
	for _, c := range []struct {
		value string
		limit uint32
	}{{"service_1", 1}, {"service_2", 2}} {
		m, found := cfg.Match("rl", []rls.Entry{{Key: "service", Value: c.value}})
		if !found || !m.Rule.QuotaMode || m.Rule.RequestsPerUnit != c.limit || m.Rule.FullKey != "rl.service_"+c.value {
			t.Fatalf("service %s: %+v %v", c.value, m.Rule, found)
		}
		want := replayJSON(t, `{"service_with_quota": {"name": "`+c.value+`"}}`)
		replayExpect(t, "metadata of service "+c.value, m.Rule.Metadata, want)
	}
	if m, _ := cfg.Match("rl", []rls.Entry{{Key: "unspec", Value: "x"}}); m.Rule == nil || !m.Rule.DetailedMetric {
		t.Errorf("rl.unspec: detailed_metric not kept: %+v", m.Rule)
	}
}

// The peer's config tests (test/config/config_test.go) on its rule files:
// which rule each descriptor gets, its limit, shadow_mode and metadata,
// and the stats key (sluice's RuleStat.Rule, the rule's full key).
func TestPeerConfigMatches(t *testing.T) {
	type want struct {
		entries  []string // key, value, ...
		rpu      uint32   // 0: no rule
		unit     rlsv3.RateLimitResponse_RateLimit_Unit
		fullKey  string
		shadow   bool
		metadata string // JSON; empty: none
	}
	cases := map[string][]want{
		// TestBasicConfig.
		replayBasic: {
			{entries: nil},
			{entries: []string{"key1", "something"}},
			{entries: []string{"key1", "value1"}},
			{entries: []string{"key2", "value2", "subkey", "subvalue"}},
			{entries: []string{"key5", "value5", "subkey5", "subvalue"}},
			{entries: []string{"key1", "value1", "subkey1", "something"}, rpu: 5, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1"},
			{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rpu: 10, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1_subvalue1"},
			{entries: []string{"key2", "something"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.key2"},
			{entries: []string{"key2", "value2"}, rpu: 30, unit: replayMinute, fullKey: "test-domain.key2_value2"},
			{entries: []string{"key2", "value3"}},
			{entries: []string{"key3", "foo"}, rpu: 1, unit: replayHour, fullKey: "test-domain.key3"},
			{entries: []string{"key4", "foo"}, rpu: 1, unit: replayDay, fullKey: "test-domain.key4"},
			// detailed_metric: the peer's stats key names the value
			// ("test-domain.key7_unspecified_value"); sluice keeps one
			// series per rule, never one per value (a value is a
			// client's, and series per value grow without bound).
			{entries: []string{"key7", "unspecified_value"}, rpu: 70, unit: replayMinute, fullKey: "test-domain.key7"},
			{entries: []string{"key7", "another_value"}, rpu: 70, unit: replayMinute, fullKey: "test-domain.key7"},
		},
		// TestShadowModeConfig.
		replayShadow: {
			{entries: []string{"key1", "value1", "subkey1", "something"}, rpu: 5, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1"},
			{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rpu: 10, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1_subvalue1", shadow: true},
			{entries: []string{"key2", "something"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.key2", shadow: true},
			{entries: []string{"key2", "value2"}, rpu: 30, unit: replayMinute, fullKey: "test-domain.key2_value2"},
		},
		// TestWildcardConfig: a wildcard's stats key is its pattern.
		"test/config/wildcard.yaml": {
			{entries: []string{"noVal", "foo1"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.noVal"},
			{entries: []string{"wild", "foo1"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.wild_foo*"},
			{entries: []string{"wild", "foo2"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.wild_foo*"},
			{entries: []string{"nestedWild", "val1", "wild", "goo2"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.nestedWild_val1.wild_goo*"},
			{entries: []string{"wild", "bar"}},
			{entries: []string{"noWild", "foo1"}},
			{entries: []string{"midWild", "barab"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.midWild_bar*b"},
			{entries: []string{"midWild", "bar123b"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.midWild_bar*b"},
			{entries: []string{"midWild", "barb"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.midWild_bar*b"},
			{entries: []string{"midWild", "bara"}},
			{entries: []string{"midWild", "xbarb"}},
			{entries: []string{"multiWild", "foo123bar456baz"}, rpu: 10, unit: replayMinute, fullKey: "test-domain.multiWild_foo*bar*baz"},
			{entries: []string{"multiWild", "foobarbaz"}, rpu: 10, unit: replayMinute, fullKey: "test-domain.multiWild_foo*bar*baz"},
			{entries: []string{"multiWild", "foo123baz"}},
			{entries: []string{"multiWild", "bar456baz"}},
		},
		// TestMetadata.
		replayMetadata: {
			{entries: nil},
			{entries: []string{"key1", "value1", "subkey1", "something"}, rpu: 5, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1", metadata: `{"name": "service_1"}`},
			{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rpu: 10, unit: replaySecond, fullKey: "test-domain.key1_value1.subkey1_subvalue1"},
			{entries: []string{"key2", "something"}, rpu: 20, unit: replayMinute, fullKey: "test-domain.key2", metadata: `{"service_with_quota": {"name": "service_2"}}`},
		},
	}
	for file, ws := range cases {
		cfg := replayConfig(t, file)
		for _, w := range ws {
			var es []rls.Entry
			for i := 0; i+1 < len(w.entries); i += 2 {
				es = append(es, rls.Entry{Key: w.entries[i], Value: w.entries[i+1]})
			}
			m, found := cfg.Match("test-domain", es)
			if w.rpu == 0 {
				if found {
					t.Errorf("%s %v: rule %s, the peer's GetLimit gives none", file, w.entries, m.Rule.FullKey)
				}
				continue
			}
			if !found {
				t.Errorf("%s %v: no rule, want %s", file, w.entries, w.fullKey)
				continue
			}
			r := m.Rule
			if r.RequestsPerUnit != w.rpu || r.Unit != w.unit || r.FullKey != w.fullKey || r.ShadowMode != w.shadow {
				t.Errorf("%s %v: %d/%s %s shadow %v, want %d/%s %s shadow %v", file, w.entries,
					r.RequestsPerUnit, r.Unit, r.FullKey, r.ShadowMode, w.rpu, w.unit, w.fullKey, w.shadow)
			}
			switch {
			case w.metadata == "" && r.Metadata != nil:
				t.Errorf("%s %v: metadata %v, want none", file, w.entries, r.Metadata)
			case w.metadata != "":
				replayExpect(t, fmt.Sprintf("%s %v: metadata", file, w.entries), r.Metadata, replayJSON(t, w.metadata))
			}
		}
		if _, found := cfg.Match("foo_domain", nil); found {
			t.Errorf("%s: an unknown domain matched", file)
		}
	}
	// TestBasicConfig: key4's rule keeps its name.
	if m, _ := replayConfig(t, replayBasic).Match("test-domain", []rls.Entry{{Key: "key4", Value: "foo"}}); m.Rule == nil || m.Rule.Name != "key4_rate_limit" {
		t.Errorf("key4: %+v", m.Rule)
	}
}

// replayEnvoy is the Envoy of the peer's integration scripts: its
// examples/envoy/proxy.yaml, read from the copied file, turned into the
// requests Envoy's rate limit filter sends (envoyproxy/envoy,
// source/extensions/filters/http/ratelimit/ratelimit.cc): a route's
// rate_limits (those of its typed_per_filter_config first, else its own)
// each give one descriptor, in order; those with apply_on_stream_done
// go in a second request when the stream ends (Filter::onDestroy: after
// any request whose headers the filter saw, refused or not), the others
// in the request before routing. A rate limit's hits_addend is its
// descriptor's; the request's own is unset.
type replayEnvoy struct {
	domain  string                 // the filter's domain
	node    string                 // --service-cluster (the source_cluster action)
	routes  map[string]replayRoute // by the route's match prefix
	subsets map[string]string      // multiservice: an endpoint's envoy.lb service -> its locality name
}

// replayRoute is one route of proxy.yaml.
type replayRoute struct {
	cluster string
	limits  []replayLimit
}

// replayLimit is one rate_limits entry.
type replayLimit struct {
	actions      []map[string]any
	hits         *uint64
	onStreamDone bool
}

// replayYAML walks a decoded YAML document: strings index mappings, ints
// sequences; nil when absent.
func replayYAML(v any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[p]
		case int:
			l, _ := v.([]any)
			if p >= len(l) {
				return nil
			}
			v = l[p]
		}
	}
	return v
}

func replayString(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// replayProxy reads the peer's examples/envoy/proxy.yaml.
func replayProxy(t *testing.T) *replayEnvoy {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(replayRead(t, "examples/envoy/proxy.yaml"), &doc); err != nil {
		t.Fatal(err)
	}
	hcm := replayYAML(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	// --service-cluster proxy: integration-test/docker-compose-integration-test.yml.
	e := &replayEnvoy{domain: replayString(replayYAML(hcm, "http_filters", 0, "typed_config", "domain")), node: "proxy",
		routes: map[string]replayRoute{}, subsets: map[string]string{}}
	if e.domain != "rl" || replayString(replayYAML(hcm, "http_filters", 0, "name")) != "envoy.filters.http.ratelimit" {
		t.Fatalf("proxy.yaml: the first filter is not the rate limit filter of domain rl (%q)", e.domain)
	}
	routes, _ := replayYAML(hcm, "route_config", "virtual_hosts", 0, "routes").([]any)
	for _, rt := range routes {
		limits := replayYAML(rt, "typed_per_filter_config", "envoy.filters.http.ratelimit", "rate_limits")
		if limits == nil {
			limits = replayYAML(rt, "route", "rate_limits")
		}
		route := replayRoute{cluster: replayString(replayYAML(rt, "route", "cluster"))}
		ls, _ := limits.([]any)
		for _, l := range ls {
			var rl replayLimit
			acts, _ := replayYAML(l, "actions").([]any)
			for _, a := range acts {
				rl.actions = append(rl.actions, a.(map[string]any))
			}
			if n := replayYAML(l, "hits_addend", "number"); n != nil {
				v, err := strconv.ParseUint(replayString(n), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				rl.hits = &v
			}
			rl.onStreamDone = replayString(replayYAML(l, "apply_on_stream_done")) == "true"
			route.limits = append(route.limits, rl)
		}
		e.routes[replayString(replayYAML(rt, "match", "prefix"))] = route
	}
	clusters, _ := replayYAML(doc, "static_resources", "clusters").([]any)
	for _, c := range clusters {
		if replayString(replayYAML(c, "name")) != "multiservice" {
			continue
		}
		eps, _ := replayYAML(c, "load_assignment", "endpoints").([]any)
		for _, ep := range eps {
			locality := replayString(replayYAML(ep, "metadata", "filter_metadata", "envoy.cluster.locality", "name"))
			lbs, _ := replayYAML(ep, "lb_endpoints").([]any)
			for _, lb := range lbs {
				e.subsets[replayString(replayYAML(lb, "metadata", "filter_metadata", "envoy.lb", "service"))] = locality
			}
		}
	}
	return e
}

// request returns the request Envoy sends for a request to the route of
// prefix with headers: before routing (onStreamDone false) or when the
// stream ends, served by the upstream of locality (the metadata action's
// CLUSTER_LOCALITY_ENTRY; "" when none served it). nil when no rate limit
// gives a descriptor (Envoy then calls nobody).
func (e *replayEnvoy) request(t *testing.T, prefix string, onStreamDone bool, headers map[string]string, locality string) *rlsv3.RateLimitRequest {
	t.Helper()
	route, found := e.routes[prefix]
	if !found {
		t.Fatalf("proxy.yaml has no route %s", prefix)
	}
	req := &rlsv3.RateLimitRequest{Domain: e.domain}
limits:
	for _, l := range route.limits {
		if l.onStreamDone != onStreamDone {
			continue
		}
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range l.actions {
			var key, value string
			switch {
			case a["generic_key"] != nil:
				key = cmp.Or(replayString(replayYAML(a, "generic_key", "descriptor_key")), "generic_key")
				value = replayString(replayYAML(a, "generic_key", "descriptor_value"))
			case a["request_headers"] != nil:
				// An absent header drops the whole descriptor
				// (skip_if_absent is false in proxy.yaml).
				v, ok := headers[replayString(replayYAML(a, "request_headers", "header_name"))]
				if !ok {
					continue limits
				}
				key, value = replayString(replayYAML(a, "request_headers", "descriptor_key")), v
			case a["source_cluster"] != nil:
				key, value = "source_cluster", e.node
			case a["destination_cluster"] != nil:
				key, value = "destination_cluster", route.cluster
			case a["metadata"] != nil:
				if src := replayString(replayYAML(a, "metadata", "source")); src != "CLUSTER_LOCALITY_ENTRY" {
					t.Fatalf("metadata action of source %s", src)
				}
				if locality == "" {
					continue limits // no upstream, no value: no descriptor
				}
				key, value = replayString(replayYAML(a, "metadata", "descriptor_key")), locality
			default:
				t.Fatalf("route %s: an action this replay does not know: %v", prefix, a)
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
		}
		if l.hits != nil {
			d.HitsAddend = wrapperspb.UInt64(*l.hits)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if len(req.Descriptors) == 0 {
		return nil
	}
	return req
}

// curl is one curl of a script through the peer's Envoy: the
// request before routing and, when admitted, the upstream it goes to
// (for /multiservice-tokenquota: the subset the metadata names, as the
// header mutation, header_to_metadata and lb_subset_config of proxy.yaml
// pick it), then the request on stream done. It returns whether the
// request was admitted, the locality that served it ("" when refused)
// and the answer before routing.
func (e *replayEnvoy) curl(t *testing.T, r *replayRig, prefix string, headers map[string]string) (bool, string, *rlsv3.RateLimitResponse) {
	t.Helper()
	var resp *rlsv3.RateLimitResponse
	admitted := true
	if req := e.request(t, prefix, false, headers, ""); req != nil {
		resp = r.call(t, req)
		admitted = resp.GetOverallCode() == replayOK
	}
	served := ""
	if admitted && e.routes[prefix].cluster == "multiservice" {
		name := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
		if served = e.subsets[name]; served == "" {
			t.Fatalf("%s admitted with no service named in its metadata: %v", prefix, resp.GetDynamicMetadata())
		}
	}
	if req := e.request(t, prefix, true, headers, served); req != nil {
		r.call(t, req) // Envoy ignores the answer on stream done
	}
	return admitted, served, resp
}

// replayExampleRig starts a cluster of n nodes serving the peer's example
// rule directory with opts, dynamic metadata on as the peer's
// integration-test/docker-compose-integration-test.yml has it
// (RESPONSE_DYNAMIC_METADATA=true).
func replayExampleRig(opts rls.Options) func(t *testing.T, n int) *replayRig {
	return func(t *testing.T, n int) *replayRig {
		cfg, err := rls.Load(replayPath(replayExamples))
		if err != nil {
			t.Fatal(err)
		}
		opts.DynamicMetadata = true
		return startPeerCluster(t, n, peerClusterConfig{Options: opts, Config: cfg})
	}
}

// The translation of proxy.yaml's routes, as the scripts' comments
// describe the requests (e.g. token-quota.sh: "(service: service_2)
// descriptor with 0 addend on request path and ... with addend 1 on
// response path").
func TestPeerProxyRoutes(t *testing.T) {
	e := replayProxy(t)
	show := func(req *rlsv3.RateLimitRequest) string {
		if req == nil {
			return "none"
		}
		var ds []string
		for _, d := range req.Descriptors {
			var es []string
			for _, en := range d.Entries {
				es = append(es, en.Key+"="+en.Value)
			}
			h := ""
			if d.HitsAddend != nil {
				h = fmt.Sprintf(" hits %d", d.HitsAddend.GetValue())
			}
			ds = append(ds, "("+strings.Join(es, ",")+h+")")
		}
		return req.Domain + " " + strings.Join(ds, " ")
	}
	for _, c := range []struct {
		prefix       string
		onStreamDone bool
		headers      map[string]string
		locality     string
		want         string
	}{
		{"/quota", false, nil, "", "rl (service=service_1) (service=service_2)"},
		{"/quota", true, nil, "", "none"},
		{"/tokenquota", false, nil, "", "rl (service=service_2 hits 0)"},
		{"/tokenquota", true, nil, "", "rl (service=service_2 hits 1)"},
		{"/multiservice-tokenquota", false, nil, "", "rl (service=service_1 hits 0) (service=service_2 hits 0)"},
		{"/multiservice-tokenquota", true, nil, "service_2", "rl (service=service_2 hits 1)"},
		{"/multiservice-tokenquota", true, nil, "", "none"},
		{"/twoheader", false, map[string]string{"foo": "pelle", "baz": "shady"}, "", "rl (foo=pelle,baz=shady)"},
		{"/fourheader", false, map[string]string{"foo": "a", "bar": "b", "source_cluster": "proxy", "destination_cluster": "mock"}, "",
			"rl (foo=a,bar=b) (source_cluster=proxy,destination_cluster=mock)"},
		{"/test", false, nil, "", "rl (source_cluster=proxy,destination_cluster=mock)"},
	} {
		if got := show(e.request(t, c.prefix, c.onStreamDone, c.headers, c.locality)); got != c.want {
			t.Errorf("%s (stream done %v): %s, want %s", c.prefix, c.onStreamDone, got, c.want)
		}
	}
	if e.subsets["service_1"] != "service_1" || e.subsets["service_2"] != "service_2" {
		t.Errorf("multiservice subsets: %v", e.subsets)
	}
}

// replayCountings are the two ways of counting: sluice's (all or nothing,
// refused hits count nothing, a peek is OK while one more hit would pass;
// the peer's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true comes closest)
// and the peer's default (--rls-increment-when-over-limit: every
// descriptor counted on its own, refused hits included, a peek OK while
// the count is at most the limit).
var replayCountings = []struct {
	name string
	opts rls.Options
	peer bool // the peer's default counting
}{
	{"sluice counting", rls.Options{}, false},
	{"peer counting", rls.Options{IncrementWhenOverLimit: true}, true},
}

// replayAnswer is resp without what the case does not compare (dynamic
// metadata, headers).
func replayAnswer(resp *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{OverallCode: resp.GetOverallCode(), Statuses: resp.GetStatuses()}
}

// The peer's integration scripts (integration-test/scripts/*.sh, run by
// integration-test/run-all.sh against examples/ratelimit/config through
// examples/envoy/proxy.yaml), one curl at a time, each script on a fresh
// cluster (the peer runs them one after the other against one Redis, and
// sleeps a minute where the scripts do; here the clock moves instead).
func TestPeerIntegrationScripts(t *testing.T) {
	e := replayProxy(t)

	// quota.sh: /quota sends (service: service_1) and (service: service_2),
	// both quota_mode, 1 and 2 per minute: quota is debited from every
	// matching bucket, so two requests pass and the third is refused;
	// a minute later the buckets are full again. Both countings agree.
	t.Run("quota.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					now := r.clock.Now()
					want := []*rlsv3.RateLimitResponse{
						replayResp(replayOK, replayStatus(replayOK, 1, replayMinute, 0, now), replayStatus(replayOK, 2, replayMinute, 1, now)),
						replayResp(replayOK, replayStatus(replayOver, 1, replayMinute, 0, now), replayStatus(replayOK, 2, replayMinute, 0, now)),
						replayResp(replayOver, replayStatus(replayOver, 1, replayMinute, 0, now), replayStatus(replayOver, 2, replayMinute, 0, now)),
					}
					for i, w := range want {
						_, _, resp := e.curl(t, r, "/quota", nil)
						replayExpect(t, fmt.Sprintf("request %d", i+1), replayAnswer(resp), w)
					}
					r.clock.Advance(time.Minute) // sleep 60
					if ok, _, resp := e.curl(t, r, "/quota", nil); !ok {
						t.Errorf("a minute later: %v, want the buckets refreshed", resp)
					}
				})
			})
		}
	})

	// token-quota.sh: /tokenquota peeks at (service: service_2), 2 per
	// minute, with hits_addend 0 before routing and debits it with
	// hits_addend 1 on stream done.
	t.Run("token-quota.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					now := r.clock.Now()
					var got []string
					var peeks []*rlsv3.RateLimitResponse
					for range 4 {
						ok, _, resp := e.curl(t, r, "/tokenquota", nil)
						got = append(got, map[bool]string{true: "OK", false: "429"}[ok])
						peeks = append(peeks, replayAnswer(resp))
					}
					var want []string
					var wantPeeks []*rlsv3.RateLimitResponse
					if c.peer {
						// The script: requests 1 to 3 pass, the 4th is
						// refused ("only the 4th request should be
						// rejected"): the 3rd peek finds the count at
						// the limit, 2 <= 2, and passes.
						want = []string{"OK", "OK", "OK", "429"}
						wantPeeks = []*rlsv3.RateLimitResponse{
							replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 2, now)),
							replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 1, now)),
							replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 0, now)),
							replayResp(replayOver, replayStatus(replayOver, 2, replayMinute, 0, now)),
						}
					} else {
						// sluice's counting differs on purpose: a peek
						// is OK only while one more hit would pass, and
						// a request is charged all or nothing, so 2 per
						// minute admits 2: the 3rd peek finds no hit
						// left and the 3rd request is refused (its
						// stream-done debit is refused too and counts
						// nothing). The peer lets one request more than
						// the limit through each minute.
						want = []string{"OK", "OK", "429", "429"}
						wantPeeks = []*rlsv3.RateLimitResponse{
							replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 2, now)),
							replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 1, now)),
							replayResp(replayOver, replayStatus(replayOver, 2, replayMinute, 0, now)),
							replayResp(replayOver, replayStatus(replayOver, 2, replayMinute, 0, now)),
						}
					}
					if !slices.Equal(got, want) {
						t.Errorf("answers %v, want %v", got, want)
					}
					for i := range peeks {
						replayExpect(t, fmt.Sprintf("peek %d", i+1), peeks[i], wantPeeks[i])
					}
					r.clock.Advance(time.Minute) // sleep 60
					if ok, _, resp := e.curl(t, r, "/tokenquota", nil); !ok {
						t.Errorf("a minute later: %v, want the bucket refreshed", resp)
					}
				})
			})
		}
	})

	// multiservice-tokenquota.sh: /multiservice-tokenquota peeks at
	// service_1 (1 per minute) and service_2 (2 per minute); the dynamic
	// metadata names the first service with quota left, Envoy routes to
	// it, and debits the service that served on stream done.
	t.Run("multiservice-tokenquota.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					var got []string
					for i := range 6 {
						ok, served, resp := e.curl(t, r, "/multiservice-tokenquota", nil)
						if !ok {
							served = "429"
						}
						got = append(got, served)
						if i == 0 {
							// The metadata Envoy reads: the request's
							// descriptors and the merged metadata of
							// those that passed, the first value of a
							// key winning (src/service/ratelimit.go,
							// ratelimitToMetadata).
							replayExpect(t, "dynamic metadata", resp.GetDynamicMetadata(), replayJSON(t, `{
								"domain": "rl",
								"descriptors": [
									{"entries": ["service=service_1"], "hitsAddend": 0},
									{"entries": ["service=service_2"], "hitsAddend": 0}
								],
								"metadata": {"service_with_quota": {"name": "service_1"}}
							}`))
						}
					}
					var want []string
					if c.peer {
						// The script: service 1 serves requests 1 and
						// 2, service 2 requests 3 to 5, the 6th is
						// refused ("a total of 2 requests/minute for
						// service_1 and 3 requests/minute for
						// service_2").
						want = []string{"service_1", "service_1", "service_2", "service_2", "service_2", "429"}
					} else {
						// sluice's counting (see token-quota.sh): each
						// service serves as many requests a minute as its
						// limit, 1 and 2, and the 4th is refused.
						want = []string{"service_1", "service_2", "service_2", "429", "429", "429"}
					}
					if !slices.Equal(got, want) {
						t.Errorf("served by %v, want %v", got, want)
					}
					r.clock.Advance(time.Minute) // sleep 60
					if _, served, _ := e.curl(t, r, "/multiservice-tokenquota", nil); served != "service_1" {
						t.Errorf("a minute later: served by %q, want service_1 again", served)
					}
				})
			})
		}
	})

	// trigger-ratelimit.sh: (foo: pelle), (baz: not-so-shady), 3 per
	// minute: three pass, the 4th and 5th get 429.
	t.Run("trigger-ratelimit.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					if got := replayCurls(t, e, r, 5, "/twoheader", map[string]string{"foo": "pelle", "baz": "not-so-shady"}); got != "OOOXX" {
						t.Errorf("answers %s, want OOOXX", got)
					}
				})
			})
		}
	})

	// trigger-shadow-mode-key.sh and simple-get.sh: (foo: pelle), (baz:
	// shady), 3 per minute with shadow_mode: never refused, and the 6th
	// request's descriptor has no hit left. (The script means to check
	// that the 6th request's x-ratelimit-remaining is 0; its test reads
	// the header with its trailing CR, so it compares "0\r" with "0" and
	// its inverted condition never fires.)
	t.Run("trigger-shadow-mode-key.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					h := map[string]string{"foo": "pelle", "baz": "shady"}
					if got := replayCurls(t, e, r, 5, "/twoheader", h); got != "OOOOO" {
						t.Errorf("answers %s, want OOOOO", got)
					}
					_, _, resp := e.curl(t, r, "/twoheader", h)
					replayExpect(t, "6th request", replayAnswer(resp), replayResp(replayOK, replayStatus(replayOK, 3, replayMinute, 0, r.clock.Now())))
					// simple-get.sh, the happy path.
					if got := replayCurls(t, e, r, 1, "/twoheader", map[string]string{"foo": "test", "baz": "shady"}); got != "O" {
						t.Errorf("simple-get.sh: %s", got)
					}
					// The rule's statistics (shadow_mode: hits over the
					// limit let through), as the peer's base limiter
					// counts them: 6 hits, 3 within, the 3rd near the
					// limit (past 80 % of 3), 3 over and let through.
					st := r.ruleStats()["rl.foo.baz_shady"]
					if want := (rls.RuleStat{Domain: "rl", Rule: "rl.foo.baz_shady", TotalHits: 7, WithinLimit: 4, NearLimit: 1, OverLimit: 3, ShadowMode: 3}); st != want {
						t.Errorf("statistics %+v, want %+v", st, want)
					}
				})
			})
		}
	})

	// replaces.sh: replaces raises a limit (banned_limit's 0 replaced by
	// override's 2), leaves the replaced limit as it was, and one rule
	// replaces several.
	t.Run("replaces.sh", func(t *testing.T) {
		for _, c := range replayCountings {
			t.Run(c.name, func(t *testing.T) {
				replayNodes(t, replayExampleRig(c.opts), func(t *testing.T, r *replayRig) {
					h := func(kv ...string) map[string]string {
						m := map[string]string{}
						for i := 0; i+1 < len(kv); i += 2 {
							m[kv[i]] = kv[i+1]
						}
						return m
					}
					steps := []struct {
						prefix  string
						headers map[string]string
						n       int
						want    string
					}{
						{"/twoheader", h("foo", "bkthomps", "bar", "banned"), 1, "X"},
						{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "mock"), 1, "X"},
						{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "override"), 3, "OOX"},
						{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), 3, "OOX"},
						{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "not_bkthomps"), 2, "OX"},
						{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), 1, "X"},
						{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), 5, "OOOOX"},
						{"/twoheader", h("foo", "foo_2", "bar", "bkthomps"), 2, "OX"},
						{"/fourheader", h("foo", "foo_3", "bar", "bar_3", "source_cluster", "proxy", "destination_cluster", "fake"), 3, "OOX"},
						{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), 1, "X"},
					}
					for i, s := range steps {
						if got := replayCurls(t, e, r, s.n, s.prefix, s.headers); got != s.want {
							t.Errorf("step %d (%s %v): %s, want %s", i+1, s.prefix, s.headers, got, s.want)
						}
						if i == 1 {
							// The request refused by banned_limit (0 per
							// minute) asked a hit of the mock rule too:
							// the peer's statistics count it
							// (GenerateCacheKeys adds total_hits for every
							// descriptor with a limit, in both its
							// countings), within the limit.
							mock := "rl.source_cluster_proxy.destination_cluster_mock"
							if got, want := r.ruleStats()[mock], (rls.RuleStat{Domain: "rl", Rule: mock, TotalHits: 1, WithinLimit: 1, NearLimit: 1}); got != want {
								t.Errorf("after step 2, %s: %+v, want %+v", mock, got, want)
							}
						}
					}
				})
			})
		}
	})

	// value-included-in-stats-key-when-unspecified.sh: (unspec:
	// unspecified_value), 2 per minute with detailed_metric: two pass, the
	// third is refused, and the peer's over_limit stat of the key naming
	// the value (rl.unspec_unspecified_value) reads 1. sluice differs on
	// purpose: detailed_metric makes no series per value (values are the
	// clients', their series would grow without bound); the rule's own
	// statistics count the hit.
	t.Run("value-included-in-stats-key-when-unspecified.sh", func(t *testing.T) {
		replayNodes(t, replayExampleRig(rls.Options{}), func(t *testing.T, r *replayRig) {
			if got := replayCurls(t, e, r, 3, "/unspec", map[string]string{"unspec": "unspecified_value"}); got != "OOX" {
				t.Errorf("answers %s, want OOX", got)
			}
			stats := r.ruleStats()
			if want := (rls.RuleStat{Domain: "rl", Rule: "rl.unspec", TotalHits: 3, WithinLimit: 2, NearLimit: 1, OverLimit: 1}); stats["rl.unspec"] != want {
				t.Errorf("rl.unspec: %+v, want %+v", stats["rl.unspec"], want)
			}
			for rule := range stats {
				if strings.Contains(rule, "unspecified_value") {
					t.Errorf("a series per value: %s", rule)
				}
			}
		})
	})
}

// replayCurls sends n curls to the route of prefix with headers and
// returns the answers, O for passed and X for 429.
func replayCurls(t *testing.T, e *replayEnvoy, r *replayRig, n int, prefix string, headers map[string]string) string {
	t.Helper()
	var b strings.Builder
	for range n {
		ok, _, _ := e.curl(t, r, prefix, headers)
		b.WriteString(map[bool]string{true: "O", false: "X"}[ok])
	}
	return b.String()
}

// replayExhaust sends n requests of d alone to domain, each expected OK.
func replayExhaust(t *testing.T, r *replayRig, domain string, n int, d *ratelimitv3.RateLimitDescriptor) {
	t.Helper()
	if got := replaySend(t, r, n, replayReq(domain, 0, d)); got != strings.Repeat("O", n) {
		t.Fatalf("filling %v: %s", d, got)
	}
}

// The peer's service tests of quota mode and unlimited rules
// (test/service/ratelimit_test.go), which set the limiter's statuses with
// a mock: here on the peer's example rules, the statuses made by real
// traffic. rl's regular rule is (unspec), 2 per minute; its quota_mode
// rules are (service: service_1), 1 per minute, and (service: service_2),
// 2 per minute. A descriptor "over" is one whose limit earlier requests
// used up.
func TestPeerServiceQuotaMode(t *testing.T) {
	regular := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("unspec", "regular") }
	s1 := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("service", "service_1") }
	s2 := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("service", "service_2") }
	for _, c := range replayCountings {
		t.Run(c.name, func(t *testing.T) {
			// The statuses of the descriptors that were not over: a
			// request refused by another descriptor charged them with
			// the peer's counting, and left them as they were with
			// sluice's (all or nothing).
			spent := func(limit, before uint32) uint32 {
				if c.peer {
					return limit - before - 1
				}
				return limit - before
			}
			cases := []struct {
				name  string // the peer's test
				opts  rls.Options
				fill  func(t *testing.T, r *replayRig)
				req   []*ratelimitv3.RateLimitDescriptor
				want  func(now time.Time) *rlsv3.RateLimitResponse
				check func(t *testing.T, r *replayRig)
			}{
				{
					// A regular descriptor over its limit refuses the
					// request, whatever its quota descriptors say.
					name: "TestServicePerDescriptorQuotaMode",
					fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 2, regular()) },
					req:  []*ratelimitv3.RateLimitDescriptor{regular(), s2()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOver, replayStatus(replayOver, 2, replayMinute, 0, now), replayStatus(replayOK, 2, replayMinute, spent(2, 0), now))
					},
				},
				{
					// All its quota descriptors over refuse the request.
					name: "TestServiceMixedPerDescriptorModes",
					fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 1, s1()) },
					req:  []*ratelimitv3.RateLimitDescriptor{regular(), s1()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOver, replayStatus(replayOK, 2, replayMinute, spent(2, 0), now), replayStatus(replayOver, 1, replayMinute, 0, now))
					},
				},
				{
					name: "TestServiceMixedPerDescriptorModesUnderLimit",
					req:  []*ratelimitv3.RateLimitDescriptor{regular(), s2()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 1, now), replayStatus(replayOK, 2, replayMinute, 1, now))
					},
				},
				{
					name: "TestServiceQuotaModeOnlyAllOverTheLimit",
					fill: func(t *testing.T, r *replayRig) {
						replayExhaust(t, r, "rl", 1, s1())
						replayExhaust(t, r, "rl", 2, s2())
					},
					req: []*ratelimitv3.RateLimitDescriptor{s1(), s2()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOver, replayStatus(replayOver, 1, replayMinute, 0, now), replayStatus(replayOver, 2, replayMinute, 0, now))
					},
				},
				{
					// Some quota descriptors over, not all: OK.
					name: "TestServiceQuotaModeOnlySomeOverTheLimit",
					fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 1, s1()) },
					req:  []*ratelimitv3.RateLimitDescriptor{s1(), s2()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOver, 1, replayMinute, 0, now), replayStatus(replayOK, 2, replayMinute, 1, now))
					},
				},
				{
					// SHADOW_MODE (--rls-shadow-mode) answers OK
					// anyway, the statuses still OVER_LIMIT, counted in
					// global_shadow_mode (Stats.ShadowOK).
					name: "TestServiceQuotaModeWithShadowMode",
					opts: rls.Options{ShadowMode: true},
					fill: func(t *testing.T, r *replayRig) {
						replayExhaust(t, r, "rl", 1, s1())
						replayExhaust(t, r, "rl", 2, s2())
					},
					req: []*ratelimitv3.RateLimitDescriptor{s1(), s2()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOver, 1, replayMinute, 0, now), replayStatus(replayOver, 2, replayMinute, 0, now))
					},
					check: func(t *testing.T, r *replayRig) {
						if st := r.stats(); st.ShadowOK != 1 || st.OverLimit != 0 {
							t.Errorf("global_shadow_mode %d, over limit %d; want 1 and 0", st.ShadowOK, st.OverLimit)
						}
					},
				},
				{
					name: "TestServiceMixedModeWithShadowMode",
					opts: rls.Options{ShadowMode: true},
					fill: func(t *testing.T, r *replayRig) {
						replayExhaust(t, r, "rl", 2, regular())
						replayExhaust(t, r, "rl", 1, s1())
					},
					req: []*ratelimitv3.RateLimitDescriptor{regular(), s1()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOver, 2, replayMinute, 0, now), replayStatus(replayOver, 1, replayMinute, 0, now))
					},
					check: func(t *testing.T, r *replayRig) {
						if st := r.stats(); st.ShadowOK != 1 {
							t.Errorf("global_shadow_mode %d, want 1", st.ShadowOK)
						}
					},
				},
				{
					// QUOTA_MODE (--rls-quota-mode): every descriptor a
					// quota descriptor; all over refuses.
					name: "TestServiceGlobalQuotaMode",
					opts: rls.Options{QuotaMode: true},
					fill: func(t *testing.T, r *replayRig) {
						replayExhaust(t, r, "rl", 2, replayDesc("foo", "x"))
						replayExhaust(t, r, "rl", 2, regular())
					},
					req: []*ratelimitv3.RateLimitDescriptor{replayDesc("foo", "x"), regular()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOver, replayStatus(replayOver, 2, replayMinute, 0, now), replayStatus(replayOver, 2, replayMinute, 0, now))
					},
				},
				{
					// The same with one of them under its limit: OK
					// (service/ratelimit.go's finalCode: OVER_LIMIT
					// only when all quota descriptors are over).
					name: "TestServiceGlobalQuotaMode, one under its limit",
					opts: rls.Options{QuotaMode: true},
					fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 2, replayDesc("foo", "x")) },
					req:  []*ratelimitv3.RateLimitDescriptor{replayDesc("foo", "x"), regular()},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOver, 2, replayMinute, 0, now), replayStatus(replayOK, 2, replayMinute, 1, now))
					},
				},
				{
					// With QUOTA_MODE a descriptor of no rule is a quota
					// descriptor too, one that passes
					// (service/ratelimit.go: isQuotaMode is
					// globalQuotaMode for a nil limit): OK.
					name: "TestServiceGlobalQuotaMode, a descriptor of no rule",
					opts: rls.Options{QuotaMode: true},
					fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 2, replayDesc("foo", "x")) },
					req:  []*ratelimitv3.RateLimitDescriptor{replayDesc("foo", "x"), replayDesc("hello", "world")},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOver, 2, replayMinute, 0, now), replayNone())
					},
				},
				{
					// An unlimited rule is OK with MaxUint32 remaining,
					// never counted; a descriptor of no rule is OK.
					name: "TestUnlimited",
					req:  []*ratelimitv3.RateLimitDescriptor{replayDesc("foo", "bar"), replayDesc("hello", "world"), replayDesc("qux", "baz")},
					want: func(now time.Time) *rlsv3.RateLimitResponse {
						return replayResp(replayOK, replayStatus(replayOK, 2, replayMinute, 1, now), replayNone(),
							&rlsv3.RateLimitResponse_DescriptorStatus{Code: replayOK, LimitRemaining: math.MaxUint32})
					},
				},
			}
			for _, k := range cases {
				t.Run(k.name, func(t *testing.T) {
					opts := k.opts
					opts.IncrementWhenOverLimit = c.opts.IncrementWhenOverLimit
					replayNodes(t, replayExampleRig(opts), func(t *testing.T, r *replayRig) {
						if k.fill != nil {
							k.fill(t, r)
						}
						resp := r.call(t, replayReq("rl", 0, k.req...))
						replayExpect(t, "answer", replayAnswer(resp), k.want(r.clock.Now()))
						if k.check != nil {
							k.check(t, r)
						}
					})
				})
			}
		})
	}
}

// The peer's tests of the response's dynamic metadata
// (RESPONSE_DYNAMIC_METADATA, --rls-response-dynamic-metadata):
// TestRatelimitToMetadata (src/service/ratelimit_test.go), whose cases
// give the Struct as JSON, and TestMetadataReturnedForPassedDescriptors,
// TestMetadataReturnedForAllPassedDescriptors and
// TestOverlappingMetadataReturnsTheFirstValue
// (test/service/ratelimit_test.go). The peer's cases take made-up
// limits; here the same shapes on its rule files (example.yaml's
// service_1 and service_2 both carry service_with_quota.name;
// metadata.yaml's key1/subkey1 carries name, its key2
// service_with_quota.name), the whole Struct compared.
func TestPeerDynamicMetadata(t *testing.T) {
	cases := []struct {
		name  string // the peer's case
		file  string
		opts  rls.Options
		fill  func(t *testing.T, r *replayRig)
		req   *rlsv3.RateLimitRequest
		code  rlsv3.RateLimitResponse_Code
		codes string // the statuses, O for OK and X for OVER_LIMIT
		want  string
	}{
		{
			// The peer's very request: no rule, no metadata.
			name: "TestRatelimitToMetadata: Single descriptor with single entry, no quota violations",
			file: replayMetadata,
			req:  replayReq("fake-domain", 0, replayDesc("key1", "val1")),
			code: replayOK, codes: "O",
			want: `{"descriptors": [{"entries": ["key1=val1"]}], "domain": "fake-domain"}`,
		},
		{
			// A passed quota descriptor (QUOTA_MODE) with metadata.
			name: "TestRatelimitToMetadata: Single descriptor with quota mode violation",
			file: replayMetadata,
			opts: rls.Options{QuotaMode: true},
			req:  replayReq("test-domain", 0, replayDesc("key1", "value1", "subkey1", "x")),
			code: replayOK, codes: "O",
			want: `{"descriptors": [{"entries": ["key1=value1", "subkey1=x"]}], "domain": "test-domain", "metadata": {"name": "service_1"}}`,
		},
		{
			// Only the descriptors that passed give their metadata:
			// service_1 (used up) is left out, service_2's is kept;
			// unspec has none.
			name: "TestRatelimitToMetadata: Multiple descriptors with mixed quota violations",
			file: replayExample,
			fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 1, replayDesc("service", "service_1")) },
			req:  replayReq("rl", 0, replayDesc("service", "service_1"), replayDesc("service", "service_2"), replayDesc("unspec", "x")),
			code: replayOK, codes: "XOO",
			want: `{
				"descriptors": [{"entries": ["service=service_1"]}, {"entries": ["service=service_2"]}, {"entries": ["unspec=x"]}],
				"domain": "rl",
				"metadata": {"service_with_quota": {"name": "service_2"}}
			}`,
		},
		{
			name: "TestRatelimitToMetadata: Request with hits addend",
			file: replayBasic,
			req:  replayReq("test-domain", 5, replayDesc("key2", "x")),
			code: replayOK, codes: "O",
			want: `{"descriptors": [{"entries": ["key2=x"]}], "domain": "test-domain", "hitsAddend": 5}`,
		},
		{
			// QUOTA_MODE: the first descriptor passes, the second
			// (used up) does not: only the first's metadata.
			name: "TestMetadataReturnedForPassedDescriptors",
			file: replayExample,
			opts: rls.Options{QuotaMode: true},
			fill: func(t *testing.T, r *replayRig) { replayExhaust(t, r, "rl", 2, replayDesc("service", "service_2")) },
			req:  replayReq("rl", 0, replayDesc("service", "service_1"), replayDesc("service", "service_2")),
			code: replayOK, codes: "OX",
			want: `{
				"descriptors": [{"entries": ["service=service_1"]}, {"entries": ["service=service_2"]}],
				"domain": "rl",
				"metadata": {"service_with_quota": {"name": "service_1"}}
			}`,
		},
		{
			// Both pass: their metadata of different keys merge.
			name: "TestMetadataReturnedForAllPassedDescriptors",
			file: replayMetadata,
			opts: rls.Options{QuotaMode: true},
			req:  replayReq("test-domain", 0, replayDesc("key1", "value1", "subkey1", "x"), replayDesc("key2", "y")),
			code: replayOK, codes: "OO",
			want: `{
				"descriptors": [{"entries": ["key1=value1", "subkey1=x"]}, {"entries": ["key2=y"]}],
				"domain": "test-domain",
				"metadata": {"name": "service_1", "service_with_quota": {"name": "service_2"}}
			}`,
		},
		{
			// Both pass with the same key: the first value wins.
			name: "TestOverlappingMetadataReturnsTheFirstValue",
			file: replayExample,
			opts: rls.Options{QuotaMode: true},
			req:  replayReq("rl", 0, replayDesc("service", "service_1"), replayDesc("service", "service_2")),
			code: replayOK, codes: "OO",
			want: `{
				"descriptors": [{"entries": ["service=service_1"]}, {"entries": ["service=service_2"]}],
				"domain": "rl",
				"metadata": {"service_with_quota": {"name": "service_1"}}
			}`,
		},
		{
			// A regular descriptor over its limit refuses the request;
			// the metadata is still the passed descriptors' (key2).
			name: "TestRatelimitToMetadata (a refused request)",
			file: replayMetadata,
			fill: func(t *testing.T, r *replayRig) {
				replayExhaust(t, r, "test-domain", 5, replayDesc("key1", "value1", "subkey1", "x"))
			},
			req:  replayReq("test-domain", 0, replayDesc("key1", "value1", "subkey1", "x"), replayDesc("key2", "y")),
			code: replayOver, codes: "XO",
			want: `{
				"descriptors": [{"entries": ["key1=value1", "subkey1=x"]}, {"entries": ["key2=y"]}],
				"domain": "test-domain",
				"metadata": {"service_with_quota": {"name": "service_2"}}
			}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := replayConfig(t, c.file)
			opts := c.opts
			opts.DynamicMetadata = true
			replayOn(t, cfg, opts, func(t *testing.T, r *replayRig) {
				if c.fill != nil {
					c.fill(t, r)
				}
				resp := r.call(t, c.req)
				if resp.GetOverallCode() != c.code || replayCodes(resp) != c.codes {
					t.Errorf("answer %s %s, want %s %s", resp.GetOverallCode(), replayCodes(resp), c.code, c.codes)
				}
				replayExpect(t, "dynamic_metadata", resp.GetDynamicMetadata(), replayJSON(t, c.want))
			})
		})
	}
	// Off (the default): no dynamic metadata.
	replayOn(t, replayConfig(t, replayExample), rls.Options{}, func(t *testing.T, r *replayRig) {
		if md := r.call(t, replayReq("rl", 0, replayDesc("service", "service_1"))).GetDynamicMetadata(); md != nil {
			t.Errorf("dynamic metadata off: %v", md)
		}
	})
}

// The peer's TestServiceWithCustomRatelimitHeaders and
// TestServiceWithDefaultRatelimitHeaders (test/service/ratelimit_test.go):
// a request of a descriptor over its 10 per minute and one of no rule, at
// the peer's mock time (2 s into a minute): OVER_LIMIT, and the headers of
// the descriptor closest to its limit, its reset in whole seconds (58).
// The peer's rule is a mock of 10 per minute; merge_domain_key1.yaml's
// (key1: value1) is one.
func TestPeerResponseHeaders(t *testing.T) {
	for _, c := range []struct {
		name                    string // the peer's test
		names                   rls.HeaderNames
		limit, remaining, reset string
	}{
		{"TestServiceWithCustomRatelimitHeaders", rls.HeaderNames{Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"},
			"A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset"},
		{"TestServiceWithDefaultRatelimitHeaders", rls.HeaderNames{}, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"},
	} {
		t.Run(c.name, func(t *testing.T) {
			names := c.names
			replayOn(t, replayConfig(t, replayMerge1), rls.Options{Headers: &names}, func(t *testing.T, r *replayRig) {
				key1 := replayDesc("key1", "value1")
				headers := func(limit, remaining, reset string) []*corev3.HeaderValue {
					return []*corev3.HeaderValue{{Key: c.limit, Value: limit}, {Key: c.remaining, Value: remaining}, {Key: c.reset, Value: reset}}
				}
				now := r.clock.Now()
				// The first hit: 9 left.
				first := r.call(t, replayReq("test-domain", 0, key1))
				want := replayResp(replayOK, replayStatus(replayOK, 10, replayMinute, 9, now))
				want.ResponseHeadersToAdd = headers("10", "9", "58")
				replayExpect(t, "first hit", first, want)
				replayExhaust(t, r, "test-domain", 9, key1)
				resp := r.call(t, replayReq("test-domain", 0, key1, replayDesc("hello", "world")))
				// The peer's mock status has no duration_until_reset;
				// its limiter's has (base_limiter.go, CalculateReset).
				want = replayResp(replayOver, replayStatus(replayOver, 10, replayMinute, 0, now), replayNone())
				want.ResponseHeadersToAdd = headers("10", "0", "58")
				replayExpect(t, "over the limit", resp, want)
				// No limited descriptor: no headers.
				if h := r.call(t, replayReq("test-domain", 0, replayDesc("hello", "world"))).GetResponseHeadersToAdd(); h != nil {
					t.Errorf("no limit, headers %v", h)
				}
				// Half a second later the reset still reads in whole
				// seconds, rounded up as the peer's unit - now % unit.
				r.clock.Advance(1500 * time.Millisecond)
				resp = r.call(t, replayReq("test-domain", 0, key1))
				if got := resp.GetResponseHeadersToAdd(); len(got) != 3 || got[2].GetValue() != "57" {
					t.Errorf("1.5 s later: headers %v, want reset 57", got)
				}
			})
		})
	}
	// Which descriptor the headers describe, as the peer's
	// shouldRateLimitWorker (src/service/ratelimit.go) picks it: the one
	// with the fewest hits remaining, the first of a tie, and the last
	// one over its limit. basic_config.yaml: key2 20 per minute, key3 1
	// per hour, key4 1 per day (their resets tell them apart).
	t.Run("the descriptor closest to its limit", func(t *testing.T) {
		replayOn(t, replayConfig(t, replayBasic), rls.Options{Headers: &rls.HeaderNames{}}, func(t *testing.T, r *replayRig) {
			now := r.clock.Now()
			reset := func(u rlsv3.RateLimitResponse_RateLimit_Unit) string {
				return strconv.FormatInt(replayReset(now, u).GetSeconds(), 10)
			}
			for _, c := range []struct {
				name                    string
				req                     *rlsv3.RateLimitRequest
				limit, remaining, reset string
			}{
				{"fewest remaining, last", replayReq("test-domain", 0, replayDesc("key2", "a"), replayDesc("key3", "a")), "1", "0", reset(replayHour)},
				{"a tie: the first", replayReq("test-domain", 0, replayDesc("key3", "b"), replayDesc("key4", "b")), "1", "0", reset(replayHour)},
				{"both over: the last", replayReq("test-domain", 0, replayDesc("key3", "b"), replayDesc("key4", "b")), "1", "0", reset(replayDay)},
			} {
				got := r.call(t, c.req).GetResponseHeadersToAdd()
				want := []*corev3.HeaderValue{{Key: rls.DefaultLimitHeader, Value: c.limit}, {Key: rls.DefaultRemainingHeader, Value: c.remaining},
					{Key: rls.DefaultResetHeader, Value: c.reset}}
				if len(got) != 3 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) || !proto.Equal(got[2], want[2]) {
					t.Errorf("%s: headers %v, want %v", c.name, got, want)
				}
			}
		})
	})
}

// The peer's shadow mode tests (test/service/ratelimit_test.go) on its
// rule files. Global: TestServiceGlobalShadowMode (SHADOW_MODE,
// --rls-shadow-mode) answers OK a request over a limit, its status still
// OVER_LIMIT, counted in global_shadow_mode. Per rule
// (shadowmode_config.yaml): TestRuleShadowMode, shadow_mode rules over
// their limits answer OK; TestMixedRuleShadowMode, a shadow_mode rule over
// its limit does not save a request another rule refuses.
func TestPeerShadowMode(t *testing.T) {
	t.Run("TestServiceGlobalShadowMode", func(t *testing.T) {
		replayOn(t, replayConfig(t, replayMerge1), rls.Options{ShadowMode: true}, func(t *testing.T, r *replayRig) {
			key1 := replayDesc("key1", "value1")
			replayExhaust(t, r, "test-domain", 10, key1)
			resp := r.call(t, replayReq("test-domain", 0, key1, replayDesc("hello", "world")))
			replayExpect(t, "answer", resp, replayResp(replayOK, replayStatus(replayOver, 10, replayMinute, 0, r.clock.Now()), replayNone()))
			if st := r.stats(); st.ShadowOK != 1 || st.OverLimit != 0 || st.Requests != 11 {
				t.Errorf("stats %+v: want global_shadow_mode 1, no request over the limit, 11 answered", st)
			}
		})
	})
	cfg := replayConfig(t, replayShadow)
	sub := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("key1", "value1", "subkey1", "subvalue1") } // 10/s, shadow_mode
	key2 := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("key2", "x") }                             // 20/min, shadow_mode
	value2 := func() *ratelimitv3.RateLimitDescriptor { return replayDesc("key2", "value2") }                      // 30/min
	for _, c := range replayCountings {
		t.Run(c.name, func(t *testing.T) {
			t.Run("TestRuleShadowMode", func(t *testing.T) {
				replayOn(t, cfg, c.opts, func(t *testing.T, r *replayRig) {
					replayExhaust(t, r, "test-domain", 10, sub())
					replayExhaust(t, r, "test-domain", 20, key2())
					now := r.clock.Now()
					resp := r.call(t, replayReq("test-domain", 0, sub(), key2()))
					replayExpect(t, "answer", resp, replayResp(replayOK, replayStatus(replayOK, 10, replaySecond, 0, now), replayStatus(replayOK, 20, replayMinute, 0, now)))
					st := r.ruleStats()
					if got := st["test-domain.key2"]; got.ShadowMode != 1 || got.OverLimit != 1 || got.TotalHits != 21 {
						t.Errorf("key2's statistics %+v: want 21 hits, 1 over the limit and let through", got)
					}
					if s := r.stats(); s.ShadowOK != 0 || s.OverLimit != 0 {
						t.Errorf("stats %+v: global_shadow_mode must stay 0", s)
					}
				})
			})
			t.Run("TestMixedRuleShadowMode", func(t *testing.T) {
				replayOn(t, cfg, c.opts, func(t *testing.T, r *replayRig) {
					replayExhaust(t, r, "test-domain", 20, key2())
					replayExhaust(t, r, "test-domain", 30, value2())
					now := r.clock.Now()
					resp := r.call(t, replayReq("test-domain", 0, key2(), value2()))
					replayExpect(t, "answer", resp, replayResp(replayOver, replayStatus(replayOK, 20, replayMinute, 0, now), replayStatus(replayOver, 30, replayMinute, 0, now)))
					// The shadow_mode rule's statistics count its hit
					// whatever the request's answer: the peer's
					// GenerateCacheKeys adds total_hits for every
					// descriptor with a limit, and its
					// GetResponseDescriptorStatus the over_limit and
					// shadow_mode of one over its limit
					// (src/limiter/base_limiter.go), in both its
					// countings.
					st := r.ruleStats()
					if want := (rls.RuleStat{Domain: "test-domain", Rule: "test-domain.key2", TotalHits: 21, WithinLimit: 20, NearLimit: 4,
						OverLimit: 1, ShadowMode: 1}); st["test-domain.key2"] != want {
						t.Errorf("key2's statistics %+v, want %+v", st["test-domain.key2"], want)
					}
					if got := st["test-domain.key2_value2"]; got.TotalHits != 31 || got.OverLimit != 1 {
						t.Errorf("key2_value2's statistics %+v, want 31 hits, 1 over the limit", got)
					}
				})
			})
		})
	}
}

// The peer's merge tests (test/config/config_test.go): TestDomainMerge,
// two files of one domain merged with MERGE_DOMAIN_CONFIG
// (LoadOptions.MergeDomains, --rls-merge-domain-config);
// TestDuplicateDomain, refused without it; TestDuplicateKeyDomainMerge,
// a descriptor given twice refused even merged. Then the merged rules
// answer on the nodes, loaded from a directory of the two files.
func TestPeerMergeDomainConfig(t *testing.T) {
	merged, err := replayParse(t, rls.LoadOptions{MergeDomains: true}, replayMerge1, replayMerge2)
	if err != nil {
		t.Fatal(err)
	}
	if _, found := merged.Match("foo_domain", nil); found {
		t.Error("an unknown domain matched")
	}
	if _, found := merged.Match("test-domain", nil); found {
		t.Error("an empty descriptor matched")
	}
	for _, c := range []struct {
		key, value string
		rpu        uint32
	}{{"key1", "value1", 10}, {"key2", "value2", 20}} {
		if m, found := merged.Match("test-domain", []rls.Entry{{Key: c.key, Value: c.value}}); !found || m.Rule.RequestsPerUnit != c.rpu {
			t.Errorf("%s=%s: %+v %v, want %d", c.key, c.value, m.Rule, found, c.rpu)
		}
	}
	var ce *rls.ConfigError
	// Without merging, the peer refuses the second file of a domain.
	if _, err := replayParse(t, rls.LoadOptions{}, replayMerge1, replayMerge2); !errors.As(err, &ce) || ce.File != replayMerge2 ||
		!strings.Contains(err.Error(), `duplicate domain "test-domain"`) {
		t.Errorf("merge_domain_key1 and 2 without merging: %v", err)
	}
	if _, err := replayParse(t, rls.LoadOptions{}, replayBasic, "test/config/duplicate_domain.yaml"); !errors.As(err, &ce) ||
		ce.File != "test/config/duplicate_domain.yaml" || !strings.Contains(err.Error(), `duplicate domain "test-domain"`) {
		t.Errorf("TestDuplicateDomain: %v", err)
	}
	if _, err := replayParse(t, rls.LoadOptions{MergeDomains: true}, replayMerge1, replayMerge1); !errors.As(err, &ce) ||
		ce.File != replayMerge1 || !strings.Contains(err.Error(), "duplicate descriptor composite key 'test-domain.key1_value1'") {
		t.Errorf("TestDuplicateKeyDomainMerge: %v", err)
	}

	// The two files in one rule directory: a node does not start without
	// merging, and answers with both limits merged.
	dir := t.TempDir()
	for _, rel := range []string{replayMerge1, replayMerge2} {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(rel)), replayRead(t, rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--rls-merge-domain-config") {
		t.Errorf("the directory without merging: %v", err)
	}
	replayNodes(t, func(t *testing.T, n int) *replayRig {
		src, err := rls.Open(dir, rls.LoadOptions{MergeDomains: true}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return startPeerCluster(t, n, peerClusterConfig{Source: src})
	}, func(t *testing.T, r *replayRig) {
		if got := replaySend(t, r, 11, replayReq("test-domain", 0, replayDesc("key1", "value1"))); got != strings.Repeat("O", 10)+"X" {
			t.Errorf("key1_value1, 10 per minute: %s", got)
		}
		if got := replaySend(t, r, 21, replayReq("test-domain", 0, replayDesc("key2", "value2"))); got != strings.Repeat("O", 20)+"X" {
			t.Errorf("key2_value2, 20 per minute: %s", got)
		}
	})
}

// replayCopyDir copies the peer's rule directory rel into a new temporary
// directory and returns it.
func replayCopyDir(t *testing.T, rel string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(replayPath(rel))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.WriteFile(filepath.Join(dir, e.Name()), replayRead(t, rel+"/"+e.Name()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// replaySourceRig starts a cluster of n nodes following src.
func replaySourceRig(src func(t *testing.T) *rls.Source) func(t *testing.T, n int) *replayRig {
	return func(t *testing.T, n int) *replayRig {
		return startPeerCluster(t, n, peerClusterConfig{Source: src(t)})
	}
}

// The peer's reload test (test/integration/integration_test.go,
// TestBasicReloadConfig / testConfigReload): the running rule directory
// (runtime/current/ratelimit/config) gets reload.yaml copied in
// (reloadNewConfigFile): its domain, unknown before, is limited after;
// the file removed (restoreConfigFile), the reload drops it. And the
// peer's TestService (test/service/ratelimit_test.go, "Config load
// failure"): a bad file (the peer's test/config/bad_yaml.yaml) is refused,
// config_load_error counted, the rules in force kept. Reloaded with
// Source.Reload here (SIGHUP's), with Source.Watch in
// TestPeerConfigReloadWatched.
func TestPeerConfigReload(t *testing.T) {
	var dir string
	var src *rls.Source
	replayNodes(t, replaySourceRig(func(t *testing.T) *rls.Source {
		dir = replayCopyDir(t, replayIntConfig)
		var err error
		if src, err = rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		return src
	}), func(t *testing.T, r *replayRig) {
		now := r.clock.Now()
		block := replayReq("reload", 0, replayDesc("block", "foo"))
		key1 := replayReq("reload", 0, replayDesc("key1", "foo"))
		replayExpect(t, "before the reload", r.call(t, block), replayResp(replayOK, replayNone()))
		basic := replayReq("basic", 0, replayDesc("key1", "x"))
		replayExpect(t, "basic before the reload", r.call(t, basic), replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 49, now)))
		before := r.stats().ConfigLoads

		// reloadNewConfigFile, then the reload.
		if err := os.WriteFile(filepath.Join(dir, "reload.yaml"), replayRead(t, replayIntReload), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := src.Reload(); err != nil {
			t.Fatal(err)
		}
		if after := r.stats().ConfigLoads; after <= before {
			t.Fatalf("config_load_success %d after the reload, %d before", after, before)
		}
		replayExpect(t, "key1 after the reload", r.call(t, key1), replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 49, now)))
		// The file's block rule (requests_per_unit 0) refuses from now on.
		replayExpect(t, "block after the reload", r.call(t, block), replayResp(replayOver, replayStatus(replayOver, 0, replaySecond, 0, now)))

		// A bad file: refused, counted, the rules in force stay.
		bad := filepath.Join(dir, "bad_yaml.yaml")
		if err := os.WriteFile(bad, replayRead(t, "test/config/bad_yaml.yaml"), 0o644); err != nil {
			t.Fatal(err)
		}
		var ce *rls.ConfigError
		if err := src.Reload(); !errors.As(err, &ce) || ce.File != bad || ce.Line != 1 {
			t.Fatalf("the bad file: %v", err)
		}
		if st := r.stats(); st.ConfigLoadErrors != 1 || st.ConfigLoads != 2 || st.Domains != 4 {
			t.Errorf("stats %+v: want 2 loads, 1 refused, 4 domains", st)
		}
		replayExpect(t, "key1 after the refused reload", r.call(t, key1), replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 48, now)))

		// restoreConfigFile (and the bad file gone): the reload drops the
		// reload domain.
		for _, f := range []string{bad, filepath.Join(dir, "reload.yaml")} {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := src.Reload(); err != nil {
			t.Fatal(err)
		}
		if st := r.stats(); st.ConfigLoads != 3 || st.Domains != 3 {
			t.Errorf("stats %+v: want 3 loads, 3 domains", st)
		}
		replayExpect(t, "block once the file is removed", r.call(t, block), replayResp(replayOK, replayNone()))
		// The other domains kept their counts through the reloads, and
		// their rules' statistics their series (the peer's stats store
		// keeps a counter by name across loads; so does it a removed
		// rule's).
		replayExpect(t, "basic after the reloads", r.call(t, basic), replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 48, now)))
		st := r.ruleStats()
		if got := st["basic.key1"]; got.TotalHits != 2 || got.WithinLimit != 2 {
			t.Errorf("basic.key1's statistics through the reloads: %+v, want 2 hits", got)
		}
		if got := st["reload.key1"]; got.TotalHits != 2 {
			t.Errorf("the removed reload.key1's statistics: %+v, want its 2 hits kept", got)
		}
	})
}

// TestPeerConfigReload with the reloads made by Source.Watch on a real
// temporary directory (the peer's runtime watch): written files applied,
// a bad one refused with the rules kept, a removed one dropped. It polls
// for each change with a deadline; the clock does not move.
func TestPeerConfigReloadWatched(t *testing.T) {
	var dir string
	var src *rls.Source
	replayNodes(t, replaySourceRig(func(t *testing.T) *rls.Source {
		dir = replayCopyDir(t, replayIntConfig)
		var err error
		if src, err = rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- src.Watch(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		return src
	}), func(t *testing.T, r *replayRig) {
		// until polls cond, doing act first each time, for 20 s at most.
		until := func(what string, act func(), cond func() bool) {
			t.Helper()
			for deadline := time.Now().Add(20 * time.Second); ; {
				act()
				if cond() {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: not seen in 20 s (stats %+v)", what, r.stats())
				}
				time.Sleep(50 * time.Millisecond) // polls the watch; moves no clock
			}
		}
		limited := func() bool {
			m, found := r.services()[len(r.services())-1].Config().Match("reload", []rls.Entry{{Key: "key1", Value: "foo"}})
			return found && m.Rule.RequestsPerUnit == 50
		}
		reload := filepath.Join(dir, "reload.yaml")
		// The watch starts asynchronously: write until it has seen a write.
		until("reload.yaml applied", func() {
			if err := os.WriteFile(reload, replayRead(t, replayIntReload), 0o644); err != nil {
				t.Fatal(err)
			}
		}, limited)
		now := r.clock.Now()
		replayExpect(t, "key1 after the reload", r.call(t, replayReq("reload", 0, replayDesc("key1", "foo"))),
			replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 49, now)))

		bad := filepath.Join(dir, "bad_yaml.yaml")
		if err := os.WriteFile(bad, replayRead(t, "test/config/bad_yaml.yaml"), 0o644); err != nil {
			t.Fatal(err)
		}
		until("the bad file refused", func() {}, func() bool { return r.stats().ConfigLoadErrors > 0 })
		if !limited() {
			t.Fatal("the rules in force were dropped by a refused reload")
		}
		replayExpect(t, "key1 after the refused reload", r.call(t, replayReq("reload", 0, replayDesc("key1", "foo"))),
			replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 48, now)))

		for _, f := range []string{bad, reload} {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		until("reload.yaml removed", func() {}, func() bool { return !limited() })
		replayExpect(t, "key1 once the file is removed", r.call(t, replayReq("reload", 0, replayDesc("key1", "foo"))), replayResp(replayOK, replayNone()))
	})
}

// An empty rule directory starts and answers every request OK; a rule
// file added (the peer's integration basic.yaml) applies after a reload.
// The peer starts without rules the same way, healthy
// (test/service/ratelimit_test.go, TestServiceHealthStatus: gRPC health
// of "ratelimit" SERVING with no config loaded).
func TestPeerEmptyRuleDirectory(t *testing.T) {
	var dir string
	var src *rls.Source
	replayNodes(t, replaySourceRig(func(t *testing.T) *rls.Source {
		dir = t.TempDir()
		var err error
		if src, err = rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		return src
	}), func(t *testing.T, r *replayRig) {
		for _, nd := range r.nodes {
			replayServing(t, nd)
		}
		key1 := replayReq("basic", 0, replayDesc("key1", "foo"))
		for range 3 {
			replayExpect(t, "no rules", r.call(t, key1), replayResp(replayOK, replayNone()))
		}
		if st := r.stats(); st.Domains != 0 || st.ConfigLoads != 1 {
			t.Errorf("stats %+v", st)
		}
		if err := os.WriteFile(filepath.Join(dir, "basic.yaml"), replayRead(t, replayIntConfig+"/basic.yaml"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := src.Reload(); err != nil {
			t.Fatal(err)
		}
		replayExpect(t, "after the file", r.call(t, key1), replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 49, r.clock.Now())))
		if st := r.stats(); st.Domains != 1 || st.ConfigLoads != 2 {
			t.Errorf("stats %+v", st)
		}
	})
}

// replayServing waits until nd's gRPC health answers SERVING for the
// peer's service name, "ratelimit", for 10 s at most.
func replayServing(t *testing.T, nd *replayNode) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := nd.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.HealthName})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: health of %q: %v %v, want SERVING", nd.Name(), rls.HealthName, resp, err)
		}
		time.Sleep(20 * time.Millisecond) // polls readiness; moves no clock
	}
}

// replayHTTP sends a request to the next node's HTTP face and returns the
// status, Content-Type and body; a /json answered 200 or 429 counts as
// answered.
func replayHTTP(t *testing.T, r *replayRig, method, path, body string) (int, string, string) {
	t.Helper()
	nd := r.pick()
	req, err := http.NewRequest(method, "http://"+nd.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if path == "/json" && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests) {
		r.answer()
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// The peer's HTTP face against real nodes: TestJsonHandler
// (test/server/server_impl_test.go), POST /json answered 200 with the
// response in proto3 JSON when OK, 429 when over the limit, 400 for no
// body, a body that is not JSON, or a request the service refuses (no
// descriptors); TestHealthCheck (test/server/health_test.go), GET
// /healthcheck 200 "OK" when healthy; and gRPC health of "ratelimit"
// SERVING (TestServiceHealthStatus, test/service/ratelimit_test.go). The
// peer's 500 cases (a response of unknown code, a nil response) come
// from its mock service only: a real service never answers them. sluice
// differs on purpose in its 400 bodies: they say what is wrong (the peer
// writes "Bad Request").
func TestPeerJSONAndHealthcheck(t *testing.T) {
	cfg, err := rls.Load(replayPath(replayIntConfig))
	if err != nil {
		t.Fatal(err)
	}
	replayOn(t, cfg, rls.Options{}, func(t *testing.T, r *replayRig) {
		for _, nd := range r.nodes {
			replayServing(t, nd)
		}
		for range r.nodes {
			if code, _, body := replayHTTP(t, r, http.MethodGet, "/healthcheck", ""); code != http.StatusOK || body != "OK" {
				t.Errorf("/healthcheck: %d %q, want 200 OK", code, body)
			}
		}
		const text = "text/plain; charset=utf-8"
		for _, c := range []struct {
			name, body, says string
		}{
			{"Missing request body", "", "body: not a RateLimitRequest"},
			{"Request body is not valid json", "}", "body: not a RateLimitRequest"},
			{"ratelimit service error", `{"domain": "foo"}`, "descriptors: must not be empty"},
		} {
			code, ctype, body := replayHTTP(t, r, http.MethodPost, "/json", c.body)
			if code != http.StatusBadRequest || ctype != text || !strings.Contains(body, c.says) {
				t.Errorf("%s: %d %q %q, want 400 %s saying %q", c.name, code, ctype, body, text, c.says)
			}
		}
		now := r.clock.Now()
		req := `{"domain": "basic", "descriptors": [{"entries": [{"key": "one_per_minute", "value": "json"}]}]}`
		for i, w := range []struct {
			code int
			resp *rlsv3.RateLimitResponse
		}{
			{http.StatusOK, replayResp(replayOK, replayStatus(replayOK, 1, replayMinute, 0, now))},
			{http.StatusTooManyRequests, replayResp(replayOver, replayStatus(replayOver, 1, replayMinute, 0, now))},
		} {
			code, ctype, body := replayHTTP(t, r, http.MethodPost, "/json", req)
			if code != w.code || ctype != "application/json" {
				t.Errorf("request %d: %d %q, want %d application/json", i+1, code, ctype, w.code)
			}
			// proto3 JSON with lowerCamelCase names, as the peer's
			// ({"overallCode":"OK"}).
			if want := `"overallCode":"` + w.resp.OverallCode.String() + `"`; !strings.Contains(body, want) {
				t.Errorf("request %d: body %s, want %s", i+1, body, want)
			}
			var got rlsv3.RateLimitResponse
			if err := protojson.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("request %d: %v: %s", i+1, err, body)
			}
			replayExpect(t, fmt.Sprintf("request %d", i+1), &got, w.resp)
		}
	})
}

// The peer's statistics of a rule (ratelimit.service.rate_limit.<key>.*:
// total_hits, over_limit, near_limit, within_limit, shadow_mode), as its
// limiter tests expect them for a sequence of hits: TestNearLimit and
// TestRedis (test/redis/fixed_cache_impl_test.go, which drive the base
// limiter of src/limiter/base_limiter.go with the counts a mock Redis
// returns; near_limit past NEAR_LIMIT_RATIO 0.8 of the limit). Here the
// counts are real: requests fill a key up to the count the peer's mock
// starts from, and each case checks what its request added to
// rls.Service.RuleStats (all the nodes together). The peer's made-up
// limits are replaced by basic_config.yaml's: key4_value4's 15 per hour by
// key5_value5's 15 per day, key5..key10's 20 per second by key2's 20 per
// minute (each case its own value), key6's 8 per second by
// key1_value1.subkey1_subvalue1's 10 per second (the same geometry: the
// hits straddle the near-limit threshold). Then the nodes' /metrics: one
// series per rule, none per value.
func TestPeerRuleStatistics(t *testing.T) {
	type step struct {
		name  string // the peer's comment
		desc  []string
		fill  uint32 // hits sent first
		hits  uint32 // the request's hits_addend
		code  rlsv3.RateLimitResponse_Code
		rem   uint32
		delta rls.RuleStat // TotalHits, OverLimit, NearLimit, WithinLimit
	}
	steps := []step{
		{"TestNearLimit: under near limit ratio", []string{"key5", "value5"}, 10, 1, replayOK, 4, rls.RuleStat{TotalHits: 1, WithinLimit: 1}},
		{"TestNearLimit: at near limit ratio, still OK", []string{"key5", "value5"}, 1, 1, replayOK, 2, rls.RuleStat{TotalHits: 1, NearLimit: 1, WithinLimit: 1}},
		{"TestNearLimit: over limit, near_limit not counted", []string{"key5", "value5"}, 2, 1, replayOver, 0, rls.RuleStat{TotalHits: 1, OverLimit: 1}},
		{"TestNearLimit: hitsAddend 3, all under limit and under near limit", []string{"key2", "k5"}, 2, 3, replayOK, 15, rls.RuleStat{TotalHits: 3, WithinLimit: 3}},
		{"TestNearLimit: hitsAddend 2, all under limit, some over near limit", []string{"key1", "value1", "subkey1", "subvalue1"}, 7, 2, replayOK, 1, rls.RuleStat{TotalHits: 2, NearLimit: 1, WithinLimit: 2}},
		{"TestNearLimit: all under limit, all over near limit", []string{"key2", "k7"}, 16, 3, replayOK, 1, rls.RuleStat{TotalHits: 3, NearLimit: 3, WithinLimit: 3}},
		{"TestNearLimit: some over limit, all over near limit", []string{"key2", "k8"}, 19, 3, replayOver, 0, rls.RuleStat{TotalHits: 3, OverLimit: 2, NearLimit: 1}},
		{"TestNearLimit: some of it in all three places", []string{"key2", "k9"}, 15, 7, replayOver, 0, rls.RuleStat{TotalHits: 7, OverLimit: 2, NearLimit: 4}},
		{"TestNearLimit: all of it over limit", []string{"key2", "k10"}, 20, 3, replayOver, 0, rls.RuleStat{TotalHits: 3, OverLimit: 3}},
	}
	for _, c := range replayCountings {
		t.Run(c.name, func(t *testing.T) {
			replayOn(t, replayConfig(t, replayBasic), c.opts, func(t *testing.T, r *replayRig) {
				cfg := r.services()[0].Config()
				for _, s := range steps {
					d := replayDesc(s.desc...)
					m, _ := cfg.Match("test-domain", []rls.Entry{{Key: s.desc[0], Value: s.desc[1]}})
					if len(s.desc) > 2 {
						m, _ = cfg.Match("test-domain", []rls.Entry{{Key: s.desc[0], Value: s.desc[1]}, {Key: s.desc[2], Value: s.desc[3]}})
					}
					rule := m.Rule.FullKey
					if s.fill > 0 {
						if resp := r.call(t, replayReq("test-domain", s.fill, d)); resp.GetOverallCode() != replayOK {
							t.Fatalf("%s: filling %d: %s", s.name, s.fill, resp.GetOverallCode())
						}
					}
					before := r.ruleStats()[rule]
					resp := r.call(t, replayReq("test-domain", s.hits, d))
					after := r.ruleStats()[rule]
					if g := resp.GetStatuses()[0]; g.GetCode() != s.code || g.GetLimitRemaining() != s.rem {
						t.Errorf("%s: %s remaining %d, want %s remaining %d", s.name, g.GetCode(), g.GetLimitRemaining(), s.code, s.rem)
					}
					delta := rls.RuleStat{TotalHits: after.TotalHits - before.TotalHits, OverLimit: after.OverLimit - before.OverLimit,
						NearLimit: after.NearLimit - before.NearLimit, WithinLimit: after.WithinLimit - before.WithinLimit, ShadowMode: after.ShadowMode - before.ShadowMode}
					if delta != s.delta {
						t.Errorf("%s: %s counted %+v, want %+v", s.name, rule, delta, s.delta)
					}
				}
				// TestRedis: a descriptor of hits_addend 0 over its limit
				// is OVER_LIMIT and counts no hit (its key a count the
				// peer's mock gives as 11 of 10: here 20 of 20 and one
				// refused hit).
				peek := replayDesc("key2", "k3")
				replaySend(t, r, 1, replayReq("test-domain", 20, peek))
				if got := replaySend(t, r, 1, replayReq("test-domain", 0, peek)); got != "X" {
					t.Fatalf("the 21st hit: %s", got)
				}
				before := r.ruleStats()["test-domain.key2"]
				peek.HitsAddend = wrapperspb.UInt64(0)
				if got := r.call(t, replayReq("test-domain", 0, peek)); got.GetOverallCode() != replayOver {
					t.Errorf("a peek over the limit: %s", got.GetOverallCode())
				}
				if after := r.ruleStats()["test-domain.key2"]; after != before {
					t.Errorf("a peek counted: %+v, then %+v", before, after)
				}
				replayMetrics(t, r)
			})
		})
	}
}

// replayMetrics checks the rule series of every node's /metrics
// (sluice_rls_rule_*_hits_total): labels domain and rule only, one series
// per rule, none naming a descriptor's value, and all nodes' values
// adding up to RuleStats.
func replayMetrics(t *testing.T, r *replayRig) {
	t.Helper()
	series := regexp.MustCompile(`^(sluice_rls_rule_(\w+)_hits_total)\{([^}]*)\} (\S+)$`)
	label := regexp.MustCompile(`^(\w+)="([^"]*)"$`)
	sums := map[string]map[string]float64{} // metric -> rule -> sum over the nodes
	rules := map[string]bool{}              // the full keys of the rules in force
	for _, rule := range r.services()[0].Config().Rules() {
		rules[rule.FullKey] = true
	}
	for _, nd := range r.nodes {
		resp, err := http.Get("http://" + nd.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for l := range strings.Lines(string(body)) {
			m := series.FindStringSubmatch(strings.TrimSpace(l))
			if m == nil {
				continue
			}
			labels := map[string]string{}
			for kv := range strings.SplitSeq(m[3], ",") {
				p := label.FindStringSubmatch(kv)
				if p == nil {
					t.Fatalf("%s: label %q", nd.Name(), kv)
				}
				labels[p[1]] = p[2]
			}
			if len(labels) != 2 || labels["domain"] == "" || !strings.HasPrefix(labels["rule"], labels["domain"]+".") {
				t.Errorf("%s: %s has labels %v, want domain and rule only", nd.Name(), m[1], labels)
			}
			if seen[m[1]+" "+labels["rule"]] {
				t.Errorf("%s: two series of %s for rule %s", nd.Name(), m[1], labels["rule"])
			}
			seen[m[1]+" "+labels["rule"]] = true
			if !rules[labels["rule"]] {
				t.Errorf("%s: a series of no rule of the file (one per value?): %s", nd.Name(), l)
			}
			v, err := strconv.ParseFloat(m[4], 64)
			if err != nil {
				t.Fatal(err)
			}
			if sums[m[2]] == nil {
				sums[m[2]] = map[string]float64{}
			}
			sums[m[2]][labels["rule"]] += v
		}
	}
	stats := r.ruleStats()
	var counted []string
	for rule := range stats {
		counted = append(counted, rule)
	}
	sort.Strings(counted)
	if len(counted) == 0 {
		t.Fatal("no rule statistics")
	}
	for _, rule := range counted {
		st := stats[rule]
		for metric, want := range map[string]int64{"total": st.TotalHits, "over_limit": st.OverLimit, "near_limit": st.NearLimit,
			"within_limit": st.WithinLimit, "shadow_mode": st.ShadowMode} {
			if got := sums[metric][rule]; got != float64(want) {
				t.Errorf("sluice_rls_rule_%s_hits_total{rule=%q}: %v over the nodes, RuleStats %d", metric, rule, got, want)
			}
		}
	}
	if len(sums["total"]) != len(counted) {
		t.Errorf("%d rules in /metrics, %d in RuleStats", len(sums["total"]), len(counted))
	}
}

// The peer's integration test of answers on its integration rule
// directory (basic.yaml, another.yaml, share_threshold.yaml):
// testBasicBaseConfig (test/integration/integration_test.go, run by
// TestBasicConfig) and TestShareThreshold. Its answers, statuses and
// stats total_hits and over_limit, on 1 and 3 nodes. Its runs with a
// local cache (the _local keys, over_limit_with_local_cache, the local
// cache's hit and miss counts) are about the peer's in-process cache of
// keys over their limits (LOCAL_CACHE_SIZE_IN_BYTES), which sluice has
// not: their answers are the same. Its default counting is
// sluice's --rls-increment-when-over-limit; its
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT runs
// ("...WithstopCacheKeyIncrementWhenOverlimitConfig") answer as sluice's
// own counting does.
func TestPeerIntegrationBasicConfig(t *testing.T) {
	cfg, err := rls.Load(replayPath(replayIntConfig))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range replayCountings {
		t.Run(c.name, func(t *testing.T) {
			replayOn(t, cfg, c.opts, func(t *testing.T, r *replayRig) {
				now := r.clock.Now()
				stat := func(rule string) rls.RuleStat { return r.ruleStats()[rule] }

				// An unknown domain: OK, no limit.
				replayExpect(t, "foo hello", r.call(t, replayReq("foo", 1, replayDesc("hello", "world"))), replayResp(replayOK, replayNone()))
				replayExpect(t, "basic key1", r.call(t, replayReq("basic", 1, replayDesc("key1", "foo"))),
					replayResp(replayOK, replayStatus(replayOK, 50, replaySecond, 49, now)))
				if st := stat("basic.key1"); st.TotalHits != 1 {
					t.Errorf("basic.key1 total_hits %d, want 1", st.TotalHits)
				}

				// Over a minute limit: 20 pass, 5 refused.
				for i := range 25 {
					code, remaining := replayOK, uint32(20-(i+1))
					if i >= 20 {
						code, remaining = replayOver, 0
					}
					replayExpect(t, fmt.Sprintf("key2, request %d", i+1), r.call(t, replayReq("another", 1, replayDesc("key2", "r1"))),
						replayResp(code, replayStatus(code, 20, replayMinute, remaining, now)))
					if st := stat("another.key2"); st.TotalHits != int64(i+1) || st.OverLimit != int64(max(0, i-19)) {
						t.Errorf("key2, request %d: total_hits %d over_limit %d, want %d and %d", i+1, st.TotalHits, st.OverLimit, i+1, max(0, i-19))
					}
				}

				// Two keys of the domain in one request: key3 (10 per
				// hour) refuses from the 11th; key2 keeps counting with
				// the peer's counting, and stays at 10 with sluice's
				// (the peer's "Ceased incrementing cached keys upon
				// exceeding the overall rate limit": limitRemaining1 =
				// 10).
				for i := range 15 {
					code, rem1, rem2 := replayOK, uint32(20-(i+1)), uint32(10-(i+1))
					if i >= 10 {
						code, rem2 = replayOver, 0
						if !c.peer {
							rem1 = 10
						}
					}
					resp := r.call(t, replayReq("another", 1, replayDesc("key2", "r2"), replayDesc("key3", "r2")))
					replayExpect(t, fmt.Sprintf("key2 and key3, request %d", i+1), resp,
						replayResp(code, replayStatus(replayOK, 20, replayMinute, rem1, now), replayStatus(code, 10, replayHour, rem2, now)))
					if st := stat("another.key2"); st.TotalHits != int64(i+26) || st.OverLimit != 5 {
						t.Errorf("key2, request %d: total_hits %d over_limit %d, want %d and 5", i+1, st.TotalHits, st.OverLimit, i+26)
					}
					if st := stat("another.key3"); st.TotalHits != int64(i+1) || st.OverLimit != int64(max(0, i-9)) {
						t.Errorf("key3, request %d: total_hits %d over_limit %d, want %d and %d", i+1, st.TotalHits, st.OverLimit, i+1, max(0, i-9))
					}
				}

				// DurationUntilReset: the same key twice, 2 s apart
				// (the peer sleeps; the clock moves here): 2 s less,
				// in whole seconds.
				key4 := replayReq("another", 1, replayDesc("key4", "durTest"))
				resp1 := r.call(t, key4)
				r.clock.Advance(2 * time.Second)
				resp2 := r.call(t, key4)
				d1, d2 := resp1.GetStatuses()[0].GetDurationUntilReset(), resp2.GetStatuses()[0].GetDurationUntilReset()
				if !proto.Equal(d1, replayReset(now, replayDay)) || d2.GetSeconds() != d1.GetSeconds()-2 || d2.GetNanos() != 0 {
					t.Errorf("duration_until_reset %v then %v, want %v then 2 s less", d1.AsDuration(), d2.AsDuration(), replayReset(now, replayDay).AsDuration())
				}
			})
		})
	}

	// TestShareThreshold: files/* with share_threshold, 10 per hour, one
	// count for every value it matches: after 10 requests of files/a.pdf,
	// files/b.csv is over the limit; files_no_share/* without it, one
	// count per value.
	t.Run("TestShareThreshold", func(t *testing.T) {
		replayOn(t, cfg, rls.Options{}, func(t *testing.T, r *replayRig) {
			const domain = "share-threshold-test"
			if got := replaySend(t, r, 10, replayReq(domain, 1, replayDesc("files", "files/a.pdf"))); got != "OOOOOOOOOO" {
				t.Errorf("files/a.pdf: %s", got)
			}
			now := r.clock.Now()
			replayExpect(t, "files/b.csv", r.call(t, replayReq(domain, 1, replayDesc("files", "files/b.csv"))),
				replayResp(replayOver, replayStatus(replayOver, 10, replayHour, 0, now)))
			for i := range 10 {
				replayExpect(t, fmt.Sprintf("files_no_share, value %d", i), r.call(t, replayReq(domain, 1, replayDesc("files_no_share", fmt.Sprintf("files_no_share/%d", i)))),
					replayResp(replayOK, replayStatus(replayOK, 10, replayHour, 9, now)))
			}
		})
	})
}

// The peer's TestEmptyDomain, TestEmptyDescriptors and
// TestInitialLoadError (test/service/ratelimit_test.go). sluice differs
// on purpose in how it refuses: INVALID_ARGUMENT naming the field (the
// peer answers a plain error, gRPC code UNKNOWN, "rate limit domain must
// not be empty", "rate limit descriptor list must not be empty"), and a
// rule directory that does not load stops the node from starting (the
// peer starts and answers every request "no rate limit configuration
// loaded").
func TestPeerServiceErrors(t *testing.T) {
	replayOn(t, replayConfig(t, replayBasic), rls.Options{}, func(t *testing.T, r *replayRig) {
		for _, c := range []struct {
			name string
			req  *rlsv3.RateLimitRequest
			msg  string
		}{
			{"TestEmptyDomain", replayReq("", 1, replayDesc("hello", "world")), "domain: must not be empty"},
			{"TestEmptyDescriptors", replayReq("test-domain", 1), "descriptors: must not be empty"},
		} {
			resp, err := r.try(c.req)
			if st, _ := status.FromError(err); resp != nil || st.Code() != codes.InvalidArgument || st.Message() != c.msg {
				t.Errorf("%s: %v %v, want INVALID_ARGUMENT %q", c.name, resp, err, c.msg)
			}
		}
	})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad_yaml.yaml"), replayRead(t, "test/config/bad_yaml.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ce *rls.ConfigError
	if _, err := rls.Open(dir, rls.LoadOptions{}, slog.New(slog.DiscardHandler)); !errors.As(err, &ce) || ce.File != filepath.Join(dir, "bad_yaml.yaml") {
		t.Errorf("TestInitialLoadError: a bad rule file at start: %v, want its ConfigError", err)
	}
}

// The peer's TestShareThreshold (test/config/config_test.go) on its
// share_threshold.yaml: the rule each descriptor gets, its stats key
// (RuleStat.Rule) and whether values share one count (a share_threshold
// wildcard counts every value it matches as one: the same sluice check
// key). sluice differs on purpose with detailed_metric: the peer's stats
// key names the value ("test-domain.service_svc/*.endpoint_get"), sluice
// keeps one series per rule.
func TestPeerShareThresholdConfig(t *testing.T) {
	cfg := replayConfig(t, "test/config/share_threshold.yaml")
	match := func(kv ...string) rls.Match {
		t.Helper()
		var es []rls.Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, rls.Entry{Key: kv[i], Value: kv[i+1]})
		}
		m, found := cfg.Match("test-domain", es)
		if !found {
			t.Fatalf("%v: no rule", kv)
		}
		return m
	}
	for _, c := range []struct {
		a, b    []string // two descriptors of one rule
		rpu     uint32
		fullKey string
		shared  bool // one count for both
	}{
		{[]string{"files", "files/a.pdf"}, []string{"files", "files/b.csv"}, 100, "test-domain.files_files/*", true},
		{[]string{"route", "api/v1", "method", "GET"}, []string{"route", "api/v2", "method", "GET"}, 60, "test-domain.route_api/*.method", true},
		{[]string{"route", "api/v1", "method", "GET"}, []string{"route", "api/v1", "method", "POST"}, 60, "test-domain.route_api/*.method", false},
		{[]string{"service", "svc/user", "endpoint", "get"}, []string{"service", "svc/order", "endpoint", "get"}, 80, "test-domain.service_svc/*.endpoint", true},
		{[]string{"nested", "parent", "files", "nested/a"}, []string{"nested", "parent", "files", "nested/b"}, 200, "test-domain.nested_parent.files_nested/*", true},
		{[]string{"files", "top/a", "files", "nested/a"}, []string{"files", "top/b", "files", "nested/b"}, 300, "test-domain.files_top/*.files_nested/*", true},
		// A child wildcard without share_threshold keeps a count per value.
		{[]string{"path", "path/a", "file", "file/x", "type", "t"}, []string{"path", "path/b", "file", "file/x", "type", "t"}, 120, "test-domain.path_path/*.file_file/*.type", true},
		{[]string{"path", "path/a", "file", "file/x", "type", "t"}, []string{"path", "path/a", "file", "file/y", "type", "t"}, 120, "test-domain.path_path/*.file_file/*.type", false},
		{[]string{"user", "user/a", "resource", "res/a", "action", "read"}, []string{"user", "user/b", "resource", "res/b", "action", "read"}, 150, "test-domain.user_user/*.resource_res/*.action", true},
		{[]string{"file", "test2"}, []string{"file", "test3"}, 100, "test-domain.file_test*", true},
		{[]string{"midpath", "/api/foo/v1"}, []string{"midpath", "/apiv1"}, 100, "test-domain.midpath_/api*v1", true},
		{[]string{"multiroute", "svcAepBrpc"}, []string{"multiroute", "svceprpc"}, 50, "test-domain.multiroute_svc*ep*rpc", true},
		{[]string{"midroute", "/api/v2"}, []string{"midroute", "/api-beta-v2"}, 80, "test-domain.midroute_/api*v2", true},
		{[]string{"tenant", "t1prod", "resource", "resAv2"}, []string{"tenant", "t2prod", "resource", "resBv2"}, 60, "test-domain.tenant_t*prod.resource_res*v2", true},
	} {
		ma, mb := match(c.a...), match(c.b...)
		if ma.Rule != mb.Rule || ma.Rule.FullKey != c.fullKey || ma.Rule.RequestsPerUnit != c.rpu {
			t.Errorf("%v and %v: rules %s (%d) and %s, want both %s (%d)", c.a, c.b, ma.Rule.FullKey, ma.Rule.RequestsPerUnit, mb.Rule.FullKey, c.fullKey, c.rpu)
		}
		if shared := ma.Name == mb.Name && ma.Key == mb.Key; shared != c.shared {
			t.Errorf("%v and %v: one count %v, want %v", c.a, c.b, shared, c.shared)
		}
	}
	// An explicit value wins over a wildcard with share_threshold.
	if m := match("file", "test1"); m.Rule.FullKey != "test-domain.file_test1" || m.Rule.RequestsPerUnit != 50 {
		t.Errorf("file test1: %s %d, want test-domain.file_test1 50", m.Rule.FullKey, m.Rule.RequestsPerUnit)
	}
	// A value no wildcard matches.
	if _, found := cfg.Match("test-domain", []rls.Entry{{Key: "multiroute", Value: "svcABCrpc"}}); found {
		t.Error("multiroute svcABCrpc matched svc*ep*rpc")
	}
}
