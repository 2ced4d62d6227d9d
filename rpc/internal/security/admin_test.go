package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

const tokenAdmin = "tok-admin-0123456789abcdef"

// adminTokenFile writes an admin token file of tokenAdmin, named ops.
func adminTokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "admin-tokens")
	writeFile(t, f, []byte("# operators\n"+tokenAdmin+" ops\n"))
	return f
}

func TestParseAdminTokens(t *testing.T) {
	ts, err := ParseAdminTokens("admin", []byte("# c\n\n"+tokenAdmin+" ops # trailing\n"+tokenAll+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0] != (AdminToken{Name: "ops", Token: tokenAdmin}) || ts[1] != (AdminToken{Name: "admin:4", Token: tokenAll}) {
		t.Fatalf("%+v", ts)
	}
	for _, tc := range []struct{ data, err string }{
		{"", "admin: no tokens"},
		{"short ops\n", "admin:1: token: must be at least 16 bytes, got 5"},
		{tokenAdmin + " ops extra\n", "admin:1: want `TOKEN [NAME]`, got 3 fields"},
	} {
		if _, err := ParseAdminTokens("admin", []byte(tc.data)); err == nil || err.Error() != tc.err {
			t.Errorf("%q: %v, want %q", tc.data, err, tc.err)
		}
	}
	if _, err := NewAdminTokenSet(filepath.Join(t.TempDir(), "missing"), quietLogger()); err == nil || !strings.HasPrefix(err.Error(), "admin_token_file: ") {
		t.Fatalf("a missing admin token file: %v", err)
	}
	f := adminTokenFile(t)
	s, err := NewAdminTokenSet(f, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, f, []byte("short\n"))
	if s.Reload() == nil || s.lookup(tokenAdmin) == nil {
		t.Fatal("a bad file was taken, or dropped the running tokens")
	}
	writeFile(t, f, []byte(tokenAll+" other\n"))
	if s.Reload() != nil || s.lookup(tokenAdmin) != nil || s.lookup(tokenAll).name != "other" {
		t.Fatal("a good file did not replace the tokens")
	}
}

// leaf returns a certificate of kind and name signed by a fresh CA.
func leaf(t *testing.T, kind certs.Kind, name string) *x509.Certificate {
	t.Helper()
	caPEM, caKey, err := certs.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := certs.Issue(caPEM, caKey, kind, name, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(c)
	x, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// verified is a TLS connection state whose verified chain starts at c
// (nil: a TLS connection without a client certificate).
func verified(c *x509.Certificate) *tls.ConnectionState {
	st := &tls.ConnectionState{}
	if c != nil {
		st.VerifiedChains = [][]*x509.Certificate{{c}}
	}
	return st
}

// adminAuth returns an Authenticator of mode, TLS on or off, with the
// check tokens of tokenFile (modes token and either) and, when admin, the
// admin tokens of adminTokenFile.
func adminAuth(t *testing.T, mode ClientAuth, tlsOn, admin bool) *Authenticator {
	t.Helper()
	a := newAuth(t, mode, tlsOn)
	if admin {
		s, err := NewAdminTokenSet(adminTokenFile(t), quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		a.cfg.AdminTokens = s
	}
	return a
}

// Who may call the admin API, on gRPC: an admin token (over TLS or from
// loopback) or an admin certificate; with neither configured and no
// client authentication, a caller on loopback that forwards no one;
// nobody else. A check token, a client or peer certificate, no
// credential: PermissionDenied naming what is needed.
func TestAuthorizeAdmin(t *testing.T) {
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}
	adminCert, clientCert, peerCert := leaf(t, certs.Admin, "ops"), leaf(t, certs.Client, "app"), leaf(t, certs.Peer, "node2")

	open := adminAuth(t, ClientAuthNone, false, false)           // nothing configured: loopback only
	tokenOnly := adminAuth(t, ClientAuthToken, false, false)     // client tokens, no admin credential
	withAdmin := adminAuth(t, ClientAuthEither, true, true)      // TLS, client and admin tokens
	tlsOnly := adminAuth(t, ClientAuthMTLS, true, false)         // TLS: admin certificates only
	adminTokensOnly := adminAuth(t, ClientAuthNone, false, true) // admin tokens, no client auth
	for _, tc := range []struct {
		what    string
		a       *Authenticator
		addr    net.Addr
		tls     *tls.ConnectionState // nil: plaintext
		auth    string               // the Authorization value
		forward bool                 // the call carries x-forwarded-for
		want    codes.Code
		who     string // the operator's label, or a piece of the refusal
	}{
		{"open, loopback, nothing", open, loopback, nil, "", false, codes.OK, "loopback (no admin credential configured)"},
		{"open, another host, nothing", open, remote, nil, "", false, codes.PermissionDenied, "answers callers on loopback only"},
		{"open, loopback forwarding another's call", open, loopback, nil, "", true, codes.PermissionDenied, "none forwarding"},
		{"open, loopback with a token it does not know", open, loopback, nil, "Bearer " + tokenAdmin, false, codes.OK, "loopback"},
		{"client tokens, loopback, nothing", tokenOnly, loopback, nil, "", false, codes.PermissionDenied, "client auth token), so the admin API needs a credential of its own"},
		{"client tokens, a check token with *", tokenOnly, loopback, nil, "Bearer " + tokenAll, false, codes.PermissionDenied, "not an admin's"},
		{"a check token over TLS", withAdmin, remote, verified(nil), "Bearer " + tokenAll, false, codes.PermissionDenied, "--token-file"},
		{"an admin token over TLS", withAdmin, remote, verified(nil), "Bearer " + tokenAdmin, false, codes.OK, "admin token ops"},
		{"an admin token from loopback, plaintext", adminTokensOnly, loopback, nil, "Bearer " + tokenAdmin, false, codes.OK, "admin token ops"},
		{"an admin token over plaintext from another host", adminTokensOnly, remote, nil, "Bearer " + tokenAdmin, false, codes.Unauthenticated, "plaintext"},
		{"an unknown token", withAdmin, remote, verified(nil), "Bearer " + tokenAdmin + "x", false, codes.Unauthenticated, "unknown token"},
		{"not a bearer token", withAdmin, remote, verified(nil), "Basic " + tokenAdmin, false, codes.Unauthenticated, "Bearer TOKEN"},
		{"a client certificate", withAdmin, remote, verified(clientCert), "", false, codes.PermissionDenied, "a client certificate (app) is not an admin's"},
		{"an admin certificate", tlsOnly, remote, verified(adminCert), "", false, codes.OK, "admin certificate ops"},
		{"an admin certificate and a check token", withAdmin, remote, verified(adminCert), "Bearer " + tokenAll, false, codes.OK, "admin certificate ops"},
		{"a peer certificate", tlsOnly, remote, verified(peerCert), "", false, codes.PermissionDenied, "a peer certificate (node2)"},
		{"TLS, loopback, nothing", tlsOnly, loopback, verified(nil), "", false, codes.PermissionDenied, "admin certificate"},
		{"admin tokens, loopback, nothing", adminTokensOnly, loopback, nil, "", false, codes.PermissionDenied, "--admin-token-file"},
	} {
		p := &grpcpeer.Peer{Addr: tc.addr}
		if tc.tls != nil {
			p.AuthInfo = credentials.TLSInfo{State: *tc.tls}
		}
		ctx := grpcpeer.NewContext(context.Background(), p)
		md := metadata.MD{}
		if tc.auth != "" {
			md.Set("authorization", tc.auth)
		}
		if tc.forward {
			md.Set("x-forwarded-for", "198.51.100.7")
		}
		ctx = metadata.NewIncomingContext(ctx, md)
		who, err := tc.a.AuthorizeAdmin(ctx)
		got := status.Code(err)
		msg := who
		if err != nil {
			msg = status.Convert(err).Message()
		}
		if got != tc.want || !strings.Contains(msg, tc.who) {
			t.Errorf("%s: %s %q, want %s %q", tc.what, got, msg, tc.want, tc.who)
		}
	}
}

// The HTTP face records each admin request's caller for AuthorizeAdmin:
// its address, its token, its certificate; a request that says it was
// forwarded is not a local one.
func TestAdminHTTPHandler(t *testing.T) {
	for _, tc := range []struct {
		what   string
		a      *Authenticator
		remote string
		tls    *tls.ConnectionState
		header http.Header
		want   codes.Code
	}{
		{"open, loopback", adminAuth(t, ClientAuthNone, false, false), "127.0.0.1:5000", nil, nil, codes.OK},
		{"open, another host", adminAuth(t, ClientAuthNone, false, false), "192.0.2.1:5000", nil, nil, codes.PermissionDenied},
		{"open, loopback, X-Forwarded-For", adminAuth(t, ClientAuthNone, false, false), "127.0.0.1:5000", nil, http.Header{"X-Forwarded-For": {"198.51.100.7"}}, codes.PermissionDenied},
		{"open, loopback, Forwarded", adminAuth(t, ClientAuthNone, false, false), "127.0.0.1:5000", nil, http.Header{"Forwarded": {"for=198.51.100.7"}}, codes.PermissionDenied},
		{"open, loopback, another site's Origin", adminAuth(t, ClientAuthNone, false, false), "127.0.0.1:5000", nil, http.Header{"Origin": {"https://evil.example"}}, codes.PermissionDenied},
		{"admin token from loopback, another site's Origin", adminAuth(t, ClientAuthToken, false, true), "127.0.0.1:5000", nil, http.Header{"Authorization": {"Bearer " + tokenAdmin}, "Origin": {"https://evil.example"}}, codes.OK},
		{"admin token from loopback", adminAuth(t, ClientAuthToken, false, true), "127.0.0.1:5000", nil, http.Header{"Authorization": {"Bearer " + tokenAdmin}}, codes.OK},
		{"check token", adminAuth(t, ClientAuthToken, false, true), "127.0.0.1:5000", nil, http.Header{"Authorization": {"Bearer " + tokenAll}}, codes.PermissionDenied},
		{"admin certificate", adminAuth(t, ClientAuthMTLS, true, false), "192.0.2.1:5000", verified(leaf(t, certs.Admin, "ops")), nil, codes.OK},
		{"client certificate", adminAuth(t, ClientAuthMTLS, true, false), "192.0.2.1:5000", verified(leaf(t, certs.Client, "app")), nil, codes.PermissionDenied},
	} {
		var err error
		h := tc.a.AdminHTTPHandler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			_, err = tc.a.AuthorizeAdmin(r.Context())
		}))
		r := httptest.NewRequest("POST", AdminHTTPPrefix+"key/reset", nil)
		r.RemoteAddr, r.TLS, r.Host = tc.remote, tc.tls, "127.0.0.1:7080"
		for k, v := range tc.header {
			r.Header[k] = v
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: %v, want %s", tc.what, err, tc.want)
		}
	}
	// The node's HTTP guard lets the admin API through to be authorised
	// apart: a request without the client credential reaches it.
	a := adminAuth(t, ClientAuthToken, false, true)
	reached := false
	h := a.HTTPHandler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	r := httptest.NewRequest("POST", AdminHTTPPrefix+"key/reset", nil)
	r.RemoteAddr = "192.0.2.1:5000"
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !reached {
		t.Fatal("the HTTP guard stopped an admin request before its own authorisation")
	}
}

// The interceptors leave the admin API to its own authorisation (an
// admin token is no check token, and must reach it), treat its
// node-to-node half as the peer API, and refuse an admin token on a
// check with a message that says what it is for.
func TestInterceptorsAndTheAdminAPI(t *testing.T) {
	a := adminAuth(t, ClientAuthEither, true, true)
	remoteTLS := &grpcpeer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}, AuthInfo: credentials.TLSInfo{State: *verified(nil)}}
	ctx := metadata.NewIncomingContext(grpcpeer.NewContext(context.Background(), remoteTLS), metadata.Pairs("authorization", "Bearer "+tokenAdmin))
	called := false
	handler := func(context.Context, any) (any, error) { called = true; return nil, nil }
	if _, err := a.UnaryInterceptor(ctx, &sluicev1.ResetKeyRequest{}, &grpc.UnaryServerInfo{FullMethod: sluicev1.AdminService_ResetKey_FullMethodName}, handler); err != nil || !called {
		t.Fatalf("an admin call with an admin token: %v, handler called %v", err, called)
	}
	called = false
	_, err := a.UnaryInterceptor(ctx, checkReq("api"), &grpc.UnaryServerInfo{FullMethod: sluicev1.RateLimitService_Check_FullMethodName}, handler)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "admin API only") || called {
		t.Fatalf("a check with an admin token: %v, handler called %v", err, called)
	}
	peerMethod := sluicev1.AdminPeerService_KeyAdmin_FullMethodName
	if err := a.authorize(peerMethod, principal{kind: certs.Client, name: "app", cert: true}, nil); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("KeyAdmin with a client certificate: %v, want PermissionDenied", err)
	}
	if err := a.authorize(peerMethod, principal{kind: certs.Admin, name: "ops", cert: true}, nil); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("KeyAdmin with an admin certificate: %v, want PermissionDenied", err)
	}
	if err := a.authorize(peerMethod, principal{kind: certs.Peer, name: "node2", cert: true}, nil); err != nil {
		t.Fatalf("KeyAdmin with a member's peer certificate: %v", err)
	}
}

// The loopback admin API without credentials answers a local caller's own
// requests only (issue 38: a cross-site POST with Origin
// https://evil.example and Host evil.example:PORT reset a key): not one a
// proxy says it forwards (any of its headers, even empty), not one whose
// Host names another site (DNS rebinding), not one with another site's
// Origin.
func TestLocalAdminRequestsAreTheLocalCallersOwn(t *testing.T) {
	for _, tc := range []struct {
		what    string
		host    string
		headers map[string]string
		local   bool
	}{
		{"sluice's tools: 127.0.0.1", "127.0.0.1:7080", nil, true},
		{"localhost", "localhost:7080", nil, true},
		{"IPv6 loopback", "[::1]:7080", nil, true},
		{"a loopback origin", "127.0.0.1:7080", map[string]string{"Origin": "http://localhost:3000"}, true},
		{"another site's origin", "127.0.0.1:7080", map[string]string{"Origin": "https://evil.example"}, false},
		{"a null origin", "127.0.0.1:7080", map[string]string{"Origin": "null"}, false},
		{"DNS rebinding: another site's host", "evil.example:7080", nil, false},
		{"the issue's request", "evil.example:7080", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}, false},
		{"X-Forwarded-For", "127.0.0.1:7080", map[string]string{"X-Forwarded-For": "203.0.113.9"}, false},
		{"an empty X-Forwarded-For", "127.0.0.1:7080", map[string]string{"X-Forwarded-For": ""}, false},
		{"X-Real-IP", "127.0.0.1:7080", map[string]string{"X-Real-IP": "203.0.113.9"}, false},
		{"Forwarded", "127.0.0.1:7080", map[string]string{"Forwarded": "for=203.0.113.9"}, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "http://"+tc.host+"/v1/admin/key/reset", strings.NewReader("{}"))
		r.Host = tc.host
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		if got := localRequest(r); got != tc.local {
			t.Errorf("%s: local %v, want %v", tc.what, got, tc.local)
		}
	}
}
