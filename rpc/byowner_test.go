package rpc

import (
	"maps"
	"slices"
	"testing"
)

// byOwner groups indexes by member in order, sharing idx while the first
// member's are a prefix of it, and never writes into idx.
func TestByOwnerGroups(t *testing.T) {
	for _, c := range []struct {
		name    string
		owners  []string // the member of each index; "" : decided here (not added)
		want    map[string][]int
		wantPre bool
	}{
		{"one check", []string{"a"}, map[string][]int{"a": {10}}, true},
		{"all to one", []string{"a", "a", "a"}, map[string][]int{"a": {10, 11, 12}}, true},
		{"local first", []string{"", "a", "a"}, map[string][]int{"a": {11, 12}}, false},
		{"local between", []string{"a", "", "a"}, map[string][]int{"a": {10, 12}}, false},
		{"two members", []string{"a", "b", "a", "b"}, map[string][]int{"a": {10, 12}, "b": {11, 13}}, false},
		{"none", []string{"", ""}, map[string][]int{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			idx := make([]int, len(c.owners))
			for k := range idx {
				idx[k] = 10 + k
			}
			orig := slices.Clone(idx)
			var g byOwner
			for k, o := range c.owners {
				if o != "" {
					g.add(o, idx, k)
				}
			}
			got := map[string][]int{}
			if g.firstIs != nil {
				got[g.first] = g.firstIs
			}
			maps.Copy(got, g.more)
			if !maps.EqualFunc(got, c.want, slices.Equal) {
				t.Fatalf("groups %v, want %v", got, c.want)
			}
			if g.prefix != c.wantPre {
				t.Fatalf("prefix %v, want %v", g.prefix, c.wantPre)
			}
			if c.wantPre && &g.firstIs[0] != &idx[0] {
				t.Fatal("a prefix's indexes are a copy, not idx's")
			}
			if !slices.Equal(idx, orig) {
				t.Fatalf("idx changed to %v", idx)
			}
		})
	}
}
