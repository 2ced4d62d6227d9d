package rpc

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// vtMessage is a message with the marshalling code that
// protoc-gen-go-vtproto (github.com/planetscale/vtprotobuf) generates: every
// message of sluice.v1 (make proto).
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVT(b []byte) (int, error)
	UnmarshalVT(b []byte) error
}

// vtCodec is gRPC's "proto" codec with vtprotobuf's generated code for the
// messages that have it: no reflection, about half the CPU of proto.Marshal
// and proto.Unmarshal on sluice's batches. Other messages (health,
// reflection, Envoy's rate limit service) go through the proto package.
// It follows google.golang.org/grpc/encoding/proto: buffers come from
// gRPC's pool, and UnmarshalVT copies what it keeps, so the buffer goes
// back at once. A ReplicateRequest, the largest message a node receives
// steadily, is decoded by unmarshalReplicate instead: one copy of the
// buffer and one slab of states per request rather than three
// allocations per key.
//
// Unlike proto.Unmarshal, UnmarshalVT does not check that string fields
// are UTF-8: the server checks the strings it uses (a check's name and
// key: parseCheck); the others name members or rings and match none when
// they are not.
type vtCodec struct{}

var _ encoding.CodecV2 = vtCodec{}

// Name returns "proto": the same wire format and content-subtype as gRPC's
// own codec, so peers and clients need not know which one is used.
func (vtCodec) Name() string { return "proto" }

// Marshal encodes v into a buffer of gRPC's pool (a plain slice below the
// pooling threshold).
func (vtCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case vtMessage:
		size := m.SizeVT()
		if mem.IsBelowBufferPoolingThreshold(size) {
			buf := make([]byte, size)
			if _, err := m.MarshalToSizedBufferVT(buf); err != nil {
				return nil, err
			}
			return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
		}
		pool := mem.DefaultBufferPool()
		buf := pool.Get(size)
		if _, err := m.MarshalToSizedBufferVT(*buf); err != nil {
			pool.Put(buf)
			return nil, err
		}
		return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("rpc: cannot marshal %T: not a protobuf message", v)
}

// Unmarshal decodes data into v.
func (vtCodec) Unmarshal(data mem.BufferSlice, v any) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	switch m := v.(type) {
	case *sluicev1.ReplicateRequest:
		return unmarshalReplicate(buf.ReadOnlyData(), m)
	case vtMessage:
		return m.UnmarshalVT(buf.ReadOnlyData())
	case proto.Message:
		return proto.Unmarshal(buf.ReadOnlyData(), m)
	}
	return fmt.Errorf("rpc: cannot unmarshal into %T: not a protobuf message", v)
}

// codecServerOption and codecDialOption make a node's gRPC server and its
// connections to peers use vtCodec.
var (
	codecServerOption = grpc.ForceServerCodecV2(vtCodec{})
	codecDialOption   = grpc.WithDefaultCallOptions(grpc.ForceCodecV2(vtCodec{}))
)

// flowWindow is the HTTP/2 flow-control window, per stream and per
// connection, in bytes, that a node's gRPC server and its connections to
// peers advertise. Setting it turns off gRPC's estimation of the
// bandwidth-delay product, which pings the other side after each burst of
// data it receives: on a link that carries a few small messages a
// millisecond (a peer's forwards), that was a ping and its ack, more
// writes and reads, per call. With it, spread load on three nodes went
// from 1.12 to 0.90 read calls and from 0.78 to 0.64 write calls per check
// (BENCHMARKS.md). 1 MiB is 16 times gRPC's initial window and within what
// the estimation grows to; on a link of 100 ms round trip it still carries
// about 10 MB/s per stream, some 150000 forwarded checks a second.
const flowWindow = 1 << 20

// windowServerOptions set flowWindow on a node's gRPC server.
var windowServerOptions = []grpc.ServerOption{grpc.InitialWindowSize(flowWindow), grpc.InitialConnWindowSize(flowWindow)}

// WindowDialOptions returns the two dial options that give a client
// connection a node's fixed flow-control window (1 MiB per stream and per
// connection, no bandwidth-delay-product pings): a node dials its peers
// with them, and `sluice bench` the nodes.
func WindowDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(flowWindow), grpc.WithInitialConnWindowSize(flowWindow)}
}
