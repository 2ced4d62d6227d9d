package security

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
// (Check, Members, Envoy's RLS, reflection; gRPC and HTTP): one of the
// ClientAuth constants ("" picks the default, see
// Settings.ClientAuthMode).
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
// at least 16 bytes. file names the file in errors only. It returns the
// tokens in file order, or an error naming the file and line (YAML: the
// index) when the file holds no token, does not parse, or a token is
// short or has no prefix.
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

// TokenSet holds the current tokens of a token file (see ParseTokens),
// reloaded by Reload. It is safe for concurrent use: a reload swaps the
// whole set at once.
type TokenSet struct {
	file string
	log  *slog.Logger
	cur  atomic.Pointer[[]tokenEntry]
}

// NewTokenSet reads the token file at path file; log receives the
// reloads. It returns an error starting "token_file: " when the file
// cannot be read or does not parse (see ParseTokens).
func NewTokenSet(file string, log *slog.Logger) (*TokenSet, error) {
	s := &TokenSet{file: file, log: log}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("token_file: %w", err)
	}
	return s, nil
}

func (s *TokenSet) load() error {
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

// Reload reads the token file again. A file that cannot be read or does
// not parse keeps the running tokens, is logged, and its error (the read
// error or ParseTokens') is returned.
func (s *TokenSet) Reload() error {
	if err := s.load(); err != nil {
		s.log.Error("token file refused; the running tokens stay", "file", s.file, "error", err)
		return err
	}
	s.log.Info("tokens reloaded", "file", s.file, "tokens", len(*s.cur.Load()))
	return nil
}

// lookup returns the entry of token; it compares the token's digest with
// every entry's in constant time (crypto/subtle), whichever matches.
func (s *TokenSet) lookup(token string) *tokenEntry { return lookupDigest(*s.cur.Load(), token) }

// lookupDigest returns the entry of es whose digest is token's SHA-256
// (none: nil), comparing with every entry in constant time.
func lookupDigest(es []tokenEntry, token string) *tokenEntry {
	d := sha256.Sum256([]byte(token))
	var found *tokenEntry
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

// AuthConfig configures an Authenticator.
type AuthConfig struct {
	// Mode is how callers of the public API authenticate (see
	// Settings.ClientAuthMode for its default). (Required)
	Mode ClientAuth
	// TLS says the public port serves TLS: the peer API then takes only
	// callers whose verified peer certificate names a current member.
	// Without TLS the peer API is open (loopback or insecure: see
	// Settings.ProtectedMode). (Optional)
	TLS bool
	// Tokens are the bearer tokens of mode token or either; nil: none.
	// (Optional)
	Tokens *TokenSet
	// IsMember reports whether a member name is this node or a member of
	// its ring. (Required with TLS)
	IsMember func(name string) bool
	// HasNumbers reports whether a check carries numbers of its own
	// (limit, window_ms, burst or algorithm) rather than naming a
	// configured limit; a token's checks may not. (Required with Tokens)
	HasNumbers func(*sluicev1.RateLimitCheck) bool
	// AdminTokens are the tokens of the admin API (see AuthorizeAdmin);
	// nil: none. They check nothing. (Optional)
	AdminTokens *AdminTokenSet
	// Refunds says the node takes clients' refunds (a check of negative
	// hits; serve --allow-refunds): a token may then send one only with
	// the prefix "*", since a refund lifts what the key admits and a
	// token limited to prefixes must not lift its own limits. Off, the
	// node refuses negative hits itself (INVALID_ARGUMENT), whatever the
	// caller. (Optional)
	Refunds bool
}

// Authenticator checks the callers of a node: its gRPC interceptors and
// HTTP handler authenticate each call (certificate, bearer token) and
// authorize it for the method and, for a token, the limit names checked.
// Refusals are gRPC status errors: Unauthenticated when the caller is not
// known, PermissionDenied when it may not make this call. It is safe for
// concurrent use.
type Authenticator struct {
	cfg AuthConfig
}

// NewAuthenticator returns the Authenticator of cfg.
func NewAuthenticator(cfg AuthConfig) *Authenticator { return &Authenticator{cfg: cfg} }

// Mode returns the client authentication mode.
func (a *Authenticator) Mode() ClientAuth { return a.cfg.Mode }

// verifiedCert returns the kind and name of the verified client
// certificate of a TLS connection state, and whether a chain was verified.
func verifiedCert(cs *tls.ConnectionState) (kind certs.Kind, name string, verified bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", "", false
	}
	k, n, _ := certs.Identity(cs.VerifiedChains[0][0])
	return k, n, true
}

// PeerName returns the member name of the caller of a gRPC call (ctx is
// the call's) from its verified peer certificate
// (spiffe://sluice/peer/NAME), or ok = false when the call came without
// one (plaintext, no certificate, a client certificate).
func PeerName(ctx context.Context) (string, bool) {
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
func (a *Authenticator) fromToken(tok string, secure bool) (*tokenEntry, error) {
	if !secure {
		return nil, status.Error(codes.Unauthenticated, "a token over plaintext from another host is refused: use TLS")
	}
	e := a.cfg.Tokens.lookup(tok)
	if e == nil {
		if a.cfg.AdminTokens.lookup(tok) != nil {
			return nil, status.Error(codes.Unauthenticated, "an admin token (serve --admin-token-file) is for the admin API only: checks take a token of --token-file")
		}
		return nil, status.Error(codes.Unauthenticated, "unknown token")
	}
	return e, nil
}

// takesTokens reports whether the mode accepts bearer tokens; other modes
// ignore an Authorization header.
func (a *Authenticator) takesTokens() bool {
	return a.cfg.Tokens != nil && (a.cfg.Mode == ClientAuthToken || a.cfg.Mode == ClientAuthEither)
}

// grpcPrincipal authenticates a gRPC call from its peer and metadata.
func (a *Authenticator) grpcPrincipal(ctx context.Context) (principal, error) {
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
func (a *Authenticator) authorize(method string, pr principal, req any) error {
	if isPeerMethod(method) {
		if !a.cfg.TLS {
			return nil // plaintext peers: loopback or --insecure (protected mode)
		}
		switch {
		case pr.kind == certs.Peer && a.cfg.IsMember(pr.name):
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
	if a.cfg.Mode == ClientAuthNone {
		return nil
	}
	if pr.cert && (a.cfg.Mode == ClientAuthMTLS || a.cfg.Mode == ClientAuthEither) {
		return nil // certificates from the CA may check every name
	}
	if pr.token == nil {
		return status.Errorf(codes.Unauthenticated, "client auth %s: %s", a.cfg.Mode, a.wanted())
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
			if a.cfg.HasNumbers(c) {
				return status.Errorf(codes.PermissionDenied, "checks[%d]: a token checks configured limits only: send no limit, window_ms, burst or algorithm (the limit %q takes its numbers from the node's limits file)", i, c.GetName())
			}
			// A refund gives hits back: a token limited to prefixes
			// would lift its own limits.
			if a.cfg.Refunds && c.GetHits() < 0 && !slices.Contains(pr.token.prefixes, "*") {
				return status.Errorf(codes.PermissionDenied, "checks[%d].hits: a refund (negative hits) needs a token with the prefix \"*\" or a client certificate: a token limited to prefixes may not give hits back", i)
			}
		}
		return nil
	case sluicev1.RateLimitService_Members_FullMethodName, sluicev1.RateLimitService_Routes_FullMethodName:
		return nil
	}
	if slices.Contains(pr.token.prefixes, "*") {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s needs a token with the prefix \"*\"", method)
}

// wanted says what a caller must present.
func (a *Authenticator) wanted() string {
	switch a.cfg.Mode {
	case ClientAuthMTLS:
		return "present a client certificate signed by the node's CA"
	case ClientAuthToken:
		return "send Authorization: Bearer TOKEN"
	}
	return "present a client certificate or send Authorization: Bearer TOKEN"
}

// UnaryInterceptor is the gRPC unary server interceptor
// (grpc.UnaryServerInterceptor): it authenticates and authorizes the call
// before h runs, else returns the refusal (a status error) without
// calling h.
func (a *Authenticator) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, AdminServicePrefix) {
		return h(ctx, req) // it authorises each call itself (AuthorizeAdmin), with or without this interceptor
	}
	pr, err := a.grpcPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.authorize(info.FullMethod, pr, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// StreamInterceptor is the gRPC stream server interceptor
// (grpc.StreamServerInterceptor): it authenticates and authorizes the
// stream before h runs, else returns the refusal (a status error)
// without calling h. A token's stream is authorized by its method alone.
func (a *Authenticator) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, AdminServicePrefix) {
		return h(srv, ss) // see UnaryInterceptor
	}
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

// HTTPHandler guards the HTTP face h: /v1/ and /metrics need the client
// authentication of the gRPC port (a verified client certificate, or
// Authorization: Bearer TOKEN); /healthz, /readyz and /healthcheck stay
// open for probes; mode none lets everything through. The admin API
// (AdminHTTPPrefix) goes through untouched: it is authorised apart (see
// AdminHTTPHandler and AuthorizeAdmin). A refused request gets 401
// with a google.rpc.Status JSON body and WWW-Authenticate: Bearer. The
// principal goes in the request's context, where
// AuthorizeGatewayCheck finds it to check the token's prefixes.
func (a *Authenticator) HTTPHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/healthcheck" || a.cfg.Mode == ClientAuthNone ||
			strings.HasPrefix(r.URL.Path, AdminHTTPPrefix) {
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
		if (pr.cert && (a.cfg.Mode == ClientAuthMTLS || a.cfg.Mode == ClientAuthEither)) || pr.token != nil {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, pr)))
			return
		}
		httpDeny(w, http.StatusUnauthorized, fmt.Sprintf("client auth %s: %s", a.cfg.Mode, a.wanted()))
	})
}

// AuthorizeGatewayCheck authorizes req, a Check that came through the
// HTTP gateway behind HTTPHandler (ctx is the request's), for the caller
// HTTPHandler put in ctx: a token's prefixes must cover every check's
// name and its checks carry no numbers of their own. It returns nil or
// a status error: Unauthenticated when ctx holds no caller (and the mode
// is not none), else PermissionDenied.
func (a *Authenticator) AuthorizeGatewayCheck(ctx context.Context, req *sluicev1.CheckRequest) error {
	pr, ok := ctx.Value(principalKey{}).(principal)
	if !ok && a.cfg.Mode != ClientAuthNone {
		return status.Error(codes.Unauthenticated, "no client authentication")
	}
	return a.authorize(sluicev1.RateLimitService_Check_FullMethodName, pr, req)
}

// AuthorizeGatewayMethod authorizes a call to method (a full gRPC method
// name, e.g. Envoy's ShouldRateLimit) that came through the HTTP face
// behind HTTPHandler (ctx is the request's), as the gRPC port would: a
// client certificate may call it, a token needs the prefix "*". It
// returns nil or a status error (Unauthenticated, PermissionDenied).
func (a *Authenticator) AuthorizeGatewayMethod(ctx context.Context, method string) error {
	pr, ok := ctx.Value(principalKey{}).(principal)
	if !ok && a.cfg.Mode != ClientAuthNone {
		return status.Error(codes.Unauthenticated, "no client authentication")
	}
	return a.authorize(method, pr, nil)
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
