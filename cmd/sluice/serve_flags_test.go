package main

import (
	"slices"
	"testing"
)

// serve's flag table and serveCheckOrder agree: names are unique, and the
// flags whose values are checked are exactly those of serveCheckOrder,
// each once.
func TestServeFlagTable(t *testing.T) {
	seen := map[string]bool{}
	var checked []string
	for _, f := range serveFlags("host") {
		name := f.flagName()
		if seen[name] {
			t.Errorf("--%s is in the table twice", name)
		}
		seen[name] = true
		var valid bool
		switch r := f.(type) {
		case *stringFlag:
			valid = r.valid != nil
		case *intFlag:
			valid = r.valid != nil
		case *durationFlag:
			valid = r.valid != nil
		case *boolFlag:
			valid = r.valid != nil
		default:
			t.Fatalf("--%s: a row of type %T", name, f)
		}
		if valid {
			checked = append(checked, name)
		}
	}
	order := slices.Clone(serveCheckOrder)
	slices.Sort(order)
	slices.Sort(checked)
	if !slices.Equal(order, checked) {
		t.Errorf("serveCheckOrder (sorted) = %v, want the flags with a check: %v", order, checked)
	}
}
