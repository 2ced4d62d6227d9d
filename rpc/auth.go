package rpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// ClientAuth is how a node authenticates the callers of its public API
// (Check, Members, Envoy's RLS, reflection; gRPC and HTTP).
type ClientAuth string

// The client authentication modes.
const (
	// ClientAuthNone authenticates nobody: the default without TLS and
	// without a token file (loopback, or --insecure).
	ClientAuthNone ClientAuth = "none"
	// ClientAuthMTLS requires a client certificate signed by the CA (the
	// default with TLS).
	ClientAuthMTLS ClientAuth = "mtls"
	// ClientAuthToken requires a bearer token from the token file (the
	// default without TLS but with a token file: loopback only).
	ClientAuthToken ClientAuth = "token"
	// ClientAuthEither takes a client certificate or a token.
	ClientAuthEither ClientAuth = "either"
)

const peerServicePrefix = "/" + "sluice.v1.PeerService" + "/"

// Token is one bearer token of a token file and the limit names it may
// check: a name is covered when it starts with one of Prefixes ("*"
// covers every name).
type Token struct {
	// Name labels the token in logs (never the token itself). Default
	// "token<line>".
	Name string `yaml:"name"`
	// Token is the secret a client sends (Authorization: Bearer TOKEN).
	Token string `yaml:"token"`
	// Prefixes are the limit-name prefixes the token may use; "*" is all.
	Prefixes []string `yaml:"prefixes"`
}

// tokenEntry is a Token with its secret replaced by its SHA-256, so that
// lookups compare fixed-length digests in constant time.
type tokenEntry struct {
	name     string
	digest   [sha256.Size]byte
	prefixes []string
}

// covers reports whether the token may check limit name.
func (t *tokenEntry) covers(name string) bool {
	for _, p := range t.prefixes {
		if p == "*" || strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// ParseTokens reads a token file: YAML (`tokens: [{name, token,
// prefixes: [...]}]`) when it starts with `tokens:`, else one token a
// line, `TOKEN PREFIX [PREFIX...]` separated by spaces ('#' starts a
// comment). Each token needs at least one prefix ("*" for all) and must be
// at least 16 bytes. Errors name the file and line.
func ParseTokens(file string, data []byte) ([]Token, error) {
	trimmed := bytes.TrimSpace(data)
	var out []Token
	if bytes.HasPrefix(trimmed, []byte("tokens:")) {
		var doc struct {
			Tokens []Token `yaml:"tokens"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		for i, t := range doc.Tokens {
			if t.Name == "" {
				t.Name = fmt.Sprintf("token%d", i+1)
			}
			if err := checkToken(t); err != nil {
				return nil, fmt.Errorf("%s: tokens[%d]: %v", file, i, err)
			}
			out = append(out, t)
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for line := 1; sc.Scan(); line++ {
			text, _, _ := strings.Cut(sc.Text(), "#")
			f := strings.Fields(text)
			if len(f) == 0 {
				continue
			}
			t := Token{Name: fmt.Sprintf("%s:%d", file, line), Token: f[0], Prefixes: f[1:]}
			if err := checkToken(t); err != nil {
				return nil, fmt.Errorf("%s:%d: %v", file, line, err)
			}
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tokens", file)
	}
	return out, nil
}

func checkToken(t Token) error {
	if len(t.Token) < 16 {
		return fmt.Errorf("token: must be at least 16 bytes, got %d", len(t.Token))
	}
	if len(t.Prefixes) == 0 {
		return errors.New(`prefixes: at least one limit-name prefix ("*" for all)`)
	}
	return nil
}

// tokenSet holds the current tokens of a token file, reloaded by reload.
type tokenSet struct {
	file string
	log  *slog.Logger
	cur  atomic.Pointer[[]tokenEntry]
}

func newTokenSet(file string, log *slog.Logger) (*tokenSet, error) {
	s := &tokenSet{file: file, log: log}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("token_file: %w", err)
	}
	return s, nil
}

func (s *tokenSet) load() error {
	b, err := os.ReadFile(s.file)
	if err != nil {
		return err
	}
	ts, err := ParseTokens(s.file, b)
	if err != nil {
		return err
	}
	es := make([]tokenEntry, len(ts))
	for i, t := range ts {
		es[i] = tokenEntry{name: t.Name, digest: sha256.Sum256([]byte(t.Token)), prefixes: t.Prefixes}
	}
	s.cur.Store(&es)
	return nil
}

// reload reads the token file again; a file that does not parse keeps
// the running tokens and is logged.
func (s *tokenSet) reload() error {
	if err := s.load(); err != nil {
		s.log.Error("token file refused; the running tokens stay", "file", s.file, "error", err)
		return err
	}
	s.log.Info("tokens reloaded", "file", s.file, "tokens", len(*s.cur.Load()))
	return nil
}

// lookup returns the entry of token; it compares the token's digest with
// every entry's in constant time (crypto/subtle), whichever matches.
func (s *tokenSet) lookup(token string) *tokenEntry {
	d := sha256.Sum256([]byte(token))
	var found *tokenEntry
	es := *s.cur.Load()
	for i := range es {
		if subtle.ConstantTimeCompare(d[:], es[i].digest[:]) == 1 && found == nil {
			found = &es[i]
		}
	}
	return found
}

// principal is who made a call, as authenticated.
type principal struct {
	kind  certs.Kind  // Peer or Client for a verified certificate; "" otherwise
	name  string      // the certificate's sluice name
	cert  bool        // a certificate chain was verified
	token *tokenEntry // a valid bearer token
}

// authenticator checks callers of a node.
type authenticator struct {
	mode     ClientAuth
	tls      bool // the public port serves TLS
	tokens   *tokenSet
	isMember func(name string) bool
}

// verifiedCert returns the kind and name of the verified client
// certificate of a TLS connection state, and whether a chain was verified.
func verifiedCert(cs *tls.ConnectionState) (kind certs.Kind, name string, verified bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", "", false
	}
	k, n, _ := certs.Identity(cs.VerifiedChains[0][0])
	return k, n, true
}

// peerName returns the member name of the caller's verified peer
// certificate (spiffe://sluice/peer/NAME), or ok = false when the call
// came without one (plaintext, no certificate, a client certificate).
func peerName(ctx context.Context) (string, bool) {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	kind, name, _ := verifiedCert(&info.State)
	return name, kind == certs.Peer
}

// bearer returns the token of an "Authorization: Bearer TOKEN" value.
func bearer(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// fromToken checks a bearer token; secure says the call came over TLS or
// from loopback. It returns the principal or an Unauthenticated error.
func (a *authenticator) fromToken(tok string, secure bool) (*tokenEntry, error) {
	if !secure {
		return nil, status.Error(codes.Unauthenticated, "a token over plaintext from another host is refused: use TLS")
	}
	e := a.tokens.lookup(tok)
	if e == nil {
		return nil, status.Error(codes.Unauthenticated, "unknown token")
	}
	return e, nil
}

// takesTokens reports whether the mode accepts bearer tokens; other modes
// ignore an Authorization header.
func (a *authenticator) takesTokens() bool {
	return a.tokens != nil && (a.mode == ClientAuthToken || a.mode == ClientAuthEither)
}

// grpcPrincipal authenticates a gRPC call from its peer and metadata.
func (a *authenticator) grpcPrincipal(ctx context.Context) (principal, error) {
	var pr principal
	p, _ := grpcpeer.FromContext(ctx)
	secure := false
	if p != nil {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			secure = true
			pr.kind, pr.name, pr.cert = verifiedCert(&info.State)
		} else {
			secure = isLoopback(p.Addr)
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if vs := md.Get("authorization"); len(vs) > 0 && a.takesTokens() {
		tok, ok := bearer(vs[0])
		if !ok {
			return pr, status.Error(codes.Unauthenticated, `authorization: want "Bearer TOKEN"`)
		}
		e, err := a.fromToken(tok, secure)
		if err != nil {
			return pr, err
		}
		pr.token = e
	}
	return pr, nil
}

// authorize decides a call to method (a full gRPC method name) by pr; req
// is the request of a unary call (nil for streams).
func (a *authenticator) authorize(method string, pr principal, req any) error {
	if strings.HasPrefix(method, peerServicePrefix) {
		if !a.tls {
			return nil // plaintext peers: loopback or --insecure (protected mode)
		}
		switch {
		case pr.kind == certs.Peer && a.isMember(pr.name):
			return nil
		case pr.kind == certs.Peer:
			return status.Errorf(codes.PermissionDenied, "peer %q is not a current member", pr.name)
		case pr.cert || pr.token != nil:
			return status.Error(codes.PermissionDenied, "the peer API takes only a member's peer certificate")
		}
		return status.Error(codes.Unauthenticated, "the peer API needs a member's peer certificate")
	}
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil // probes: liveness says nothing about the keys
	}
	if a.mode == ClientAuthNone {
		return nil
	}
	if pr.cert && (a.mode == ClientAuthMTLS || a.mode == ClientAuthEither) {
		return nil // certificates from the CA may check every name
	}
	if pr.token == nil {
		return status.Errorf(codes.Unauthenticated, "client auth %s: %s", a.mode, a.wanted())
	}
	switch method {
	case sluicev1.RateLimitService_Check_FullMethodName:
		r, _ := req.(*sluicev1.CheckRequest)
		for i, c := range r.GetChecks() {
			if !pr.token.covers(c.GetName()) {
				return status.Errorf(codes.PermissionDenied, "checks[%d].name: %q is not covered by the token's prefixes", i, c.GetName())
			}
			// Numbers of its own would let a token reset every key of
			// its names (another algorithm or window starts a key
			// afresh), other clients' keys included.
			if hasNumbers(c) {
				return status.Errorf(codes.PermissionDenied, "checks[%d]: a token checks configured limits only: send no limit, window_ms, burst or algorithm (the limit %q takes its numbers from the node's limits file)", i, c.GetName())
			}
		}
		return nil
	case sluicev1.RateLimitService_Members_FullMethodName:
		return nil
	}
	if slices.Contains(pr.token.prefixes, "*") {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s needs a token with the prefix \"*\"", method)
}

// wanted says what a caller must present.
func (a *authenticator) wanted() string {
	switch a.mode {
	case ClientAuthMTLS:
		return "present a client certificate signed by the node's CA"
	case ClientAuthToken:
		return "send Authorization: Bearer TOKEN"
	}
	return "present a client certificate or send Authorization: Bearer TOKEN"
}

// unary is the gRPC unary interceptor.
func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	pr, err := a.grpcPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.authorize(info.FullMethod, pr, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// stream is the gRPC stream interceptor.
func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	pr, err := a.grpcPrincipal(ss.Context())
	if err != nil {
		return err
	}
	if err := a.authorize(info.FullMethod, pr, nil); err != nil {
		return err
	}
	return h(srv, ss)
}

type principalKey struct{}

// httpAuth guards the HTTP face: /v1/ and /metrics need the client
// authentication of the gRPC port (a verified client certificate, or
// Authorization: Bearer TOKEN); /healthz and /readyz stay open for
// probes. The principal goes in the request's context, where the
// gateway's Check finds it to check the token's prefixes.
func (a *authenticator) httpAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || a.mode == ClientAuthNone {
			h.ServeHTTP(w, r)
			return
		}
		var pr principal
		pr.kind, pr.name, pr.cert = verifiedCert(r.TLS)
		secure := r.TLS != nil || isLoopbackHost(r.RemoteAddr)
		if v := r.Header.Get("Authorization"); v != "" && a.takesTokens() {
			tok, ok := bearer(v)
			var err error = status.Error(codes.Unauthenticated, `authorization: want "Bearer TOKEN"`)
			if ok {
				pr.token, err = a.fromToken(tok, secure)
			}
			if err != nil {
				httpDeny(w, http.StatusUnauthorized, status.Convert(err).Message())
				return
			}
		}
		if (pr.cert && (a.mode == ClientAuthMTLS || a.mode == ClientAuthEither)) || pr.token != nil {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, pr)))
			return
		}
		httpDeny(w, http.StatusUnauthorized, fmt.Sprintf("client auth %s: %s", a.mode, a.wanted()))
	})
}

func httpDeny(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	}
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"code":%d,"message":%q,"details":[]}`+"\n", codes.Unauthenticated, msg)
}

func isLoopbackHost(hostport string) bool {
	return isLoopback(stringAddr(hostport))
}

type stringAddr string

func (stringAddr) Network() string  { return "tcp" }
func (a stringAddr) String() string { return string(a) }

// gatewayServer is the Server as the HTTP gateway calls it: Check checks
// the token's prefixes (httpAuth put the principal in the context).
type gatewayServer struct {
	*Server
	auth *authenticator
}

// Check authorizes the checks' names for the caller's token, then checks.
func (g gatewayServer) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	pr, ok := ctx.Value(principalKey{}).(principal)
	if !ok && g.auth.mode != ClientAuthNone {
		return nil, status.Error(codes.Unauthenticated, "no client authentication")
	}
	if err := g.auth.authorize(sluicev1.RateLimitService_Check_FullMethodName, pr, req); err != nil {
		return nil, err
	}
	return g.Server.Check(ctx, req)
}
