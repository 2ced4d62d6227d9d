package rls_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/window"
)

// These tests hold docs/envoy.md's secured set-up to what it says: the
// certificates its commands make, a node started with its serve flags (in
// protected mode), and gRPC clients built from its Envoy configurations,
// calling ShouldRateLimit as that Envoy would.

// docPKI is what the documented certificate commands made, in a test's
// directory standing for the working directory they ran in.
type docPKI struct {
	root  string
	files []string // the files written, relative to root
}

// path maps a path of the documented sluice commands (relative to their
// working directory) into the test's directory.
func (p docPKI) path(rel string) string { return filepath.Join(p.root, rel) }

// envoyFile maps a file name of Envoy's configuration to the file the
// commands made with the same base name (the document copies pki/ca/ca.pem
// and the pki/envoy pair to the Envoy hosts); exactly one must match, and
// never a CA key.
func (p docPKI) envoyFile(t *testing.T, name string) string {
	t.Helper()
	var found []string
	for _, f := range p.files {
		if filepath.Base(f) == filepath.Base(name) {
			found = append(found, f)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Envoy's %s: the documented commands made %d files of that name (%v), want 1", name, len(found), found)
	}
	if filepath.Base(name) == "ca-key.pem" {
		t.Fatalf("Envoy's %s: Envoy is given the CA's key", name)
	}
	return p.path(found[0])
}

// makeDocPKI runs the documented commands of the block that creates the CA
// (sluice tls ca create, sluice tls cert create, sluice keygen > FILE) with
// what those commands call (internal/certs, cluster.NewKey), in a new
// directory. A command it does not know fails the test, so that nothing
// documented there goes untried.
func makeDocPKI(t *testing.T) docPKI {
	t.Helper()
	var cmds [][]string
	for _, b := range envoyDocBlocks(t) {
		if b.lang == "sh" && strings.Contains(b.text, "sluice tls ca create") {
			cmds = shellCommands(b.text)
			break
		}
	}
	if cmds == nil {
		t.Fatal("docs/envoy.md: no sh block with `sluice tls ca create`")
	}
	p := docPKI{root: t.TempDir()}
	write := func(rel string, b []byte) {
		t.Helper()
		full := p.path(rel)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
		p.files = append(p.files, rel)
	}
	read := func(rel string) []byte {
		t.Helper()
		b, err := os.ReadFile(p.path(rel))
		if err != nil {
			t.Fatalf("a documented command reads %s, which no earlier one made: %v", rel, err)
		}
		return b
	}
	validity := func(f map[string][]string, def time.Duration) time.Duration {
		if v := f["validity"]; len(v) > 0 {
			d, err := time.ParseDuration(v[0])
			if err != nil {
				t.Fatalf("--validity %s: %v", v[0], err)
			}
			return d
		}
		return def
	}
	for _, c := range cmds {
		line := strings.Join(c, " ")
		switch {
		case len(c) >= 4 && slices.Equal(c[:4], []string{"sluice", "tls", "ca", "create"}):
			f := cliFlags(t, c[4:])
			cn := "sluice development CA"
			if v := f["common-name"]; len(v) > 0 {
				cn = v[0]
			}
			crt, key, err := certs.NewCA(cn, validity(f, 365*24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			write(filepath.Join(f["out"][0], "ca.pem"), crt)
			write(filepath.Join(f["out"][0], "ca-key.pem"), key)
		case len(c) >= 4 && slices.Equal(c[:4], []string{"sluice", "tls", "cert", "create"}):
			f := cliFlags(t, c[4:])
			kind, name := certs.Peer, f["peer"]
			if len(name) == 0 {
				kind, name = certs.Client, f["client"]
			}
			var hosts []string
			for _, h := range f["host"] {
				hosts = append(hosts, strings.Split(h, ",")...)
			}
			ca := f["ca"][0]
			crt, key, err := certs.Issue(read(filepath.Join(ca, "ca.pem")), read(filepath.Join(ca, "ca-key.pem")), kind, name[0], hosts, validity(f, 90*24*time.Hour))
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			write(filepath.Join(f["out"][0], name[0]+".pem"), crt)
			write(filepath.Join(f["out"][0], name[0]+"-key.pem"), key)
		case len(c) == 4 && c[0] == "sluice" && c[1] == "keygen" && c[2] == ">":
			k, err := cluster.NewKey()
			if err != nil {
				t.Fatal(err)
			}
			write(c[3], []byte(k+"\n"))
		default:
			t.Fatalf("docs/envoy.md: the test does not know the command %q", line)
		}
	}
	return p
}

// docServe returns the flags of the documented `sluice serve` commands
// that set --tls-cert, the one with --client-auth token when token is set,
// else the one without --client-auth.
func docServe(t *testing.T, token bool) map[string][]string {
	t.Helper()
	for _, b := range envoyDocBlocks(t) {
		if b.lang != "sh" {
			continue
		}
		for _, c := range shellCommands(b.text) {
			if len(c) < 2 || c[0] != "sluice" || c[1] != "serve" {
				continue
			}
			f := cliFlags(t, c[2:], "insecure")
			if f["tls-cert"] == nil {
				continue
			}
			if auth := f["client-auth"]; (token && slices.Equal(auth, []string{"token"})) || (!token && auth == nil) {
				return f
			}
		}
	}
	t.Fatalf("docs/envoy.md: no `sluice serve --tls-cert ...` command (token: %v)", token)
	return nil
}

// docTokenFile returns the documented token file (a text block whose first
// line names path).
func docTokenFile(t *testing.T, path string) string {
	t.Helper()
	for _, b := range envoyDocBlocks(t) {
		if b.lang == "text" && strings.Contains(b.firstLine(), path) {
			return b.text
		}
	}
	t.Fatalf("docs/envoy.md: no text block naming %s on its first line", path)
	return ""
}

// docNode is a node started from a documented serve command.
type docNode struct {
	*rpc.Node
	port string // the documented gRPC port (the node listens on an OS-picked one)
}

// addr is where the node listens: 127.0.0.1 and the port it advertises
// (it advertises the documented host, which is not this machine).
func (n docNode) addr(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(n.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// startDocNode starts one node with the documented serve flags f, its files
// mapped into pki's directory (the token file and the rule directory: into
// files the test makes from the document, plus extraTokens lines). What the
// test changes: the node listens on 127.0.0.1 with OS-picked ports, but
// advertises the documented host, which is off loopback, so that
// rpc.StartNode applies protected mode to the documented settings; --join
// is left out (the documented peers do not exist here: a cluster of one);
// memberlist's timings are the local profile; the clock is clock. Any
// other flag fails the test, so that a flag added to the document is
// either mapped here or noticed.
func startDocNode(t *testing.T, f map[string][]string, pki docPKI, clock window.Clock, extraTokens string) docNode {
	t.Helper()
	cfg := rpc.NodeConfig{
		GRPCAddr: "127.0.0.1:0", GossipAddr: "127.0.0.1:0", Profile: cluster.Local, Clock: clock, Logger: testLogger(),
		ForwardTimeout: 2 * time.Second, LeaveTimeout: time.Second, HandOffTimeout: time.Second,
	}
	var n docNode
	for name, vs := range f {
		v := vs[len(vs)-1]
		switch name {
		case "name":
			cfg.Name = v
		case "grpc-addr":
			host, port, err := net.SplitHostPort(v)
			if err != nil {
				t.Fatalf("--grpc-addr %s: %v", v, err)
			}
			if ip := net.ParseIP(host); ip == nil || ip.IsLoopback() {
				t.Fatalf("--grpc-addr %s: want an IP off loopback, where protected mode applies", v)
			}
			cfg.AdvertiseHost, n.port = host, port
		case "gossip-addr", "join":
		case "gossip-key-file":
			keys, err := cluster.ReadKeyFile(pki.path(v))
			if err != nil {
				t.Fatalf("--gossip-key-file: %v", err)
			}
			cfg.GossipKeys = keys
		case "tls-cert":
			cfg.TLSCert = pki.path(v)
		case "tls-key":
			cfg.TLSKey = pki.path(v)
		case "tls-ca":
			cfg.TLSCA = pki.path(v)
		case "client-auth":
			cfg.ClientAuth = rpc.ClientAuth(v)
		case "token-file":
			file := filepath.Join(t.TempDir(), "tokens.txt")
			if err := os.WriteFile(file, []byte(docTokenFile(t, v)+extraTokens), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.TokenFile = file
		case "rls-config":
			// The document copies examples/rls/edge.yaml there.
			dir := t.TempDir()
			b, err := os.ReadFile("../examples/rls/edge.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			if cfg.RLS, err = rls.Load(dir); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("serve --%s: the test does not map this flag", name)
		}
	}
	node, err := rpc.StartNode(cfg)
	if err != nil {
		t.Fatalf("the documented serve command does not start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = node.Close(ctx)
	})
	n.Node = node
	return n
}

// envoyClient calls ShouldRateLimit as one Envoy bootstrap's rate limit
// filter would: over a connection made from its cluster's transport socket,
// with its grpc_service's initial_metadata, in its domain, with the
// descriptors its route actions make.
type envoyClient struct {
	rls  rlsv3.RateLimitServiceClient
	hcm  *hcmv3.HttpConnectionManager
	rl   *ratelimitfilterv3.RateLimit
	meta []string // initial_metadata: key, value, ...
}

// dialAsEnvoy makes bs's client of the node at addr, whose documented
// port is port (the cluster's endpoints must name it); Envoy's files are
// mapped to pki's (see docPKI.envoyFile).
func dialAsEnvoy(t *testing.T, bs *bootstrapv3.Bootstrap, addr, port string, pki docPKI) *envoyClient {
	t.Helper()
	hcm, rl := rateLimitFilter(t, bs)
	c := sluiceCluster(t, bs, rl)
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			if got := fmt.Sprint(e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()); got != port {
				t.Errorf("cluster %s: endpoint port %s, but serve --grpc-addr says %s", c.GetName(), got, port)
			}
		}
	}
	utc := upstreamTLS(t, c)
	if utc == nil {
		t.Fatalf("cluster %s: plaintext (no TLS transport socket)", c.GetName())
	}
	cfg := envoyTLSConfig(t, utc, pki)
	// The TLS connection is made here, as Envoy makes it, and gRPC speaks
	// HTTP/2 on it as Envoy does: gRPC's own TLS credentials would offer h2
	// by ALPN whatever the configuration says.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err != nil {
				return nil, err
			}
			conn := tls.Client(raw, cfg)
			if err := conn.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return conn, nil
		})}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ec := &envoyClient{rls: rlsv3.NewRateLimitServiceClient(conn), hcm: hcm, rl: rl}
	for _, h := range rl.GetRateLimitService().GetGrpcService().GetInitialMetadata() {
		ec.meta = append(ec.meta, h.GetKey(), h.GetValue())
	}
	return ec
}

// envoyTLSConfig is the client side of an UpstreamTlsContext, as Envoy
// applies it: the client certificate of tls_certificates, SNI, ALPN, the
// TLS versions of tls_params (Envoy's client defaults: 1.2 to 1.2), and
// the server's chain verified against trusted_ca, then its SANs against
// match_typed_subject_alt_names. The SNI is also checked against the
// certificate, which Envoy does not do by itself: the document says every
// node's certificate carries it.
func envoyTLSConfig(t *testing.T, utc *tlsv3.UpstreamTlsContext, pki docPKI) *tls.Config {
	t.Helper()
	ctc := utc.GetCommonTlsContext()
	vc := ctc.GetValidationContext()
	if vc.GetTrustedCa().GetFilename() == "" {
		t.Fatal("the transport socket verifies nothing: no validation_context.trusted_ca filename")
	}
	if utc.GetSni() == "" {
		t.Fatal("the transport socket sends no SNI")
	}
	caPEM, err := os.ReadFile(pki.envoyFile(t, vc.GetTrustedCa().GetFilename()))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("trusted_ca: no certificate")
	}
	versions := map[tlsv3.TlsParameters_TlsProtocol]uint16{
		tlsv3.TlsParameters_TLSv1_0: tls.VersionTLS10, tlsv3.TlsParameters_TLSv1_1: tls.VersionTLS11,
		tlsv3.TlsParameters_TLSv1_2: tls.VersionTLS12, tlsv3.TlsParameters_TLSv1_3: tls.VersionTLS13,
	}
	cfg := &tls.Config{
		ServerName: utc.GetSni(),
		NextProtos: ctc.GetAlpnProtocols(),
		MinVersion: tls.VersionTLS12,
		MaxVersion: tls.VersionTLS12,
		// Verified below as Envoy does, not as Go does by default.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no server certificate")
			}
			leaf := cs.PeerCertificates[0]
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
				return fmt.Errorf("trusted_ca: %w", err)
			}
			if ms := vc.GetMatchTypedSubjectAltNames(); len(ms) > 0 && !slices.ContainsFunc(ms, func(m *tlsv3.SubjectAltNameMatcher) bool { return sanMatches(leaf, m) }) {
				return fmt.Errorf("match_typed_subject_alt_names: no SAN of %v %v matches", leaf.DNSNames, leaf.URIs)
			}
			if err := leaf.VerifyHostname(utc.GetSni()); err != nil {
				return fmt.Errorf("sni: %w", err)
			}
			return nil
		},
	}
	if v, ok := versions[ctc.GetTlsParams().GetTlsMinimumProtocolVersion()]; ok {
		cfg.MinVersion = v
	}
	if v, ok := versions[ctc.GetTlsParams().GetTlsMaximumProtocolVersion()]; ok {
		cfg.MaxVersion = v
	}
	switch certs := ctc.GetTlsCertificates(); len(certs) {
	case 0:
	case 1:
		pair, err := tls.LoadX509KeyPair(pki.envoyFile(t, certs[0].GetCertificateChain().GetFilename()), pki.envoyFile(t, certs[0].GetPrivateKey().GetFilename()))
		if err != nil {
			t.Fatalf("tls_certificates: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	default:
		t.Fatalf("tls_certificates: %d, want at most 1", len(certs))
	}
	return cfg
}

// sanMatches reports whether a SAN of cert of m's type matches m's matcher.
func sanMatches(cert *x509.Certificate, m *tlsv3.SubjectAltNameMatcher) bool {
	var sans []string
	switch m.GetSanType() {
	case tlsv3.SubjectAltNameMatcher_DNS:
		sans = cert.DNSNames
	case tlsv3.SubjectAltNameMatcher_URI:
		for _, u := range cert.URIs {
			sans = append(sans, u.String())
		}
	case tlsv3.SubjectAltNameMatcher_IP_ADDRESS:
		for _, ip := range cert.IPAddresses {
			sans = append(sans, ip.String())
		}
	case tlsv3.SubjectAltNameMatcher_EMAIL:
		sans = cert.EmailAddresses
	}
	return slices.ContainsFunc(sans, func(s string) bool { return stringMatches(m.GetMatcher(), s) })
}

// stringMatches applies an Envoy StringMatcher.
func stringMatches(m *matcherv3.StringMatcher, s string) bool {
	if m.GetIgnoreCase() {
		s = strings.ToLower(s)
	}
	low := func(p string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(p)
		}
		return p
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return s == low(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(s, low(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(s, low(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(s, low(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		return err == nil && re.MatchString(s)
	}
	return false
}

// httpRequest is a request reaching Envoy's listener.
type httpRequest struct {
	path, clientIP string
	headers        map[string]string
}

// descriptors returns the descriptors Envoy's rate limit filter sends for
// req: the route's rate_limits (the first route whose prefix matches, in
// the first virtual host), then the virtual host's when the route has
// none or sets include_vh_rate_limits. Each policy's actions make one
// descriptor, which is dropped when a request header it needs is missing.
// Other matchers and actions fail the test.
func (c *envoyClient) descriptors(t *testing.T, req httpRequest) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	vh := c.hcm.GetRouteConfig().GetVirtualHosts()[0]
	var route *routev3.Route
	for _, r := range vh.GetRoutes() {
		p, ok := r.GetMatch().GetPathSpecifier().(*routev3.RouteMatch_Prefix)
		if !ok {
			t.Fatalf("route %v: only prefix matches are known here", r.GetMatch())
		}
		if strings.HasPrefix(req.path, p.Prefix) {
			route = r
			break
		}
	}
	if route == nil {
		t.Fatalf("no route for %s", req.path)
	}
	policies := route.GetRoute().GetRateLimits()
	if len(policies) == 0 || route.GetRoute().GetIncludeVhRateLimits().GetValue() {
		policies = append(slices.Clone(policies), vh.GetRateLimits()...)
	}
	var out []*ratelimitv3.RateLimitDescriptor
policy:
	for _, p := range policies {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range p.GetActions() {
			var key, value string
			switch a := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				key, value = "remote_address", req.clientIP
			case *routev3.RateLimit_Action_GenericKey_:
				key, value = cmp.Or(a.GenericKey.GetDescriptorKey(), "generic_key"), a.GenericKey.GetDescriptorValue()
			case *routev3.RateLimit_Action_RequestHeaders_:
				v, ok := req.headers[a.RequestHeaders.GetHeaderName()]
				if !ok {
					continue policy
				}
				key, value = a.RequestHeaders.GetDescriptorKey(), v
			default:
				t.Fatalf("rate limit action %T: not known here", a)
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
		}
		out = append(out, d)
	}
	return out
}

// call sends the request Envoy would send for req. Envoy bounds it by the
// filter's timeout (100 ms in the document); here the bound is generous,
// so that a slow machine under the race detector does not fail the test.
func (c *envoyClient) call(t *testing.T, req httpRequest) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(c.meta) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, c.meta...)
	}
	return c.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: c.rl.GetDomain(), Descriptors: c.descriptors(t, req)})
}

// driveToLimit sends req until past its tightest limit and counts the
// answers: the first requests_per_unit are OK, each with one less
// remaining on that descriptor, and the next three are OVER_LIMIT with
// none. The first answer must show the whole limit left (nothing counted
// before, by the refused calls either).
func (c *envoyClient) driveToLimit(t *testing.T, req httpRequest) {
	t.Helper()
	const past = 3
	var limit uint32
	tight := -1
	var ok, over int
	for i := 1; tight < 0 || i <= int(limit)+past; i++ {
		resp, err := c.call(t, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if tight < 0 { // the first answer says which descriptor limits most
			for j, s := range resp.GetStatuses() {
				if l := s.GetCurrentLimit(); l != nil && (tight < 0 || l.GetRequestsPerUnit() < limit) {
					tight, limit = j, l.GetRequestsPerUnit()
				}
			}
			if tight < 0 || limit == 0 {
				t.Fatalf("request 1: no limited descriptor in %v", resp)
			}
		}
		s := resp.GetStatuses()[tight]
		switch {
		case i <= int(limit):
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || s.GetLimitRemaining() != limit-uint32(i) {
				t.Fatalf("request %d of %d allowed: %v, remaining %d; want OK, remaining %d", i, limit, resp.GetOverallCode(), s.GetLimitRemaining(), limit-uint32(i))
			}
			ok++
		default:
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || s.GetLimitRemaining() != 0 {
				t.Fatalf("request %d, past the limit of %d: %v", i, limit, resp)
			}
			over++
		}
	}
	if ok != int(limit) || over != past {
		t.Fatalf("%d OK and %d OVER_LIMIT, want %d and %d", ok, over, limit, past)
	}
}

// refused asserts that req is refused with code, and an error message
// that msg (a regular expression) matches.
func (c *envoyClient) refused(t *testing.T, what string, req httpRequest, code codes.Code, msg string) {
	t.Helper()
	resp, err := c.call(t, req)
	if err == nil {
		t.Errorf("%s: answered %v, want a refusal", what, resp)
		return
	}
	if status.Code(err) != code || !regexp.MustCompile(msg).MatchString(status.Convert(err).Message()) {
		t.Errorf("%s: %v, want %v matching %q", what, err, code, msg)
	}
}

// docBootstraps returns the whole Envoy bootstraps of docs/envoy.md.
func docBootstraps(t *testing.T) []*bootstrapv3.Bootstrap {
	t.Helper()
	var out []*bootstrapv3.Bootstrap
	for _, b := range envoyYAMLBlocks(t) {
		if b.isBootstrap() {
			out = append(out, envoyBootstrap(t, b))
		}
	}
	if len(out) < 2 {
		t.Fatalf("docs/envoy.md: %d Envoy bootstraps, want the secured set-up's and Envoy's", len(out))
	}
	return out
}

// requestFor returns the request of the i-th bootstrap, from its own client IP
// (so that each has its own count): under /api/ with a user when the
// bootstrap has such a route, so that its per-user descriptor goes too.
func requestFor(i int, bs *envoyClient) httpRequest {
	req := httpRequest{path: "/", clientIP: fmt.Sprintf("203.0.113.%d", 10+i), headers: map[string]string{"x-user-id": "42"}}
	for _, r := range bs.hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		if r.GetMatch().GetPrefix() == "/api/" {
			req.path = "/api/orders"
		}
	}
	return req
}

// withoutClientCert returns a copy of bs whose sluice cluster presents no
// client certificate.
func withoutClientCert(t *testing.T, bs *bootstrapv3.Bootstrap) *bootstrapv3.Bootstrap {
	t.Helper()
	return editUpstreamTLS(t, bs, func(u *tlsv3.UpstreamTlsContext) { u.CommonTlsContext.TlsCertificates = nil })
}

// editUpstreamTLS returns a copy of bs whose sluice cluster's
// UpstreamTlsContext edit changed.
func editUpstreamTLS(t *testing.T, bs *bootstrapv3.Bootstrap, edit func(*tlsv3.UpstreamTlsContext)) *bootstrapv3.Bootstrap {
	t.Helper()
	out := proto.CloneOf(bs)
	_, rl := rateLimitFilter(t, out)
	c := sluiceCluster(t, out, rl)
	utc := upstreamTLS(t, c)
	edit(utc)
	c.TransportSocket.ConfigType = &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(t, utc)}
	return out
}

// filename is a DataSource's file name.
func filename(name string) *corev3.DataSource_Filename {
	return &corev3.DataSource_Filename{Filename: name}
}

// withForeignClient returns p with a client certificate and key of another
// CA added, as foreign.pem and foreign-key.pem.
func (p docPKI) withForeignClient(t *testing.T) docPKI {
	t.Helper()
	caCert, caKey, err := certs.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := certs.Issue(caCert, caKey, certs.Client, "envoy", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	out := docPKI{root: p.root, files: slices.Clone(p.files)}
	for name, b := range map[string][]byte{"foreign/foreign.pem": crt, "foreign/foreign-key.pem": key} {
		if err := os.MkdirAll(out.path("foreign"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out.path(name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		out.files = append(out.files, name)
	}
	return out
}

// docClock is a whole minute from its start, so that no window ends
// during a test: time is never moved.
func docClock() window.Clock { return window.NewManualClock(time.Unix(60*29_000_000, 0)) }

// The secured set-up with mutual TLS: a node started with the documented
// serve command (protected mode on, for its advertised address is off
// loopback) answers every documented Envoy bootstrap's client, made from
// its cluster's UpstreamTlsContext (CA, client certificate, SNI, ALPN h2)
// with the documented certificates: OK up to the limit of the documented
// rules, OVER_LIMIT after. Without the client certificate, with one of
// another CA, or without ALPN h2, the same client is refused, and nothing
// is counted.
func TestEnvoyDocSecuredMutualTLS(t *testing.T) {
	pki := makeDocPKI(t)
	node := startDocNode(t, docServe(t, false), pki, docClock(), "")
	for i, bs := range docBootstraps(t) {
		_, rl := rateLimitFilter(t, bs)
		if utc := upstreamTLS(t, sluiceCluster(t, bs, rl)); len(utc.GetCommonTlsContext().GetTlsCertificates()) != 1 {
			t.Fatalf("bootstrap %d: the sluice cluster presents no client certificate", i+1)
		}
		envoy := dialAsEnvoy(t, bs, node.addr(t), node.port, pki)
		req := requestFor(i, envoy)

		noCert := dialAsEnvoy(t, withoutClientCert(t, bs), node.addr(t), node.port, pki)
		noCert.refused(t, "no client certificate", req, codes.Unavailable, "tls: handshake failure|tls: certificate required")

		foreign := dialAsEnvoy(t, editUpstreamTLS(t, bs, func(u *tlsv3.UpstreamTlsContext) {
			u.CommonTlsContext.TlsCertificates[0].CertificateChain.Specifier = filename("/etc/envoy/sluice/foreign.pem")
			u.CommonTlsContext.TlsCertificates[0].PrivateKey.Specifier = filename("/etc/envoy/sluice/foreign-key.pem")
		}), node.addr(t), node.port, pki.withForeignClient(t))
		foreign.refused(t, "a client certificate of another CA", req, codes.Unavailable, "tls: handshake failure|tls: bad certificate|tls: unknown certificate authority")

		noALPN := dialAsEnvoy(t, editUpstreamTLS(t, bs, func(u *tlsv3.UpstreamTlsContext) { u.CommonTlsContext.AlpnProtocols = nil }), node.addr(t), node.port, pki)
		// The handshake succeeds; the server then closes the connection.
		noALPN.refused(t, "no ALPN", req, codes.Unavailable, "broken pipe|EOF|connection reset|closed")

		envoy.driveToLimit(t, req)
	}
}

// The token variant: a node started with the documented serve command and
// token file answers the secured set-up's Envoy changed as documented (no
// client certificate; the filter's rate_limit_service replaced by the
// documented one, whose initial_metadata sends the token): OK up to the
// limit, OVER_LIMIT after. The same Envoy without the token, with a token
// the node does not know, or with a token whose only prefix is "rls" (the
// start of every RLS check's name) is refused, and nothing is counted.
func TestEnvoyDocSecuredToken(t *testing.T) {
	pki := makeDocPKI(t)
	const rlsOnly = "only-rls-prefix-0123456789abcdef"
	node := startDocNode(t, docServe(t, true), pki, docClock(), rlsOnly+" rls\n")

	var service *ratelimitconfv3.RateLimitServiceConfig
	for _, b := range envoyYAMLBlocks(t) {
		if strings.Contains(b.firstLine(), "token variant") {
			service = rateLimitServicePart(t, b)
		}
	}
	if service == nil {
		t.Fatal("docs/envoy.md: no `# envoy.yaml (token variant...` block")
	}
	bs := setRateLimitService(t, withoutClientCert(t, docBootstraps(t)[0]), service)
	validateDeep(t, "the secured bootstrap, token variant", bs)

	// The token Envoy sends is the documented token file's "*" token.
	envoy := dialAsEnvoy(t, bs, node.addr(t), node.port, pki)
	if len(envoy.meta) != 2 || envoy.meta[0] != "authorization" {
		t.Fatalf("initial_metadata %v: want authorization alone", envoy.meta)
	}
	tokens, err := rpc.ParseTokens("tokens.txt", []byte(docTokenFile(t, docServe(t, true)["token-file"][0])))
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(tokens, func(tk rpc.Token) bool { return "Bearer "+tk.Token == envoy.meta[1] }); i < 0 || !slices.Contains(tokens[i].Prefixes, "*") {
		t.Fatalf("Envoy sends %q: not a token of the documented file with the prefix \"*\"", envoy.meta[1])
	}
	req := requestFor(0, envoy)

	for _, tc := range []struct {
		what  string
		value string // the authorization value; "" sends none
		code  codes.Code
		msg   string
	}{
		{"no token", "", codes.Unauthenticated, "Bearer TOKEN"},
		{"an unknown token", "Bearer unknown-token-0123456789abcdef", codes.Unauthenticated, "unknown token"},
		{`a token of prefix "rls" alone`, "Bearer " + rlsOnly, codes.PermissionDenied, `the prefix "\*"`},
	} {
		c := *envoy
		c.meta = nil
		if tc.value != "" {
			c.meta = []string{"authorization", tc.value}
		}
		c.refused(t, tc.what, req, tc.code, tc.msg)
	}
	envoy.driveToLimit(t, req)
}
