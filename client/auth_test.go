package client_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// authNode records the authorization metadata of the checks it answers.
type authNode struct {
	fakeNode
	mu   sync.Mutex
	auth []string
}

func (a *authNode) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.auth = append(a.auth, md.Get("authorization")...)
	a.mu.Unlock()
	return a.fakeNode.Check(ctx, req)
}

func startAuthNode(t *testing.T, host string) *authNode {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	a := &authNode{}
	a.addr = lis.Addr().String()
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, a)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return a
}

// Token sends "Bearer TOKEN" to a node on loopback in plaintext, and
// refuses to send it in plaintext to another host (the call fails, the
// node sees no token).
func TestTokenNeverInPlaintextOffLoopback(t *testing.T) {
	const tok = "tok-0123456789abcdef"
	local := startAuthNode(t, "127.0.0.1")
	c, err := client.New(client.Config{Addrs: []string{local.addr}, FailureMode: client.FailClosed,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), client.Token(tok)}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Check(context.Background(), client.Check{Name: "api", Key: "k", Hits: 1}); err != nil {
		t.Fatal(err)
	}
	local.mu.Lock()
	defer local.mu.Unlock()
	if len(local.auth) != 1 || local.auth[0] != "Bearer "+tok {
		t.Fatalf("loopback node got authorization %q, want the bearer token", local.auth)
	}

	var ip string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			ip = n.IP.String()
			break
		}
	}
	if ip == "" {
		t.Skip("no non-loopback IPv4 address")
	}
	remote := startAuthNode(t, ip)
	rc, err := client.New(client.Config{Addrs: []string{remote.addr}, FailureMode: client.FailClosed,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), client.Token(tok)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	_, err = rc.Check(context.Background(), client.Check{Name: "api", Key: "k", Hits: 1})
	if err == nil {
		t.Fatal("a token in plaintext to another host: no error")
	}
	remote.mu.Lock()
	defer remote.mu.Unlock()
	if len(remote.auth) != 0 || len(remote.got()) != 0 {
		t.Fatalf("the remote node saw %q and %d checks, want nothing", remote.auth, len(remote.got()))
	}
	// The client's errors carry the gRPC code only: the token source
	// refused, before anything was sent.
	if !strings.Contains(err.Error(), "Unauthenticated") {
		t.Fatalf("error %v, want Unauthenticated (the token was refused locally)", err)
	}
}
