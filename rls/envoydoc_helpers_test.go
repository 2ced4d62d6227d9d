package rls_test

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// The helpers of the docs/envoy.md tests: the document's code blocks, its
// Envoy configurations parsed strictly into go-control-plane's types (the
// blank imports above register the typed configs they hold, so that their
// Any fields resolve), and its shell commands.

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// docBlock is one fenced code block of a Markdown document.
type docBlock struct {
	lang string // the fence's info string: sh, yaml, text, ...
	text string // the lines between the fences, each ending in "\n"
	line int    // the line of the opening fence, from 1
}

// firstLine returns the block's first line.
func (b docBlock) firstLine() string {
	first, _, _ := strings.Cut(b.text, "\n")
	return first
}

// envoyDocBlocks returns the fenced code blocks of docs/envoy.md in order.
func envoyDocBlocks(t *testing.T) []docBlock {
	t.Helper()
	doc, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	lines := strings.Split(string(doc), "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		b := docBlock{lang: strings.TrimSpace(lang), line: i + 1}
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			b.text += lines[i] + "\n"
		}
		out = append(out, b)
	}
	return out
}

// envoyYAMLBlocks returns the blocks of docs/envoy.md that hold Envoy's
// own configuration: YAML whose first line is a comment naming envoy.yaml.
func envoyYAMLBlocks(t *testing.T) []docBlock {
	t.Helper()
	var out []docBlock
	for _, b := range envoyDocBlocks(t) {
		if b.lang == "yaml" && strings.HasPrefix(b.firstLine(), "# envoy.yaml") {
			out = append(out, b)
		}
	}
	return out
}

// isBootstrap reports whether an Envoy block is a whole bootstrap (rather
// than a part of one).
func (b docBlock) isBootstrap() bool { return strings.Contains(b.text, "\nstatic_resources:") }

// parseEnvoyYAML parses YAML into m strictly (protojson refuses unknown
// fields and unresolvable Any types) and validates it deeply (see
// validateDeep); what names the block in errors.
func parseEnvoyYAML(t *testing.T, what, text string, m proto.Message) {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%s: not a valid %s: %v", what, m.ProtoReflect().Descriptor().FullName(), err)
	}
	validateDeep(t, what, m)
}

// rateLimitServicePart parses an Envoy block that is a part of the rate
// limit filter's config holding its rate_limit_service alone, strictly, and
// validates that (the filter's other required fields are not there).
func rateLimitServicePart(t *testing.T, b docBlock) *ratelimitconfv3.RateLimitServiceConfig {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(b.text))
	if err != nil {
		t.Fatalf("%s: %v", b.firstLine(), err)
	}
	var rl ratelimitfilterv3.RateLimit
	if err := protojson.Unmarshal(js, &rl); err != nil {
		t.Fatalf("%s: not a part of a rate limit filter's config: %v", b.firstLine(), err)
	}
	if rl.GetRateLimitService() == nil || !proto.Equal(&rl, &ratelimitfilterv3.RateLimit{RateLimitService: rl.GetRateLimitService()}) {
		t.Fatalf("%s: want rate_limit_service alone", b.firstLine())
	}
	validateDeep(t, b.firstLine(), rl.GetRateLimitService())
	return rl.GetRateLimitService()
}

// envoyBootstrap parses an Envoy block as a whole bootstrap.
func envoyBootstrap(t *testing.T, b docBlock) *bootstrapv3.Bootstrap {
	t.Helper()
	var bs bootstrapv3.Bootstrap
	parseEnvoyYAML(t, b.firstLine(), b.text, &bs)
	return &bs
}

// validateDeep runs ValidateAll (every constraint of Envoy's API) on m and
// on every message packed in an Any inside it, at any depth: ValidateAll
// itself does not look into an Any, and the typed configs (the HTTP
// connection manager, its filters, the TLS transport socket) live in Anys.
func validateDeep(t *testing.T, what string, m proto.Message) {
	t.Helper()
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %s: %v", what, m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	for _, a := range anysIn(m.ProtoReflect()) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: %s: %v", what, a.GetTypeUrl(), err)
			continue
		}
		validateDeep(t, what, inner)
	}
}

// anysIn returns the Any messages set anywhere in m, not looking into them.
func anysIn(m protoreflect.Message) []*anypb.Any {
	var out []*anypb.Any
	visit := func(v protoreflect.Message) {
		if a, ok := v.Interface().(*anypb.Any); ok {
			out = append(out, a)
			return
		}
		out = append(out, anysIn(v)...)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				visit(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message())
		}
		return true
	})
	return out
}

// rateLimitFilter returns the HTTP connection manager of the bootstrap's
// first listener and its rate limit filter's config.
func rateLimitFilter(t *testing.T, bs *bootstrapv3.Bootstrap) (*hcmv3.HttpConnectionManager, *ratelimitfilterv3.RateLimit) {
	t.Helper()
	lis := bs.GetStaticResources().GetListeners()
	if len(lis) == 0 {
		t.Fatal("no listener")
	}
	var hcm hcmv3.HttpConnectionManager
	if err := lis[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	for _, f := range hcm.GetHttpFilters() {
		var rl ratelimitfilterv3.RateLimit
		if f.GetTypedConfig().MessageIs(&rl) {
			if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
				t.Fatal(err)
			}
			return &hcm, &rl
		}
	}
	t.Fatal("no rate limit filter")
	return nil, nil
}

// setRateLimitService returns a copy of bs whose rate limit filter has
// svc as its rate_limit_service.
func setRateLimitService(t *testing.T, bs *bootstrapv3.Bootstrap, svc *ratelimitconfv3.RateLimitServiceConfig) *bootstrapv3.Bootstrap {
	t.Helper()
	out := proto.CloneOf(bs)
	fc := out.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0]
	var hcm hcmv3.HttpConnectionManager
	if err := fc.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	for _, f := range hcm.GetHttpFilters() {
		var rl ratelimitfilterv3.RateLimit
		if !f.GetTypedConfig().MessageIs(&rl) {
			continue
		}
		if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
			t.Fatal(err)
		}
		rl.RateLimitService = svc
		f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rl)}
	}
	fc.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &hcm)}
	return out
}

// mustAny packs m.
func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sluiceCluster returns the cluster the rate limit filter calls.
func sluiceCluster(t *testing.T, bs *bootstrapv3.Bootstrap, rl *ratelimitfilterv3.RateLimit) *clusterv3.Cluster {
	t.Helper()
	name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %q, the rate limit filter's", name)
	return nil
}

// upstreamTLS returns the UpstreamTlsContext of a cluster's transport
// socket, or nil when it has none (plaintext).
func upstreamTLS(t *testing.T, c *clusterv3.Cluster) *tlsv3.UpstreamTlsContext {
	t.Helper()
	ts := c.GetTransportSocket()
	if ts == nil {
		return nil
	}
	var utc tlsv3.UpstreamTlsContext
	if err := ts.GetTypedConfig().UnmarshalTo(&utc); err != nil {
		t.Fatalf("cluster %s: transport socket %s: %v", c.GetName(), ts.GetName(), err)
	}
	return &utc
}

// shellCommands splits a shell block into commands, each a list of words:
// a line ending in a backslash continues on the next, a word starting with
// '#' ends the line, and words are split on blanks. (The commands parsed
// here quote nothing.)
func shellCommands(text string) [][]string {
	var out [][]string
	var cur []string
	for _, line := range strings.Split(text, "\n") {
		cont := strings.HasSuffix(strings.TrimRight(line, " "), "\\")
		line = strings.TrimSuffix(strings.TrimRight(line, " "), "\\")
		for _, w := range strings.Fields(line) {
			if strings.HasPrefix(w, "#") {
				break
			}
			cur = append(cur, w)
		}
		if !cont && len(cur) > 0 {
			out = append(out, cur)
			cur = nil
		}
	}
	return out
}

// cliFlags parses the flags of a command's words (after its subcommand):
// "--name value", "--name=value", and the bare boolean flags in bools. It
// returns each flag's values in order, and fails on a word that is not a
// flag.
func cliFlags(t *testing.T, words []string, bools ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i := 0; i < len(words); i++ {
		name, ok := strings.CutPrefix(words[i], "--")
		if !ok {
			t.Fatalf("%q: not a flag, in %s", words[i], strings.Join(words, " "))
		}
		if n, v, found := strings.Cut(name, "="); found {
			out[n] = append(out[n], v)
			continue
		}
		if strings.Contains(" "+strings.Join(bools, " ")+" ", " "+name+" ") {
			out[name] = append(out[name], "true")
			continue
		}
		if i+1 == len(words) {
			t.Fatalf("--%s: no value, in %s", name, strings.Join(words, " "))
		}
		out[name] = append(out[name], words[i+1])
		i++
	}
	return out
}
