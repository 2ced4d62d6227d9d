package middleware_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/middleware"
)

// The interceptors limit unary calls and stream opens by the caller's IP
// and answer RESOURCE_EXHAUSTED with RetryInfo and retry-after metadata.
func TestGRPCInterceptors(t *testing.T) {
	e := newEnv(t)
	key, err := middleware.PeerIP(middleware.IPConfig{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	base := middleware.GRPCConfig{Checker: e.client, Limit: fixed(2, time.Minute), Key: key, Now: e.clock.Now, Logger: nil}
	uc, sc := base, base
	uc.Name, sc.Name = "grpc-unary", "grpc-stream"
	unary, err := middleware.UnaryServerInterceptor(uc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := middleware.StreamServerInterceptor(sc)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	defer hs.Shutdown()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx := context.Background()

	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		if status.Code(err) != want {
			t.Fatalf("unary call %d: %v, want %s", i+1, err, want)
		}
		if got := md.Get("x-ratelimit-remaining"); len(got) != 1 || got[0] != []string{"1", "0", "0"}[i] {
			t.Errorf("unary call %d: x-ratelimit-remaining %v", i+1, got)
		}
		if want != codes.ResourceExhausted {
			continue
		}
		if ra := md.Get("retry-after"); len(ra) != 1 || ra[0] != "60" {
			t.Errorf("retry-after metadata %v, want [60]", ra)
		}
		var info *errdetails.RetryInfo
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if info == nil || info.RetryDelay.AsDuration() != time.Minute {
			t.Errorf("RetryInfo %v, want 60 s", info)
		}
	}

	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		sctx, cancel := context.WithCancel(ctx)
		w, err := hc.Watch(sctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		cancel()
		if status.Code(err) != want {
			t.Fatalf("stream %d: %v, want %s", i+1, err, want)
		}
	}

	if _, err := middleware.UnaryServerInterceptor(middleware.GRPCConfig{Checker: e.client, Name: "x"}); err == nil {
		t.Fatal("no Key: no error")
	}
	if _, err := middleware.UnaryServerInterceptor(middleware.GRPCConfig{Key: key, Name: "x"}); err == nil || err.Error() != "middleware: GRPCConfig.Checker: required" {
		t.Fatalf("no Checker: %v", err)
	}
}
