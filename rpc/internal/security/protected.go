package security

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// InsecureWarnEvery is how often a node running insecure (serve
// --insecure) off loopback says so in its log.
const InsecureWarnEvery = 5 * time.Minute

// Settings are the settings of a node that protected mode and the client
// authentication mode depend on (a node's configuration, by the same
// names).
type Settings struct {
	// GRPCAddr, HTTPAddr and GossipAddr are the host:port addresses the
	// node listens on, AdvertiseHost the host it advertises; "" is
	// unset (an unset HTTPAddr: no HTTP face).
	GRPCAddr, HTTPAddr, GossipAddr, AdvertiseHost string
	// GossipEncrypted says gossip is encrypted (gossip keys are given).
	GossipEncrypted bool
	// TLSCert, TLSKey and TLSCA are the node's TLS files (see CertFiles);
	// all three or none.
	TLSCert, TLSKey, TLSCA string
	// ClientAuth is the mode asked for; "" picks the default (see
	// ClientAuthMode).
	ClientAuth ClientAuth
	// TokenFile is the file of bearer tokens; "" is none.
	TokenFile string
	// Insecure accepts running off loopback unprotected.
	Insecure bool
}

// ClientAuthMode returns the client authentication mode of s with its
// default (mtls with TLS, else token with a token file, else none), or an
// error naming the setting (tls_cert, tls_key, tls_ca; client_auth;
// token_file) when the TLS files are incomplete, the mode is unknown, or
// the mode lacks what it needs or is given what it cannot use.
func (s Settings) ClientAuthMode() (ClientAuth, error) {
	tlsOn := s.TLSCert != "" || s.TLSKey != "" || s.TLSCA != ""
	if tlsOn && (s.TLSCert == "" || s.TLSKey == "" || s.TLSCA == "") {
		return "", errors.New("tls_cert, tls_key, tls_ca: give all three or none")
	}
	mode := s.ClientAuth
	if mode == "" {
		switch {
		case tlsOn:
			mode = ClientAuthMTLS
		case s.TokenFile != "":
			mode = ClientAuthToken
		default:
			mode = ClientAuthNone
		}
	}
	switch mode {
	case ClientAuthNone, ClientAuthToken, ClientAuthMTLS, ClientAuthEither:
	default:
		return "", fmt.Errorf("client_auth: want mtls, token, either or none, got %q", mode)
	}
	if (mode == ClientAuthMTLS || mode == ClientAuthEither) && !tlsOn {
		return "", fmt.Errorf("client_auth: %s needs TLS (tls_cert, tls_key, tls_ca)", mode)
	}
	if (mode == ClientAuthToken || mode == ClientAuthEither) && s.TokenFile == "" {
		return "", fmt.Errorf("client_auth: %s needs token_file", mode)
	}
	if mode != ClientAuthToken && mode != ClientAuthEither && s.TokenFile != "" {
		return "", fmt.Errorf("token_file: given, but client_auth %s takes no tokens (use token or either)", mode)
	}
	return mode, nil
}

// offLoopback returns the first of the node's addresses (settings by
// name) that other hosts can reach, or "" when all are on loopback. A
// host name counts as off loopback unless it is "localhost".
func offLoopback(addrs map[string]string) (setting, addr string) {
	for _, name := range []string{"grpc_addr", "http_addr", "gossip_addr", "advertise_addr"} {
		a := addrs[name]
		if a == "" {
			continue
		}
		host := a
		if h, _, err := net.SplitHostPort(a); err == nil {
			host = h
		}
		if host == "localhost" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			continue
		}
		return name, a
	}
	return "", ""
}

// Exposed returns the first of s's addresses that other hosts can reach,
// by its setting's name (grpc_addr, http_addr, gossip_addr,
// advertise_addr, in that order) and value, or "", "" when the node stays
// on loopback. A host name counts as reachable unless it is "localhost".
func (s Settings) Exposed() (setting, addr string) {
	return offLoopback(map[string]string{
		"grpc_addr": s.GRPCAddr, "http_addr": s.HTTPAddr, "gossip_addr": s.GossipAddr, "advertise_addr": s.AdvertiseHost,
	})
}

// ProtectedMode refuses a node (of settings s) that others could reach
// while it cannot keep strangers out: off loopback a node needs its gossip encrypted
// and its callers authenticated: TLS on the gRPC and HTTP ports (which
// also authenticates peers by certificate) with client auth mtls, either,
// or token. Insecure (serve --insecure) accepts the risk. It returns nil,
// or an error starting with the exposed setting's name ("grpc_addr: ...")
// that names each missing piece and --insecure.
func (s Settings) ProtectedMode() error {
	setting, addr := s.Exposed()
	if setting == "" || s.Insecure {
		return nil
	}
	var missing []string
	if !s.GossipEncrypted {
		missing = append(missing, "gossip is not encrypted (serve --gossip-key-file)")
	}
	tlsOn := s.TLSCert != "" && s.TLSKey != "" && s.TLSCA != ""
	if !tlsOn {
		missing = append(missing, "the gRPC and HTTP ports are not TLS, so peers are not authenticated (serve --tls-cert, --tls-key, --tls-ca)")
	}
	mode, err := s.ClientAuthMode()
	switch {
	case err != nil:
		missing = append(missing, "clients are not authenticated ("+err.Error()+")")
	case mode == ClientAuthNone:
		missing = append(missing, "clients are not authenticated (serve --client-auth mtls, token or either)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s is reachable from other hosts, and %s: "+
		"add what is missing, keep every address on loopback, or accept the risk on a private network with insecure (serve --insecure, SLUICE_INSECURE=true)",
		setting, addr, strings.Join(missing, "; "))
}

// WarnInsecure logs, now and every InsecureWarnEvery until ctx is done,
// that the node runs off loopback in plaintext; setting and addr are
// Exposed's. It returns when ctx is done.
func WarnInsecure(ctx context.Context, log *slog.Logger, setting, addr string) {
	t := time.NewTicker(InsecureWarnEvery)
	defer t.Stop()
	for {
		log.Warn("INSECURE: reachable from other hosts without gossip encryption, TLS or client authentication (--insecure)", "setting", setting, "addr", addr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
