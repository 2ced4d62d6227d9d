package rpc

import "github.com/sluicehq/sluice/rpc/internal/security"

// KeyFingerprint returns a short keyed fingerprint of a store key (or of
// any key): 8 hex digits of an HMAC-SHA256 under a random per-process key.
// Logs name keys by it, never by the key itself; the same key gets the
// same fingerprint for the life of the process.
func KeyFingerprint(key []byte) string { return security.KeyFingerprint(key) }
