package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ruleGroup is a Prometheus rule group, as alerts.yml and a
// PrometheusRule's spec.groups hold it (every field sluice's rules use;
// decoding refuses others).
type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []struct {
		Record      string            `json:"record,omitempty"`
		Alert       string            `json:"alert,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"rules"`
}

// objectMeta is the metadata of prometheus-operator's objects.
type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule.
type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

// secretKey is a SecretKeySelector.
type secretKey struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// serviceMonitor is monitoring.coreos.com/v1 ServiceMonitor, the fields
// the chart sets.
type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Scheme        string `json:"scheme"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			TLSConfig     struct {
				CA struct {
					Secret *secretKey `json:"secret"`
				} `json:"ca"`
				Cert *struct {
					Secret *secretKey `json:"secret"`
				} `json:"cert,omitempty"`
				KeySecret *secretKey `json:"keySecret,omitempty"`
			} `json:"tlsConfig"`
			Authorization *struct {
				Type        string     `json:"type"`
				Credentials *secretKey `json:"credentials"`
			} `json:"authorization,omitempty"`
			Relabelings []struct {
				Action      string `json:"action"`
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// monitoringArgs turn on the three monitoring objects.
var monitoringArgs = []string{"--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true",
	"--set", "serviceMonitor.labels.release=kube-prometheus-stack", "--set", "prometheusRule.labels.release=kube-prometheus-stack"}

// TestChartMonitoringOff: the defaults render no monitoring object.
func TestChartMonitoringOff(t *testing.T) {
	m := mustRender(t)
	if len(m.monitoring) != 0 || m.configMaps["sluice-dashboard"] != nil {
		t.Errorf("monitoring objects by default: %v, dashboard %v", keys(m.monitoring), m.configMaps["sluice-dashboard"] != nil)
	}
}

// TestChartMonitoring renders the ServiceMonitor, the PrometheusRule and
// the dashboard ConfigMap: the rule's groups are alerts.yml's, exactly;
// the dashboard is sluice.json, byte for byte, labelled for Grafana's
// sidecar; the ServiceMonitor scrapes every pod (the headless Service, not
// the client one) over HTTPS with the scraper's certificate (or token) as
// job sluice, which the alerts read; helm lint passes; and the chart's
// files are links to deploy/prometheus and deploy/grafana (one source).
func TestChartMonitoring(t *testing.T) {
	helm := helmBinary(t)
	lint := exec.Command(helm, append(append([]string{"lint", "--strict", chartDir}, imageArgs...), monitoringArgs...)...)
	if out, err := lint.CombinedOutput(); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	for _, l := range []struct{ link, target string }{
		{"helm/sluice/files/alerts.yml", "prometheus/alerts.yml"},
		{"helm/sluice/files/sluice.json", "grafana/sluice.json"},
	} {
		dest, err := os.Readlink(l.link)
		if err != nil || filepath.Clean(filepath.Join(filepath.Dir(l.link), dest)) != l.target {
			t.Errorf("%s: a link to %s, or a copy would drift (%q, %v)", l.link, l.target, dest, err)
		}
	}

	m := mustRender(t, monitoringArgs...)

	// The PrometheusRule: alerts.yml's groups.
	var rule prometheusRule
	if err := yaml.UnmarshalStrict(m.monitoring["PrometheusRule/sluice"], &rule); err != nil {
		t.Fatalf("PrometheusRule sluice: %v", err)
	}
	var alerts struct {
		Groups []ruleGroup `json:"groups"`
	}
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &alerts); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	if len(alerts.Groups) == 0 || !reflect.DeepEqual(rule.Spec.Groups, alerts.Groups) {
		t.Errorf("the PrometheusRule's groups differ from alerts.yml's (%d groups, alerts.yml %d)", len(rule.Spec.Groups), len(alerts.Groups))
	}
	if rule.Metadata.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v: want prometheusRule.labels", rule.Metadata.Labels)
	}

	// The ServiceMonitor.
	var sm serviceMonitor
	if err := yaml.UnmarshalStrict(m.monitoring["ServiceMonitor/sluice"], &sm); err != nil {
		t.Fatalf("ServiceMonitor sluice: %v", err)
	}
	if sm.Metadata.Labels["release"] != "kube-prometheus-stack" || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"sluice"}) {
		t.Errorf("ServiceMonitor labels %v, namespaces %v", sm.Metadata.Labels, sm.Spec.NamespaceSelector.MatchNames)
	}
	var selected []string
	for name, svc := range m.services {
		match := true
		for k, v := range sm.Spec.Selector.MatchLabels {
			match = match && svc.Labels[k] == v
		}
		if match {
			selected = append(selected, name)
		}
	}
	if !slices.Equal(selected, []string{"sluice-peers"}) {
		t.Fatalf("the ServiceMonitor selects the Services %v, want sluice-peers alone (every pod, ready or not; the client Service would skip nodes not ready)", selected)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("endpoints %+v", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	ss := m.statefulSets["sluice"]
	var httpPort int32
	for _, cp := range ss.Spec.Template.Spec.Containers[0].Ports {
		if cp.Name == "http" {
			httpPort = cp.ContainerPort
		}
	}
	if !slices.ContainsFunc(m.services["sluice-peers"].Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == ep.Port && p.TargetPort.String() == "http" && p.Port == httpPort
	}) {
		t.Errorf("the ServiceMonitor scrapes port %q, not the headless Service's port to the pods' HTTP port", ep.Port)
	}
	if ep.Scheme != "https" || ep.Path != "/metrics" {
		t.Errorf("scrapes %s %s, want https /metrics", ep.Scheme, ep.Path)
	}
	scraper := secretKey{Name: "sluice-scraper", Key: "ca.pem"}
	if ep.TLSConfig.CA.Secret == nil || *ep.TLSConfig.CA.Secret != scraper ||
		ep.TLSConfig.Cert == nil || ep.TLSConfig.Cert.Secret == nil || *ep.TLSConfig.Cert.Secret != (secretKey{"sluice-scraper", "tls.crt"}) ||
		ep.TLSConfig.KeySecret == nil || *ep.TLSConfig.KeySecret != (secretKey{"sluice-scraper", "tls.key"}) || ep.Authorization != nil {
		t.Errorf("tlsConfig %+v, authorization %+v: want the CA and a client certificate of sluice-scraper (mtls)", ep.TLSConfig, ep.Authorization)
	}
	job := ""
	for _, r := range ep.Relabelings {
		if r.TargetLabel == "job" {
			job = r.Replacement
		}
	}
	if job != "sluice" || !strings.Contains(string(b), `up{job="sluice"}`) {
		t.Errorf("the scraped job is %q; alerts.yml's availability alert reads up{job=\"sluice\"}", job)
	}

	// The dashboard, for the sidecar.
	cm := m.configMaps["sluice-dashboard"]
	if cm == nil {
		t.Fatal("no ConfigMap sluice-dashboard")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v: want grafana_dashboard: \"1\" (the sidecar's default)", cm.Labels)
	}
	want, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["sluice.json"] != string(want) {
		t.Errorf("the dashboard ConfigMap's sluice.json differs from deploy/grafana/sluice.json")
	}
	var dash struct {
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["sluice.json"]), &dash); err != nil || dash.UID == "" || len(dash.Panels) == 0 {
		t.Errorf("the dashboard: uid %q, %d panels, %v", dash.UID, len(dash.Panels), err)
	}

	// With tokens the ServiceMonitor sends the scraper's token instead.
	m = mustRender(t, append(slices.Clone(monitoringArgs), "--set", "clientAuth=token", "--set", "serviceMonitor.secret=prom")...)
	sm = serviceMonitor{}
	if err := yaml.UnmarshalStrict(m.monitoring["ServiceMonitor/sluice"], &sm); err != nil {
		t.Fatal(err)
	}
	ep = sm.Spec.Endpoints[0]
	if a := ep.Authorization; a == nil || a.Type != "Bearer" || a.Credentials == nil || *a.Credentials != (secretKey{"prom", "token"}) ||
		ep.TLSConfig.Cert != nil || ep.TLSConfig.KeySecret != nil || ep.TLSConfig.CA.Secret == nil || *ep.TLSConfig.CA.Secret != (secretKey{"prom", "ca.pem"}) {
		t.Errorf("clientAuth token: authorization %+v, tlsConfig %+v: want the token and CA of prom, no certificate", a, ep.TLSConfig)
	}
}
