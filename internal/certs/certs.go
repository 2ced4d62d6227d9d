// Package certs makes development certificates for sluice (a CA, and
// certificates for peers and clients signed by it) with crypto/x509, and
// reads the identity sluice puts in them: a URI SAN
// spiffe://sluice/peer/NAME for a node, spiffe://sluice/client/NAME for a
// client and spiffe://sluice/admin/NAME for an operator allowed the admin
// API (the SPIFFE ID shape, https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE-ID.md).
// Keys are ECDSA P-256. These are for development and tests; production
// certificates come from the operator's own CA.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Kind is what a certificate is for.
type Kind string

// The kinds of leaf certificates.
const (
	// Peer is a node: it serves gRPC and calls its peers.
	Peer Kind = "peer"
	// Client calls the public API.
	Client Kind = "client"
	// Admin is an operator: it may call the admin API (inspect and reset
	// keys, list limits) as well as the public API.
	Admin Kind = "admin"
)

// TrustDomain is the SPIFFE trust domain of sluice identities.
const TrustDomain = "sluice"

// ID returns the URI SAN of kind and name, e.g.
// spiffe://sluice/peer/node1.
func ID(kind Kind, name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + string(kind) + "/" + name}
}

// Identity returns the kind and name of the first sluice URI SAN of cert,
// or ok = false when it has none.
func Identity(cert *x509.Certificate) (kind Kind, name string, ok bool) {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != TrustDomain {
			continue
		}
		k, n, found := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if found && n != "" && (Kind(k) == Peer || Kind(k) == Client || Kind(k) == Admin) {
			return Kind(k), n, true
		}
	}
	return "", "", false
}

// NewCA returns a self-signed CA certificate and its private key, PEM
// encoded, valid from now for validFor.
func NewCA(commonName string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := template(commonName, validFor)
	if err != nil {
		return nil, nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	return encode(der, key)
}

// Issue returns a certificate of kind for name signed by the CA (PEM),
// and its private key: its URI SAN is [ID](kind, name), and hosts (DNS
// names or IP addresses) are added as SANs so that clients can verify a
// peer by the address they dial. A peer certificate is good for serving
// and for calling (server and client auth), a client or admin one for
// calling.
// It returns an error for an empty or malformed name or a CA that does
// not parse.
func Issue(caCertPEM, caKeyPEM []byte, kind Kind, name string, hosts []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	if validFor <= 0 {
		return nil, nil, fmt.Errorf("validity: must be > 0, got %s", validFor)
	}
	now := time.Now()
	return IssueWindow(caCertPEM, caKeyPEM, kind, name, hosts, now.Add(-5*time.Minute), now.Add(validFor))
}

// IssueWindow is Issue with an explicit validity window [notBefore,
// notAfter] (e.g. an expired certificate for a test). It returns an error
// when notAfter is not after notBefore, and Issue's errors.
func IssueWindow(caCertPEM, caKeyPEM []byte, kind Kind, name string, hosts []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	if kind != Peer && kind != Client && kind != Admin {
		return nil, nil, fmt.Errorf("kind: want peer, client or admin, got %q", kind)
	}
	if name == "" || strings.ContainsAny(name, "/?#% ") {
		return nil, nil, fmt.Errorf("name: must be non-empty without '/', '?', '#', '%%' or spaces, got %q", name)
	}
	ca, caKey, err := parseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if !notAfter.After(notBefore) {
		return nil, nil, fmt.Errorf("validity: not after %s must be later than not before %s", notAfter, notBefore)
	}
	tmpl, err := template(name, time.Hour)
	if err != nil {
		return nil, nil, err
	}
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if kind == Peer {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	tmpl.URIs = []*url.URL{ID(kind, name)}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	return encode(der, key)
}

func template(cn string, validFor time.Duration) (*x509.Certificate, error) {
	if validFor <= 0 {
		return nil, fmt.Errorf("validity: must be > 0, got %s", validFor)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"sluice (development)"}},
		NotBefore:    now.Add(-5 * time.Minute), // tolerate small clock skew
		NotAfter:     now.Add(validFor),
	}, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

// ErrBadCA is wrapped by the errors of a CA that cannot sign.
var ErrBadCA = errors.New("bad CA certificate or key")

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, any, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%w: no CERTIFICATE block", ErrBadCA)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadCA, err)
	}
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("%w: the certificate is not a CA", ErrBadCA)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%w: no key block", ErrBadCA)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: key: %v", ErrBadCA, err)
	}
	return ca, key, nil
}
