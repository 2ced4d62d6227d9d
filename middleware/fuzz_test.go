package middleware

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// fuzzSecret keys the fuzzed IP keyers; any 16+ bytes do.
var fuzzSecret = []byte("fuzz-secret-0123456789")

// fuzzTrusted are the trusted proxies of the fuzzed keyers: a private
// IPv4 network and an IPv6 one, so hops of both families can be trusted.
var fuzzTrusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

// FuzzForwardedFor drives the client-IP resolution with any socket
// address and any X-Forwarded-For or Forwarded lines, and checks what a
// rate limit keyed by IP rests on:
//   - it never panics, and a key is "ip:" and 22 base64url characters;
//   - a request whose socket peer is not a trusted proxy is keyed by that
//     peer, whatever its headers say (a client cannot pick its own key);
//   - otherwise the address chosen is the peer or one written in the
//     header, and it is a trusted proxy only when every hop is one, or
//     when the hop just left of it is no address (e.g. "unknown"): then
//     the client cannot be told apart from that proxy, and all behind it
//     share its key rather than choose their own.
func FuzzForwardedFor(f *testing.F) {
	f.Add("10.0.0.1:443", "203.0.113.7, 10.0.0.2", false)
	f.Add("10.0.0.1:443", "for=203.0.113.7;proto=https, for=\"[2001:db8::1]:80\"", true)
	f.Add("192.0.2.1:1000", "1.2.3.4", false)
	f.Add("[fd00::1]:443", "unknown, 198.51.100.1", false)
	f.Add("10.1.2.3:80", "for=unknown;by=10.0.0.1", true)
	f.Add("10.1.2.3:80", ",,, ,", false)
	f.Add("garbage", "1.2.3.4", false)
	f.Add("[::ffff:10.0.0.9]:1", "::ffff:198.51.100.9%eth0", false)
	f.Fuzz(func(t *testing.T, remote, header string, rfc7239 bool) {
		name := "X-Forwarded-For"
		if rfc7239 {
			name = "Forwarded"
		}
		k, err := newIPKeyer(IPConfig{Secret: fuzzSecret, TrustedProxies: fuzzTrusted, Header: name})
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		for _, line := range strings.Split(header, "\n") {
			h.Add(name, line)
		}
		keyFn, err := ClientIP(IPConfig{Secret: fuzzSecret, TrustedProxies: fuzzTrusted, Header: name})
		if err != nil {
			t.Fatal(err)
		}
		r := &http.Request{RemoteAddr: remote, Header: h}
		key, kerr := keyFn(r)
		a, aerr := k.addr(remote, h)
		if (kerr == nil) != (aerr == nil) {
			t.Fatalf("ClientIP error %v, addr error %v", kerr, aerr)
		}
		peer, perr := ParseAddr(remote)
		if perr != nil {
			if kerr == nil {
				t.Fatalf("socket address %q does not parse, yet ClientIP keyed it as %q", remote, key)
			}
			return
		}
		if kerr != nil {
			t.Fatalf("socket address %q parses, yet ClientIP failed: %v", remote, kerr)
		}
		if !strings.HasPrefix(key, ipTag) || len(key) != len(ipTag)+22 {
			t.Fatalf("key %q: want %q and 22 characters", key, ipTag)
		}
		if key != k.key(a) {
			t.Fatalf("ClientIP keyed %q, the address it resolved (%v) keys %q", key, a, k.key(a))
		}
		if !k.trusted(peer) {
			if a != peer {
				t.Fatalf("untrusted peer %v: keyed by %v from the header", peer, a)
			}
			return
		}
		if a == peer {
			return
		}
		hops := forwardedFor(h, name)
		found, allTrusted := false, true
		for _, hop := range hops {
			ha, err := ParseAddr(hop)
			if err == nil && ha == a {
				found = true
			}
			if err != nil || !k.trusted(ha) {
				allTrusted = false
			}
		}
		if !found {
			t.Fatalf("resolved %v, which is neither the peer %v nor a hop of %q", a, peer, hops)
		}
		if k.trusted(a) && !allTrusted && !rightOfUnparsable(hops, a, k) {
			t.Fatalf("resolved the trusted proxy %v while an untrusted hop is in %q", a, hops)
		}
	})
}

// rightOfUnparsable reports whether, reading hops from the right over
// trusted addresses only, a hop that is no address is met just left of a.
func rightOfUnparsable(hops []string, a netip.Addr, k *ipKeyer) bool {
	for i := len(hops) - 1; i > 0; i-- {
		ha, err := ParseAddr(hops[i])
		if err != nil || !k.trusted(ha) {
			return false
		}
		if _, err := ParseAddr(hops[i-1]); err != nil {
			return ha == a
		}
	}
	return false
}

// FuzzSignedClientIP signs an address, changes one byte of the signed
// value (or none) and checks that the signature check accepts only what a
// holder of the secret signed: an accepted value names the address that
// was signed, and a value signed under another secret, or too old, is
// never accepted.
func FuzzSignedClientIP(f *testing.F) {
	f.Add([]byte{203, 0, 113, 7}, int64(0), 0, byte(0))
	f.Add([]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, int64(-30), 5, byte('9'))
	f.Add([]byte{198, 51, 100, 1}, int64(120), 12, byte(';'))
	f.Add([]byte{10, 0, 0, 1}, int64(3), -1, byte('A'))
	f.Fuzz(func(t *testing.T, ipBytes []byte, ageSeconds int64, at int, b byte) {
		ip, ok := netip.AddrFromSlice(ipBytes)
		if !ok {
			return
		}
		ip = ip.Unmap()
		now := time.Unix(1_800_000_000, 0)
		cfg := SignedIPConfig{Secret: fuzzSecret, MaxAge: time.Minute, Now: func() time.Time { return now }}
		if ageSeconds < -1e6 || ageSeconds > 1e6 {
			ageSeconds %= 1_000_000
		}
		signedAt := now.Add(-time.Duration(ageSeconds) * time.Second)
		v := SignIP(fuzzSecret, ip, signedAt)
		if at >= 0 && len(v) > 0 {
			bs := []byte(v)
			bs[at%len(bs)] = b
			v = string(bs)
		}
		got, accepted := verifySigned(cfg, v)
		fresh := ageSeconds*int64(time.Second) <= int64(cfg.MaxAge) && ageSeconds*int64(time.Second) >= -int64(maxSkew)
		if accepted && got != ip {
			t.Fatalf("value %q accepted for %v, but %v was signed", v, got, ip)
		}
		if accepted && !fresh {
			t.Fatalf("value %q signed %d s ago accepted (max age %s)", v, ageSeconds, cfg.MaxAge)
		}
		if at < 0 && fresh && !accepted {
			t.Fatalf("the unchanged fresh value %q was refused", v)
		}
		other := cfg
		other.Secret = []byte("another-secret-0123456789")
		if _, ok := verifySigned(other, v); ok {
			t.Fatalf("value %q accepted under a secret that did not sign it", v)
		}
	})
}
