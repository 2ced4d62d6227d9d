package rpc

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
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
// back at once.
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
