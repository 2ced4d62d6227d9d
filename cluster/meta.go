package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
)

// metaVersion is the version of the metadata encoding. A node refuses
// metadata of a version it does not know.
const metaVersion = 1

// maxMetaSize bounds the encoded metadata, well under memberlist's
// MetaMaxSize (512 bytes).
const maxMetaSize = 400

// metadata is what a node gossips about itself beside its name and gossip
// address. It is encoded as compact JSON with a version field.
type metadata struct {
	V        int    `json:"v"`
	GRPCAddr string `json:"grpc"`
	Region   string `json:"region"`
	Version  string `json:"version,omitempty"`
	// The node's ring: fingerprint, hash of its member set (16 hex digits
	// each) and epoch (ring builds that changed the fingerprint).
	RingFP      string `json:"rf,omitempty"`
	RingMembers string `json:"rm,omitempty"`
	RingEpoch   uint64 `json:"re,omitempty"`
	// Instance is random per process start (16 hex digits): it tells a
	// node that restarted under its name from the one before.
	Instance string `json:"id,omitempty"`
}

var errMeta = errors.New("bad node metadata")

func encodeMeta(m metadata) ([]byte, error) {
	m.V = metaVersion
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > maxMetaSize {
		return nil, fmt.Errorf("node metadata is %d bytes, over the %d-byte limit (shorten grpc_addr, region or version)", len(b), maxMetaSize)
	}
	return b, nil
}

func decodeMeta(b []byte) (metadata, error) {
	var m metadata
	if len(b) > maxMetaSize {
		return m, fmt.Errorf("%w: %d bytes", errMeta, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	if m.V != metaVersion {
		return m, fmt.Errorf("%w: version %d, want %d", errMeta, m.V, metaVersion)
	}
	if m.GRPCAddr == "" {
		return m, fmt.Errorf("%w: no gRPC address", errMeta)
	}
	return m, nil
}
