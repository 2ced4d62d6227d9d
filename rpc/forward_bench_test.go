package rpc

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/rpc/sluicev1"
	"github.com/sluicehq/sluice/window"
)

// echoPeer answers every forwarded check allowed, over the peer stream.
type echoPeer struct {
	sluicev1.UnimplementedPeerServiceServer
}

func (echoPeer) ForwardStream(st sluicev1.PeerService_ForwardStreamServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		resp := &sluicev1.ForwardResponse{Decisions: make([]*sluicev1.Decision, len(req.Checks))}
		for i := range req.Checks {
			resp.Decisions[i] = &sluicev1.Decision{Allowed: true}
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// benchForwarder returns a Server whose one peer, "echo", is an echoPeer
// served over bufconn, and the checks of one request for it.
func benchForwarder(b *testing.B) (*Server, []request) {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(codecServerOption)
	sluicev1.RegisterPeerServiceServer(gs, echoPeer{})
	go gs.Serve(lis)
	b.Cleanup(gs.Stop)
	s, err := NewServer(ServerConfig{
		Name:   "node1",
		Store:  window.NewStore(window.StoreConfig{Clock: windowClock(), MaxKeys: 1000}),
		Logger: testLogger(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return lis.DialContext(ctx)
		})},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	if err := s.SetMembers([]cluster.Member{
		{Name: "node1", GRPCAddr: "passthrough:///node1", State: cluster.Alive},
		{Name: "echo", GRPCAddr: "passthrough:///echo", State: cluster.Alive},
	}); err != nil {
		b.Fatal(err)
	}
	reqs, fe := parseChecks([]*sluicev1.RateLimitCheck{{Name: "api", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 60000}}, nil, false)
	if fe != nil {
		b.Fatal(fe)
	}
	return s, reqs
}

// BenchmarkForwardBatched is one check forwarded on the default path
// (Server.forward through the owner's batcher and stream), from 16
// goroutines per GOMAXPROCS, each waiting for its answer: checks gather
// in batches while calls are in flight. Allocations include gRPC's on
// both ends (bufconn, no sockets) and the echoing owner's.
func BenchmarkForwardBatched(b *testing.B) {
	s, reqs := benchForwarder(b)
	b.SetParallelism(16)
	p := s.view.Load().peers["echo"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]*sluicev1.Decision, 1)
		is := []int{0}
		for pb.Next() {
			if fs := s.forward(ctx, p, "echo", reqs, is, out); len(fs) > 0 {
				b.Error(fs[0].err)
				return
			}
		}
	})
}

// BenchmarkForwardBatchedSerial is BenchmarkForwardBatched from one
// goroutine: every check goes alone, at once (nothing in flight).
func BenchmarkForwardBatchedSerial(b *testing.B) {
	s, reqs := benchForwarder(b)
	p := s.view.Load().peers["echo"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	out := make([]*sluicev1.Decision, 1)
	is := []int{0}
	b.ReportAllocs()
	for b.Loop() {
		if fs := s.forward(ctx, p, "echo", reqs, is, out); len(fs) > 0 {
			b.Fatal(fs[0].err)
		}
	}
}

// benchOwnerCluster starts two in-process nodes and returns node1's
// client and a check of a key node2 owns: every call goes client ->
// node1 -> node2 (the owner decides) and back. The limit is never reached.
func benchOwnerCluster(b *testing.B) (sluicev1.RateLimitServiceClient, *sluicev1.CheckRequest) {
	nodes := startInprocCluster(b, 2, windowClock())
	key := ""
	for i := 0; key == ""; i++ {
		if k := "user:" + strconv.Itoa(i); nodes[0].srv.Owner("api", k) == "node2" {
			key = k
		}
	}
	return nodes[0].client, &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{Name: "api", Key: key, Hits: proto.Int64(0), Limit: 10, WindowMs: 60000}}}
}

// BenchmarkCheckForwardedToOwner is a whole forwarded check (a peek): a
// client's Check to node1, which forwards it through its batcher and
// stream to the owner node2, whose ForwardStream decides it; one caller
// at a time, so every check goes alone. Tracing is off.
func BenchmarkCheckForwardedToOwner(b *testing.B) {
	c, req := benchOwnerCluster(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Check(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckForwardedToOwnerParallel is BenchmarkCheckForwardedToOwner
// from 16 goroutines per GOMAXPROCS: checks gather in batches.
func BenchmarkCheckForwardedToOwnerParallel(b *testing.B) {
	c, req := benchOwnerCluster(b)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Check(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
