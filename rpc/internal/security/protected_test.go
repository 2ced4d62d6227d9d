package security

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/syncbuf"
)

// The client authentication mode: its default follows TLS and the token
// file; a mode that lacks what it needs, or a token file no mode takes,
// is refused naming the setting.
func TestClientAuthMode(t *testing.T) {
	tlsOn := Settings{TLSCert: "n.pem", TLSKey: "n-key.pem", TLSCA: "ca.pem"}
	with := func(s Settings, mode ClientAuth, tokens string) Settings {
		s.ClientAuth, s.TokenFile = mode, tokens
		return s
	}
	for _, tc := range []struct {
		what string
		s    Settings
		want ClientAuth
		err  string // prefix of the error; "" none
	}{
		{"nothing", Settings{}, ClientAuthNone, ""},
		{"TLS", tlsOn, ClientAuthMTLS, ""},
		{"tokens", with(Settings{}, "", "t"), ClientAuthToken, ""},
		{"TLS and tokens", with(tlsOn, "", "t"), "", "token_file: given, but client_auth mtls takes no tokens"},
		{"either", with(tlsOn, ClientAuthEither, "t"), ClientAuthEither, ""},
		{"token over TLS", with(tlsOn, ClientAuthToken, "t"), ClientAuthToken, ""},
		{"none over TLS", with(tlsOn, ClientAuthNone, ""), ClientAuthNone, ""},
		{"half TLS", Settings{TLSCert: "n.pem"}, "", "tls_cert, tls_key, tls_ca: give all three or none"},
		{"unknown mode", with(Settings{}, "basic", ""), "", `client_auth: want mtls, token, either or none, got "basic"`},
		{"mtls without TLS", with(Settings{}, ClientAuthMTLS, ""), "", "client_auth: mtls needs TLS"},
		{"either without TLS", with(Settings{}, ClientAuthEither, "t"), "", "client_auth: either needs TLS"},
		{"token without a file", with(Settings{}, ClientAuthToken, ""), "", "client_auth: token needs token_file"},
		{"none with a file", with(Settings{}, ClientAuthNone, "t"), "", "token_file: given, but client_auth none"},
	} {
		got, err := tc.s.ClientAuthMode()
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.what, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)):
			t.Errorf("%s: %q, %v; want an error starting %q", tc.what, got, err, tc.err)
		}
	}
}

// Exposed names the first address other hosts can reach, in the order
// grpc_addr, http_addr, gossip_addr, advertise_addr; loopback, "localhost"
// and unset addresses are not.
func TestExposed(t *testing.T) {
	for _, tc := range []struct {
		s             Settings
		setting, addr string
	}{
		{Settings{GRPCAddr: "127.0.0.1:7070", GossipAddr: "127.0.0.1:7946", HTTPAddr: "127.0.0.1:7080"}, "", ""},
		{Settings{GRPCAddr: "[::1]:7070", GossipAddr: "localhost:7946"}, "", ""},
		{Settings{GRPCAddr: "0.0.0.0:7070", HTTPAddr: ":7080"}, "grpc_addr", "0.0.0.0:7070"},
		{Settings{GRPCAddr: "127.0.0.1:7070", HTTPAddr: ":7080", GossipAddr: "10.0.0.5:7946"}, "http_addr", ":7080"},
		{Settings{GRPCAddr: "127.0.0.1:7070", GossipAddr: "10.0.0.5:7946"}, "gossip_addr", "10.0.0.5:7946"},
		{Settings{GRPCAddr: "127.0.0.1:7070", AdvertiseHost: "10.0.0.5"}, "advertise_addr", "10.0.0.5"},
		{Settings{AdvertiseHost: "127.0.0.1"}, "", ""},
		{Settings{GRPCAddr: "sluice1:7070"}, "grpc_addr", "sluice1:7070"},
	} {
		if setting, addr := tc.s.Exposed(); setting != tc.setting || addr != tc.addr {
			t.Errorf("%+v: %q %q, want %q %q", tc.s, setting, addr, tc.setting, tc.addr)
		}
	}
}

// Off loopback, protected mode wants gossip encrypted, TLS and client
// authentication, and names exactly what is missing; Insecure or
// loopback wants nothing.
func TestProtectedModeNamesWhatIsMissing(t *testing.T) {
	wide := Settings{GRPCAddr: "0.0.0.0:7070", GossipAddr: "127.0.0.1:7946", AdvertiseHost: "127.0.0.1"}
	with := func(f func(*Settings)) Settings { s := wide; f(&s); return s }
	tlsOn := func(s *Settings) { s.TLSCert, s.TLSKey, s.TLSCA = "n.pem", "n-key.pem", "ca.pem" }
	const (
		gossip  = "gossip is not encrypted (serve --gossip-key-file)"
		noTLS   = "the gRPC and HTTP ports are not TLS"
		clients = "clients are not authenticated"
	)
	for _, tc := range []struct {
		what    string
		s       Settings
		missing []string // empty: allowed
	}{
		{"loopback", Settings{GRPCAddr: "127.0.0.1:7070", GossipAddr: "127.0.0.1:7946"}, nil},
		{"nothing", wide, []string{gossip, noTLS, clients}},
		{"insecure", with(func(s *Settings) { s.Insecure = true }), nil},
		{"gossip key only", with(func(s *Settings) { s.GossipEncrypted = true }), []string{noTLS, clients}},
		{"TLS only", with(tlsOn), []string{gossip}},
		{"TLS, no client auth", with(func(s *Settings) { tlsOn(s); s.GossipEncrypted = true; s.ClientAuth = ClientAuthNone }), []string{clients + " (serve --client-auth"}},
		{"a bad mode", with(func(s *Settings) { tlsOn(s); s.GossipEncrypted = true; s.ClientAuth = ClientAuthToken }), []string{clients + " (client_auth: token needs token_file)"}},
		{"tokens over plaintext", with(func(s *Settings) { s.GossipEncrypted = true; s.TokenFile = "t" }), []string{noTLS}},
		{"TLS + mtls + gossip key", with(func(s *Settings) { tlsOn(s); s.GossipEncrypted = true }), nil},
		{"TLS + either + gossip key", with(func(s *Settings) {
			tlsOn(s)
			s.GossipEncrypted = true
			s.ClientAuth = ClientAuthEither
			s.TokenFile = "t"
		}), nil},
	} {
		err := tc.s.ProtectedMode()
		if len(tc.missing) == 0 {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.what, err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), "grpc_addr: 0.0.0.0:7070 is reachable") || !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("%s: %v, want a refusal naming grpc_addr and --insecure", tc.what, err)
			continue
		}
		for _, m := range tc.missing {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not name %q", tc.what, err, m)
			}
		}
		for _, m := range []string{gossip, noTLS, clients} {
			if !slices.ContainsFunc(tc.missing, func(w string) bool { return strings.HasPrefix(w, m) }) && strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q names %q, which is there", tc.what, err, m)
			}
		}
	}
}

// WarnInsecure says so at once, naming the setting, and returns when its
// context ends.
func TestWarnInsecure(t *testing.T) {
	var logs syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		WarnInsecure(ctx, slog.New(slog.NewTextHandler(&logs, nil)), "http_addr", ":7080")
		close(done)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "INSECURE") {
		if time.Now().After(deadline) {
			t.Fatal("no INSECURE warning")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if out := logs.String(); !strings.Contains(out, "setting=http_addr") || strings.Count(out, "INSECURE") != 1 {
		t.Fatalf("warnings: %s", out)
	}
}
