package middleware

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// KeyFunc returns the key a request is limited by. It returns an error
// wrapping ErrNoKey when the request has nothing to key by (e.g. no user
// id); [FirstOf] then tries the next KeyFunc. It must be safe for
// concurrent use.
//
// The ready-made KeyFuncs tag their keys by kind ("ip:", "user:", and
// length-prefixed parts for composites), so that keys of different kinds
// or parts never collide: the user id "192.0.2.4" and the client at
// 192.0.2.4 have separate budgets.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by a KeyFunc's error when the request has nothing
// to key by.
var ErrNoKey = errors.New("middleware: no key for the request")

// Key tags of the ready-made key functions.
const (
	ipTag   = "ip:"
	userTag = "user:"
	compTag = "c:"
)

// IPConfig says how to find a request's client IP and turn it into a key.
type IPConfig struct {
	// Secret is the HMAC-SHA256 key that turns an address into a key, so
	// that keys reveal no IP; at least 16 bytes. (Required)
	Secret []byte
	// TrustedProxies are the networks of the proxies in front of the app.
	// Only when the socket peer is in one of them are the forwarding
	// headers read; the client is then the right-most address in them
	// that is not trusted. Empty: the socket address is the client,
	// whatever the headers say. (Optional)
	TrustedProxies []netip.Prefix
	// Header is the forwarding header the trusted proxies append to:
	// "X-Forwarded-For" (the default) or "Forwarded" (RFC 7239, its for=
	// parameters). It must be the one the proxies write: a client can
	// send either. (Optional)
	Header string
	// PlatformHeader, when set, names a header that the trusted proxy in
	// front overwrites with the client's IP (e.g. "Fly-Client-IP",
	// "X-Real-IP"); it is read instead of Header, and only when the
	// socket peer is trusted. (Optional)
	PlatformHeader string
	// IPv6Prefix groups IPv6 clients by this many leading bits, since a
	// client controls a whole /64. 1..128, default 64. (Optional)
	IPv6Prefix int
	// IPv4Prefix groups IPv4 clients by this many leading bits. 1..32,
	// default 32. (Optional)
	IPv4Prefix int
}

// ipKeyer resolves a client's address and keys it.
type ipKeyer struct {
	cfg IPConfig
}

func newIPKeyer(cfg IPConfig) (*ipKeyer, error) {
	switch {
	case len(cfg.Secret) < 16:
		return nil, fmt.Errorf("middleware: IPConfig.Secret: must be at least 16 bytes, got %d", len(cfg.Secret))
	case cfg.IPv6Prefix < 0 || cfg.IPv6Prefix > 128:
		return nil, fmt.Errorf("middleware: IPConfig.IPv6Prefix: must be 1..128, got %d", cfg.IPv6Prefix)
	case cfg.IPv4Prefix < 0 || cfg.IPv4Prefix > 32:
		return nil, fmt.Errorf("middleware: IPConfig.IPv4Prefix: must be 1..32, got %d", cfg.IPv4Prefix)
	}
	switch http.CanonicalHeaderKey(cfg.Header) {
	case "":
		cfg.Header = "X-Forwarded-For"
	case "X-Forwarded-For", "Forwarded":
		cfg.Header = http.CanonicalHeaderKey(cfg.Header)
	default:
		return nil, fmt.Errorf("middleware: IPConfig.Header: want X-Forwarded-For or Forwarded, got %q", cfg.Header)
	}
	trusted := make([]netip.Prefix, len(cfg.TrustedProxies)) // the caller's slice stays as it was
	for i, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("middleware: IPConfig.TrustedProxies[%d]: invalid prefix", i)
		}
		trusted[i] = p.Masked()
	}
	cfg.TrustedProxies = trusted
	if cfg.IPv6Prefix == 0 {
		cfg.IPv6Prefix = 64
	}
	if cfg.IPv4Prefix == 0 {
		cfg.IPv4Prefix = 32
	}
	cfg.Secret = bytes.Clone(cfg.Secret)
	return &ipKeyer{cfg: cfg}, nil
}

// ClientIP returns a KeyFunc keying a request by its client's IP: the
// socket address, unless the socket peer is a trusted proxy (then see
// IPConfig.TrustedProxies). IPv4-mapped IPv6 addresses count as IPv4,
// zones are stripped, addresses are grouped by IPConfig.IPv6Prefix (or
// IPv4Prefix), and the key is "ip:" and 22 characters of base64url
// HMAC-SHA256 of the group (e.g. "2001:db8:a:b::/64") under Secret.
func ClientIP(cfg IPConfig) (KeyFunc, error) {
	k, err := newIPKeyer(cfg)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request) (string, error) {
		a, err := k.addr(r.RemoteAddr, r.Header)
		if err != nil {
			return "", err
		}
		return k.key(a), nil
	}, nil
}

// ParseAddr parses an address as written in a forwarding header or a
// socket address: "192.0.2.1", "192.0.2.1:80", "2001:db8::1",
// "[2001:db8::1]:80", optionally quoted, zones stripped and IPv4-mapped
// IPv6 unwrapped.
func ParseAddr(s string) (netip.Addr, error) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, fmt.Errorf("middleware: bad address %q", s)
		}
		s = s[1:end]
	} else if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("middleware: bad address %q", s)
	}
	return a.WithZone("").Unmap(), nil
}

func (k *ipKeyer) trusted(a netip.Addr) bool {
	for _, p := range k.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// addr returns the client address of a request from remote (the socket
// address) and its headers.
func (k *ipKeyer) addr(remote string, h http.Header) (netip.Addr, error) {
	peer, err := ParseAddr(remote)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: socket address: %v", ErrNoKey, err)
	}
	if !k.trusted(peer) {
		return peer, nil
	}
	if k.cfg.PlatformHeader != "" {
		if a, err := ParseAddr(h.Get(k.cfg.PlatformHeader)); err == nil {
			return a, nil
		}
		return peer, nil
	}
	hops := forwardedFor(h, k.cfg.Header)
	// From the right: the first hop not trusted is the client.
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := ParseAddr(hops[i])
		if err != nil {
			// A trusted proxy wrote something that is no address (e.g.
			// Forwarded's "unknown"): the client cannot be told apart from
			// the last trusted hop.
			if i < len(hops)-1 {
				if a, err := ParseAddr(hops[i+1]); err == nil {
					return a, nil
				}
			}
			return peer, nil
		}
		if !k.trusted(a) {
			return a, nil
		}
	}
	if len(hops) > 0 { // every hop trusted: the left-most started it
		if a, err := ParseAddr(hops[0]); err == nil {
			return a, nil
		}
	}
	return peer, nil
}

// forwardedFor returns the hops of header (X-Forwarded-For or Forwarded)
// in order, every line of it included.
func forwardedFor(h http.Header, header string) []string {
	var hops []string
	for _, line := range h.Values(header) {
		for _, elem := range strings.Split(line, ",") {
			elem = strings.TrimSpace(elem)
			if header == "X-Forwarded-For" {
				if elem != "" {
					hops = append(hops, elem)
				}
				continue
			}
			for _, pair := range strings.Split(elem, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					hops = append(hops, v)
				}
			}
		}
	}
	return hops
}

// key returns the key of a: "ip:" and the HMAC of its group.
func (k *ipKeyer) key(a netip.Addr) string {
	bits := k.cfg.IPv4Prefix
	if a.Is6() {
		bits = k.cfg.IPv6Prefix
	}
	p, _ := a.Prefix(bits) // bits is within range for a's family
	m := hmac.New(sha256.New, k.cfg.Secret)
	m.Write([]byte(p.String()))
	return ipTag + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// SignedIPConfig configures trust in a client IP signed by a front server
// (e.g. a server-side renderer calling the API for its visitor).
type SignedIPConfig struct {
	// Header carries the signed IP, as made by [SignIP]. Default
	// "X-Signed-Client-IP". (Optional)
	Header string
	// Secret is the HMAC-SHA256 signing key shared with the front server;
	// keep it apart from other secrets. At least 16 bytes. (Required)
	Secret []byte
	// MaxAge is how long a signature stays valid. Default 60 s. (Optional)
	MaxAge time.Duration
	// Now is the clock freshness is judged by. Default time.Now. (Optional)
	Now func() time.Time
}

// maxSkew is how far in the future a signature's time may be (clock skew
// between the front server and this one).
const maxSkew = 5 * time.Second

// SignIP returns the header value by which a front server vouches that
// ip is its client's address at time at: "IP;UNIX_SECONDS;SIGNATURE",
// the signature being base64url HMAC-SHA256 of "IP;UNIX_SECONDS" under
// secret.
func SignIP(secret []byte, ip netip.Addr, at time.Time) string {
	msg := ip.WithZone("").Unmap().String() + ";" + strconv.FormatInt(at.Unix(), 10)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(msg))
	return msg + ";" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verifySigned returns the IP of a signed header value if its signature
// is valid and it is fresh.
func verifySigned(cfg SignedIPConfig, v string) (netip.Addr, bool) {
	i := strings.LastIndexByte(v, ';')
	if i < 0 {
		return netip.Addr{}, false
	}
	msg, sig := v[:i], v[i+1:]
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return netip.Addr{}, false
	}
	m := hmac.New(sha256.New, cfg.Secret)
	m.Write([]byte(msg))
	if !hmac.Equal(got, m.Sum(nil)) {
		return netip.Addr{}, false
	}
	ipText, tsText, ok := strings.Cut(msg, ";")
	if !ok {
		return netip.Addr{}, false
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return netip.Addr{}, false
	}
	age := cfg.Now().Sub(time.Unix(ts, 0))
	if age > cfg.MaxAge || age < -maxSkew {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(ipText)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// SignedClientIP returns a KeyFunc keying a request by the client IP a
// front server signed (see [SignIP]) when the signature is valid and
// fresh, and otherwise, ignoring the forged, altered or stale value, as
// [ClientIP] does with ip. Both give the same key for the same address.
func SignedClientIP(ip IPConfig, signed SignedIPConfig) (KeyFunc, error) {
	k, err := newIPKeyer(ip)
	if err != nil {
		return nil, err
	}
	if len(signed.Secret) < 16 {
		return nil, fmt.Errorf("middleware: SignedIPConfig.Secret: must be at least 16 bytes, got %d", len(signed.Secret))
	}
	if signed.MaxAge < 0 {
		return nil, fmt.Errorf("middleware: SignedIPConfig.MaxAge: must be >= 0, got %s", signed.MaxAge)
	}
	if signed.Header == "" {
		signed.Header = "X-Signed-Client-IP"
	}
	if signed.MaxAge == 0 {
		signed.MaxAge = time.Minute
	}
	if signed.Now == nil {
		signed.Now = time.Now
	}
	signed.Secret = bytes.Clone(signed.Secret)
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(signed.Header); v != "" {
			if a, ok := verifySigned(signed, v); ok {
				return k.key(a), nil
			}
		}
		a, err := k.addr(r.RemoteAddr, r.Header)
		if err != nil {
			return "", err
		}
		return k.key(a), nil
	}, nil
}

// UserFromContext returns a KeyFunc keying a request by the user id that
// get finds in its context (e.g. put there by an authentication
// middleware): "user:" and the id. No id (or an empty one): ErrNoKey.
func UserFromContext(get func(context.Context) (string, bool)) KeyFunc {
	return func(r *http.Request) (string, error) {
		id, ok := get(r.Context())
		if !ok || id == "" {
			return "", fmt.Errorf("%w: no user id in the context", ErrNoKey)
		}
		return userTag + id, nil
	}
}

// UserFromHeader returns a KeyFunc keying a request by the user id in
// header name (set by a trusted gateway that authenticated the user):
// "user:" and the id. No id: ErrNoKey.
func UserFromHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		id := strings.TrimSpace(r.Header.Get(name))
		if id == "" {
			return "", fmt.Errorf("%w: no %s header", ErrNoKey, name)
		}
		return userTag + id, nil
	}
}

// FirstOf returns a KeyFunc that returns the key of the first of fns that
// has one (returns no ErrNoKey), e.g. FirstOf(user, ip): signed-in users
// by id, others by IP. Other errors stop it.
func FirstOf(fns ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		for _, f := range fns {
			k, err := f(r)
			if err == nil {
				return k, nil
			}
			if !errors.Is(err, ErrNoKey) {
				return "", err
			}
		}
		return "", fmt.Errorf("%w: none of %d key functions had one", ErrNoKey, len(fns))
	}
}

// Const returns a KeyFunc that always returns s: a route's name as a part
// of a composite key.
func Const(s string) KeyFunc {
	return func(*http.Request) (string, error) { return s, nil }
}

// Pattern returns a KeyFunc returning the request's net/http ServeMux
// pattern (e.g. "POST /auth/signin"), set once the mux routed it (so use
// it in a middleware inside the route); the path if there is none.
func Pattern() KeyFunc {
	return func(r *http.Request) (string, error) {
		if r.Pattern != "" {
			return r.Pattern, nil
		}
		return r.URL.Path, nil
	}
}

// Composite returns a KeyFunc joining the keys of parts so that different
// parts can never give the same key: "c:" and, per part, its length in
// bytes, ":" and the part. ("ab", "c") and ("a", "bc") are different
// keys. An error of any part is the composite's.
func Composite(parts ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		var b strings.Builder
		b.WriteString(compTag)
		for _, p := range parts {
			k, err := p(r)
			if err != nil {
				return "", err
			}
			b.WriteString(strconv.Itoa(len(k)))
			b.WriteByte(':')
			b.WriteString(k)
		}
		return b.String(), nil
	}
}

// MaxFieldBody is how much of a request body Field reads, in bytes.
const MaxFieldBody = 64 << 10

// Field returns a KeyFunc returning the field called name of the
// request's body, a form (application/x-www-form-urlencoded) or a JSON
// object (application/json; a string or number at the top level), trimmed
// and in lower case (so "Alice@Example.com " and "alice@example.com" are
// one key), or "" when the body has no such field. It reads at most
// MaxFieldBody bytes and puts the body back for the handler.
func Field(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		if r.Body == nil || r.Body == http.NoBody {
			return "", nil
		}
		buf, err := io.ReadAll(io.LimitReader(r.Body, MaxFieldBody))
		if err != nil {
			return "", fmt.Errorf("middleware: reading the body for field %q: %w", name, err)
		}
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		var v string
		switch {
		case mt == "application/x-www-form-urlencoded":
			if q, err := url.ParseQuery(string(buf)); err == nil {
				v = q.Get(name)
			}
		case mt == "application/json" || strings.HasSuffix(mt, "+json"):
			var obj map[string]json.RawMessage
			if json.Unmarshal(buf, &obj) == nil {
				var s string
				var n json.Number
				if json.Unmarshal(obj[name], &s) == nil {
					v = s
				} else if json.Unmarshal(obj[name], &n) == nil {
					v = n.String()
				}
			}
		}
		return strings.ToLower(strings.TrimSpace(v)), nil
	}
}

// readCloser reads from the buffered head and the rest, and closes the
// original body.
type readCloser struct {
	io.Reader
	io.Closer
}
