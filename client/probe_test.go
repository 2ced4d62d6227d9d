package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/testcluster"
)

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// ErrNoAnswer tells a call no node answered from one a node answered
// without the owner's count: both are ErrUnavailable, failing open (the
// Cause) and closed (the error), and the message is unchanged.
func TestErrNoAnswer(t *testing.T) {
	f := startScripted(t)
	dead := deadAddr(t)
	for _, mode := range []client.FailureMode{client.FailOpen, client.FailClosed} {
		down := newClient(t, client.Config{Addrs: []string{dead}, Timeout: 2 * time.Second, FailureMode: mode})
		up := newClient(t, client.Config{Addrs: []string{f.addr}, Timeout: 2 * time.Second, FailureMode: mode})
		causeOf := func(d client.Decision, err error) error {
			if err != nil {
				return err
			}
			return d.Cause
		}
		d, err := down.Check(context.Background(), client.Check{Name: "api", Key: "k"})
		if c := causeOf(d, err); !errors.Is(c, client.ErrNoAnswer) || !errors.Is(c, client.ErrUnavailable) ||
			!strings.HasPrefix(c.Error(), "client: rate limiter unavailable: node "+dead+": Unavailable") {
			t.Errorf("%s, no node up: %+v, %v; want ErrNoAnswer and ErrUnavailable", mode, d, err)
		}
		ds, err := down.CheckAll(context.Background(), []client.Check{{Name: "a", Key: "k"}, {Name: "b", Key: "k"}})
		if c := causeOf(ds[0], err); !errors.Is(c, client.ErrNoAnswer) {
			t.Errorf("%s, CheckAll, no node up: %+v, %v; want ErrNoAnswer", mode, ds, err)
		}
		for _, key := range []string{"unreachable-1", "degraded-allow-1"} {
			d, err := up.Check(context.Background(), client.Check{Name: "api", Key: key})
			c := causeOf(d, err)
			if key == "degraded-allow-1" && mode == client.FailOpen {
				if c != nil || !d.Degraded {
					t.Errorf("%s %s: %+v, %v; want the node's degraded answer", mode, key, d, err)
				}
				continue
			}
			if !errors.Is(c, client.ErrUnavailable) || errors.Is(c, client.ErrNoAnswer) {
				t.Errorf("%s %s: %+v, %v; want ErrUnavailable, not ErrNoAnswer (a node answered)", mode, key, d, err)
			}
		}
	}
}

// Probe asks every node for its members at once and reports each: nil
// for a node that answered, the gRPC error for the others (a node down,
// a server without Members, a token refused or not covering a name);
// after Close, ErrClosed.
func TestProbe(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	const tok = "probe-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte(tok+" api\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	limits := "limits:\n  api: {limit: 5, window: 1m}\n  login: {limit: 5, window: 1m}\n"
	nodes := testcluster.Start(t, 1, testcluster.Options{Limits: limits})
	secured := testcluster.Start(t, 1, testcluster.Options{Limits: limits, TokenFile: tokens, Token: tok})
	f := startScripted(t)
	dead := deadAddr(t)
	c := newClient(t, client.Config{Addrs: []string{nodes[0].GRPCAddr(), dead, f.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := c.Probe(ctx, "api")
	if len(errs) != 3 || errs[0] != nil || status.Code(errs[1]) != codes.Unavailable || status.Code(errs[2]) != codes.Unimplemented {
		t.Fatalf("probe of a node, a dead address and a server without Members: %v", errs)
	}
	if n := len(f.requests()); n != 0 {
		t.Fatalf("the server without Members got %d checks", n)
	}
	withToken := func(tok string) *client.Client {
		return newClient(t, client.Config{Addrs: []string{secured[0].GRPCAddr()}, DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()), client.Token(tok)}})
	}
	for _, tc := range []struct {
		token string
		names []string
		code  codes.Code
	}{
		{tok, []string{"api"}, codes.OK},
		{tok, nil, codes.OK},
		{"wrong-token-0123456789abcdef", nil, codes.Unauthenticated},
		{tok, []string{"api", "login"}, codes.PermissionDenied},
		{tok, []string{"nolimit"}, codes.PermissionDenied},
	} {
		if errs := withToken(tc.token).Probe(ctx, tc.names...); status.Code(errs[0]) != tc.code {
			t.Errorf("token %s, names %v: %v, want %s", tc.token, tc.names, errs, tc.code)
		}
	}
	// A peek counts nothing: the key still has its whole budget.
	one := newClient(t, client.Config{Addrs: []string{nodes[0].GRPCAddr()}})
	d, err := one.Check(ctx, client.Check{Name: "api", Key: "sluice-probe", Peek: true})
	if err != nil || !d.Allowed || d.Remaining != 5 {
		t.Fatalf("after the probes' peeks: %+v, %v; want 5 remaining", d, err)
	}
	c.Close()
	for _, err := range c.Probe(ctx) {
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
}
