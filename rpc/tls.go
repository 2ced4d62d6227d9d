package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/certs"
)

// MinPublicTLS is the lowest TLS version the public port (gRPC and HTTP)
// accepts: 1.2, because Envoy's default maximum is 1.2.
const MinPublicTLS = tls.VersionTLS12

// MinPeerTLS is the lowest TLS version a node uses when it dials a peer.
const MinPeerTLS = tls.VersionTLS13

// tlsMaterial is one loaded set of the node's certificate, its key and the
// CA pool that verifies clients and peers.
type tlsMaterial struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// certSource holds the node's current TLS material, reloaded from disk by
// reload (on SIGHUP and when the files change). Handshakes read the
// current material, so a reload takes effect on the next handshake.
type certSource struct {
	certFile, keyFile, caFile string
	// member, when set, is the node's name: a reloaded certificate must
	// be this member's peer certificate, signed by the reloaded CA, as at
	// start (else the node would serve another's identity, or one its
	// peers refuse).
	member            string
	log               *slog.Logger
	cur               atomic.Pointer[tlsMaterial]
	reloads, failures atomic.Int64
}

// newCertSource loads the files; it returns an error naming the setting
// when one cannot be read or does not parse.
func newCertSource(certFile, keyFile, caFile string, log *slog.Logger) (*certSource, error) {
	s := &certSource{certFile: certFile, keyFile: keyFile, caFile: caFile, log: log}
	m, err := loadTLS(certFile, keyFile, caFile)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

// loadTLS reads a certificate, its key and a CA bundle.
func loadTLS(certFile, keyFile, caFile string) (*tlsMaterial, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls_cert, tls_key: %w", err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls_cert: %w", err)
		}
		cert.Leaf = leaf
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tlsMaterial{cert: &cert, pool: pool}, nil
}

// loadPool reads a PEM bundle of CA certificates; it refuses a file with
// none, or with a block that is not a certificate.
func loadPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls_ca: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if blk.Type != "CERTIFICATE" || err != nil {
			return nil, fmt.Errorf("tls_ca: %s: block %d is not a certificate", caFile, n+1)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("tls_ca: %s: no PEM certificate", caFile)
	}
	return pool, nil
}

// reload reads the files again; on any error (a file missing, half
// written or not matching) it keeps the running material and logs why.
func (s *certSource) reload() error {
	m, err := loadTLS(s.certFile, s.keyFile, s.caFile)
	if err == nil && s.member != "" {
		if verr := verifyPeerChain(chainOf(m.cert), m.pool, s.member, x509.ExtKeyUsageServerAuth); verr != nil {
			err = fmt.Errorf("tls_cert: %w (want a peer certificate of %s signed by tls_ca)", verr, s.member)
		}
	}
	if err != nil {
		s.failures.Add(1)
		s.log.Error("TLS files refused; the running certificate and CA stay", "error", err)
		return err
	}
	s.cur.Store(m)
	s.reloads.Add(1)
	s.log.Info("TLS certificate and CA reloaded", "not_after", m.cert.Leaf.NotAfter)
	return nil
}

// serverConfig returns the TLS config of the public port: every handshake
// takes the current certificate and CA. auth is how clients must present
// a certificate; nextProtos the ALPN protocols served.
func (s *certSource) serverConfig(auth tls.ClientAuthType, nextProtos []string) *tls.Config {
	return &tls.Config{
		MinVersion: MinPublicTLS,
		// Also here: net/http serves HTTP/2 only when the outer config
		// lists h2.
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			return &tls.Config{
				MinVersion:   MinPublicTLS,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   auth,
				NextProtos:   nextProtos,
			}, nil
		},
	}
}

// peerConfig returns the TLS config this node dials the member called
// name with: TLS 1.3 at least, this node's current certificate presented,
// and the server's chain verified against the current CA with its sluice
// identity naming that member (spiffe://sluice/peer/NAME; the address
// dialed is not checked, the identity is).
func (s *certSource) peerConfig(name string) *tls.Config {
	return &tls.Config{
		MinVersion: MinPeerTLS,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.cur.Load().cert, nil
		},
		// The chain and identity are verified in VerifyConnection against
		// the current CA: Go's default would check the host name.
		InsecureSkipVerify: true, //nolint:gosec // verified below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeerChain(cs.PeerCertificates, s.cur.Load().pool, name, x509.ExtKeyUsageServerAuth)
		},
	}
}

// verifyPeerChain verifies chain (leaf first) against pool for usage and
// checks that its leaf is the peer certificate of want.
func verifyPeerChain(chain []*x509.Certificate, pool *x509.CertPool, want string, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("peer certificate: %w", err)
	}
	kind, name, ok := certs.Identity(chain[0])
	if !ok || kind != certs.Peer || name != want {
		return fmt.Errorf("peer certificate names %s %q, want peer %q", kind, name, want)
	}
	return nil
}

// verifyMember opens a TLS connection to addr and checks that the server
// there presents the peer certificate of name (see peerConfig); it closes
// the connection.
func (s *certSource) verifyMember(ctx context.Context, name, addr string) error {
	d := tls.Dialer{Config: s.peerConfig(name)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// isLoopback reports whether a is a loopback address (a connection from
// this host).
func isLoopback(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	if a == nil {
		return false
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
