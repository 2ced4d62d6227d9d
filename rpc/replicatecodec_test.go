package rpc

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// unmarshalReplicate decodes the fields ReplicateRequest and KeyState
// have; a field added to either must be added to it too.
func TestUnmarshalReplicateKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		m    proto.Message
		want []protoreflect.FieldNumber
	}{
		{&sluicev1.ReplicateRequest{}, []protoreflect.FieldNumber{1, 2, 3}},
		{&sluicev1.KeyState{}, []protoreflect.FieldNumber{1, 2, 3, 4}},
	} {
		fs := c.m.ProtoReflect().Descriptor().Fields()
		var got []protoreflect.FieldNumber
		for i := range fs.Len() {
			got = append(got, fs.Get(i).Number())
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%T has fields %v; unmarshalReplicate decodes %v: teach it the new ones", c.m, got, c.want)
		}
	}
}

// unmarshalReplicate reads what UnmarshalVT reads from every request
// proto.Marshal writes, and owns its bytes (the input may be reused).
func TestUnmarshalReplicateMatchesVT(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 200 {
		want := &sluicev1.ReplicateRequest{Sender: "n" + strconv.Itoa(n%3)}
		if n%2 == 0 {
			want.SenderInstance = "inst" + strconv.Itoa(n)
		}
		for i := range rng.IntN(1100) {
			ks := &sluicev1.KeyState{Key: []byte("\x03apik" + strconv.Itoa(i))}
			if rng.IntN(5) > 0 {
				ks.State = bytes.Repeat([]byte{byte(i)}, rng.IntN(40))
			}
			if rng.IntN(4) == 0 {
				ks.Owner, ks.OwnerInstance = "o", "oi"
			}
			want.States = append(want.States, ks)
		}
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var vt sluicev1.ReplicateRequest
		if err := vt.UnmarshalVT(b); err != nil {
			t.Fatal(err)
		}
		var got sluicev1.ReplicateRequest
		if err := unmarshalReplicate(b, &got); err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
		clear(b)
		if !proto.Equal(&got, &vt) || !proto.Equal(&got, want) {
			t.Fatalf("request %d: decoded %d states that differ from UnmarshalVT's %d", n, len(got.States), len(vt.States))
		}
	}
}

// Malformed input is an error, never a panic; what both accept they read
// the same (but for unknown fields, which unmarshalReplicate skips).
func FuzzUnmarshalReplicate(f *testing.F) {
	seed, _ := proto.Marshal(&sluicev1.ReplicateRequest{Sender: "a", SenderInstance: "i", States: []*sluicev1.KeyState{{Key: []byte("k"), State: []byte("s"), Owner: "o"}}})
	f.Add(seed)
	f.Add(seed[:len(seed)-2])
	f.Add(protowire.AppendTag(slices.Clone(seed), 9, protowire.VarintType))
	f.Add([]byte{0x12, 0x02, 0x08, 0x01}) // a state with a varint key
	f.Fuzz(func(t *testing.T, b []byte) {
		var vt sluicev1.ReplicateRequest
		vtErr := vt.UnmarshalVT(b)
		var got sluicev1.ReplicateRequest
		err := unmarshalReplicate(b, &got)
		if vtErr != nil || err != nil {
			// Either may refuse what the other skips: a malformed group
			// (proto2's, which no sender writes) UnmarshalVT skips
			// without matching its end.
			return
		}
		vt.ProtoReflect().SetUnknown(nil)
		for _, ks := range vt.States {
			ks.ProtoReflect().SetUnknown(nil)
		}
		if !proto.Equal(&got, &vt) {
			t.Fatalf("decoded %v, UnmarshalVT %v", &got, &vt)
		}
	})
}

// BenchmarkUnmarshalReplicate decodes one full replication request (1000
// keys) as a replica receives it: through the codec (codec), and as the
// codec did before it decoded ReplicateRequest itself (UnmarshalVT).
func BenchmarkUnmarshalReplicate(b *testing.B) {
	req := &sluicev1.ReplicateRequest{Sender: "n1", SenderInstance: "abc"}
	for i := range handOffBatch {
		req.States = append(req.States, &sluicev1.KeyState{Key: []byte("\x03apik" + strconv.Itoa(i)), State: make([]byte, 26)})
	}
	raw, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m sluicev1.ReplicateRequest
			if err := (vtCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("UnmarshalVT", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m sluicev1.ReplicateRequest
			if err := m.UnmarshalVT(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}
