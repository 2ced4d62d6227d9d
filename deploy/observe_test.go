package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/testcluster"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
)

// The files under test, relative to this package.
const (
	alertsFile     = "prometheus/alerts.yml"
	alertTestsFile = "prometheus/alerts_test.yml"
	dashboardFile  = "grafana/sluice.json"
	runbookFile    = "../docs/operations.md"
	proxyMetricsGo = "../cmd/sluice/proxy_admin.go"
)

// series is what is known of the metrics the rules and the dashboard may
// read: metric name -> label name -> the values seen (nil: any value,
// e.g. job and instance, which Prometheus adds when it scrapes).
type series map[string]map[string]map[string]bool

// add records one series of name with labels.
func (s series) add(name string, labels map[string]string) {
	if s[name] == nil {
		s[name] = map[string]map[string]bool{"job": nil, "instance": nil}
	}
	for k, v := range labels {
		if s[name][k] == nil {
			s[name][k] = map[string]bool{}
		}
		s[name][k][v] = true
	}
}

// addFamilies records every series of fams: a histogram as its _bucket
// (with le), _sum and _count series, a summary as itself (with quantile),
// _sum and _count.
func (s series) addFamilies(fams map[string]*dto.MetricFamily) {
	for name, f := range fams {
		for _, m := range f.Metric {
			ls := map[string]string{}
			for _, l := range m.Label {
				ls[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					s.add(name+"_bucket", with(ls, "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)))
				}
				s.add(name+"_bucket", with(ls, "le", "+Inf"))
				s.add(name+"_sum", ls)
				s.add(name+"_count", ls)
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					s.add(name, with(ls, "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)))
				}
				s.add(name+"_sum", ls)
				s.add(name+"_count", ls)
			default:
				s.add(name, ls)
			}
		}
	}
}

func with(m map[string]string, k, v string) map[string]string {
	out := maps.Clone(m)
	out[k] = v
	return out
}

// TestObservability checks deploy/prometheus/alerts.yml and
// deploy/grafana/sluice.json against what sluice exports: two real nodes
// (gRPC, gossip and HTTP on 127.0.0.1, named limits and Envoy rules from
// files) answer checks that are allowed, denied, shadow-denied, inline,
// forwarded and over an Envoy rule, and their /metrics is scraped; the
// proxy's metrics are read from cmd/sluice/proxy_admin.go's source (the
// proxy is package main). Every PromQL expression of the rules and of the
// dashboard's panels and variables is parsed with Prometheus's own parser,
// and each metric it selects must be in the scrape (or the proxy's, or a
// recording rule's), each label it matches, groups or joins on must be on
// those series, and each label value it matches exactly must have been
// seen.
func TestObservability(t *testing.T) {
	known := scrapeNodes(t)
	known.add("up", nil) // Prometheus's own, per target: job and instance
	proxy := proxySeries(t)
	for name, ls := range proxy {
		known[name] = ls
	}
	ruleMetrics := map[string]bool{}

	t.Run("alerts", func(t *testing.T) {
		var f struct {
			Groups []struct {
				Name  string
				Rules []struct {
					Record, Alert, Expr, For string
					Labels, Annotations      map[string]string
				}
			}
		}
		readYAML(t, alertsFile, &f)
		docs := readFile(t, runbookFile)
		names := map[string]bool{}
		for _, g := range f.Groups {
			if g.Name == "" || len(g.Rules) == 0 {
				t.Errorf("a group without a name or rules: %q", g.Name)
			}
			for _, r := range g.Rules {
				where := g.Name + "/" + r.Alert + r.Record
				if names[r.Alert+r.Record] {
					t.Errorf("%s: defined twice", where)
				}
				names[r.Alert+r.Record] = true
				c := &checker{t: t, where: where, known: known, proxy: proxy, used: ruleMetrics}
				out := c.check(r.Expr)
				if r.Record != "" {
					// A recording rule's series carry the labels its
					// expression keeps; later rules may select it.
					known[r.Record] = map[string]map[string]bool{}
					for l := range out {
						known[r.Record][l] = nil
					}
					continue
				}
				if _, err := model.ParseDuration(r.For); err != nil || r.For == "0m" || r.For == "0s" {
					t.Errorf("%s: for %q: every alert waits a while (debounce)", where, r.For)
				}
				if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
					t.Errorf("%s: severity %q, want critical, warning or info", where, s)
				}
				for _, a := range []string{"summary", "description", "runbook_url"} {
					if strings.TrimSpace(r.Annotations[a]) == "" {
						t.Errorf("%s: no %s annotation", where, a)
					}
				}
				// The runbook: docs/operations.md has a section named
				// after the alert, and runbook_url points to it.
				anchor := strings.ToLower(r.Alert)
				if !strings.HasSuffix(r.Annotations["runbook_url"], "/docs/operations.md#"+anchor) {
					t.Errorf("%s: runbook_url %q, want .../docs/operations.md#%s", where, r.Annotations["runbook_url"], anchor)
				}
				if !regexp.MustCompile(`(?m)^#+ ` + r.Alert + `$`).MatchString(docs) {
					t.Errorf("%s: docs/operations.md has no heading %q", where, r.Alert)
				}
			}
		}
		// What issue 22 asks the alerts to watch.
		for _, m := range []string{"up", "sluice_ready", "sluice_members",
			"sluice_degraded_checks_total", "sluice_keys_moved_without_state_total", "sluice_keys_owner_lost_total",
			"sluice_replica_behind_total", "sluice_keys_evicted_live_total", "sluice_handoff_timeouts_total",
			"sluice_ring_mismatch_total", "sluice_view_mismatch_total", "sluice_insecure",
			"sluice_limits_reloads_total", "sluice_rls_config_loads_total", "sluice_forward_errors_total",
			"sluice_inflight_refused_total", "sluice_rls_partial_charges_total", "sluice_proxy_cluster_ready"} {
			if !ruleMetrics[m] {
				t.Errorf("no alert reads %s", m)
			}
		}

		// Every alert has a unit test where it fires and one where it
		// does not (promtool runs them: make alerts-check).
		var tf struct {
			RuleFiles []string `yaml:"rule_files"`
			Tests     []struct {
				AlertRuleTest []struct {
					AlertName string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			}
		}
		readYAML(t, alertTestsFile, &tf)
		if !slices.Equal(tf.RuleFiles, []string{filepath.Base(alertsFile)}) {
			t.Errorf("%s tests rule files %v, want [%s]", alertTestsFile, tf.RuleFiles, filepath.Base(alertsFile))
		}
		fires, quiet := map[string]bool{}, map[string]bool{}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName] = true
				} else {
					quiet[a.AlertName] = true
				}
			}
		}
		for name := range names {
			if strings.Contains(name, ":") {
				continue // a recording rule
			}
			if !fires[name] || !quiet[name] {
				t.Errorf("%s: %s has no case where it fires (%v) or none where it does not (%v)", name, alertTestsFile, fires[name], quiet[name])
			}
		}
		for name := range fires {
			if !names[name] {
				t.Errorf("%s tests %s, which alerts.yml does not define", alertTestsFile, name)
			}
		}
	})

	t.Run("dashboard", func(t *testing.T) {
		var d struct {
			Title, UID    string
			SchemaVersion int `json:"schemaVersion"`
			Templating    struct {
				List []struct {
					Name, Type string
					Query      any
					Datasource *datasource
				}
			}
			Panels []panel
		}
		if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &d); err != nil {
			t.Fatalf("%s: %v", dashboardFile, err)
		}
		if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
			t.Fatalf("%s: title %q, uid %q, schemaVersion %d, %d panels", dashboardFile, d.Title, d.UID, d.SchemaVersion, len(d.Panels))
		}
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
			switch v.Type {
			case "datasource":
				if v.Query != "prometheus" {
					t.Errorf("variable %s: a datasource variable of %v, want prometheus", v.Name, v.Query)
				}
			case "query":
				if !v.Datasource.isVar() {
					t.Errorf("variable %s: datasource %+v, want the datasource variable", v.Name, v.Datasource)
				}
				q, _ := v.Query.(string)
				m := regexp.MustCompile(`^label_values\((.+), *(\w+)\)$`).FindStringSubmatch(q)
				if m == nil {
					t.Errorf("variable %s: query %q, want label_values(SELECTOR, LABEL)", v.Name, q)
					continue
				}
				c := &checker{t: t, where: "variable " + v.Name, known: known, proxy: proxy, used: map[string]bool{}}
				if out := c.check(grafanaVars(t, c.where, m[1], vars)); !out[m[2]] {
					t.Errorf("variable %s: %s has no label %s", v.Name, m[1], m[2])
				}
			}
		}
		for _, v := range []string{"datasource", "region", "instance"} {
			if vars[v] == "" {
				t.Errorf("no variable %s", v)
			}
		}
		if vars["datasource"] != "datasource" {
			t.Error("the variable datasource is not a datasource variable")
		}
		used := map[string]bool{}
		ids := map[int]bool{}
		var cells []gridPos
		for _, p := range d.Panels {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("%s: id missing or not unique", where)
			}
			ids[p.ID] = true
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v is outside the 24 columns", where, g)
			}
			for _, o := range cells {
				if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
					t.Errorf("%s: gridPos %+v overlaps %+v", where, g, o)
				}
			}
			cells = append(cells, g)
			if p.Type == "row" {
				if len(p.Targets) > 0 {
					t.Errorf("%s: a row with targets", where)
				}
				continue
			}
			if p.Title == "" || p.Type == "" {
				t.Errorf("%s: no title or type", where)
			}
			if !p.Datasource.isVar() {
				t.Errorf("%s: datasource %+v, want the datasource variable", where, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no target", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("%s: target refId %q missing or repeated", where, tg.RefID)
				}
				refs[tg.RefID] = true
				if !tg.Datasource.isVar() {
					t.Errorf("%s, target %s: datasource %+v, want the datasource variable", where, tg.RefID, tg.Datasource)
				}
				if !strings.Contains(tg.Expr, `instance=~"$instance"`) && !strings.Contains(tg.Expr, `instance=~"$proxy"`) {
					t.Errorf("%s, target %s: %q does not follow the node (or proxy) variable", where, tg.RefID, tg.Expr)
				}
				c := &checker{t: t, where: where + ", target " + tg.RefID, known: known, proxy: proxy, used: used}
				c.check(grafanaVars(t, c.where, tg.Expr, vars))
			}
		}
		// What issue 22 asks the dashboard to show.
		for _, m := range []string{"sluice_checks_total", "sluice_degraded_checks_total",
			"sluice_forward_duration_seconds_bucket", "sluice_forward_batch_size_bucket",
			"sluice_handed_off_keys_total", "sluice_replica_behind_total", "sluice_keys", "sluice_members",
			"sluice_ring_epoch", "sluice_rls_requests_total", "sluice_rls_rule_over_limit_hits_total",
			"sluice_keys_moved_without_state_total", "sluice_keys_owner_lost_total", "sluice_keys_evicted_live_total",
			"sluice_handoff_timeouts_total", "sluice_inflight_refused_total", "sluice_proxy_requests_total"} {
			if !used[m] {
				t.Errorf("no panel shows %s", m)
			}
		}
	})
}

// datasource is a panel's, a target's or a variable's data source.
type datasource struct{ Type, UID string }

// isVar reports whether d is the dashboard's Prometheus datasource
// variable.
func (d *datasource) isVar() bool {
	return d != nil && d.Type == "prometheus" && d.UID == "${datasource}"
}

type gridPos struct{ H, W, X, Y int }

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource *datasource
	GridPos    gridPos `json:"gridPos"`
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string
		Datasource *datasource
	}
}

// grafanaVars replaces the dashboard's variables in expr with what
// Prometheus could be sent ($__rate_interval: 5m; a variable: .*, every
// one of them inside a regexp matcher), failing t on a variable the
// dashboard does not define.
func grafanaVars(t *testing.T, where, expr string, vars map[string]string) string {
	t.Helper()
	expr = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(expr)
	return regexp.MustCompile(`\$\{?(\w+)\}?`).ReplaceAllStringFunc(expr, func(v string) string {
		name := strings.Trim(v, "${}")
		if vars[name] == "" {
			t.Errorf("%s: %s is not a variable of the dashboard", where, v)
		}
		if !regexp.MustCompile(`=~"[^"]*` + regexp.QuoteMeta(v)).MatchString(expr) {
			t.Errorf("%s: %s is used outside a regexp matcher (=~)", where, v)
		}
		return ".*"
	})
}

// reporter is where a checker reports: a *testing.T, or a recorder in
// TestCheckerFindsMistakes.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// checker checks PromQL expressions against known series.
type checker struct {
	t     reporter
	where string
	known series
	proxy series          // the proxy's metrics (label values: its source's strings)
	used  map[string]bool // every metric name the expressions select
}

// check parses expr and checks it (see labels), returning the labels of
// its result.
func (c *checker) check(expr string) map[string]bool {
	c.t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		c.t.Errorf("%s: %q does not parse: %v", c.where, expr, err)
		return nil
	}
	return c.labels(e)
}

func (c *checker) errorf(format string, args ...any) {
	c.t.Helper()
	c.t.Errorf("%s: %s", c.where, fmt.Sprintf(format, args...))
}

// labels returns the label names the result of e carries (for a scalar,
// none), reporting every selector of an unknown metric or label, every
// exact label value never seen, and every grouping, on() or group_left()
// label that its operand does not have.
func (c *checker) labels(e parser.Expr) map[string]bool {
	c.t.Helper()
	switch e := e.(type) {
	case *parser.VectorSelector:
		return c.selector(e)
	case *parser.MatrixSelector:
		return c.labels(e.VectorSelector)
	case *parser.SubqueryExpr:
		return c.labels(e.Expr)
	case *parser.ParenExpr:
		return c.labels(e.Expr)
	case *parser.UnaryExpr:
		return c.labels(e.Expr)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return map[string]bool{}
	case *parser.Call:
		out := map[string]bool{}
		for _, a := range e.Args {
			for l := range c.labels(a) {
				out[l] = true
			}
		}
		switch e.Func.Name {
		case "histogram_quantile":
			if !out["le"] {
				c.errorf("histogram_quantile of series without le: %s", e)
			}
			delete(out, "le")
		case "label_replace", "label_join":
			if s, ok := e.Args[1].(*parser.StringLiteral); ok {
				out[s.Val] = true
			}
		case "vector", "scalar", "time":
			out = map[string]bool{}
		}
		return out
	case *parser.AggregateExpr:
		in := c.labels(e.Expr)
		if e.Param != nil {
			c.labels(e.Param)
		}
		out := map[string]bool{}
		if e.Without {
			out = maps.Clone(in)
			for _, g := range e.Grouping {
				delete(out, g)
			}
		} else {
			for _, g := range e.Grouping {
				if !in[g] {
					c.errorf("%s by (%s): no such label on %s", e.Op, g, e.Expr)
				}
				out[g] = true
			}
		}
		if e.Op == parser.COUNT_VALUES {
			out[e.Param.(*parser.StringLiteral).Val] = true
		}
		return out
	case *parser.BinaryExpr:
		l, r := c.labels(e.LHS), c.labels(e.RHS)
		if e.LHS.Type() == parser.ValueTypeScalar {
			return r
		}
		if e.RHS.Type() == parser.ValueTypeScalar {
			return l
		}
		vm := e.VectorMatching
		if vm == nil {
			return l
		}
		if vm.On {
			for _, m := range vm.MatchingLabels {
				if !l[m] || !r[m] {
					c.errorf("on (%s): not on both sides of %s", m, e)
				}
			}
		}
		switch {
		case e.Op == parser.LOR:
			out := maps.Clone(l)
			maps.Copy(out, r)
			return out
		case vm.Card == parser.CardManyToOne:
			out := maps.Clone(l)
			for _, inc := range vm.Include {
				if !r[inc] {
					c.errorf("group_left (%s): not on %s", inc, e.RHS)
				}
				out[inc] = true
			}
			return out
		case vm.Card == parser.CardOneToMany:
			out := maps.Clone(r)
			for _, inc := range vm.Include {
				if !l[inc] {
					c.errorf("group_right (%s): not on %s", inc, e.LHS)
				}
				out[inc] = true
			}
			return out
		}
		return l
	}
	c.errorf("unexpected expression %T: %s", e, e)
	return nil
}

// selector checks a vector selector: its metric is known, each label it
// matches is on that metric, each value it matches exactly (or each
// alternative of a|b) was seen. It returns the metric's labels.
func (c *checker) selector(vs *parser.VectorSelector) map[string]bool {
	c.t.Helper()
	c.used[vs.Name] = true
	ls, ok := c.known[vs.Name]
	if !ok {
		c.errorf("%s: no such metric in a node's /metrics, the proxy's or a recording rule", vs.Name)
		return nil
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName {
			continue
		}
		values, ok := ls[m.Name]
		if !ok {
			c.errorf("%s: %s has no label %s", vs, vs.Name, m.Name)
			continue
		}
		if values == nil {
			continue // job, instance: the scrape's
		}
		var want []string
		switch {
		case m.Type == labels.MatchEqual:
			want = []string{m.Value}
		case m.Type == labels.MatchRegexp && regexp.MustCompile(`^[\w|]+$`).MatchString(m.Value):
			want = strings.Split(m.Value, "|")
		}
		for _, v := range want {
			if !values[v] {
				c.errorf("%s: %s{%s=%q} was never seen (seen: %v)", vs, vs.Name, m.Name, v, slices.Sorted(maps.Keys(values)))
			}
		}
	}
	out := map[string]bool{}
	for l := range ls {
		out[l] = true
	}
	return out
}

// scrapeNodes starts two nodes with HTTP, named limits and Envoy rules
// from files, makes them answer checks of every kind the rules and panels
// count, and returns the series of both nodes' /metrics.
func scrapeNodes(t *testing.T) series {
	t.Helper()
	dir := t.TempDir()
	limitsPath := filepath.Join(dir, "limits.yaml")
	rulesPath := filepath.Join(dir, "edge.yaml")
	writeFile(t, limitsPath, []byte("limits:\n  api:\n    limit: 1\n    window: 1h\n  signup:\n    limit: 1\n    window: 1h\n    shadow: true\n"))
	writeFile(t, rulesPath, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n"))
	log := testcluster.Logger()
	var nodes []*rpc.Node
	for i := 1; i <= 2; i++ {
		lim, err := limits.Open(limitsPath, log)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := rls.Open(rulesPath, rls.LoadOptions{}, log)
		if err != nil {
			t.Fatal(err)
		}
		cfg := rpc.NodeConfig{
			Name: fmt.Sprintf("node%d", i), GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Profile: cluster.Local, Logger: log, LeaveTimeout: time.Second, SettleTime: 10 * time.Millisecond,
			Limits: lim, RLSSource: rules, Version: "test",
		}
		if i > 1 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		n, err := rpc.StartNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = n.Close(ctx)
		})
		nodes = append(nodes, n)
	}
	testcluster.WaitRingAgrees(t, nodes)
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	post := func(path, body string) int {
		t.Helper()
		resp, err := hc.Post("http://"+nodes[0].HTTPAddr()+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	check := func(name, key, numbers string) {
		t.Helper()
		if code := post("/v1/check", `{"checks":[{"name":"`+name+`","key":"`+key+`"`+numbers+`}]}`); code != http.StatusOK {
			t.Fatalf("POST /v1/check %s %s: %d", name, key, code)
		}
	}
	// Each key twice: allowed, then denied (or shadow-denied); the one
	// that node2 owns is forwarded, so the per-peer series exist.
	for _, key := range []string{testcluster.KeyOwnedBy(t, nodes[0], "api", "user:", "node1"), testcluster.KeyOwnedBy(t, nodes[0], "api", "user:", "node2")} {
		check("api", key, "")
		check("api", key, "")
		check("signup", key, "")
		check("signup", key, "")
		check("other", key, `,"limit":5,"window_ms":60000`)
	}
	envoy := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`
	if code := post("/json", envoy); code != http.StatusOK {
		t.Fatalf("POST /json, first: %d", code)
	}
	if code := post("/json", envoy); code != http.StatusTooManyRequests {
		t.Fatalf("POST /json, over the limit: %d", code)
	}

	out := series{}
	for _, n := range nodes {
		resp, err := hc.Get("http://" + n.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s /metrics: %v", n.Name(), err)
		}
		out.addFamilies(fams)
	}
	// The scrape holds what the checks above made (else the checks of
	// the expressions would prove little).
	for name, lv := range map[string][2]string{
		"sluice_checks_total":                   {"outcome", "shadow_denied"},
		"sluice_forward_calls_total":            {"peer", "node2"},
		"sluice_rls_rule_over_limit_hits_total": {"domain", "edge"},
		"sluice_node_info":                      {"member", "node2"},
	} {
		if !out[name][lv[0]][lv[1]] {
			t.Fatalf("/metrics has no %s{%s=%q}", name, lv[0], lv[1])
		}
	}
	return out
}

// proxySeries reads the metrics of sluice proxy from the source that
// defines them (cmd/sluice/proxy_admin.go): each prometheus.New*(Opts{Name:
// ...}, []string{labels}) call. A label's values are the string literals
// of that file (the outcome, kind and result constants among them).
func proxySeries(t *testing.T) series {
	t.Helper()
	fset := token.NewFileSet()
	f, err := goparser.ParseFile(fset, proxyMetricsGo, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	strs := map[string]bool{}
	out := series{}
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				strs[s] = true
			}
		}
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
			return true
		}
		opts, ok := call.Args[0].(*ast.CompositeLit)
		if !ok {
			return true
		}
		var name string
		for _, el := range opts.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
					if lit, ok := kv.Value.(*ast.BasicLit); ok {
						name, _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
		if name == "" {
			return true
		}
		var labelNames []string
		if len(call.Args) > 1 {
			if lst, ok := call.Args[1].(*ast.CompositeLit); ok {
				for _, el := range lst.Elts {
					if lit, ok := el.(*ast.BasicLit); ok {
						s, _ := strconv.Unquote(lit.Value)
						labelNames = append(labelNames, s)
					}
				}
			}
		}
		out.add(name, nil)
		for _, l := range labelNames {
			out[name][l] = strs // filled as the walk goes on
		}
		return true
	})
	// The extractor found what it must (else it proves nothing).
	if out["sluice_proxy_requests_total"]["outcome"] == nil || out["sluice_proxy_cluster_ready"] == nil {
		t.Fatalf("%s: no sluice_proxy_requests_total{outcome} or sluice_proxy_cluster_ready found: %v", proxyMetricsGo, slices.Sorted(maps.Keys(out)))
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(readFile(t, path)), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
