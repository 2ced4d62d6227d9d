package security

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/certs"
)

// The admin API (sluice.v1.AdminService: inspect and reset keys, list the
// limits in force) is authorised apart from checks. A caller is an
// operator when it presents
//
//   - an admin token: a token of the node's admin token file (serve
//     --admin-token-file), sent as Authorization: Bearer TOKEN over TLS or
//     from loopback; never a token of the check token file (--token-file),
//     whatever its prefixes, and an admin token checks nothing; or
//   - an admin certificate: a client certificate signed by the node's CA
//     whose URI SAN is spiffe://sluice/admin/NAME (certs.Admin).
//
// A node with no admin credential configured (no admin token file, no
// TLS) and no client authentication at all (client auth none) answers
// the admin API to callers on loopback only, and only to those that do
// not say they forward someone else's request (X-Forwarded-For,
// Forwarded, X-Real-IP and the other headers of forwardHeaders; a local
// reverse proxy would otherwise open it to whoever reaches the proxy), and
// on HTTP only to requests whose Host names this machine and that carry no
// Origin of another site (a browser on the operator's machine, or a page
// whose name resolves to 127.0.0.1, would otherwise reach it cross-site). Everyone else is refused with PermissionDenied
// naming what is needed.
//
// The admin service authorises each call itself (AuthorizeAdmin), with or
// without the node's interceptors, which let its methods through; its
// node-to-node half (sluice.v1.AdminPeerService) is a peer API, authorised
// as PeerService is.

// AdminServicePrefix and AdminPeerServicePrefix start the full gRPC method
// names of the admin API and of its node-to-node half.
const (
	AdminServicePrefix     = "/sluice.v1.AdminService/"
	AdminPeerServicePrefix = "/sluice.v1.AdminPeerService/"
)

// AdminHTTPPrefix starts the paths of the admin API on the HTTP face.
const AdminHTTPPrefix = "/v1/admin/"

// isPeerMethod reports whether method (a full gRPC method name) is one
// of the peer API's: called by nodes only.
func isPeerMethod(method string) bool {
	return strings.HasPrefix(method, peerServicePrefix) || strings.HasPrefix(method, AdminPeerServicePrefix)
}

// AdminToken is one token of an admin token file.
type AdminToken struct {
	// Name labels the token in logs (never the token itself): the line's
	// second field, default "FILE:LINE".
	Name string
	// Token is the secret an operator sends (Authorization: Bearer TOKEN).
	Token string
}

// ParseAdminTokens reads an admin token file: one token a line, `TOKEN
// [NAME]` separated by spaces ('#' starts a comment), each at least 16
// bytes. file names the file in errors and default names only. It returns
// the tokens in file order, or an error "FILE:LINE: ..." for a short token
// or a line of more than two fields, "FILE: no tokens" for a file with
// none.
func ParseAdminTokens(file string, data []byte) ([]AdminToken, error) {
	var out []AdminToken
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		switch {
		case len(f) == 0:
			continue
		case len(f) > 2:
			return nil, fmt.Errorf("%s:%d: want `TOKEN [NAME]`, got %d fields", file, line, len(f))
		case len(f[0]) < 16:
			return nil, fmt.Errorf("%s:%d: token: must be at least 16 bytes, got %d", file, line, len(f[0]))
		}
		t := AdminToken{Name: fmt.Sprintf("%s:%d", file, line), Token: f[0]}
		if len(f) == 2 {
			t.Name = f[1]
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tokens", file)
	}
	return out, nil
}

// AdminTokenSet holds the current tokens of an admin token file (see
// ParseAdminTokens), reloaded by Reload. It is safe for concurrent use: a
// reload swaps the whole set at once.
type AdminTokenSet struct {
	file string
	log  *slog.Logger
	cur  atomic.Pointer[[]tokenEntry]
}

// NewAdminTokenSet reads the admin token file at path file; log receives
// the reloads. It returns an error starting "admin_token_file: " when the
// file cannot be read or does not parse (see ParseAdminTokens).
func NewAdminTokenSet(file string, log *slog.Logger) (*AdminTokenSet, error) {
	s := &AdminTokenSet{file: file, log: log}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("admin_token_file: %w", err)
	}
	return s, nil
}

func (s *AdminTokenSet) load() error {
	b, err := os.ReadFile(s.file)
	if err != nil {
		return err
	}
	ts, err := ParseAdminTokens(s.file, b)
	if err != nil {
		return err
	}
	es := make([]tokenEntry, len(ts))
	for i, t := range ts {
		// No prefixes: an admin token covers no limit name.
		es[i] = tokenEntry{name: t.Name, digest: sha256.Sum256([]byte(t.Token))}
	}
	s.cur.Store(&es)
	return nil
}

// Reload reads the admin token file again. A file that cannot be read or
// does not parse keeps the running tokens, is logged, and its error is
// returned.
func (s *AdminTokenSet) Reload() error {
	if err := s.load(); err != nil {
		s.log.Error("admin token file refused; the running admin tokens stay", "file", s.file, "error", err)
		return err
	}
	s.log.Info("admin tokens reloaded", "file", s.file, "tokens", len(*s.cur.Load()))
	return nil
}

// lookup returns the entry of token (nil set or none: nil), as
// TokenSet.lookup does.
func (s *AdminTokenSet) lookup(token string) *tokenEntry {
	if s == nil {
		return nil
	}
	return lookupDigest(*s.cur.Load(), token)
}

// adminCaller is who called the admin API, as its transport shows it.
type adminCaller struct {
	certKind certs.Kind // the verified certificate's kind ("" without one)
	certName string
	bearer   string // the bearer token sent ("" none)
	badAuth  bool   // an Authorization value that is not "Bearer TOKEN"
	secure   bool   // TLS, or loopback
	local    bool   // from loopback, not saying it forwards another's request
}

type adminCallerKey struct{}

// AdminHTTPHandler records the caller of each request to the admin API on
// the HTTP face (its verified certificate, its bearer token, whether it
// came from loopback) in the request's context, where AuthorizeAdmin
// finds it; h decides. It authorises nothing itself.
func (a *Authenticator) AdminHTTPHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c adminCaller
		c.certKind, c.certName, _ = verifiedCert(r.TLS)
		loop := isLoopbackHost(r.RemoteAddr)
		c.secure = r.TLS != nil || loop
		c.local = loop && localRequest(r)
		if v := r.Header.Get("Authorization"); v != "" {
			c.bearer, c.badAuth = bearerOrBad(v)
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), adminCallerKey{}, c)))
	})
}

// forwardHeaders are the headers a proxy sets to say it forwards someone
// else's request: present at all (even empty), the request is not taken
// for a local caller's.
var forwardHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Real-Ip", "X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "X-Cluster-Client-Ip", "Via"}

// localRequest reports whether r, which came from loopback, is a local
// caller's own: no proxy says it forwards it (forwardHeaders), its Host
// names this machine (localhost or a loopback address: a page of another
// site whose name resolves to 127.0.0.1, DNS rebinding, sends its own
// name), and it carries no Origin of another site (a browser on this
// machine sends the page's origin with a cross-site request; sluice's
// tools and curl send none).
func localRequest(r *http.Request) bool {
	for _, h := range forwardHeaders {
		if _, ok := r.Header[h]; ok {
			return false
		}
	}
	if !loopbackName(r.Host) {
		return false
	}
	if o, ok := r.Header["Origin"]; ok {
		if len(o) != 1 {
			return false
		}
		u, err := url.Parse(o[0])
		if err != nil || u.Host == "" || !loopbackName(u.Host) {
			return false
		}
	}
	return true
}

// forwardedMD reports whether gRPC metadata md carries any of
// forwardHeaders (a proxy says it forwards the call).
func forwardedMD(md metadata.MD) bool {
	for _, h := range forwardHeaders {
		if _, ok := md[strings.ToLower(h)]; ok {
			return true
		}
	}
	return false
}

// loopbackName reports whether hostport (a Host header, or an origin's
// host) names this machine: localhost (or a name under .localhost) or a
// loopback address, with or without a port.
func loopbackName(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearerOrBad returns the token of an "Authorization: Bearer TOKEN"
// value, or bad = true for any other value.
func bearerOrBad(v string) (tok string, bad bool) {
	tok, ok := bearer(v)
	return tok, !ok
}

// grpcAdminCaller is the caller of a gRPC call (ctx is the call's).
func grpcAdminCaller(ctx context.Context) adminCaller {
	var c adminCaller
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.secure = true
			c.certKind, c.certName, _ = verifiedCert(&info.State)
		}
		c.local = isLoopback(p.Addr)
		c.secure = c.secure || c.local
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if forwardedMD(md) {
		c.local = false
	}
	if vs := md.Get("authorization"); len(vs) > 0 {
		c.bearer, c.badAuth = bearerOrBad(vs[0])
	}
	return c
}

// openAdmin reports whether the admin API answers local callers without
// a credential: no admin token file, no TLS (no admin certificate can be
// presented), and no client authentication at all.
func (a *Authenticator) openAdmin() bool {
	return a.cfg.AdminTokens == nil && !a.cfg.TLS && a.cfg.Mode == ClientAuthNone
}

// AuthorizeAdmin authorises a call to the admin API. ctx is the call's:
// a gRPC call's, or a request's that came through AdminHTTPHandler. It
// returns a label of the operator for logs ("admin token NAME", "admin
// certificate NAME", "loopback (no admin credential configured)"; never
// a secret), or a status error: Unauthenticated for an Authorization
// value that is not a bearer token, an unknown token, or a token over
// plaintext from another host; PermissionDenied, naming what the admin
// API takes, for every other caller that is not an operator (no
// credential, a client or peer certificate, a check token).
func (a *Authenticator) AuthorizeAdmin(ctx context.Context) (string, error) {
	c, ok := ctx.Value(adminCallerKey{}).(adminCaller)
	if !ok {
		c = grpcAdminCaller(ctx)
	}
	if c.certKind == certs.Admin {
		return "admin certificate " + c.certName, nil
	}
	if c.badAuth {
		return "", status.Error(codes.Unauthenticated, `authorization: want "Bearer TOKEN"`)
	}
	if c.bearer != "" {
		if e := a.cfg.AdminTokens.lookup(c.bearer); e != nil {
			if !c.secure {
				return "", status.Error(codes.Unauthenticated, "an admin token over plaintext from another host is refused: use TLS")
			}
			return "admin token " + e.name, nil
		}
		if a.cfg.Tokens != nil && a.cfg.Tokens.lookup(c.bearer) != nil {
			return "", status.Error(codes.PermissionDenied, "a token of the token file (--token-file) checks limits and is not an admin's: "+a.adminWanted())
		}
		if a.cfg.AdminTokens != nil {
			return "", status.Error(codes.Unauthenticated, "unknown token: "+a.adminWanted())
		}
		// A node with no admin tokens: the token means nothing here (as
		// on the public API of a node that takes none).
	}
	if a.openAdmin() && c.local {
		return "loopback (no admin credential configured)", nil
	}
	why := ""
	switch {
	case c.certKind != "":
		why = fmt.Sprintf("a %s certificate (%s) is not an admin's: ", c.certKind, c.certName)
	case a.openAdmin():
		why = "with no admin credential configured the admin API answers callers on loopback only, and none forwarding another's request or sent by another site (Origin, Host): "
	case a.cfg.AdminTokens == nil && !a.cfg.TLS:
		why = fmt.Sprintf("the node authenticates clients (client auth %s), so the admin API needs a credential of its own: ", a.cfg.Mode)
	}
	return "", status.Error(codes.PermissionDenied, "admin API: "+why+a.adminWanted())
}

// adminWanted says what the admin API takes on this node.
func (a *Authenticator) adminWanted() string {
	switch {
	case a.cfg.AdminTokens != nil && a.cfg.TLS:
		return "send an admin token (Authorization: Bearer TOKEN of serve --admin-token-file) or present an admin certificate (URI SAN spiffe://sluice/admin/NAME: sluice tls cert create --admin NAME)"
	case a.cfg.AdminTokens != nil:
		return "send an admin token (Authorization: Bearer TOKEN of serve --admin-token-file)"
	case a.cfg.TLS:
		return "present an admin certificate (URI SAN spiffe://sluice/admin/NAME: sluice tls cert create --admin NAME), or give the node admin tokens (serve --admin-token-file)"
	}
	return "give the node admin tokens (serve --admin-token-file) and send one (Authorization: Bearer TOKEN), or serve TLS and present an admin certificate (sluice tls cert create --admin NAME)"
}
