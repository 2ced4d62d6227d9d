package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLS returns the dial option of a TLS connection (1.2 at least) to nodes
// whose certificates caFile (a PEM bundle) signs, verified against the
// host dialed (the node's certificate must list it, see `sluice tls cert
// create --host`). With certFile and keyFile it presents that client
// certificate (mTLS); give both or neither. It returns an error naming
// the file that cannot be read or does not parse.
func TLS(caFile, certFile, keyFile string) (grpc.DialOption, error) {
	cfg, err := TLSConfig(caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// TLSConfig is the tls.Config behind TLS, for callers that build their
// own credentials.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, errors.New("client: tls ca: required")
	}
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("client: tls ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("client: tls ca: %s: no PEM certificate", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("client: tls cert, tls key: give both or neither")
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client: tls cert, tls key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// Token returns the dial option that sends token on every call as
// "authorization: Bearer TOKEN" (a node's serve --token-file). Over a
// plaintext connection it sends it only to a loopback address: calls to
// another host fail with an error instead of showing the token. Add a
// transport option (TLS, or plaintext on loopback) as well.
func Token(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearerToken(token))
}

type bearerToken string

// GetRequestMetadata returns the authorization header, or an error on a
// plaintext connection to another host.
func (b bearerToken) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) != nil {
		host := ""
		if len(uri) > 0 {
			if u, err := url.Parse(uri[0]); err == nil {
				host = u.Hostname()
			}
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("client: not sending a token over plaintext to %q: use TLS", host)
		}
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(b))}, nil
}

// RequireTransportSecurity is false: GetRequestMetadata allows plaintext
// to loopback only.
func (bearerToken) RequireTransportSecurity() bool { return false }
