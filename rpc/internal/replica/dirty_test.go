package replica

import (
	"slices"
	"testing"
)

func TestDirtySet(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []string
		want []string
	}{
		{"nothing", nil, nil},
		{"one", []string{"a"}, []string{"a"}},
		{"each key once", []string{"a", "b", "a", "c", "b"}, []string{"a", "b", "c"}},
		{"an empty key", []string{""}, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDirtySet()
			for _, k := range tc.add {
				d.Add([]byte(k))
			}
			got := d.Drain()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Drain = %q, want %q", got, tc.want)
			}
			if again := d.Drain(); len(again) != 0 {
				t.Errorf("a second Drain = %q, want nothing", again)
			}
		})
	}
}

// TestDirtySetCopiesKey: Add keeps its own copy of the key (callers reuse
// their buffers).
func TestDirtySetCopiesKey(t *testing.T) {
	d := NewDirtySet()
	buf := []byte("key1")
	d.Add(buf)
	copy(buf, "XXXX")
	d.Add([]byte("key1")) // already marked
	if got := d.Drain(); !slices.Equal(got, []string{"key1"}) {
		t.Errorf("Drain = %q, want [key1]", got)
	}
}
