package rpc

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// vtCodec writes the bytes proto.Marshal writes, and each reads what the
// other wrote, for sluice's messages; other messages take proto's path.
func TestVTCodecMatchesProto(t *testing.T) {
	req := &sluicev1.CheckRequest{}
	for i := range 300 { // large enough to come from gRPC's buffer pool
		req.Checks = append(req.Checks, &sluicev1.RateLimitCheck{
			Name: "login", Key: "user:" + strings.Repeat("é", i%7), Hits: proto.Int64(int64(i)), Limit: 100, WindowMs: 60000,
			Algorithm: sluicev1.Algorithm(i % 5), Burst: int64(i % 3), Named: i%2 == 0, NoBatching: i%3 == 0,
			OnOwnerUnavailable: sluicev1.OwnerUnavailablePolicy(i % 4),
		})
	}
	small := &sluicev1.ForwardResponse{Decisions: []*sluicev1.Decision{{
		Allowed: true, Limit: 10, Remaining: 9, ResetTime: windowStart.UnixMilli(), RetryAfter: 5, Owner: "node2", Delay: 3,
		Error: "e", Shadow: true, Degraded: true,
	}}}
	for _, m := range []proto.Message{req, small, &sluicev1.ReplicateRequest{Sender: "n", States: []*sluicev1.KeyState{{Key: []byte{0, 1, 0xff}, State: []byte("s"), Owner: "o"}}}} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := vtCodec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := bs.Materialize()
		bs.Free()
		if !bytes.Equal(got, want) {
			t.Fatalf("%T: vtCodec wrote %d bytes that differ from proto.Marshal's %d", m, len(got), len(want))
		}
		back := m.ProtoReflect().New().Interface()
		if err := (vtCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(back, m) {
			t.Fatalf("%T: vtCodec read back %v, want %v", m, back, m)
		}
	}

	// A message without vtprotobuf code goes through proto.
	h := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	bs, err := vtCodec{}.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back healthpb.HealthCheckResponse
	if err := (vtCodec{}).Unmarshal(bs, &back); err != nil || back.Status != h.Status {
		t.Fatalf("health response through the fallback: %v, %v", &back, err)
	}
	if _, err := (vtCodec{}).Marshal("not a message"); err == nil {
		t.Fatal("a string was marshalled")
	}
	if err := (vtCodec{}).Unmarshal(bs, new(int)); err == nil {
		t.Fatal("an int was unmarshalled into")
	}
	// Bytes that are not a message are refused, not half-read.
	if err := (vtCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0xff})}, &sluicev1.CheckRequest{}); err == nil {
		t.Fatal("a truncated CheckRequest was accepted")
	}
}

// The node's codec does not check UTF-8 as proto.Unmarshal did, so the
// node does: a name or key that is not UTF-8 is refused with
// InvalidArgument naming the field, and nothing is counted.
func TestNotUTF8Refused(t *testing.T) {
	n := startInprocNode(t, "node1", windowClock())
	// A client with the same codec can send what proto.Marshal refuses.
	c := sluicev1.NewRateLimitServiceClient(n.conn(t, codecDialOption))
	for _, tc := range []struct{ name, key, field string }{
		{"login\xff", "k", "checks[0].name"},
		{"login", "user:\xc3", "checks[0].key"},
	} {
		_, err := c.Check(context.Background(), &sluicev1.CheckRequest{Checks: []*sluicev1.RateLimitCheck{{Name: tc.name, Key: tc.key, Limit: 10, WindowMs: 60000}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field+": must be valid UTF-8") {
			t.Fatalf("%q/%q: %v, want InvalidArgument on %s", tc.name, tc.key, err, tc.field)
		}
	}
	if k := n.Server().store.Stats().Keys; k != 0 {
		t.Fatalf("the refused checks left %d keys in the store", k)
	}
	d := check(t, n.client, &sluicev1.RateLimitCheck{Name: "login", Key: "user:é", Hits: proto.Int64(0), Limit: 10, WindowMs: 60000})
	if !d.Allowed || d.Remaining != 10 {
		t.Fatalf("a peek after the refusals: %v, want 10 of 10 left", d)
	}
}
