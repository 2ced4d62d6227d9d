package forward

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// echoStream is an in-memory ForwardStream whose owner allows every check.
type echoStream struct {
	grpc.ClientStream
	ctx  context.Context
	reqs chan *sluicev1.ForwardRequest
	dec  *sluicev1.Decision
}

func (s *echoStream) Send(r *sluicev1.ForwardRequest) error {
	select {
	case s.reqs <- r:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *echoStream) Recv() (*sluicev1.ForwardResponse, error) {
	select {
	case r := <-s.reqs:
		resp := &sluicev1.ForwardResponse{Decisions: make([]*sluicev1.Decision, len(r.Checks))}
		for i := range resp.Decisions {
			resp.Decisions[i] = s.dec
		}
		return resp, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

// echoClient opens echoStreams.
type echoClient struct{ sluicev1.PeerServiceClient }

func (echoClient) ForwardStream(ctx context.Context, _ ...grpc.CallOption) (sluicev1.PeerService_ForwardStreamClient, error) {
	return &echoStream{ctx: ctx, reqs: make(chan *sluicev1.ForwardRequest, 64), dec: &sluicev1.Decision{Allowed: true}}, nil
}

// BenchmarkForwardBatchedInMemory is one check forwarded on the default
// path (Peer.Forward through the batcher and the peer stream) to an
// in-memory owner, one at a time: the sender's own cost, without gRPC's.
func BenchmarkForwardBatchedInMemory(b *testing.B) {
	c := echoClient{}
	p := newPeer("echo", "echo:1", Config{Sender: "node1", Timeout: time.Hour, View: func() (string, uint64) { return "0123456789abcdef", 3 }},
		nil, c, &peerStream{client: c})
	defer p.tr.close()
	defer p.batcher.close()
	r := Request{Checks: []*sluicev1.RateLimitCheck{{Key: "k"}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Forward(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}
