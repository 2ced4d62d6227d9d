package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// serve --rls-config refuses a bad rule file, naming the file and line,
// and serves ShouldRateLimit from a good one (here from SLUICE_RLS_CONFIG).
func TestServeRLSConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := sluice(t, "serve", "--name", "r", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "", "--rls-config", bad)
	if want := "invalid --rls-config: " + bad + `:5:13: descriptors[0].rate_limit.unit: invalid rate limit unit "minutes"`; code != exitUsage || !strings.Contains(errOut, want) {
		t.Fatalf("bad rules: exit %d, stderr %q; want exit 2 and %q", code, errOut, want)
	}

	env := map[string]string{
		"SLUICE_NAME": "rls-node", "SLUICE_GRPC_ADDR": "127.0.0.1:0", "SLUICE_GOSSIP_ADDR": "127.0.0.1:0", "SLUICE_HTTP_ADDR": "127.0.0.1:0",
		"SLUICE_PROFILE": "local", "SLUICE_RLS_CONFIG": "../../examples/rls",
	}
	// Refunds on from the config file (Envoy's is_negative_hits).
	conf := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(conf, []byte("allow-refunds: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	errBuf, m, stop := startServeLog(t, []string{"--config", conf}, env,
		regexp.MustCompile(`msg="node started" node=rls-node grpc_addr=(\S+) .*http_addr=(\S+) .*allow_refunds=true`))
	defer stop()
	addr := m[0][1]
	if !strings.Contains(errBuf.String(), `msg="rls rules loaded" node=rls-node component=rls domains=edge files=1 rules=5`) {
		t.Errorf("no rules line in the log:\n%s", errBuf.String())
	}
	wantRules(t, m[0][2], 5, 1)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}}}}}
	// 10 hits fill the per-minute limit of 10, the next is over it (once
	// more if a minute began in between).
	for try := 0; ; try++ {
		first, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil || first.OverallCode != rlsv3.RateLimitResponse_OK || first.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("first: %v %v", first, err)
		}
		req.HitsAddend = 1
		second, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if second.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && second.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 10 {
			break
		}
		if try == 1 {
			t.Fatalf("second: %v, want OVER_LIMIT", second)
		}
		req.HitsAddend = 10
		req.Descriptors[0].Entries[0].Value = "203.0.113.8"
	}
	// A refund (is_negative_hits) of the 10 hits: OK with all 10 back,
	// counted in sluice_rls_refunds_total (given back; nothing when a
	// minute began since the charge, whose count is then gone anyway).
	refund := proto.Clone(req).(*rlsv3.RateLimitRequest)
	refund.HitsAddend = 10
	refund.Descriptors[0].IsNegativeHits = true
	if r, err := c.ShouldRateLimit(context.Background(), refund); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 10 {
		t.Fatalf("refund: %v %v, want OK with 10 remaining", r, err)
	}
	metrics := httpBody(t, "http://"+m[0][2]+"/metrics")
	if !regexp.MustCompile(`\nsluice_rls_refunds_total\{result="(given_back|nothing)"\} 1\n`).MatchString(metrics) ||
		!strings.Contains(metrics, "\n"+`sluice_rls_refunds_total{result="failed"} 0`+"\n") {
		t.Errorf("/metrics: no refund counted:\n%s", regexp.MustCompile(`(?m)^sluice_rls_refunds.*$`).FindAllString(metrics, -1))
	}
	if !strings.Contains(metrics, "\nsluice_refunds_allowed 1\n") || !strings.Contains(metrics, "\n"+`sluice_rls_refunds_total{result="off"} 0`+"\n") {
		t.Errorf("/metrics: want sluice_refunds_allowed 1 and no refund off")
	}
}

// serve's envoyproxy/ratelimit settings reach the rate limit service from
// SLUICE_RLS_* (shadow mode, response headers with a renamed header,
// dynamic metadata, the peer's counting); an empty rule directory starts
// and its rules apply once a file is written into it; the HTTP face serves
// /json and /healthcheck, the debug address /rlconfig.
func TestServeRLSPeerSettings(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{
		"SLUICE_NAME": "peer-node", "SLUICE_GRPC_ADDR": "127.0.0.1:0", "SLUICE_GOSSIP_ADDR": "127.0.0.1:0", "SLUICE_HTTP_ADDR": "127.0.0.1:0",
		"SLUICE_PROFILE": "local", "SLUICE_RLS_CONFIG": dir, "SLUICE_DEBUG_ADDR": "127.0.0.1:0",
		"SLUICE_RLS_SHADOW_MODE": "true", "SLUICE_RLS_RESPONSE_HEADERS": "true", "SLUICE_RLS_LIMIT_HEADER": "X-Limit",
		"SLUICE_RLS_RESPONSE_DYNAMIC_METADATA": "true", "SLUICE_RLS_INCREMENT_WHEN_OVER_LIMIT": "true",
	}
	errBuf, ms, stop := startServeLog(t, nil, env, regexp.MustCompile(`msg="node started" node=peer-node grpc_addr=(\S+) .*http_addr=(\S+)`),
		regexp.MustCompile(`msg="debug endpoints up" node=peer-node addr=(\S+)`))
	defer stop()
	m, dm := ms[0], ms[1]
	if !strings.Contains(errBuf.String(), "no rls rules yet") {
		t.Errorf("no warning of the empty rule directory:\n%s", errBuf.String())
	}
	wantRules(t, m[2], 0, 0)
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	value := fmt.Sprint(time.Now().UnixNano()) // a key no minute has counted
	req := &rlsv3.RateLimitRequest{Domain: "peer", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}}}}}
	if r, err := c.ShouldRateLimit(context.Background(), req); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("no rules: %v %v", r, err)
	}
	rule := "domain: peer\ndescriptors:\n  - key: user\n    metadata: {tier: free}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rule file was never applied:\n%s", errBuf.String())
		}
		if err := os.WriteFile(filepath.Join(dir, "peer.yaml"), []byte(rule), 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(errBuf.String(), `msg="rls rules reloaded"`) {
			break
		}
	}
	wantRules(t, m[2], 1, 1)
	first, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil || first.OverallCode != rlsv3.RateLimitResponse_OK || first.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("first: %v %v", first, err)
	}
	headers := map[string]string{}
	for _, h := range first.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	if headers["X-Limit"] != "1" || headers["RateLimit-Remaining"] != "0" || headers["RateLimit-Reset"] == "" {
		t.Errorf("headers: %v", headers)
	}
	if tier := first.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["tier"].GetStringValue(); tier != "free" {
		t.Errorf("dynamic metadata: %v", first.DynamicMetadata)
	}
	// Over the limit: OVER_LIMIT in the status, OK overall (shadow mode).
	second, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil || second.OverallCode != rlsv3.RateLimitResponse_OK || second.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v %v", second, err)
	}
	// The peer's counting: the refused hit was counted, so a peek is over.
	peek := proto.Clone(req).(*rlsv3.RateLimitRequest)
	peek.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	if r, err := c.ShouldRateLimit(context.Background(), peek); err != nil || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("peek past the limit: %v %v", r, err)
	}
	// Refunds off (the default): is_negative_hits only peeks, as before
	// refunds (over the limit still), counted as off; a check of
	// negative hits is refused naming the field and the flag.
	refund := proto.Clone(req).(*rlsv3.RateLimitRequest)
	refund.Descriptors[0].HitsAddend = wrapperspb.UInt64(1)
	refund.Descriptors[0].IsNegativeHits = true
	if r, err := c.ShouldRateLimit(context.Background(), refund); err != nil || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a refund with refunds off: %v %v, want the peek's OVER_LIMIT", r, err)
	}
	if r, err := c.ShouldRateLimit(context.Background(), peek); err != nil || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("peek after the refund: %v %v, want still over (nothing given back)", r, err)
	}
	metrics := httpBody(t, "http://"+m[2]+"/metrics")
	if !strings.Contains(metrics, "\n"+`sluice_rls_refunds_total{result="off"} 1`+"\n") || !strings.Contains(metrics, "\nsluice_refunds_allowed 0\n") {
		t.Errorf("/metrics: want a refund counted off and sluice_refunds_allowed 0:\n%s", regexp.MustCompile(`(?m)^sluice_(rls_)?refunds.*$`).FindAllString(metrics, -1))
	}
	_, err = sluicev1.NewRateLimitServiceClient(conn).Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "k", Limit: 5, WindowMs: 60000, Hits: proto.Int64(-1)}}})
	if want := "checks[0].hits: must be >= 0, got -1 (refunds are off: serve --allow-refunds)"; status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
		t.Errorf("a check of hits -1: %v, want INVALID_ARGUMENT %q", err, want)
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	body := `{"domain":"peer","descriptors":[{"entries":[{"key":"user","value":"` + value + `"}]}]}`
	resp, err := hc.Post("http://"+m[2]+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Shadow mode: the overall code is OK, so 200, with the status over.
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(js), `"code":"OVER_LIMIT"`) || !strings.Contains(string(js), `"overallCode":"OK"`) {
		t.Errorf("/json: %d %s", resp.StatusCode, js)
	}
	if resp, err := hc.Post("http://"+m[2]+"/json", "application/json", strings.NewReader(`{"domain":`)); err != nil {
		t.Error(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("/json with a bad body: %d", resp.StatusCode)
		}
	}
	for path, want := range map[string]string{"http://" + m[2] + "/healthcheck": "OK",
		"http://" + dm[1] + "/rlconfig": "peer.user: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false @ " + filepath.Join(dir, "peer.yaml") + ":3\n"} {
		resp, err := hc.Get(path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != want {
			t.Errorf("%s: %d %q, want %q", path, resp.StatusCode, b, want)
		}
	}
}

// wantRules checks that the node whose HTTP face is at addr says, on
// /readyz and in the sluice_rls_rules gauge of /metrics, that rules RLS
// rules of domains domains are in force.
func wantRules(t *testing.T, addr string, rules, domains int) {
	t.Helper()
	get := func(path string) string { return httpBody(t, "http://"+addr+path) }
	if got, want := get("/readyz"), fmt.Sprintf("ready\nrls rules: %d in %d domains\n", rules, domains); got != want {
		t.Errorf("/readyz: %q, want %q", got, want)
	}
	if got, want := get("/metrics"), fmt.Sprintf("\nsluice_rls_rules %d\n", rules); !strings.Contains(got, want) {
		t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
	}
}

// httpBody returns the body of GET url, on a connection closed after it.
func httpBody(t *testing.T, url string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// serve --rls-config given envoyproxy/ratelimit's runtime root (the
// peer's RUNTIME_ROOT, whose RUNTIME_SUBDIRECTORY/config/ holds the rule
// files) refuses to start, exit 2, naming the files it would not read and
// the config/ directory to pass; given that directory, it starts.
func TestServeRLSPeerRuntimeRoot(t *testing.T) {
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "rl.yaml"), []byte("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Join(root, "ratelimit")} {
		code, _, errOut := sluice(t, "serve", "--name", "r", "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--http-addr", "", "--rls-config", dir)
		if code != exitUsage || !strings.Contains(errOut, "invalid --rls-config: "+dir+": ") || !strings.Contains(errOut, filepath.Join(cfgDir, "rl.yaml")) ||
			!strings.Contains(errOut, "pass --rls-config "+cfgDir) {
			t.Errorf("serve --rls-config %s: exit %d, stderr %q; want exit 2 naming %s and --rls-config %s", dir, code, errOut, filepath.Join(cfgDir, "rl.yaml"), cfgDir)
		}
	}
	env := map[string]string{
		"SLUICE_NAME": "peer-root", "SLUICE_GRPC_ADDR": "127.0.0.1:0", "SLUICE_GOSSIP_ADDR": "127.0.0.1:0", "SLUICE_HTTP_ADDR": "127.0.0.1:0",
		"SLUICE_PROFILE": "local", "SLUICE_RLS_CONFIG": cfgDir,
	}
	_, m, stop := startServeLog(t, nil, env, regexp.MustCompile(`msg="node started" node=peer-root grpc_addr=(\S+) .*http_addr=(\S+)`))
	defer stop()
	wantRules(t, m[0][2], 1, 1)
}
