package client_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// scopeNode answers each check denied with the region fields set, echoing
// the scope it got.
type scopeNode struct {
	sluicev1.UnimplementedRateLimitServiceServer
	got chan sluicev1.Scope
}

func (f *scopeNode) Check(_ context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	c := req.Checks[0]
	f.got <- c.Scope
	return &sluicev1.CheckResponse{Decisions: []*sluicev1.Decision{{
		Limit: 10, Scope: c.Scope, Region: "eu-west", Slice: 3, SliceExhausted: true, RetryAfter: 100,
	}}}, nil
}

// A check's scope goes on the wire; a decision's scope, region, slice and
// slice_exhausted come back.
func TestScope(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &scopeNode{got: make(chan sluicev1.Scope, 8)}
	s := grpc.NewServer()
	sluicev1.RegisterRateLimitServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	c := newClient(t, client.Config{Addrs: []string{lis.Addr().String()}})
	for sc, wire := range map[client.Scope]sluicev1.Scope{
		client.ScopeDefault:  sluicev1.Scope_SCOPE_UNSPECIFIED,
		client.ScopeGlobal:   sluicev1.Scope_SCOPE_GLOBAL,
		client.ScopeRegional: sluicev1.Scope_SCOPE_REGIONAL,
		client.ScopeExact:    sluicev1.Scope_SCOPE_EXACT,
	} {
		d, err := c.Check(t.Context(), client.Check{Name: "api", Key: "u", Scope: sc})
		if err != nil {
			t.Fatal(err)
		}
		if got := <-f.got; got != wire {
			t.Errorf("scope %q sent as %v, want %v", sc, got, wire)
		}
		if d.Allowed || d.Scope != sc || d.Region != "eu-west" || d.Slice != 3 || !d.SliceExhausted {
			t.Errorf("scope %q: decision %+v", sc, d)
		}
	}
	if _, err := c.Check(t.Context(), client.Check{Name: "api", Key: "u", Scope: "planet"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("unknown scope: %v", err)
	}
	if sc, err := client.ParseScope("exact"); sc != client.ScopeExact || err != nil {
		t.Errorf("ParseScope: %q %v", sc, err)
	}
	if _, err := client.ParseScope("planet"); err == nil {
		t.Error("ParseScope accepted planet")
	}
}
