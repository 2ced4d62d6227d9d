package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// testPKI is a CA made at test time and the files it issues.
type testPKI struct {
	dir           string
	caCert, caKey []byte
	caFile        string
	pool          *x509.CertPool
	issuedSerials sync.Map
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	c, k, err := certs.NewCA("sluice test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), caCert: c, caKey: k, pool: x509.NewCertPool()}
	p.caFile = filepath.Join(p.dir, "ca.pem")
	writeFile(t, p.caFile, c)
	p.pool.AppendCertsFromPEM(c)
	return p
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue writes a certificate of kind for name (SAN 127.0.0.1) valid for
// an hour, and returns its files.
func (p *testPKI) issue(t *testing.T, kind certs.Kind, name string) (certFile, keyFile string) {
	now := time.Now()
	return p.issueWindow(t, kind, name, now.Add(-time.Minute), now.Add(time.Hour))
}

func (p *testPKI) issueWindow(t *testing.T, kind certs.Kind, name string, nb, na time.Time) (certFile, keyFile string) {
	t.Helper()
	c, k, err := certs.IssueWindow(p.caCert, p.caKey, kind, name, []string{"127.0.0.1"}, nb, na)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(p.dir, string(kind)+"-"+name+"-"+nb.Format("150405.000000000"))
	certFile, keyFile = base+".pem", base+"-key.pem"
	writeFile(t, certFile, c)
	writeFile(t, keyFile, k)
	return certFile, keyFile
}

// clientTLS is a client's TLS config trusting p's CA, presenting the
// certificate in certFile/keyFile (none when certFile is "").
func (p *testPKI) clientTLS(t *testing.T, certFile, keyFile string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg
}

// tlsConn opens a gRPC connection to addr with cfg, closed when the test
// ends.
func tlsConn(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startTLSNode starts a node with a peer certificate of p for name and
// cfg's other settings; its client presents a client certificate of p.
func startTLSNode(t *testing.T, p *testPKI, name string, cfg NodeConfig, join ...string) *testNode {
	t.Helper()
	cfg.TLSCert, cfg.TLSKey = p.issue(t, certs.Peer, name)
	cfg.TLSCA = p.caFile
	n := startNodeWith(t, name, window.NewManualClock(windowStart), cfg, join...)
	cc, ck := p.issue(t, certs.Client, "tester")
	n.client = sluicev1.NewRateLimitServiceClient(tlsConn(t, n.GRPCAddr(), p.clientTLS(t, cc, ck)))
	return n
}

func startTLSCluster(t *testing.T, p *testPKI, n int, cfg NodeConfig) []*testNode {
	t.Helper()
	nodes := []*testNode{startTLSNode(t, p, "node1", cfg)}
	for i := 2; i <= n; i++ {
		nodes = append(nodes, startTLSNode(t, p, "node"+string(rune('0'+i)), cfg, nodes[0].GossipAddr()))
	}
	waitRingAgrees(t, nodes)
	return nodes
}

func nodeByName(nodes []*testNode, name string) *testNode {
	for _, n := range nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// keyState returns the state of a key after hits hits of a fixed window
// of limit 10 per hour, as a hand-off or replication carries it.
func keyState(t *testing.T, name, key string, hits int64) *sluicev1.KeyState {
	t.Helper()
	st := window.NewStore(window.StoreConfig{Clock: window.NewManualClock(windowStart)})
	k := ring.Key(nil, name, key)
	if _, err := st.ApplyBytes(k, window.Check{Algorithm: window.FixedWindow, Limit: 10, Window: time.Hour, Hits: hits}, windowStart); err != nil {
		t.Fatal(err)
	}
	s, ok := st.Get(string(k))
	if !ok {
		t.Fatal("no state")
	}
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return &sluicev1.KeyState{Key: k, State: b}
}

// callPeerMethods calls every peer method of addr over conn, each trying
// to count or inject hits on (name, key), and returns each call's error.
func callPeerMethods(t *testing.T, conn *grpc.ClientConn, name, key string) map[string]error {
	t.Helper()
	c := sluicev1.NewPeerServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc := &sluicev1.RateLimitCheck{Name: name, Key: key, Hits: proto.Int64(3), Limit: 10, WindowMs: 3600_000}
	out := map[string]error{}
	_, out["Forward"] = c.Forward(ctx, &sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{rc}, Sender: "node1"})
	if s, err := c.ForwardStream(ctx); err != nil {
		out["ForwardStream"] = err
	} else {
		_ = s.Send(&sluicev1.ForwardRequest{Checks: []*sluicev1.RateLimitCheck{rc}, Sender: "node1"})
		_, out["ForwardStream"] = s.Recv()
	}
	if s, err := c.HandOff(ctx); err != nil {
		out["HandOff"] = err
	} else {
		_ = s.Send(&sluicev1.HandOffRequest{Sender: "node1", States: []*sluicev1.KeyState{keyState(t, name, key, 3)}})
		_ = s.CloseSend()
		_, out["HandOff"] = s.Recv()
	}
	_, out["Pull"] = c.Pull(ctx, &sluicev1.PullRequest{Sender: "node1", Keys: [][]byte{ring.Key(nil, name, key)}})
	_, out["Replicate"] = c.Replicate(ctx, &sluicev1.ReplicateRequest{Sender: "node1", States: []*sluicev1.KeyState{keyState(t, name, key, 3)}})
	return out
}

// On a three-node mTLS cluster every peer method refuses a caller with no
// certificate, one of a foreign CA, an expired one (the handshake fails),
// a client certificate and a peer certificate of a non-member
// (PermissionDenied); nothing of theirs is counted or stored.
func TestPeerMethodsRefuseStrangers(t *testing.T) {
	p := newPKI(t)
	nodes := startTLSCluster(t, p, 3, NodeConfig{ForwardTimeout: 2 * time.Second})
	const name = "api"
	key := keyOwnedBy(t, nodes[0], name, "node2")
	owner := nodeByName(nodes, "node2")

	foreign := newPKI(t)
	fc, fk := foreign.issue(t, certs.Peer, "node1")
	ec, ek := p.issueWindow(t, certs.Peer, "node1", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	cc, ck := p.issue(t, certs.Client, "app")
	ic, ik := p.issue(t, certs.Peer, "intruder")
	for _, tc := range []struct {
		who  string
		cfg  *tls.Config
		want codes.Code
	}{
		{"no certificate", p.clientTLS(t, "", ""), codes.Unavailable},
		{"foreign CA", p.clientTLS(t, fc, fk), codes.Unavailable},
		{"expired", p.clientTLS(t, ec, ek), codes.Unavailable},
		{"client certificate", p.clientTLS(t, cc, ck), codes.PermissionDenied},
		{"non-member peer", p.clientTLS(t, ic, ik), codes.PermissionDenied},
	} {
		errs := callPeerMethods(t, tlsConn(t, owner.GRPCAddr(), tc.cfg), name, key)
		if len(errs) != 5 {
			t.Fatalf("%s: %d methods called, want 5", tc.who, len(errs))
		}
		for m, err := range errs {
			if got := status.Code(err); got != tc.want {
				t.Errorf("%s: %s: %v (code %s), want %s", tc.who, m, err, got, tc.want)
			}
		}
	}
	for _, n := range nodes {
		st := n.Server().Stats()
		if st.ReceivedRPCs != 0 || st.ReceivedChecks != 0 || st.ReceivedHandOff != 0 || n.Server().replicas.Len() != 0 {
			t.Errorf("%s: received %d calls, %d checks, %d handed-off keys, holds %d replicas; want none",
				n.Name(), st.ReceivedRPCs, st.ReceivedChecks, st.ReceivedHandOff, n.Server().replicas.Len())
		}
	}
	for _, n := range nodes {
		d := check(t, n.client, &sluicev1.RateLimitCheck{Name: name, Key: key, Hits: proto.Int64(0), Limit: 10, WindowMs: 3600_000})
		if !d.Allowed || d.Remaining != 10 || d.Owner != "node2" {
			t.Errorf("peek via %s: allowed=%v remaining=%d owner=%s, want allowed, 10, node2", n.Name(), d.Allowed, d.Remaining, d.Owner)
		}
	}
	// A member's own certificate passes the same interceptor: a real
	// forward from node1 counts at node2.
	d := check(t, nodes[0].client, &sluicev1.RateLimitCheck{Name: name, Key: key, Hits: proto.Int64(1), Limit: 10, WindowMs: 3600_000})
	if !d.Allowed || d.Remaining != 9 || owner.Server().Stats().ReceivedChecks == 0 {
		t.Fatalf("a member's forward: allowed=%v remaining=%d, received %d", d.Allowed, d.Remaining, owner.Server().Stats().ReceivedChecks)
	}
	if n, ok := peerNameOf(t, p, owner); !ok || n != "node1" {
		t.Fatalf("peerName of a call with node1's certificate: %q, %v", n, ok)
	}
}

// peerNameOf calls a server's peerName through a real TLS connection
// presenting node1's peer certificate.
func peerNameOf(t *testing.T, p *testPKI, n *testNode) (string, bool) {
	t.Helper()
	c, k := p.issue(t, certs.Peer, "node1")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Value
	cs, err := security.NewCertSource(security.CertFiles{Cert: n.cfg.TLSCert, Key: n.cfg.TLSKey, CA: n.cfg.TLSCA}, "", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(cs.ServerConfig(tls.RequireAndVerifyClientCert, []string{"h2"}))),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			name, ok := security.PeerName(ctx)
			got.Store([2]any{name, ok})
			return nil, status.Error(codes.Aborted, "seen")
		}))
	sluicev1.RegisterPeerServiceServer(gs, n.Server())
	go gs.Serve(lis)
	defer gs.Stop()
	_, _ = sluicev1.NewPeerServiceClient(tlsConn(t, lis.Addr().String(), p.clientTLS(t, c, k))).Pull(context.Background(), &sluicev1.PullRequest{})
	v, _ := got.Load().([2]any)
	if v[0] == nil {
		return "", false
	}
	return v[0].(string), v[1].(bool)
}

// A node with the right gossip key but a certificate of a foreign CA is
// heard by gossip but never enters the ring: the owners of 10000 keys do
// not change.
func TestUnverifiedMemberNeverEntersRing(t *testing.T) {
	p := newPKI(t)
	gk := [][]byte{[]byte("0123456789abcdef0123456789abcdef")}
	nodes := startTLSCluster(t, p, 3, NodeConfig{ForwardTimeout: 2 * time.Second, GossipKeys: gk})
	owners := func(n *testNode) []string {
		out := make([]string, 10000)
		for i := range out {
			out[i] = n.Server().Owner("api", "k"+strconv.Itoa(i))
		}
		return out
	}
	before := owners(nodes[0])
	foreign := newPKI(t)
	startTLSNode(t, foreign, "node4", NodeConfig{ForwardTimeout: 2 * time.Second, GossipKeys: gk}, nodes[0].GossipAddr())
	for _, n := range nodes {
		eventually(t, n.Name()+" to fail verifying node4 twice", func() bool { return n.Unverified()["node4"] >= 2 })
	}
	heard := false
	for _, m := range nodes[0].cluster.Members() {
		heard = heard || m.Name == "node4"
	}
	if !heard {
		t.Fatal("gossip does not list node4: the test proves nothing")
	}
	for _, n := range nodes {
		if got := owners(n); !equalStrings(got, before) {
			t.Errorf("%s: owners changed with an unverified member", n.Name())
		}
		if ms := n.Server().view.Load().ring.Members(); len(ms) != 3 {
			t.Errorf("%s: ring members %v, want node1..3", n.Name(), ms)
		}
	}
	// The check behind admission, by a real handshake: node2's address
	// presents node2's certificate, never node1's.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := nodes[0].certs.VerifyMember(ctx, "node2", nodes[1].GRPCAddr()); err != nil {
		t.Fatalf("verifying node2 at its address: %v", err)
	}
	if err := nodes[0].certs.VerifyMember(ctx, "node1", nodes[1].GRPCAddr()); err == nil || !strings.Contains(err.Error(), `want peer "node1"`) {
		t.Fatalf("node2's address taken for node1: %v, want a name mismatch", err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// servedSerial returns the serial of the certificate the server at addr
// presents in a new handshake.
func servedSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c := cfg.Clone()
	c.InsecureSkipVerify = true
	c.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func serialOf(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// replaceFile writes b to path by a rename, as a deploy tool does.
func replaceFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, b)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Certificates reload under load: a corrupt file changes nothing; a new
// CA and certificate written over the files are picked up by the watch:
// new handshakes present the new certificate, clients of the removed CA
// are refused on new connections, those of the new CA pass, and the
// connection carrying the load keeps working throughout.
func TestCertificateReloadUnderLoad(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"), filepath.Join(dir, "ca.pem")
	c1, k1 := p.issue(t, certs.Peer, "solo")
	writeFile(t, certFile, readFile(t, c1))
	writeFile(t, keyFile, readFile(t, k1))
	writeFile(t, caFile, p.caCert)
	n := startNodeWith(t, "solo", window.NewManualClock(windowStart),
		NodeConfig{ForwardTimeout: 2 * time.Second, TLSCert: certFile, TLSKey: keyFile, TLSCA: caFile})
	p2 := newPKI(t)
	both := x509.NewCertPool()
	both.AppendCertsFromPEM(p.caCert)
	both.AppendCertsFromPEM(p2.caCert)
	cc1, ck1 := p.issue(t, certs.Client, "app")
	cc2, ck2 := p2.issue(t, certs.Client, "app")
	old := p.clientTLS(t, cc1, ck1)
	old.RootCAs = both
	newer := p2.clientTLS(t, cc2, ck2)
	newer.RootCAs = both

	loadClient := sluicev1.NewRateLimitServiceClient(tlsConn(t, n.GRPCAddr(), old))
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := loadClient.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
					{Name: "api", Key: "load", Hits: proto.Int64(1), Limit: 1 << 40, WindowMs: 3600_000}}})
				calls.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	eventually(t, "load to flow", func() bool { return calls.Load() > 50 })
	serial1 := serialOf(t, certFile)
	if got := servedSerial(t, n.GRPCAddr(), old); got != serial1 {
		t.Fatalf("served serial %s, want %s", got, serial1)
	}

	// A corrupt certificate file: refused, nothing changes.
	writeFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"))
	if err := n.ReloadTLS(); err == nil {
		t.Fatal("ReloadTLS of a corrupt certificate: no error")
	}
	if got := servedSerial(t, n.GRPCAddr(), old); got != serial1 {
		t.Fatalf("after a corrupt file: served serial %s, want the old %s", got, serial1)
	}
	if err := pingCheck(t, n.GRPCAddr(), old); err != nil {
		t.Fatalf("after a corrupt file, a client of the running CA: %v", err)
	}
	// Another member's certificate, and a client's, in the node's files
	// (valid pairs, signed by the CA): refused as at start, nothing
	// changes (the attacker's finding: a reload served node4's identity).
	for _, kind := range []certs.Kind{certs.Peer, certs.Client} {
		oc, ok := p.issue(t, kind, "other")
		writeFile(t, keyFile, readFile(t, ok))
		writeFile(t, certFile, readFile(t, oc))
		if err := n.ReloadTLS(); err == nil || !strings.Contains(err.Error(), "want a peer certificate of solo") {
			t.Fatalf("ReloadTLS of a %s certificate of another name: %v, want a refusal", kind, err)
		}
		if got := servedSerial(t, n.GRPCAddr(), old); got != serial1 {
			t.Fatalf("after a %s certificate of another name: served serial %s, want the old %s", kind, got, serial1)
		}
	}
	writeFile(t, keyFile, readFile(t, k1))
	writeFile(t, certFile, readFile(t, c1))

	// Rotate to CA2: key, certificate and CA replaced by renames.
	c2, k2 := p2.issue(t, certs.Peer, "solo")
	serial2 := serialOf(t, c2)
	replaceFile(t, keyFile, readFile(t, k2))
	replaceFile(t, certFile, readFile(t, c2))
	replaceFile(t, caFile, p2.caCert)
	eventually(t, "the watch to load the new certificate", func() bool { return servedSerial(t, n.GRPCAddr(), newer) == serial2 })
	eventually(t, "clients of the removed CA to be refused on new connections", func() bool {
		return pingCheck(t, n.GRPCAddr(), old) != nil
	})
	if err := pingCheck(t, n.GRPCAddr(), newer); err != nil {
		t.Fatalf("a client of the new CA: %v", err)
	}
	before := calls.Load()
	eventually(t, "load to go on after the rotation", func() bool { return calls.Load() > before+50 })
	close(stop)
	wg.Wait()
	if f := failures.Load(); f != 0 {
		t.Fatalf("%d of %d calls on the open connection failed across reloads, first: %v", f, calls.Load(), firstErr.Load())
	}
}

// pingCheck makes one peek on a new connection with cfg.
func pingCheck(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = sluicev1.NewRateLimitServiceClient(conn).Check(ctx, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "ping", Hits: proto.Int64(0), Limit: 1, WindowMs: 1000}}})
	return err
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// bearerCreds sends a bearer token on every call (plaintext allowed: the
// node decides).
type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

const (
	tokenAPI = "tok-api-0123456789abcdef"
	tokenAll = "tok-all-0123456789abcdef"
)

func writeTokens(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, f, []byte("# token prefixes\n"+tokenAPI+" api auth.\n"+tokenAll+" *\n"))
	return f
}

func tokenClient(t *testing.T, addr, token string, tc *tls.Config) sluicev1.RateLimitServiceClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecureCreds())}
	if tc != nil {
		opts[0] = grpc.WithTransportCredentials(credentials.NewTLS(tc))
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCreds(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sluicev1.NewRateLimitServiceClient(conn)
}

func checkNames(c sluicev1.RateLimitServiceClient, names ...string) error {
	req := &sluicev1.CheckRequest{}
	for _, n := range names {
		req.Checks = append(req.Checks, &sluicev1.RateLimitCheck{Name: n, Key: "k", Hits: proto.Int64(1)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Check(ctx, req)
	return err
}

// Token auth on gRPC and HTTP: the right token passes for the names its
// prefixes cover; no token, a wrong one or a malformed header is
// Unauthenticated; a name outside its prefixes is PermissionDenied and
// nothing of the batch is counted.
// tokenLimits configures the names the token tests check: a token checks
// configured limits only.
const tokenLimits = `
limits:
  api: {limit: 100, window: 1m}
  api-admin: {limit: 1, window: 1h}
  auth.signin: {limit: 100, window: 1m}
  anything: {limit: 100, window: 1m}
  billing: {limit: 100, window: 1m}
`

func TestTokenAuth(t *testing.T) {
	n := startNodeWith(t, "tok", window.NewManualClock(windowStart), NodeConfig{HTTPAddr: "127.0.0.1:0", TokenFile: writeTokens(t), Limits: mustParseLimits(t, tokenLimits)})
	addr := n.GRPCAddr()
	for _, tc := range []struct {
		what  string
		token string
		names []string
		want  codes.Code
	}{
		{"right token", tokenAPI, []string{"api", "auth.signin"}, codes.OK},
		{"all-names token", tokenAll, []string{"anything"}, codes.OK},
		{"no token", "", []string{"api"}, codes.Unauthenticated},
		{"wrong token", "tok-api-0123456789abcdeX", []string{"api"}, codes.Unauthenticated},
		{"unknown prefix", tokenAPI, []string{"api", "billing"}, codes.PermissionDenied},
	} {
		if got := status.Code(checkNames(tokenClient(t, addr, tc.token, nil), tc.names...)); got != tc.want {
			t.Errorf("gRPC %s: %s, want %s", tc.what, got, tc.want)
		}
	}
	// The refused batch counted nothing: its "api" check is at 1 (the
	// right token's) and the next is the second.
	resp, err := tokenClient(t, addr, tokenAPI, nil).Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{
		{Name: "api", Key: "k", Hits: proto.Int64(1)}}})
	if err != nil || resp.Decisions[0].Remaining != 98 {
		t.Fatalf("after a refused batch: %v, remaining %v, want 98", err, resp.GetDecisions())
	}

	// A token sends no numbers of its own: with them it could reset every
	// key of its names (another window starts a key afresh). The
	// attacker's case: api-admin (1 an hour) used up, then a check with a
	// window of its own, then the configured check again: still refused.
	admin := tokenClient(t, addr, tokenAPI, nil)
	if d := check(t, admin, &sluicev1.RateLimitCheck{Name: "api-admin", Key: "victim"}); !d.Allowed {
		t.Fatalf("first api-admin check: %+v", d)
	}
	for _, own := range []*sluicev1.RateLimitCheck{
		{Name: "api-admin", Key: "victim", Limit: 1000, WindowMs: 1000, Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET},
		{Name: "api-admin", Key: "victim", WindowMs: 1000},
		{Name: "api-admin", Key: "victim", Burst: 5},
		{Name: "api-admin", Key: "victim", Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW},
	} {
		_, err := admin.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{own}})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "configured limits only") {
			t.Errorf("token check with numbers of its own %v: %v, want PermissionDenied", own, err)
		}
	}
	if d := check(t, admin, &sluicev1.RateLimitCheck{Name: "api-admin", Key: "victim"}); d.Allowed || d.Remaining != 0 {
		t.Fatalf("api-admin after the token's own numbers were refused: %+v, want still used up", d)
	}

	body := `{"checks":[{"name":"%s","key":"h"}]}`
	for _, tc := range []struct {
		what, auth, name string
		want             int
	}{
		{"right token", "Bearer " + tokenAPI, "api", 200},
		{"no token", "", "api", 401},
		{"wrong token", "Bearer nope-nope-nope-nope", "api", 401},
		{"not bearer", "Basic " + tokenAPI, "api", 401},
		{"unknown prefix", "Bearer " + tokenAPI, "billing", 403},
	} {
		req, _ := http.NewRequest("POST", "http://"+n.HTTPAddr()+"/v1/check", strings.NewReader(strings.Replace(body, "%s", tc.name, 1)))
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("HTTP %s: %d %s, want %d", tc.what, resp.StatusCode, b, tc.want)
		}
	}
	if code, _ := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/healthz", ""); code != 200 {
		t.Errorf("/healthz without a token: %d, want 200", code)
	}
	if code, _ := httpDo(t, "GET", "http://"+n.HTTPAddr()+"/metrics", ""); code != 401 {
		t.Errorf("/metrics without a token: %d, want 401", code)
	}
}

// nonLoopbackIP returns an IPv4 address of this host other than loopback.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	t.Skip("this host has no non-loopback IPv4 address")
	return ""
}

// A token over plaintext is refused when it comes from another address
// than loopback (here: this host's own LAN address), and accepted over TLS
// (client auth either) from the same address.
func TestTokenOverPlaintextOffLoopbackRefused(t *testing.T) {
	ip := nonLoopbackIP(t)
	tokens := writeTokens(t)
	n, err := StartNode(NodeConfig{Name: "wide", GRPCAddr: net.JoinHostPort(ip, "0"), GossipAddr: "127.0.0.1:0", AdvertiseHost: ip,
		Profile: "local", Logger: testLogger(), TokenFile: tokens, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Kill()
	err = checkNames(tokenClient(t, n.GRPCAddr(), tokenAPI, nil), "api")
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("token over plaintext from %s: %v, want Unauthenticated naming plaintext", ip, err)
	}

	p := newPKI(t)
	c, k := p.issue(t, certs.Peer, "wide2")
	n2, err := StartNode(NodeConfig{Name: "wide2", GRPCAddr: net.JoinHostPort(ip, "0"), GossipAddr: "127.0.0.1:0", AdvertiseHost: ip,
		Profile: "local", Logger: testLogger(), TokenFile: tokens, ClientAuth: ClientAuthEither, TLSCert: c, TLSKey: k, TLSCA: p.caFile, Insecure: true,
		Limits: mustParseLimits(t, tokenLimits)})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Kill()
	tc := p.clientTLS(t, "", "")
	tc.InsecureSkipVerify = true // the certificate's SAN is 127.0.0.1, the address ip
	if err := checkNames(tokenClient(t, n2.GRPCAddr(), tokenAPI, tc), "api"); err != nil {
		t.Fatalf("token over TLS from %s: %v", ip, err)
	}
	if err := checkNames(tokenClient(t, n2.GRPCAddr(), "", tc), "api"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("client auth either, neither certificate nor token: %v, want Unauthenticated", err)
	}
}

// The HTTP face with mTLS: a client certificate passes, none gets 401,
// /healthz needs none.
func TestHTTPMutualTLS(t *testing.T) {
	p := newPKI(t)
	n := startTLSNode(t, p, "web", NodeConfig{HTTPAddr: "127.0.0.1:0"})
	cc, ck := p.issue(t, certs.Client, "app")
	do := func(tc *tls.Config, method, path, body string) int {
		// HTTP/2, as curl and browsers negotiate it.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequest(method, "https://"+n.HTTPAddr()+path, strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Errorf("%s %s over %s, want HTTP/2", method, path, resp.Proto)
		}
		return resp.StatusCode
	}
	body := `{"checks":[{"name":"api","key":"h","limit":5,"window_ms":60000}]}`
	if code := do(p.clientTLS(t, cc, ck), "POST", "/v1/check", body); code != 200 {
		t.Errorf("check with a client certificate: %d", code)
	}
	if code := do(p.clientTLS(t, "", ""), "POST", "/v1/check", body); code != 401 {
		t.Errorf("check without a certificate: %d, want 401", code)
	}
	if code := do(p.clientTLS(t, "", ""), "GET", "/healthz", ""); code != 200 {
		t.Errorf("/healthz without a certificate: %d, want 200", code)
	}
	// Plaintext HTTP gets Go's 400 from the TLS server, never the handler.
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	if resp, err := hc.Get("http://" + n.HTTPAddr() + "/v1/members"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("plaintext HTTP: %d, want 400", resp.StatusCode)
		}
	}
}
