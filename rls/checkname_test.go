package rls

import "testing"

// A rule's CheckName is the name its keys are counted under, and a key is
// the descriptors' values, quoted and separated by a space: what an
// operator gives sluice key get and reset (docs/admin.md).
func TestCheckNameIsTheMatchName(t *testing.T) {
	cfg, err := Load("../examples/rls")
	if err != nil {
		t.Fatal(err)
	}
	m, ok := cfg.Match("edge", []Entry{{Key: "remote_address", Value: "203.0.113.7"}})
	if !ok {
		t.Fatal("no match")
	}
	if m.Name != m.Rule.CheckName() || m.Name != `rls "edge" "remote_address"` || m.Key != `"203.0.113.7"` {
		t.Fatalf("match %q %q, rule's check name %q", m.Name, m.Key, m.Rule.CheckName())
	}
	for _, r := range cfg.Rules() {
		if r.CheckName() == "" {
			t.Errorf("rule %s has no check name", r.FullKey)
		}
	}
}
