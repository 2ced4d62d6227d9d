package rpc

import "github.com/sluicehq/sluice/rpc/internal/security"

// InsecureWarnEvery is how often a node running with NodeConfig.Insecure
// off loopback says so in its log (5 minutes).
const InsecureWarnEvery = security.InsecureWarnEvery

// securitySettings returns the settings of cfg that protected mode and
// client authentication read.
func (cfg NodeConfig) securitySettings() security.Settings {
	return security.Settings{
		GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr, GossipAddr: cfg.GossipAddr, AdvertiseHost: cfg.AdvertiseHost,
		GossipEncrypted: len(cfg.GossipKeys) > 0,
		TLSCert:         cfg.TLSCert, TLSKey: cfg.TLSKey, TLSCA: cfg.TLSCA,
		ClientAuth: cfg.ClientAuth, TokenFile: cfg.TokenFile, Insecure: cfg.Insecure,
	}
}

// exposed returns the first of cfg's addresses that other hosts can
// reach, by setting name, or "" when the node stays on loopback (see
// security.Settings.Exposed).
func exposed(cfg NodeConfig) (setting, addr string) { return cfg.securitySettings().Exposed() }

// protectedMode refuses a node that others could reach while it cannot
// keep strangers out (see security.Settings.ProtectedMode): it returns
// nil, or an error naming the setting and each missing piece.
func protectedMode(cfg NodeConfig) error { return cfg.securitySettings().ProtectedMode() }
