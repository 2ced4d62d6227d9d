package rpc

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// unmarshalReplicate decodes a ReplicateRequest from b into m, as
// UnmarshalVT does, but with three allocations per request instead of
// three per key: one copy of b that every key and state aliases, one slab
// of KeyStates and one slice of pointers into it. A replica receives one
// request of up to [handOffBatch] keys per interval from each owner it
// holds copies for, every key of it fresh (the keys an owner's checks
// changed), so the per-key allocations were most of what receiving a copy
// cost. Unknown fields are skipped (the receiver only reads the message).
// The error names the field that does not parse.
func unmarshalReplicate(b []byte, m *sluicev1.ReplicateRequest) error {
	buf := make([]byte, len(b)) // owned: gRPC's buffer goes back to its pool
	copy(buf, b)
	n, err := countField(buf, 2)
	if err != nil {
		return fmt.Errorf("proto: ReplicateRequest: %w", err)
	}
	*m = sluicev1.ReplicateRequest{}
	slab := make([]sluicev1.KeyState, n)
	if n > 0 {
		m.States = make([]*sluicev1.KeyState, 0, n)
	}
	for len(buf) > 0 {
		num, typ, v, rest, err := nextField(buf)
		if err != nil {
			return fmt.Errorf("proto: ReplicateRequest: %w", err)
		}
		buf = rest
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Sender = string(v)
		case num == 3 && typ == protowire.BytesType:
			m.SenderInstance = string(v)
		case num == 2 && typ == protowire.BytesType:
			ks := &slab[len(m.States)]
			if err := unmarshalKeyState(v, ks); err != nil {
				return fmt.Errorf("proto: ReplicateRequest: states[%d]: %w", len(m.States), err)
			}
			m.States = append(m.States, ks)
		case num == 1 || num == 2 || num == 3:
			return fmt.Errorf("proto: ReplicateRequest: wrong wire type %d for field %d", typ, num)
		}
	}
	return nil
}

// unmarshalKeyState decodes a KeyState from b into ks; its bytes fields
// alias b.
func unmarshalKeyState(b []byte, ks *sluicev1.KeyState) error {
	for len(b) > 0 {
		num, typ, v, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		if num >= 1 && num <= 4 && typ != protowire.BytesType {
			return fmt.Errorf("wrong wire type %d for field %d", typ, num)
		}
		switch num {
		case 1:
			ks.Key = v[:len(v):len(v)]
		case 2:
			ks.State = v[:len(v):len(v)]
		case 3:
			ks.Owner = string(v)
		case 4:
			ks.OwnerInstance = string(v)
		}
	}
	return nil
}

var errProtoTruncated = errors.New("truncated or malformed field")

// nextField reads one field off b: its number, wire type, its contents
// when it is length-delimited (nil otherwise), and what follows it.
func nextField(b []byte) (protowire.Number, protowire.Type, []byte, []byte, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num <= 0 {
		return 0, 0, nil, nil, errProtoTruncated
	}
	b = b[n:]
	if typ == protowire.BytesType {
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return 0, 0, nil, nil, errProtoTruncated
		}
		return num, typ, v, b[m:], nil
	}
	m := protowire.ConsumeFieldValue(num, typ, b)
	if m < 0 {
		return 0, 0, nil, nil, errProtoTruncated
	}
	return num, typ, nil, b[m:], nil
}

// countField returns how many times field num occurs in b, length-delimited.
func countField(b []byte, num protowire.Number) (int, error) {
	c := 0
	for len(b) > 0 {
		n, typ, _, rest, err := nextField(b)
		if err != nil {
			return 0, err
		}
		if n == num && typ == protowire.BytesType {
			c++
		}
		b = rest
	}
	return c, nil
}
