package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
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
// authenticate them: this version serves gRPC and HTTP without client or
// peer authentication (and gossips in plaintext unless GossipKeys are
// set), so off loopback anyone who reaches a port can reset counters or
// join the ring. Insecure (serve --insecure) accepts that risk. It returns
// an error naming the setting and what is missing, or nil.
func protectedMode(cfg NodeConfig) error {
	setting, addr := exposed(cfg)
	if setting == "" || cfg.Insecure {
		return nil
	}
	missing := "gossip is not encrypted (serve --gossip-key-file) and clients and peers are not authenticated (not available in this version)"
	if len(cfg.GossipKeys) > 0 {
		missing = "clients and peers are not authenticated (not available in this version)"
	}
	return fmt.Errorf("%s: %s is reachable from other hosts, and %s: "+
		"keep every address on loopback, or accept the risk on a private network with insecure (serve --insecure, SLUICE_INSECURE=true)", setting, addr, missing)
}

// warnInsecure logs, now and every InsecureWarnEvery until ctx is done,
// that the node runs off loopback in plaintext.
func warnInsecure(ctx context.Context, log *slog.Logger, setting, addr string) {
	t := time.NewTicker(InsecureWarnEvery)
	defer t.Stop()
	for {
		log.Warn("INSECURE: reachable from other hosts with plaintext gossip and no authentication (--insecure)", "setting", setting, "addr", addr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
