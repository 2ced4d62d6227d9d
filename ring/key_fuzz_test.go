package ring

import (
	"bytes"
	"testing"
)

// FuzzKeyInjective: two (name, key) pairs encode to the same ring key only
// when they are the same pair (C19: ("ab", "c") and ("a", "bc") differ).
func FuzzKeyInjective(f *testing.F) {
	f.Add("ab", "c", "a", "bc")
	f.Add("api", "user:1", "api", "user:1")
	f.Add("", "x", "x", "")
	f.Fuzz(func(t *testing.T, n1, k1, n2, k2 string) {
		a, b := Key(nil, n1, k1), Key(nil, n2, k2)
		if same := n1 == n2 && k1 == k2; bytes.Equal(a, b) != same {
			t.Fatalf("Key(%q,%q)=%x, Key(%q,%q)=%x: equal=%v, pairs equal=%v", n1, k1, a, n2, k2, b, bytes.Equal(a, b), same)
		}
	})
}
