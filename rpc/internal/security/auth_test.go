package security

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

const (
	tokenAPI = "tok-api-0123456789abcdef"
	tokenAll = "tok-all-0123456789abcdef"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tokenFile writes a token file of tokenAPI (prefixes "api" and "auth.")
// and tokenAll ("*").
func tokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, f, []byte("# token prefixes\n"+tokenAPI+" api auth.\n"+tokenAll+" *\n"))
	return f
}

func TestParseTokens(t *testing.T) {
	ts, err := ParseTokens("tokens", []byte("# comment\n\n"+tokenAPI+" api auth. # trailing\n"+tokenAll+" *\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].Name != "tokens:3" || ts[0].Token != tokenAPI || strings.Join(ts[0].Prefixes, ",") != "api,auth." || ts[1].Name != "tokens:4" {
		t.Fatalf("line format: %+v", ts)
	}
	ts, err = ParseTokens("t.yaml", []byte("tokens:\n  - {name: api, token: "+tokenAPI+", prefixes: [api]}\n  - {token: "+tokenAll+", prefixes: ['*']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].Name != "api" || ts[1].Name != "token2" || ts[1].Prefixes[0] != "*" {
		t.Fatalf("YAML: %+v", ts)
	}
	for _, tc := range []struct{ data, err string }{
		{"", "tokens: no tokens"},
		{"# only a comment\n", "tokens: no tokens"},
		{tokenAPI + " api\nshort api\n", "tokens:2: token: must be at least 16 bytes, got 5"},
		{tokenAPI + "\n", `tokens:1: prefixes: at least one limit-name prefix ("*" for all)`},
		{"tokens:\n  - {token: short, prefixes: [api]}\n", "tokens: tokens[0]: token: must be at least 16 bytes"},
		{"tokens: [\n", "tokens: yaml: "},
	} {
		if _, err := ParseTokens("tokens", []byte(tc.data)); err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("%q: %v, want an error starting %q", tc.data, err, tc.err)
		}
	}
}

// A token set finds its tokens by value; a reload of a bad file keeps
// the running tokens, a good one replaces them.
func TestTokenSetReload(t *testing.T) {
	if _, err := NewTokenSet(filepath.Join(t.TempDir(), "missing"), quietLogger()); err == nil || !strings.HasPrefix(err.Error(), "token_file: ") {
		t.Fatalf("a missing token file: %v", err)
	}
	f := tokenFile(t)
	s, err := NewTokenSet(f, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if e := s.lookup(tokenAPI); e == nil || !e.covers("api") || !e.covers("auth.signin") || e.covers("billing") {
		t.Fatalf("lookup of tokenAPI: %+v", e)
	}
	if e := s.lookup(tokenAPI + "x"); e != nil {
		t.Fatalf("an unknown token found: %+v", e)
	}
	writeFile(t, f, []byte("short api\n"))
	if err := s.Reload(); err == nil {
		t.Fatal("reload of a bad file: no error")
	}
	if s.lookup(tokenAPI) == nil {
		t.Fatal("a bad file dropped the running tokens")
	}
	writeFile(t, f, []byte(tokenAll+" *\n"))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.lookup(tokenAPI) != nil || s.lookup(tokenAll) == nil {
		t.Fatal("a good file did not replace the tokens")
	}
}

func hasNumbers(c *sluicev1.RateLimitCheck) bool {
	return c.GetLimit() != 0 || c.GetWindowMs() != 0 || c.GetBurst() != 0 || c.GetAlgorithm() != sluicev1.Algorithm_ALGORITHM_UNSPECIFIED
}

func newAuth(t *testing.T, mode ClientAuth, tlsOn bool) *Authenticator {
	t.Helper()
	var ts *TokenSet
	if mode == ClientAuthToken || mode == ClientAuthEither {
		var err error
		if ts, err = NewTokenSet(tokenFile(t), quietLogger()); err != nil {
			t.Fatal(err)
		}
	}
	return NewAuthenticator(AuthConfig{Mode: mode, TLS: tlsOn, Tokens: ts,
		IsMember: func(name string) bool { return name == "node2" }, HasNumbers: hasNumbers})
}

func checkReq(names ...string) *sluicev1.CheckRequest {
	req := &sluicev1.CheckRequest{}
	for _, n := range names {
		req.Checks = append(req.Checks, &sluicev1.RateLimitCheck{Name: n, Key: "k"})
	}
	return req
}

// Who may call what, by mode and principal.
func TestAuthorize(t *testing.T) {
	const (
		forward = "/sluice.v1.PeerService/Forward"
		check   = sluicev1.RateLimitService_Check_FullMethodName
		members = sluicev1.RateLimitService_Members_FullMethodName
		routes  = sluicev1.RateLimitService_Routes_FullMethodName
		health  = "/grpc.health.v1.Health/Check"
		rls     = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	)
	either := newAuth(t, ClientAuthEither, true)
	api, all := either.cfg.Tokens.lookup(tokenAPI), either.cfg.Tokens.lookup(tokenAll)
	member := principal{kind: certs.Peer, name: "node2", cert: true}
	stranger := principal{kind: certs.Peer, name: "intruder", cert: true}
	client := principal{kind: certs.Client, name: "app", cert: true}
	withNumbers := checkReq("api")
	withNumbers.Checks[0].WindowMs = 1000
	for _, tc := range []struct {
		what   string
		a      *Authenticator
		method string
		pr     principal
		req    any
		want   codes.Code
	}{
		{"peer API, plaintext", newAuth(t, ClientAuthNone, false), forward, principal{}, nil, codes.OK},
		{"peer API, a member", either, forward, member, nil, codes.OK},
		{"peer API, a non-member", either, forward, stranger, nil, codes.PermissionDenied},
		{"peer API, a client certificate", either, forward, client, nil, codes.PermissionDenied},
		{"peer API, a token", either, forward, principal{token: all}, nil, codes.PermissionDenied},
		{"peer API, nobody", either, forward, principal{}, nil, codes.Unauthenticated},
		{"health, nobody", either, health, principal{}, nil, codes.OK},
		{"mode none, nobody", newAuth(t, ClientAuthNone, true), check, principal{}, checkReq("api"), codes.OK},
		{"mtls, a client certificate", newAuth(t, ClientAuthMTLS, true), check, client, checkReq("any"), codes.OK},
		{"mtls, nobody", newAuth(t, ClientAuthMTLS, true), check, principal{}, checkReq("api"), codes.Unauthenticated},
		{"token, a certificate only", newAuth(t, ClientAuthToken, true), check, client, checkReq("api"), codes.Unauthenticated},
		{"either, a certificate", either, check, client, checkReq("any"), codes.OK},
		{"token covering the names", either, check, principal{token: api}, checkReq("api", "auth.signin"), codes.OK},
		{"token not covering a name", either, check, principal{token: api}, checkReq("api", "billing"), codes.PermissionDenied},
		{"token with numbers of its own", either, check, principal{token: all}, withNumbers, codes.PermissionDenied},
		{"token, Members", either, members, principal{token: api}, nil, codes.OK},
		{"token, Routes", either, routes, principal{token: api}, nil, codes.OK},
		{"Routes, nobody", either, routes, principal{}, nil, codes.Unauthenticated},
		{"Routes, a client certificate", newAuth(t, ClientAuthMTLS, true), routes, client, nil, codes.OK},
		{"token without *, another service", either, rls, principal{token: api}, nil, codes.PermissionDenied},
		{"token with *, another service", either, rls, principal{token: all}, nil, codes.OK},
	} {
		if got := status.Code(tc.a.authorize(tc.method, tc.pr, tc.req)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.what, got, tc.want)
		}
	}
}

// The unary interceptor reads the caller's address and bearer token: a
// token from loopback passes, over plaintext from another host, unknown
// or malformed it is refused before the handler runs.
func TestUnaryInterceptor(t *testing.T) {
	a := newAuth(t, ClientAuthToken, false)
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}
	info := &grpc.UnaryServerInfo{FullMethod: sluicev1.RateLimitService_Check_FullMethodName}
	for _, tc := range []struct {
		what string
		addr net.Addr
		auth string
		want codes.Code
		msg  string
	}{
		{"token from loopback", loopback, "Bearer " + tokenAPI, codes.OK, ""},
		{"token over plaintext from another host", remote, "Bearer " + tokenAPI, codes.Unauthenticated, "plaintext"},
		{"unknown token", loopback, "Bearer " + tokenAPI + "x", codes.Unauthenticated, "unknown token"},
		{"not bearer", loopback, "Basic " + tokenAPI, codes.Unauthenticated, `want "Bearer TOKEN"`},
		{"no token", loopback, "", codes.Unauthenticated, "client auth token: send Authorization: Bearer TOKEN"},
	} {
		ctx := grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{Addr: tc.addr})
		if tc.auth != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", tc.auth))
		}
		called := false
		_, err := a.UnaryInterceptor(ctx, checkReq("api"), info, func(context.Context, any) (any, error) { called = true; return nil, nil })
		if got := status.Code(err); got != tc.want || called != (tc.want == codes.OK) || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v (handler called: %v), want %s %q", tc.what, err, called, tc.want, tc.msg)
		}
	}
}

// The HTTP face: probes stay open; the rest needs a token (or a
// certificate), and the gateway's Check finds the caller in the context
// to check its prefixes.
func TestHTTPHandler(t *testing.T) {
	a := newAuth(t, ClientAuthToken, false)
	var gatewayErr error
	h := a.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gatewayErr = a.AuthorizeGatewayCheck(r.Context(), checkReq(r.URL.Query().Get("name")))
	}))
	for _, tc := range []struct {
		what, path, remote, auth string
		want                     int
	}{
		{"healthz", "/healthz", "192.0.2.1:5000", "", 200},
		{"readyz", "/readyz", "192.0.2.1:5000", "", 200},
		{"no token", "/v1/check?name=api", "127.0.0.1:5000", "", 401},
		{"metrics, no token", "/metrics", "127.0.0.1:5000", "", 401},
		{"token from loopback", "/v1/check?name=api", "127.0.0.1:5000", "Bearer " + tokenAPI, 200},
		{"token over plaintext", "/v1/check?name=api", "192.0.2.1:5000", "Bearer " + tokenAPI, 401},
		{"not bearer", "/v1/check?name=api", "127.0.0.1:5000", "Basic " + tokenAPI, 401},
	} {
		r := httptest.NewRequest("POST", tc.path, nil)
		r.RemoteAddr = tc.remote
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.what, w.Code, w.Body, tc.want)
		}
		if w.Code == 401 && (w.Header().Get("WWW-Authenticate") == "" || !strings.HasPrefix(w.Body.String(), `{"code":16,"message":`)) {
			t.Errorf("%s: 401 without WWW-Authenticate or a status body: %v %s", tc.what, w.Header(), w.Body)
		}
	}
	r := httptest.NewRequest("POST", "/v1/check?name=billing", nil)
	r.RemoteAddr = "127.0.0.1:5000"
	r.Header.Set("Authorization", "Bearer "+tokenAPI)
	h.ServeHTTP(httptest.NewRecorder(), r)
	if status.Code(gatewayErr) != codes.PermissionDenied {
		t.Fatalf("the gateway's check of a name outside the token's prefixes: %v, want PermissionDenied", gatewayErr)
	}
	if err := a.AuthorizeGatewayCheck(context.Background(), checkReq("api")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a gateway check with no caller in its context: %v, want Unauthenticated", err)
	}
}

func TestIsLoopback(t *testing.T) {
	for _, tc := range []struct {
		a    net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, true},
		{&net.TCPAddr{IP: net.IPv6loopback}, true},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}, false},
		{&net.UnixAddr{Name: "/tmp/s"}, true},
		{stringAddr("[::1]:80"), true},
		{stringAddr("127.0.0.1:80"), true},
		{stringAddr("192.0.2.1:80"), false},
		{stringAddr("localhost:80"), false},
		{stringAddr("garbage"), false},
		{nil, false},
	} {
		if got := isLoopback(tc.a); got != tc.want {
			t.Errorf("isLoopback(%v) = %v, want %v", tc.a, got, tc.want)
		}
	}
}
