// Package testcluster starts real sluice nodes (rpc.StartNode on
// 127.0.0.1 with OS-picked ports and the local gossip profile) for the
// tests of packages that talk to a cluster over the network: client,
// middleware and cmd/sluice's proxy. Tests only.
package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/certs"
	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rpc"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"

	"github.com/sluicehq/sluice/internal/poll"
)

// Options shape the nodes of a test cluster; the zero value is a plain
// cluster on the system clock with no named limits.
type Options struct {
	// Clock is every node's clock (nil: the system clock).
	Clock window.Clock
	// Limits is the named limits of every node, as a limits file's text
	// (empty: none).
	Limits string
	// PKI, when set, runs every node with TLS: a peer certificate of PKI
	// for its name (SAN 127.0.0.1) and PKI's CA, and client auth
	// ClientAuth. (nil: plaintext)
	PKI *PKI
	// ClientAuth is the nodes' client auth (rpc.NodeConfig.ClientAuth;
	// empty: the node's default, mtls with TLS). Start waits for the
	// ring presenting a client certificate of PKI (plaintext without
	// one), so with a PKI it must take certificates: mtls or either.
	ClientAuth rpc.ClientAuth
	// TokenFile is the nodes' file of bearer tokens and their prefixes
	// (rpc.NodeConfig.TokenFile; empty: none).
	TokenFile string
	// Token is a token of TokenFile that Start sends while it waits for
	// the ring: needed when the nodes take tokens and no certificate
	// (client auth token, or TokenFile without a PKI). (Optional)
	Token string
	// AllowRefunds lets the nodes take clients' refunds
	// (rpc.NodeConfig.AllowRefunds, serve --allow-refunds). (Optional)
	AllowRefunds bool
}

// PKI is a development CA in a test's temporary directory, issuing peer
// and client certificates for 127.0.0.1 (internal/certs), valid for an
// hour.
type PKI struct {
	// CAFile is the CA certificate's PEM file.
	CAFile string
	dir    string
	cert   []byte
	key    []byte
	issued int
}

// NewPKI makes a CA called name in a fresh temporary directory of t.
func NewPKI(t testing.TB, name string) *PKI {
	t.Helper()
	c, k, err := certs.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{dir: t.TempDir(), cert: c, key: k}
	p.CAFile = filepath.Join(p.dir, "ca.pem")
	write(t, p.CAFile, c)
	return p
}

// Issue writes a certificate of kind for name, signed by p's CA, with the
// SAN 127.0.0.1, and its key, and returns their files.
func (p *PKI) Issue(t testing.TB, kind certs.Kind, name string) (certFile, keyFile string) {
	t.Helper()
	c, k, err := certs.Issue(p.cert, p.key, kind, name, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p.issued++
	base := filepath.Join(p.dir, fmt.Sprintf("%s-%s-%d", kind, name, p.issued))
	certFile, keyFile = base+".pem", base+"-key.pem"
	write(t, certFile, c)
	write(t, keyFile, k)
	return certFile, keyFile
}

// DialOption returns the dial option of a client of p: TLS against p's
// CA, presenting a fresh client certificate.
func (p *PKI) DialOption(t testing.TB) grpc.DialOption {
	t.Helper()
	cf, kf := p.Issue(t, certs.Client, "testcluster")
	o, err := client.TLS(p.CAFile, cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Logger logs to stderr when SLUICE_TEST_LOG is set, and nothing otherwise.
func Logger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// Start starts n nodes named node1..nodeN joined through node1, waits
// until their rings agree, and closes them when the test ends.
func Start(t testing.TB, n int, opt Options) []*rpc.Node {
	t.Helper()
	var src *limits.Source
	if opt.Limits != "" {
		set, err := limits.Parse("limits.yaml", []byte(opt.Limits))
		if err != nil {
			t.Fatal(err)
		}
		src = limits.Static(set)
	}
	var nodes []*rpc.Node
	for i := 1; i <= n; i++ {
		cfg := rpc.NodeConfig{
			Name:           fmt.Sprintf("node%d", i),
			GRPCAddr:       "127.0.0.1:0",
			GossipAddr:     "127.0.0.1:0",
			Profile:        cluster.Local,
			Clock:          opt.Clock,
			Logger:         Logger(),
			ForwardTimeout: 2 * time.Second,
			LeaveTimeout:   time.Second,
			Limits:         src,
			ClientAuth:     opt.ClientAuth,
			TokenFile:      opt.TokenFile,
			AllowRefunds:   opt.AllowRefunds,
		}
		if opt.PKI != nil {
			cfg.TLSCert, cfg.TLSKey = opt.PKI.Issue(t, certs.Peer, cfg.Name)
			cfg.TLSCA = opt.PKI.CAFile
		}
		if i > 1 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		node, err := rpc.StartNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = node.Close(ctx)
		})
		nodes = append(nodes, node)
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if opt.PKI != nil {
		dial[0] = opt.PKI.DialOption(t)
	}
	if opt.Token != "" {
		dial = append(dial, client.Token(opt.Token))
	}
	waitRingAgrees(t, nodes, dial...)
	return nodes
}

// Addrs returns the nodes' gRPC addresses.
func Addrs(nodes []*rpc.Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.GRPCAddr()
	}
	return out
}

// WaitRingAgrees waits (up to 15 s) until every node sees all of nodes
// and their rings have one fingerprint.
func WaitRingAgrees(t testing.TB, nodes []*rpc.Node) {
	t.Helper()
	waitRingAgrees(t, nodes, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// waitRingAgrees is WaitRingAgrees dialing the nodes with dial.
func waitRingAgrees(t testing.TB, nodes []*rpc.Node, dial ...grpc.DialOption) {
	t.Helper()
	var clients []sluicev1.RateLimitServiceClient
	for _, n := range nodes {
		conn, err := grpc.NewClient(n.GRPCAddr(), dial...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, sluicev1.NewRateLimitServiceClient(conn))
	}
	Eventually(t, "the rings to agree", func() bool {
		fp := ""
		for _, c := range clients {
			resp, err := c.Members(context.Background(), &sluicev1.MembersRequest{})
			if err != nil || len(resp.Members) != len(nodes) {
				return false
			}
			if fp == "" {
				fp = resp.RingFingerprint
			} else if resp.RingFingerprint != fp {
				return false
			}
		}
		return true
	})
}

// Eventually waits up to 15 s for cond (see internal/poll): only for
// waits at real network edges (gossip runs on its own timers). It fails t
// naming what when cond never holds.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 15*time.Second, what, cond)
}

// KeyOwnedBy returns a key of limit name, prefix followed by a number,
// that the member called owner owns on n's ring.
func KeyOwnedBy(t testing.TB, n *rpc.Node, name, prefix, owner string) string {
	t.Helper()
	for i := range 100000 {
		k := fmt.Sprint(prefix, i)
		if n.Server().Owner(name, k) == owner {
			return k
		}
	}
	t.Fatalf("no key of %s is owned by %s", name, owner)
	return ""
}
