package security

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// fingerprintKey is this process's random HMAC key for KeyFingerprint:
// fingerprints match within one process's logs, never across processes,
// and cannot be reversed by guessing keys.
var fingerprintKey = func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return b
}()

// KeyFingerprint returns a short keyed fingerprint of a store key (or of
// any key): 8 hex digits of an HMAC-SHA256 under a random per-process key.
// Logs name keys by it, never by the key itself; the same key gets the
// same fingerprint for the life of the process.
func KeyFingerprint(key []byte) string {
	m := hmac.New(sha256.New, fingerprintKey)
	m.Write(key)
	return hex.EncodeToString(m.Sum(nil)[:4])
}
