package rls_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/rls"
)

// Any bytes either load or give a *rls.ConfigError; neither panics.
func FuzzParse(f *testing.F) {
	for _, y := range examples {
		f.Add([]byte(y))
	}
	f.Add([]byte(serviceRules))
	f.Add([]byte("domain: d\ndescriptors:\n  - &a {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n  - *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := rls.Parse(rls.File{Name: "f.yaml", Data: data})
		var ce *rls.ConfigError
		if err != nil && !errors.As(err, &ce) {
			t.Fatalf("error %v is a %T", err, err)
		}
		if err == nil {
			for _, d := range cfg.Domains() {
				cfg.Match(d, []rls.Entry{{Key: "k", Value: "v"}})
			}
		}
	})
}

// Any descriptor matches or not; a match is a check sluice accepts.
func FuzzMatch(f *testing.F) {
	f.Add("messaging", "message_type", "marketing", "to_number", "2061111111")
	f.Add("wildcard", "path", "/api/v1", "user", "admin-1")
	f.Add("wildcard", "files", "files/x", "", "")
	cfg, err := rls.Parse(rls.File{Name: "x.yaml", Data: []byte(examples["example2.yaml"])},
		rls.File{Name: "w.yaml", Data: []byte(examples["wildcard.yaml"])})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string) {
		for _, es := range [][]rls.Entry{{{Key: k1, Value: v1}}, {{Key: k1, Value: v1}, {Key: k2, Value: v2}}} {
			m, ok := cfg.Match(domain, es)
			if ok && (m.Name == "" || m.Key == "" || len(m.Name) > 256 || len(m.Key) > 1024 || m.Rule == nil) {
				t.Fatalf("match %+v of %v", m, es)
			}
		}
	})
}
