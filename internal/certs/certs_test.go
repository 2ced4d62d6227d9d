package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"testing"
	"time"
)

func parse(t *testing.T, p []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(p)
	if b == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssueAndVerify(t *testing.T) {
	caPEM, caKey, err := NewCA("sluice dev CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	for _, tc := range []struct {
		kind  Kind
		name  string
		usage x509.ExtKeyUsage
	}{{Peer, "node1", x509.ExtKeyUsageServerAuth}, {Peer, "node1", x509.ExtKeyUsageClientAuth}, {Client, "app", x509.ExtKeyUsageClientAuth}, {Admin, "ops", x509.ExtKeyUsageClientAuth}} {
		certPEM, keyPEM, err := Issue(caPEM, caKey, tc.kind, tc.name, []string{"127.0.0.1", "sluice1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			t.Fatalf("key pair: %v", err)
		}
		c := parse(t, certPEM)
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Fatalf("%s %s for %v: %v", tc.kind, tc.name, tc.usage, err)
		}
		if k, n, ok := Identity(c); !ok || k != tc.kind || n != tc.name {
			t.Fatalf("Identity = %s %s %v, want %s %s", k, n, ok, tc.kind, tc.name)
		}
		if c.IPAddresses[0].String() != "127.0.0.1" || c.DNSNames[0] != "sluice1" {
			t.Fatalf("SANs: %v %v", c.IPAddresses, c.DNSNames)
		}
	}
	// A client or admin certificate cannot serve.
	for _, k := range []Kind{Admin, Client} {
		certPEM, _, _ := Issue(caPEM, caKey, k, "app", nil, time.Hour)
		if _, err := parse(t, certPEM).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
			t.Fatalf("a %s certificate verified for server auth", k)
		}
	}
	certPEM, _, _ := Issue(caPEM, caKey, Client, "app", nil, time.Hour)
	// Another CA's roots refuse it.
	otherCA, _, _ := NewCA("other", time.Hour)
	other := x509.NewCertPool()
	other.AppendCertsFromPEM(otherCA)
	if _, err := parse(t, certPEM).Verify(x509.VerifyOptions{Roots: other, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a certificate verified under a foreign CA")
	}
}

func TestIssueRefuses(t *testing.T) {
	caPEM, caKey, _ := NewCA("ca", time.Hour)
	leaf, leafKey, _ := Issue(caPEM, caKey, Peer, "n", nil, time.Hour)
	for _, tc := range []struct {
		ca, key []byte
		kind    Kind
		name    string
		days    time.Duration
	}{
		{caPEM, caKey, "operator", "n", time.Hour},
		{caPEM, caKey, Peer, "", time.Hour},
		{caPEM, caKey, Peer, "a/b", time.Hour},
		{caPEM, caKey, Peer, "n", 0},
		{leaf, leafKey, Peer, "n", time.Hour},
		{[]byte("junk"), caKey, Peer, "n", time.Hour},
	} {
		if _, _, err := Issue(tc.ca, tc.key, tc.kind, tc.name, nil, tc.days); err == nil {
			t.Errorf("Issue(%s, %q, %s) succeeded", tc.kind, tc.name, tc.days)
		}
	}
	if _, _, err := Issue(leaf, leafKey, Peer, "n", nil, time.Hour); !errors.Is(err, ErrBadCA) {
		t.Errorf("a leaf as CA: %v, want ErrBadCA", err)
	}
}

func TestIdentityIgnoresOtherURIs(t *testing.T) {
	c := &x509.Certificate{URIs: []*url.URL{mustURL("spiffe://other/peer/x"), mustURL("https://sluice/peer/y"), mustURL("spiffe://sluice/operator/z"), mustURL("spiffe://sluice/peer/node2")}}
	if k, n, ok := Identity(c); !ok || k != Peer || n != "node2" {
		t.Fatalf("Identity = %s %s %v", k, n, ok)
	}
	if _, _, ok := Identity(&x509.Certificate{}); ok {
		t.Fatal("an identity from no URIs")
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
