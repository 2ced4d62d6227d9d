package rpc

import "github.com/sluicehq/sluice/rpc/internal/security"

// MinPublicTLS is the lowest TLS version the public port (gRPC and HTTP)
// accepts: 1.2 (tls.VersionTLS12), because Envoy's default maximum is 1.2.
const MinPublicTLS = security.MinPublicTLS

// MinPeerTLS is the lowest TLS version a node uses when it dials a peer:
// 1.3 (tls.VersionTLS13).
const MinPeerTLS = security.MinPeerTLS
