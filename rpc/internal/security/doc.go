// Package security is rpc's room for who may talk to a node and what a
// node may say about its callers: client authentication (mTLS
// certificates and bearer tokens, on gRPC and HTTP), the admin API's
// authorisation apart from it (admin tokens and certificates, loopback
// by default: admin.go), the TLS material of a node and its reload, the
// identity of a peer (its verified
// certificate's member name), the verification of members' certificates
// before they enter the ring (Verifier), protected mode (a node others can
// reach refuses to start unprotected) and the redaction of keys in logs
// (KeyFingerprint).
//
// It knows nothing of package rpc, of the ring or of gossip: a node hands
// it the few settings it needs (Settings, AuthConfig, VerifierConfig) and
// functions for the rest (is this name a member, which members does
// gossip list, does a check carry numbers of its own). Package rpc keeps
// its public names (rpc.ClientAuth, rpc.Token, rpc.ParseTokens,
// rpc.KeyFingerprint, ...) as aliases of these.
//
// Locks: Verifier.mu guards the verifier's maps and is held for no call
// out of the package; TokenSet and CertSource swap their material
// atomically and take no lock.
package security
