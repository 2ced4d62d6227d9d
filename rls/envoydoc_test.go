package rls_test

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// The Envoy bootstrap in docs/envoy.md is a valid Envoy v3 configuration
// (every field known, every constraint of Envoy's API met), and its rate
// limit filter points at the sluice cluster over HTTP/2.
func TestEnvoyDocBootstrap(t *testing.T) {
	doc, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "# envoy.yaml (static bootstrap)\n"
	start := strings.Index(string(doc), marker)
	if start < 0 {
		t.Fatalf("docs/envoy.md has no %q block", marker)
	}
	block := string(doc[start:])
	block = block[:strings.Index(block, "```")]
	js, err := yaml.YAMLToJSON([]byte(block))
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v", err)
	}
	check := func(what string, m validator) {
		t.Helper()
		if err := m.ValidateAll(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	check("bootstrap", &b)
	lis := b.GetStaticResources().GetListeners()
	if len(lis) != 1 {
		t.Fatalf("%d listeners", len(lis))
	}
	var hcm hcmv3.HttpConnectionManager
	if err := lis[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	check("http_connection_manager", &hcm)
	var rl ratelimitfilterv3.RateLimit
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	check("ratelimit filter", &rl)
	if rl.GetDomain() != "edge" || rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "sluice" ||
		rl.GetTimeout().AsDuration().Milliseconds() != 100 || rl.GetFailureModeDeny() {
		t.Errorf("ratelimit filter: %v", &rl)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "sluice" {
			continue
		}
		var opts upstreamhttpv3.HttpProtocolOptions
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil {
			t.Fatal(err)
		}
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Error("the sluice cluster does not speak HTTP/2")
		}
		return
	}
	t.Error("no sluice cluster")
}
