package rls_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/rls"
)

// reviewMetaHead is a rule file up to its rule's metadata key, whose
// value is indented by 6 spaces.
const reviewMetaHead = "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata:\n"

// reviewAliasBomb is a rule file whose metadata is levels of width
// aliases of the level below: a file of about 65 bytes a level that
// expands to width^levels values ("billion laughs").
func reviewAliasBomb(levels, width int) string {
	var b strings.Builder
	b.WriteString(reviewMetaHead)
	b.WriteString("      l0: &l0 [" + strings.TrimSuffix(strings.Repeat("xxxxxxxx, ", width), ", ") + "]\n")
	for i := 1; i <= levels; i++ {
		refs := make([]string, width)
		for j := range refs {
			refs[j] = fmt.Sprintf("*l%d", i-1)
		}
		fmt.Fprintf(&b, "      l%d: &l%d [%s]\n", i, i, strings.Join(refs, ", "))
	}
	return b.String()
}

// Finding (medium: a rule file of under 1 KB takes a node down): YAML
// aliases in metadata are expanded by structpb.NewStruct, one copy per
// reference. goccy/go-yaml decodes them shared (cheap), then the Struct
// is built value by value: 5 levels of 10 (541 bytes) allocate about
// 110 MB, 6 levels (606 bytes) 1.1 GB in 1.2 s, 8 levels (about 670
// bytes) would need about 110 GB. Every node watches its rule files, so
// one such file written into a ConfigMap is loaded by every node at
// once: Source.Reload runs out of memory instead of refusing the file
// (the running rules are not kept: the process dies), and a node does
// not start on it. envoyproxy/ratelimit's loader (gopkg.in/yaml.v2
// 2.4.0) refuses such a file ("document contains excessive aliasing").
// Right: refuse metadata past a size (values, bytes) or with excessive
// aliasing, as a *ConfigError naming descriptors[0].metadata.
func TestReviewMetadataAliasBomb(t *testing.T) {
	src := reviewAliasBomb(5, 10) // 10^5 values from 541 bytes; kept small so that the test is cheap
	_, err := rls.Parse(rls.File{Name: "bomb.yaml", Data: []byte(src)})
	var ce *rls.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(ce.Field+ce.Msg, "metadata") {
		t.Errorf("a %d-byte file whose metadata expands to 10^5 values: %v, want a ConfigError naming descriptors[0].metadata (excessive aliasing or too large)", len(src), err)
	}
}

// Finding (low/medium): metadata numbers .nan, .inf and -.inf load into
// the rule's Struct, though google.protobuf.Value cannot carry them in
// JSON: protojson refuses to marshal them, so POST /json answers 500 to
// every request that passes the rule with dynamic metadata on (see
// rpc's TestReviewRLSJSONNaNMetadata), and Envoy is sent NaN as a
// metadata number. Right: refuse them at load, as a *ConfigError naming
// descriptors[0].metadata (the peer's loader does not either: it is the
// file, not the request, that is wrong).
func TestReviewMetadataNaNRefused(t *testing.T) {
	for _, v := range []string{".nan", ".inf", "-.inf", "{b: [.NaN]}"} {
		cfg, err := rls.Parse(rls.File{Name: "m.yaml", Data: []byte(reviewMetaHead + "      a: " + v + "\n")})
		if err == nil {
			_, jerr := protojson.Marshal(cfg.Rules()[0].Metadata)
			t.Errorf("metadata a: %s loaded (protojson.Marshal of it: %v), want a ConfigError naming descriptors[0].metadata", v, jerr)
			continue
		}
		var ce *rls.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Field, "metadata") {
			t.Errorf("metadata a: %s: %v, want a ConfigError naming descriptors[0].metadata", v, err)
		}
	}
}

// Finding (low): metadata nested deeper than goccy/go-yaml's limit
// (10000) is refused as "m.yaml: exceeded max depth", with neither line
// nor field; and the refusal costs time superlinear in the file's size
// (flow brackets, on this 2-core VM under load: 20000 levels, 40 KB:
// 0.4 s; 40000: 1.6 s; 80000, 160 KB: 5 to 25 s; 200000, 400 KB: not
// done after 9 minutes), all of it under Source.Reload's lock, at
// startup or on every change the watch sees. Right: the error locates
// the metadata (descriptors[0].metadata, its line), and a file is
// refused before the parser spends minutes on it (e.g. a size bound).
func TestReviewMetadataTooDeepLocated(t *testing.T) {
	const depth = 10001
	src := reviewMetaHead + "      a: " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n"
	_, err := rls.Parse(rls.File{Name: "m.yaml", Data: []byte(src)})
	var ce *rls.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("metadata nested %d deep: %v, want a ConfigError", depth, err)
	}
	if ce.Line == 0 && !strings.Contains(ce.Field, "metadata") {
		t.Errorf("metadata nested %d deep: %q locates nothing, want its line or descriptors[0].metadata", depth, ce.Error())
	}
}

// Holds (pinned): metadata that structpb cannot hold is a ConfigError
// naming the field and line, never a panic; YAML's odd keys become
// strings as the peer's yaml.v2 makes them (1 -> "1", null -> ""); a
// merge key, an anchor used twice and a number past float64 load; raw
// bytes that are not UTF-8 become U+FFFD (a Struct with them could not
// be marshalled).
func TestReviewMetadataOddYAML(t *testing.T) {
	for _, c := range []struct {
		yaml    string
		wantErr string // "" when it loads
		want    string // a field of the loaded Struct, as JSON
	}{
		{"      a: !!timestamp 2001-12-14t21:59:43.10-05:00\n", "m.yaml:6:8: descriptors[0].metadata: cannot be returned as Envoy metadata", ""},
		{"      ? [a, b]\n      : c\n", "m.yaml:7:7: found an invalid key for this map", ""},
		{"      a: 1\n      a: 2\n", "m.yaml:7:", ""},
		{"      1: a\n", "", `{"1":"a"}`},
		{"      null: a\n", "", `{"":"a"}`},
		{"      <<: {b: c}\n", "", `{"b":"c"}`},
		{"      a: &x {b: c}\n      d: *x\n", "", `{"a":{"b":"c"},"d":{"b":"c"}}`},
		{"      a: 1e400\n", "", `{"a":"1e400"}`},
		{"      a: \xff\n", "", `{"a":"\ufffd"}`}, // raw invalid UTF-8: replaced, so the Struct marshals
		{"      \xfe: 1\n", "", `{"\ufffd":1}`},
	} {
		cfg, err := rls.Parse(rls.File{Name: "m.yaml", Data: []byte(reviewMetaHead + c.yaml)})
		if c.wantErr != "" {
			var ce *rls.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: %v, want a ConfigError containing %q", c.yaml, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.yaml, err)
			continue
		}
		want := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(c.want), want); err != nil {
			t.Fatal(err)
		}
		if got := cfg.Rules()[0].Metadata; !proto.Equal(got, want) {
			t.Errorf("%q: metadata %v, want %v", c.yaml, got, want)
		}
	}
}

// Finding (low): metadata on a descriptor without rate_limit is dropped
// without a look, so a file the peer refuses ("error parsing metadata",
// its loader parses every descriptor's metadata) loads here, and an
// operator who put metadata on a parent descriptor never learns it is
// never returned. Right: parse it (a ConfigError when it cannot become a
// Struct), or refuse metadata where it cannot be returned.
func TestReviewMetadataWithoutRateLimit(t *testing.T) {
	src := "domain: m\ndescriptors:\n  - key: k\n    metadata:\n      a: !!timestamp 2001-12-14t21:59:43.10-05:00\n    descriptors:\n      - key: c\n        rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if _, err := rls.Parse(rls.File{Name: "m.yaml", Data: []byte(src)}); err == nil {
		t.Errorf("metadata that cannot become a Struct on a descriptor without rate_limit: loaded, want a ConfigError naming descriptors[0].metadata")
	}
}
