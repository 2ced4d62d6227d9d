package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	return httpDoWith(t, http.DefaultClient, method, url, body)
}

// httpDoWith sends a request of method to url with body (JSON) through
// client, and returns the status and the body of the answer.
func httpDoWith(t *testing.T, client *http.Client, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// POST /v1/check answers what the gRPC Check answers for the same inputs,
// in the JSON form of the same messages.
func TestHTTPCheckMatchesGRPC(t *testing.T) {
	clock := windowClock()
	n := startInproc(t, NodeConfig{Name: "node1", Clock: clock, HTTPAddr: "127.0.0.1:0"})[0]
	base := "http://" + n.HTTPAddr()
	for _, alg := range algorithms {
		for i := 0; i < 5; i++ {
			mk := func(key string) *sluicev1.RateLimitCheck {
				return &sluicev1.RateLimitCheck{Name: "api", Key: key, Limit: 3, WindowMs: 60_000, Algorithm: alg, Hits: proto.Int64(1)}
			}
			body := fmt.Sprintf(`{"checks":[{"name":"api","key":"http-%s","hits":1,"limit":3,"window_ms":"60000","algorithm":%q}]}`, alg, alg.String())
			code, out := n.httpDo(t, "POST", base+"/v1/check", body)
			if code != http.StatusOK {
				t.Fatalf("%s: POST /v1/check = %d %s", alg, code, out)
			}
			var got sluicev1.CheckResponse
			if err := protojson.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%s: %v in %s", alg, err, out)
			}
			want := check(t, n.client, mk("grpc-"+alg.String()))
			if len(got.Decisions) != 1 || !proto.Equal(got.Decisions[0], want) {
				t.Fatalf("%s hit %d: HTTP %v, gRPC %v", alg, i+1, got.Decisions, want)
			}
			// Every field is in the JSON, false and 0 included.
			if !strings.Contains(out, `"allowed":`) || !strings.Contains(out, `"retry_after":`) {
				t.Fatalf("JSON leaves fields out: %s", out)
			}
		}
		clock.Advance(time.Hour)
	}
	code, out := n.httpDo(t, "GET", base+"/v1/members", "")
	if code != http.StatusOK || !strings.Contains(out, `"self":"node1"`) {
		t.Fatalf("GET /v1/members = %d %s", code, out)
	}
}

// C12 over HTTP: bad numbers get 400 and a status naming the field;
// nothing is counted.
func TestHTTPBadInput(t *testing.T) {
	n := startInproc(t, NodeConfig{Name: "node1", HTTPAddr: "127.0.0.1:0"})[0]
	url := "http://" + n.HTTPAddr() + "/v1/check"
	for _, tc := range []struct{ check, field string }{
		{`"limit":0,"window_ms":1000`, "checks[0].limit"},
		{`"limit":-1,"window_ms":1000`, "checks[0].limit"},
		{`"limit":5,"window_ms":0`, "checks[0].window_ms"},
		{`"limit":5,"window_ms":-5000`, "checks[0].window_ms"},
		{`"limit":5,"window_ms":1000,"hits":-1`, "checks[0].hits"}, // refunds are off (serve --allow-refunds)
		{`"limit":5,"window_ms":1000,"hits":"-9223372036854775808"`, "checks[0].hits"},
		{`"limit":5,"window_ms":1000,"burst":-1`, "checks[0].burst"},
		{`"limit":5,"window_ms":1000,"algorithm":9`, "checks[0].algorithm"},
		{`"limit":5,"window_ms":1000,"key":""`, "checks[0].key"},
		{`"limit":9007199254740993,"window_ms":1000`, "checks[0].limit"},
	} {
		key := `"key":"c12",`
		if strings.Contains(tc.check, `"key"`) {
			key = ""
		}
		body := `{"checks":[{"name":"api",` + key + tc.check + `}]}`
		code, out := n.httpDo(t, "POST", url, body)
		var st struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%s: not a JSON status: %s", tc.check, out)
		}
		if code != http.StatusBadRequest || st.Code != 3 || !strings.HasPrefix(st.Message, tc.field+":") {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.check, code, out, tc.field)
		}
	}
	for _, body := range []string{`{"checks":[`, `{"checks":[{"nme":"x"}]}`, `[]`} {
		if code, out := n.httpDo(t, "POST", url, body); code != http.StatusBadRequest {
			t.Errorf("malformed %s: %d %s, want 400", body, code, out)
		}
	}
	big := `{"checks":[{"name":"api","key":"` + strings.Repeat("k", MaxHTTPBodyBytes) + `"}]}`
	if code, out := n.httpDo(t, "POST", url, big); code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "at most") {
		t.Errorf("a body over 1 MiB: %d %.200s, want 413", code, out)
	}
	for _, tc := range []struct{ method, path, allow string }{{"GET", "/v1/check", "POST"}, {"PUT", "/v1/check", "POST"}, {"POST", "/v1/members", "GET"}} {
		if code, out := n.httpDo(t, tc.method, "http://"+n.HTTPAddr()+tc.path, ""); code != http.StatusMethodNotAllowed || !strings.Contains(out, "use "+tc.allow) {
			t.Errorf("%s %s: %d %s, want 405", tc.method, tc.path, code, out)
		}
	}
	if n.Store().Len() != 0 {
		t.Fatalf("refused checks left %d keys", n.Store().Len())
	}
}

// /metrics parses as Prometheus text and its counters follow the checks.
func TestMetrics(t *testing.T) {
	clock := windowClock()
	n := startNodeCfg(t, NodeConfig{Name: "node1", Clock: clock, HTTPAddr: "127.0.0.1:0", Limits: mustParseLimits(t, testLimits)})
	for i := 0; i < 5; i++ { // api: 3 allowed, 2 denied
		check(t, n.client, named("api", "user:1"))
	}
	for i := 0; i < 3; i++ { // signup (shadow, 2 per hour): 2 allowed, 1 shadow_denied
		check(t, n.client, named("signup", "ip"))
	}
	check(t, n.client, &sluicev1.RateLimitCheck{Name: "whatever", Key: "k", Limit: 1, WindowMs: 1000})
	// A refused batch of two checks: both counted as invalid.
	if _, err := n.client.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		named("api", "ok"), {Name: "api", Key: "k", Burst: 5},
	}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `or no numbers at all to take those of the configured limit "api"`) {
		t.Fatalf("a named check with a burst only: %v", err)
	}
	code, out := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, out)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no metric %s", name)
		}
	metrics:
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return metricValue(m)
		}
		t.Fatalf("no %s with %v", name, labels)
		return 0
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_checks_total", map[string]string{"name": "api", "outcome": "allowed"}, 3},
		{"sluice_checks_total", map[string]string{"name": "api", "outcome": "denied"}, 2},
		{"sluice_checks_total", map[string]string{"name": "signup", "outcome": "allowed"}, 2},
		{"sluice_checks_total", map[string]string{"name": "signup", "outcome": "shadow_denied"}, 1},
		{"sluice_checks_total", map[string]string{"name": InlineName, "outcome": "allowed"}, 1},
		{"sluice_local_checks_total", nil, 9},
		{"sluice_checks_total", map[string]string{"name": InlineName, "outcome": "invalid"}, 2},
		{"sluice_keys", nil, 3},
		{"sluice_members", nil, 1},
		{"sluice_limits_configured", nil, 2},
	} {
		if got := value(tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if strings.Contains(out, "user:1") {
		t.Error("a key appears in /metrics")
	}
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

// /healthz is up while the process serves; /readyz waits for the join and
// the ring to settle, and turns 503 when the node leaves; sluice_ready in
// /metrics says the same (0, 1, 0), and sluice_node_info names the node.
func TestHealthAndReadiness(t *testing.T) {
	hasLine := func(base, line string) bool {
		t.Helper()
		code, out := httpDo(t, "GET", base+"/metrics", "")
		return code == http.StatusOK && strings.Contains(out, "\n"+line+"\n")
	}
	// A seed that never answers: the node serves but is not ready.
	lonely := startNodeCfg(t, NodeConfig{Name: "lonely", HTTPAddr: "127.0.0.1:0", Join: []string{"127.0.0.1:1"}, SettleTime: time.Millisecond})
	base := "http://" + lonely.HTTPAddr()
	if code, _ := httpDo(t, "GET", base+"/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	if code, out := httpDo(t, "GET", base+"/readyz", ""); code != http.StatusServiceUnavailable || !strings.Contains(out, "joining") {
		t.Fatalf("/readyz while joining = %d %s", code, out)
	}
	if !hasLine(base, "sluice_ready 0") || !hasLine(base, `sluice_node_info{member="lonely",region="local",version=""} 1`) {
		t.Fatal("/metrics of a node joining: no sluice_ready 0, or no sluice_node_info of lonely")
	}

	n := startNodeCfg(t, NodeConfig{Name: "node1", HTTPAddr: "127.0.0.1:0", SettleTime: 50 * time.Millisecond, Version: "v1.2.3"})
	base = "http://" + n.HTTPAddr()
	eventually(t, "the node to be ready", func() bool {
		code, _ := httpDo(t, "GET", base+"/readyz", "")
		return code == http.StatusOK
	})
	if !hasLine(base, "sluice_ready 1") || !hasLine(base, `sluice_node_info{member="node1",region="local",version="v1.2.3"} 1`) {
		t.Fatal("/metrics of a ready node: no sluice_ready 1, or no sluice_node_info of node1")
	}
	n.draining.Store(true) // as Close does first
	if code, out := httpDo(t, "GET", base+"/readyz", ""); code != http.StatusServiceUnavailable || !strings.Contains(out, "draining") {
		t.Fatalf("/readyz while draining = %d %s", code, out)
	}
	if !hasLine(base, "sluice_ready 0") {
		t.Fatal("/metrics of a node leaving: no sluice_ready 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("/healthz still answers after Close")
	}
}
