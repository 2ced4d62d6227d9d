package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/certs"
)

// testPKI is a CA made at test time and the files it issues.
type testPKI struct {
	dir           string
	caCert, caKey []byte
	caFile        string
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	c, k, err := certs.NewCA("sluice test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), caCert: c, caKey: k}
	p.caFile = filepath.Join(p.dir, "ca.pem")
	writeFile(t, p.caFile, c)
	return p
}

// files issues a certificate of kind for name and returns the files of
// it, its key and p's CA.
func (p *testPKI) files(t *testing.T, kind certs.Kind, name string) CertFiles {
	t.Helper()
	c, k, err := certs.Issue(p.caCert, p.caKey, kind, name, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(p.dir, string(kind)+"-"+name+"-"+time.Now().Format("150405.000000000"))
	f := CertFiles{Cert: base + ".pem", Key: base + "-key.pem", CA: p.caFile}
	writeFile(t, f.Cert, c)
	writeFile(t, f.Key, k)
	return f
}

func (p *testPKI) source(t *testing.T, kind certs.Kind, name, member string) *CertSource {
	t.Helper()
	s, err := NewCertSource(p.files(t, kind, name), member, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A node's certificate source takes only the node's own peer
// certificate, signed by its CA, and says why not by typed errors.
func TestNewCertSourceHoldsToMember(t *testing.T) {
	p := newPKI(t)
	node1 := p.files(t, certs.Peer, "node1")
	if _, err := NewCertSource(node1, "node1", quietLogger()); err != nil {
		t.Fatalf("node1's certificate for node1: %v", err)
	}
	var ie *IdentityError
	_, err := NewCertSource(node1, "node2", quietLogger())
	if !errors.As(err, &ie) || ie.Kind != certs.Peer || ie.Name != "node1" || ie.Want != "node2" ||
		err.Error() != `tls_cert: peer certificate names peer "node1", want peer "node2" (want a peer certificate of this node signed by tls_ca)` {
		t.Fatalf("node1's certificate for node2: %v", err)
	}
	var ci x509.CertificateInvalidError
	if _, err := NewCertSource(p.files(t, certs.Client, "node1"), "node1", quietLogger()); !errors.As(err, &ci) || ci.Reason != x509.IncompatibleUsage {
		t.Fatalf("a client certificate for node1: %v, want an incompatible usage (no server auth)", err)
	}
	foreign := node1
	foreign.CA = newPKI(t).caFile
	var ua x509.UnknownAuthorityError
	if _, err := NewCertSource(foreign, "node1", quietLogger()); !errors.As(err, &ua) {
		t.Fatalf("node1's certificate under another CA: %v, want an unknown authority", err)
	}
	if _, err := NewCertSource(foreign, "", quietLogger()); err != nil {
		t.Fatalf("without a member, the identity is not checked: %v", err)
	}
}

// Files that cannot be read or do not parse are refused naming the
// setting.
func TestNewCertSourceRefusesBadFiles(t *testing.T) {
	p := newPKI(t)
	good := p.files(t, certs.Peer, "node1")
	garbage := filepath.Join(p.dir, "garbage.pem")
	writeFile(t, garbage, []byte("not PEM"))
	notCert := filepath.Join(p.dir, "key-as-ca.pem")
	writeFile(t, notCert, readAll(t, good.Key))
	for _, tc := range []struct {
		what  string
		files CertFiles
		err   string
	}{
		{"no certificate", CertFiles{Cert: filepath.Join(p.dir, "missing"), Key: good.Key, CA: good.CA}, "tls_cert, tls_key: "},
		{"a garbage key", CertFiles{Cert: good.Cert, Key: garbage, CA: good.CA}, "tls_cert, tls_key: "},
		{"no CA", CertFiles{Cert: good.Cert, Key: good.Key, CA: filepath.Join(p.dir, "missing")}, "tls_ca: "},
		{"a CA without PEM", CertFiles{Cert: good.Cert, Key: good.Key, CA: garbage}, "tls_ca: " + garbage + ": no PEM certificate"},
		{"a key as CA", CertFiles{Cert: good.Cert, Key: good.Key, CA: notCert}, "tls_ca: " + notCert + ": block 1 is not a certificate"},
	} {
		if _, err := NewCertSource(tc.files, "", quietLogger()); err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error starting %q", tc.what, err, tc.err)
		}
	}
}

// A reload of another member's certificate, or of a corrupt file, keeps
// the running material; a renewed certificate of the member replaces it.
func TestCertSourceReload(t *testing.T) {
	p := newPKI(t)
	f := p.files(t, certs.Peer, "node1")
	s, err := NewCertSource(f, "node1", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	running := s.cur.Load()
	other := p.files(t, certs.Peer, "node2")
	writeFile(t, f.Cert, readAll(t, other.Cert))
	writeFile(t, f.Key, readAll(t, other.Key))
	var ie *IdentityError
	if err := s.Reload(); !errors.As(err, &ie) || !strings.Contains(err.Error(), "want a peer certificate of node1 signed by tls_ca") {
		t.Fatalf("reload of node2's certificate: %v", err)
	}
	writeFile(t, f.Cert, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"))
	if err := s.Reload(); err == nil {
		t.Fatal("reload of a corrupt certificate: no error")
	}
	if s.cur.Load() != running || s.failures.Load() != 2 {
		t.Fatalf("refused reloads changed the material (%d failures counted)", s.failures.Load())
	}
	renewed := p.files(t, certs.Peer, "node1")
	writeFile(t, f.Cert, readAll(t, renewed.Cert))
	writeFile(t, f.Key, readAll(t, renewed.Key))
	if err := s.Reload(); err != nil {
		t.Fatalf("reload of a renewed certificate: %v", err)
	}
	if s.cur.Load() == running || s.reloads.Load() != 1 {
		t.Fatal("a renewed certificate was not taken")
	}
}

// handshake runs a TLS handshake over a pipe between a client and a
// server config and returns the server's connection state and the
// client's error.
func handshake(t *testing.T, client, server *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(b, server)
	done := make(chan struct{})
	go func() { _ = srv.Handshake(); b.Close(); close(done) }()
	err := tls.Client(a, client).Handshake()
	a.Close()
	<-done
	return srv.ConnectionState(), err
}

// A peer dial verifies the server's identity, not its address; the
// server learns the caller's member name from its verified certificate.
func TestPeerConfigAndPeerName(t *testing.T) {
	p := newPKI(t)
	node1 := p.source(t, certs.Peer, "node1", "node1")
	node2 := p.source(t, certs.Peer, "node2", "node2")
	server := node2.ServerConfig(tls.RequireAndVerifyClientCert, []string{"h2"})
	st, err := handshake(t, node1.PeerConfig("node2"), server)
	if err != nil {
		t.Fatalf("node1 dialing node2: %v", err)
	}
	if st.Version < MinPeerTLS {
		t.Fatalf("peer handshake at TLS version %x", st.Version)
	}
	ctx := grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{AuthInfo: credentials.TLSInfo{State: st}})
	if name, ok := PeerName(ctx); !ok || name != "node1" {
		t.Fatalf("PeerName of node1's call: %q, %v", name, ok)
	}
	var ie *IdentityError
	if _, err := handshake(t, node1.PeerConfig("node3"), server); !errors.As(err, &ie) || ie.Name != "node2" || ie.Want != "node3" {
		t.Fatalf("node2's server taken for node3: %v, want an IdentityError", err)
	}

	client := p.source(t, certs.Client, "app", "")
	cc := &tls.Config{MinVersion: MinPublicTLS, InsecureSkipVerify: true, //nolint:gosec // the test reads the server's side
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return client.cur.Load().cert, nil }}
	st, err = handshake(t, cc, server)
	if err != nil {
		t.Fatal(err)
	}
	ctx = grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{AuthInfo: credentials.TLSInfo{State: st}})
	if name, ok := PeerName(ctx); ok {
		t.Fatalf("PeerName of a client certificate: %q, ok", name)
	}
	if _, ok := PeerName(context.Background()); ok {
		t.Fatal("PeerName without a peer: ok")
	}
	if err := verifyPeerChain(nil, x509.NewCertPool(), "node1", x509.ExtKeyUsageServerAuth); !errors.Is(err, ErrNoPeerCertificate) {
		t.Fatalf("no chain: %v", err)
	}
	if PeerCredentials(nil) != nil {
		t.Fatal("PeerCredentials without TLS: want nil (plaintext)")
	}
}

// VerifyMember dials an address and checks who answers there.
func TestVerifyMember(t *testing.T) {
	p := newPKI(t)
	node1 := p.source(t, certs.Peer, "node1", "node1")
	node2 := p.source(t, certs.Peer, "node2", "node2")
	lis, err := tls.Listen("tcp", "127.0.0.1:0", node2.ServerConfig(tls.RequireAndVerifyClientCert, []string{"h2"}))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := node1.VerifyMember(ctx, "node2", lis.Addr().String()); err != nil {
		t.Fatalf("node2 at its address: %v", err)
	}
	var ie *IdentityError
	if err := node1.VerifyMember(ctx, "node1", lis.Addr().String()); !errors.As(err, &ie) || !strings.Contains(err.Error(), `want peer "node1"`) {
		t.Fatalf("node2's address taken for node1: %v, want an IdentityError", err)
	}
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
