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
	"unicode/utf8"
)

// KeyFunc returns the key a request is limited by. It returns an error
// wrapping ErrNoKey when the request has nothing to key by (e.g. no user
// id); [FirstOf] then tries the next KeyFunc. It returns an error
// wrapping ErrBadRequest when what the client sent cannot be keyed
// safely (e.g. an ambiguous body). It must be safe for concurrent use.
//
// Whatever a KeyFunc returns, the Handler never sends a key that is
// empty (ErrNoKey), not valid UTF-8 or longer than MaxKeyBytes
// (ErrBadRequest): it answers such a request 400 instead.
//
// The ready-made KeyFuncs tag their keys by kind ("ip:", "user:", and
// length-prefixed parts for composites), so that keys of different kinds
// or parts never collide: the user id "192.0.2.4" and the client at
// 192.0.2.4 have separate budgets.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by a KeyFunc's error when the request has nothing
// to key by. With no fallback (see FirstOf) the default OnError answers
// 400 Bad Request.
var ErrNoKey = errors.New("middleware: no key for the request")

// ErrBadRequest is wrapped by a KeyFunc's error, or by the Handler's,
// when what the client sent cannot be keyed safely: a key that is not
// valid UTF-8 or is longer than MaxKeyBytes, or a body whose field is
// ambiguous (see Field). It is the client's error: the default OnError
// answers 400 Bad Request (431 when the error also wraps
// ErrHeaderTooLarge) and logs it at debug level only.
var ErrBadRequest = errors.New("middleware: the request cannot be keyed")

// ErrHeaderTooLarge is wrapped, with ErrBadRequest, by the error of a
// KeyFunc whose header is too long to make a key of (see MaxKeyBytes);
// the default OnError answers 431 Request Header Fields Too Large.
var ErrHeaderTooLarge = errors.New("middleware: header too large for a key")

// MaxKeyBytes is the longest key the nodes accept, in bytes. Longer keys
// are never sent: the request is answered 400 (431 for a header).
const MaxKeyBytes = 512

// checkKey returns nil if key can be sent to the nodes, else an error
// wrapping ErrNoKey (empty) or ErrBadRequest. The error never quotes the
// key.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty", ErrNoKey)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: the key is %d bytes, at most %d", ErrBadRequest, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: the key is not valid UTF-8", ErrBadRequest)
	}
	return nil
}

// headerKey returns tag and the value of header name, trimmed: ErrNoKey
// when there is none, ErrHeaderTooLarge when the key would be longer
// than MaxKeyBytes.
func headerKey(h http.Header, name, tag string) (string, error) {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return "", fmt.Errorf("%w: no %s header", ErrNoKey, name)
	}
	if len(tag)+len(v) > MaxKeyBytes {
		return "", fmt.Errorf("%w: %w: %s is %d bytes", ErrBadRequest, ErrHeaderTooLarge, name, len(v))
	}
	return tag + v, nil
}

// HeaderKey returns a KeyFunc keying a request by the value of header
// name, trimmed, after tag (e.g. "h:"): no value is ErrNoKey, a key over
// MaxKeyBytes is ErrHeaderTooLarge (431). A value that is not valid
// UTF-8 is answered 400 by the Handler.
func HeaderKey(name, tag string) KeyFunc {
	return func(r *http.Request) (string, error) { return headerKey(r.Header, name, tag) }
}

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
// "user:" and the id. No id: ErrNoKey; an id too long for a key:
// ErrHeaderTooLarge (431); an id that is not valid UTF-8: 400.
func UserFromHeader(name string) KeyFunc {
	return HeaderKey(name, userTag)
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
// object (application/json or +json; a string or number at the top
// level), trimmed and in lower case (so "Alice@Example.com " and
// "alice@example.com" are one key). It reads at most MaxFieldBody bytes
// and puts the body back for the handler, whole.
//
// It returns ErrNoKey (so that FirstOf tries the next KeyFunc) when it
// cannot see the field: no body, another content type (JSON sent as
// text/plain included), a body over MaxFieldBody, a JSON body that is no
// object, or no such field or an empty one. It returns ErrBadRequest
// (400) when the body is ambiguous, so that the key is never one of the
// client's choosing while the app reads another value: the field given
// more than once (in a form; in JSON in any case variant, since
// encoding/json matches names case-insensitively), a value that is no
// string or number, a value that is not valid UTF-8, or a body that does
// not parse as its content type.
func Field(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		if r.Body == nil || r.Body == http.NoBody {
			return "", fmt.Errorf("%w: no body for field %q", ErrNoKey, name)
		}
		buf, err := io.ReadAll(io.LimitReader(r.Body, MaxFieldBody+1))
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		if err != nil {
			return "", fmt.Errorf("%w: reading the body for field %q: %v", ErrBadRequest, name, err)
		}
		if len(buf) > MaxFieldBody {
			return "", fmt.Errorf("%w: body over %d bytes, field %q not read", ErrNoKey, MaxFieldBody, name)
		}
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		var v string
		switch {
		case mt == "application/x-www-form-urlencoded":
			v, err = formField(buf, name)
		case mt == "application/json" || strings.HasSuffix(mt, "+json"):
			v, err = jsonField(buf, name)
		default:
			return "", fmt.Errorf("%w: content type %q, field %q not read", ErrNoKey, mt, name)
		}
		if err != nil {
			return "", err
		}
		if !utf8.ValidString(v) { // checked before ToLower, which would make it valid
			return "", fmt.Errorf("%w: field %q is not valid UTF-8", ErrBadRequest, name)
		}
		if v = strings.ToLower(strings.TrimSpace(v)); v == "" {
			return "", fmt.Errorf("%w: field %q is empty", ErrNoKey, name)
		}
		return v, nil
	}
}

// formField returns the value of field name of a form body.
func formField(buf []byte, name string) (string, error) {
	q, err := url.ParseQuery(string(buf))
	if err != nil {
		return "", fmt.Errorf("%w: the form does not parse", ErrBadRequest)
	}
	switch vs := q[name]; len(vs) {
	case 0:
		return "", fmt.Errorf("%w: no field %q in the form", ErrNoKey, name)
	case 1:
		return vs[0], nil
	default:
		return "", fmt.Errorf("%w: field %q given %d times in the form", ErrBadRequest, name, len(vs))
	}
}

// jsonField returns the value of field name of a JSON object body,
// matching names as encoding/json does (case-insensitively).
func jsonField(buf []byte, name string) (string, error) {
	if !json.Valid(buf) {
		return "", fmt.Errorf("%w: the JSON body does not parse", ErrBadRequest)
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber()
	if t, _ := dec.Token(); t != json.Delim('{') {
		return "", fmt.Errorf("%w: the JSON body is no object", ErrNoKey)
	}
	var found []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		if err != nil || !ok {
			return "", fmt.Errorf("%w: the JSON body does not parse", ErrBadRequest)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", fmt.Errorf("%w: the JSON body does not parse", ErrBadRequest)
		}
		if strings.EqualFold(k, name) {
			found = append(found, raw)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%w: no field %q in the JSON object", ErrNoKey, name)
	case 1:
	default:
		return "", fmt.Errorf("%w: field %q given %d times in the JSON object (names match in any case)", ErrBadRequest, name, len(found))
	}
	var s string
	if json.Unmarshal(found[0], &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(found[0], &n) == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("%w: field %q is no string or number", ErrBadRequest, name)
}

// readCloser reads from the buffered head and the rest, and closes the
// original body.
type readCloser struct {
	io.Reader
	io.Closer
}
