package security

import (
	"encoding/hex"
	"testing"
)

// A fingerprint is 8 hex digits, the same for the same key, and does not
// hold the key.
func TestKeyFingerprint(t *testing.T) {
	a, b := KeyFingerprint([]byte("user-4711")), KeyFingerprint([]byte("user-4712"))
	if len(a) != 8 {
		t.Fatalf("fingerprint %q: want 8 hex digits", a)
	}
	if _, err := hex.DecodeString(a); err != nil {
		t.Fatalf("fingerprint %q: %v", a, err)
	}
	if a != KeyFingerprint([]byte("user-4711")) {
		t.Fatal("the same key got another fingerprint")
	}
	if a == b {
		t.Fatalf("two keys share the fingerprint %s", a)
	}
}
