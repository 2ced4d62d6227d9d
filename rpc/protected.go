package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// InsecureWarnEvery is how often a node running with NodeConfig.Insecure
// off loopback says so in its log.
const InsecureWarnEvery = 5 * time.Minute

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

// exposed returns the first of cfg's addresses that other hosts can
// reach (see offLoopback), or "" when the node stays on loopback.
func exposed(cfg NodeConfig) (setting, addr string) {
	return offLoopback(map[string]string{
		"grpc_addr": cfg.GRPCAddr, "http_addr": cfg.HTTPAddr, "gossip_addr": cfg.GossipAddr, "advertise_addr": cfg.AdvertiseHost,
	})
}

// protectedMode refuses a node that others could reach while it cannot
// keep strangers out: off loopback a node needs its gossip encrypted
// (GossipKeys) and its callers authenticated: TLS on the gRPC and HTTP
// ports (which also authenticates peers by certificate) with client auth
// mtls, either, or token. Insecure (serve --insecure) accepts the risk.
// It returns an error naming the setting and each missing piece, or nil.
func protectedMode(cfg NodeConfig) error {
	setting, addr := exposed(cfg)
	if setting == "" || cfg.Insecure {
		return nil
	}
	var missing []string
	if len(cfg.GossipKeys) == 0 {
		missing = append(missing, "gossip is not encrypted (serve --gossip-key-file)")
	}
	tlsOn := cfg.TLSCert != "" && cfg.TLSKey != "" && cfg.TLSCA != ""
	if !tlsOn {
		missing = append(missing, "the gRPC and HTTP ports are not TLS, so peers are not authenticated (serve --tls-cert, --tls-key, --tls-ca)")
	}
	mode, err := cfg.clientAuth()
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

// warnInsecure logs, now and every InsecureWarnEvery until ctx is done,
// that the node runs off loopback in plaintext.
func warnInsecure(ctx context.Context, log *slog.Logger, setting, addr string) {
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
