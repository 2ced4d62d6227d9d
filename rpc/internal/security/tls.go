package security

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

	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/certs"
)

// MinPublicTLS is the lowest TLS version the public port (gRPC and HTTP)
// accepts: 1.2, because Envoy's default maximum is 1.2.
const MinPublicTLS = tls.VersionTLS12

// MinPeerTLS is the lowest TLS version a node uses when it dials a peer.
const MinPeerTLS = tls.VersionTLS13

// ErrNoPeerCertificate is returned (or wrapped) when a peer presented no
// certificate.
var ErrNoPeerCertificate = errors.New("peer presented no certificate")

// IdentityError is the error of a certificate chain that verified but
// whose leaf is not the peer certificate of the member wanted.
type IdentityError struct {
	// Kind and Name are the leaf's sluice identity ("" when it has none).
	Kind certs.Kind
	Name string
	// Want is the member name wanted.
	Want string
}

// Error says what the certificate names and what was wanted.
func (e *IdentityError) Error() string {
	return fmt.Sprintf("peer certificate names %s %q, want peer %q", e.Kind, e.Name, e.Want)
}

// tlsMaterial is one loaded set of the node's certificate, its key and the
// CA pool that verifies clients and peers.
type tlsMaterial struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// CertFiles names the PEM files of a node's TLS material.
type CertFiles struct {
	// Cert is the node's certificate, leaf first (setting tls_cert).
	Cert string
	// Key is its private key (tls_key).
	Key string
	// CA is the bundle of CA certificates that verify peers and clients
	// (tls_ca).
	CA string
}

// CertSource holds a node's current TLS material, reloaded from disk by
// Reload (on SIGHUP and when the files change). Handshakes read the
// current material, so a reload takes effect on the next handshake. It
// is safe for concurrent use.
type CertSource struct {
	files CertFiles
	// member, when set, is the node's name: a reloaded certificate must
	// be this member's peer certificate, signed by the reloaded CA, as at
	// start (else the node would serve another's identity, or one its
	// peers refuse).
	member            string
	log               *slog.Logger
	cur               atomic.Pointer[tlsMaterial]
	reloads, failures atomic.Int64
}

// NewCertSource loads files; log receives the reloads. With member set
// (a node's name) the certificate must be that member's peer certificate
// signed by the CA, now and on every reload. It returns an error naming
// the setting (tls_cert, tls_key, tls_ca) when a file cannot be read or
// does not parse, or when the certificate is not member's (then wrapping
// the verification error, e.g. an *IdentityError).
func NewCertSource(files CertFiles, member string, log *slog.Logger) (*CertSource, error) {
	s := &CertSource{files: files, log: log}
	m, err := loadTLS(files)
	if err != nil {
		return nil, err
	}
	if member != "" {
		if err := verifyPeerChain(chainOf(m.cert), m.pool, member, x509.ExtKeyUsageServerAuth); err != nil {
			return nil, fmt.Errorf("tls_cert: %w (want a peer certificate of this node signed by tls_ca)", err)
		}
		s.member = member // reloads are held to the same
	}
	s.cur.Store(m)
	return s, nil
}

// loadTLS reads a certificate, its key and a CA bundle.
func loadTLS(files CertFiles) (*tlsMaterial, error) {
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
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
	pool, err := loadPool(files.CA)
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

// Reload reads the files again. On any error (a file missing, half
// written or not matching, or a certificate that is not the member's) it
// keeps the running material, logs why and returns the error, naming the
// setting as NewCertSource does.
func (s *CertSource) Reload() error {
	m, err := loadTLS(s.files)
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

// ServerConfig returns the TLS config of the public port (TLS 1.2 at
// least): every handshake takes the current certificate and CA. auth is
// how clients must present a certificate; nextProtos the ALPN protocols
// served (e.g. "h2").
func (s *CertSource) ServerConfig(auth tls.ClientAuthType, nextProtos []string) *tls.Config {
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

// PeerConfig returns the TLS config this node dials the member called
// name with: TLS 1.3 at least, this node's current certificate presented,
// and the server's chain verified against the current CA with its sluice
// identity naming that member (spiffe://sluice/peer/NAME; the address
// dialed is not checked, the identity is). A handshake with another
// server fails with an error wrapping ErrNoPeerCertificate, the x509
// verification error or an *IdentityError.
func (s *CertSource) PeerConfig(name string) *tls.Config {
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

// PeerCredentials returns the gRPC transport credentials to dial the
// member called name with (see CertSource.PeerConfig), or nil
// (plaintext) when s is nil (no TLS).
func PeerCredentials(s *CertSource) func(name string) credentials.TransportCredentials {
	if s == nil {
		return nil
	}
	return func(name string) credentials.TransportCredentials { return credentials.NewTLS(s.PeerConfig(name)) }
}

// verifyPeerChain verifies chain (leaf first) against pool for usage and
// checks that its leaf is the peer certificate of want.
func verifyPeerChain(chain []*x509.Certificate, pool *x509.CertPool, want string, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return ErrNoPeerCertificate
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
		return &IdentityError{Kind: kind, Name: name, Want: want}
	}
	return nil
}

// chainOf parses the chain of c (leaf first); certificates that do not
// parse are left out.
func chainOf(c *tls.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, der := range c.Certificate {
		if x, err := x509.ParseCertificate(der); err == nil {
			out = append(out, x)
		}
	}
	return out
}

// VerifyMember opens a TLS connection to addr (host:port) and checks that
// the server there presents the peer certificate of the member called
// name (see PeerConfig); it closes the connection. It returns nil, the
// dial's error, or the handshake's (wrapping ErrNoPeerCertificate, the
// x509 verification error or an *IdentityError).
func (s *CertSource) VerifyMember(ctx context.Context, name, addr string) error {
	d := tls.Dialer{Config: s.PeerConfig(name)}
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
