package rls_test

import (
	"net"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"
)

// The Envoy bootstrap under "Envoy" in docs/envoy.md is a valid Envoy v3
// configuration (every field known, every constraint of Envoy's API met),
// and its rate limit filter points at the sluice cluster over HTTP/2.
func TestEnvoyDocBootstrap(t *testing.T) {
	const marker = "# envoy.yaml (static bootstrap)"
	var found *docBlock
	for _, b := range envoyYAMLBlocks(t) {
		if b.firstLine() == marker {
			found = &b
		}
	}
	if found == nil {
		t.Fatalf("docs/envoy.md has no %q block", marker)
	}
	b := envoyBootstrap(t, *found)
	if lis := b.GetStaticResources().GetListeners(); len(lis) != 1 {
		t.Fatalf("%d listeners", len(lis))
	}
	_, rl := rateLimitFilter(t, b)
	if rl.GetDomain() != "edge" || rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "sluice" ||
		rl.GetTimeout().AsDuration().Milliseconds() != 100 || rl.GetFailureModeDeny() {
		t.Errorf("ratelimit filter: %v", rl)
	}
	c := sluiceCluster(t, b, rl)
	var opts upstreamhttpv3.HttpProtocolOptions
	if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil {
		t.Fatal(err)
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("the sluice cluster does not speak HTTP/2")
	}
}

// Every Envoy configuration in docs/envoy.md parses strictly into
// go-control-plane's types and meets every constraint of Envoy's API, the
// typed configs inside (the HTTP connection manager, its filters, the
// UpstreamTlsContext) included: each whole bootstrap, the token variant's
// rate_limit_service, and the Istio EnvoyFilter's patches. Every bootstrap
// speaks to sluice as the secured set-up says: HTTP/2 over TLS, verifying
// the nodes by the CA and a node's URI SAN, with SNI and ALPN h2.
func TestEnvoyDocConfigsValid(t *testing.T) {
	bootstraps := 0
	for _, blk := range envoyYAMLBlocks(t) {
		what := blk.firstLine()
		if !blk.isBootstrap() {
			if rateLimitServicePart(t, blk).GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" {
				t.Errorf("%s: no envoy_grpc cluster", what)
			}
			continue
		}
		bootstraps++
		b := envoyBootstrap(t, blk)
		_, rl := rateLimitFilter(t, b)
		c := sluiceCluster(t, b, rl)
		var opts upstreamhttpv3.HttpProtocolOptions
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("%s: the %s cluster does not speak HTTP/2 (%v)", what, c.GetName(), err)
		}
		utc := upstreamTLS(t, c)
		if utc == nil {
			t.Errorf("%s: the %s cluster is plaintext", what, c.GetName())
			continue
		}
		vc := utc.GetCommonTlsContext().GetValidationContext()
		if vc.GetTrustedCa().GetFilename() == "" || utc.GetSni() == "" || !slices.Equal(utc.GetCommonTlsContext().GetAlpnProtocols(), []string{"h2"}) ||
			!slices.ContainsFunc(vc.GetMatchTypedSubjectAltNames(), func(m *tlsv3.SubjectAltNameMatcher) bool {
				return m.GetSanType() == tlsv3.SubjectAltNameMatcher_URI && m.GetMatcher().GetPrefix() == "spiffe://sluice/peer/"
			}) {
			t.Errorf("%s: the %s cluster's TLS: %v", what, c.GetName(), utc)
		}
	}
	if bootstraps < 2 {
		t.Errorf("%d bootstraps, want the secured set-up's and Envoy's", bootstraps)
	}

	// Istio's EnvoyFilter patches: the filter it inserts, and what it
	// merges into the virtual host.
	patches := 0
	for _, blk := range envoyDocBlocks(t) {
		if blk.lang != "yaml" || !strings.Contains(blk.text, "kind: EnvoyFilter") {
			continue
		}
		var doc struct {
			Spec struct {
				ConfigPatches []struct {
					ApplyTo string `yaml:"applyTo"`
					Patch   struct {
						Value any `yaml:"value"`
					} `yaml:"patch"`
				} `yaml:"configPatches"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal([]byte(blk.text), &doc); err != nil {
			t.Fatalf("EnvoyFilter, line %d: %v", blk.line, err)
		}
		for _, p := range doc.Spec.ConfigPatches {
			js, err := yaml.Marshal(p.Patch.Value)
			if err != nil {
				t.Fatal(err)
			}
			switch p.ApplyTo {
			case "HTTP_FILTER":
				var f hcmv3.HttpFilter
				parseEnvoyYAML(t, "the EnvoyFilter's HTTP_FILTER patch", string(js), &f)
				var rl ratelimitfilterv3.RateLimit
				if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
					t.Errorf("the EnvoyFilter's filter: %v", err)
				}
			case "VIRTUAL_HOST":
				// A part of a virtual host (no name or domains): strict
				// parsing, no validation of the whole.
				var vh routev3.VirtualHost
				j, err := yaml.YAMLToJSON(js)
				if err == nil {
					err = protojson.Unmarshal(j, &vh)
				}
				if err != nil || len(vh.GetRateLimits()) == 0 {
					t.Errorf("the EnvoyFilter's VIRTUAL_HOST patch: %v %v", &vh, err)
				}
			default:
				t.Errorf("the EnvoyFilter's %s patch: not checked here", p.ApplyTo)
			}
			patches++
		}
	}
	if patches == 0 {
		t.Error("no EnvoyFilter patch found")
	}
}

// Every `sluice serve` command in docs/envoy.md passes protected mode, by
// its rule: a command whose addresses all stay on loopback (the defaults
// do), or that encrypts gossip and serves TLS with client authentication,
// or that says --insecure. (TestEnvoyDocSecuredMutualTLS and
// TestEnvoyDocSecuredToken also start the secured ones, through
// rpc.StartNode's own protected mode.)
func TestEnvoyDocServeCommandsProtected(t *testing.T) {
	n := 0
	for _, b := range envoyDocBlocks(t) {
		if b.lang != "sh" {
			continue
		}
		for _, c := range shellCommands(b.text) {
			if len(c) < 2 || c[0] != "sluice" || c[1] != "serve" {
				continue
			}
			n++
			f := cliFlags(t, c[2:], "insecure")
			last := func(name, def string) string {
				if v := f[name]; len(v) > 0 {
					return v[len(v)-1]
				}
				return def
			}
			exposed := ""
			for _, a := range []string{last("grpc-addr", "127.0.0.1:7070"), last("gossip-addr", "127.0.0.1:7946"), last("http-addr", "127.0.0.1:7080"), last("advertise-addr", "")} {
				host, _, err := net.SplitHostPort(a)
				if err != nil {
					host = a
				}
				if ip := net.ParseIP(host); a != "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
					exposed = a
				}
			}
			secured := f["gossip-key-file"] != nil && f["tls-cert"] != nil && f["tls-key"] != nil && f["tls-ca"] != nil && last("client-auth", "mtls") != "none"
			if exposed != "" && !secured && last("insecure", "false") != "true" {
				t.Errorf("line %d: `%s` listens on %s without encrypted gossip, TLS and client authentication: protected mode refuses it", b.line, strings.Join(c, " "), exposed)
			}
		}
	}
	if n < 2 {
		t.Errorf("%d serve commands, want the secured set-up's two at least", n)
	}
}
