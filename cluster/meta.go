package cluster

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
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
	// Regions is the fingerprint of the node's region list (16 hex
	// digits; "" for none): members whose lists differ refuse each other.
	Regions string `json:"rg,omitempty"`
	// Since is when the node's cluster began as far as it knows, ms
	// since the Unix epoch on its clock: its own start, lowered to the
	// earliest Since of the members it meets (0: not said).
	Since int64 `json:"cs,omitempty"`
}

var errMeta = errors.New("bad node metadata")

func encodeMeta(m metadata) ([]byte, error) {
	m.V = metaVersion
	if err := checkMeta(m); err != nil {
		return nil, fmt.Errorf("node metadata: %v (other members would refuse it)", err)
	}
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
	if err := checkMeta(m); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	return m, nil
}

// Bounds on the fields of a member's metadata and its name.
const (
	// MaxNameBytes is the longest member name.
	MaxNameBytes = 128
	maxRegion    = 64
	maxVersion   = 64
)

// checkMeta checks the fields of decoded metadata: a gRPC address that is
// host:port with a port in 1..65535 and a host that is an IP or a DNS
// name; a region and version of at most 64 bytes of [A-Za-z0-9._+-]; ring
// hashes and the instance id of 16 hex digits (or absent).
func checkMeta(m metadata) error {
	host, port, err := net.SplitHostPort(m.GRPCAddr)
	if err != nil {
		return fmt.Errorf("grpc: %v", err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("grpc: bad port %q", port)
	}
	if net.ParseIP(host) == nil && !isDNSName(host) {
		return fmt.Errorf("grpc: host %q is neither an IP nor a DNS name", host)
	}
	if !isToken(m.Region, maxRegion) {
		return fmt.Errorf("region: want 1..%d bytes of [A-Za-z0-9._+-], got %q", maxRegion, m.Region)
	}
	if m.Version != "" && !isToken(m.Version, maxVersion) {
		return fmt.Errorf("version: want at most %d bytes of [A-Za-z0-9._+-], got %q", maxVersion, m.Version)
	}
	for _, f := range []struct{ name, v string }{{"rf", m.RingFP}, {"rm", m.RingMembers}, {"id", m.Instance}, {"rg", m.Regions}} {
		if f.v == "" {
			continue
		}
		if _, err := hex.DecodeString(f.v); err != nil || len(f.v) != 16 {
			return fmt.Errorf("%s: want 16 hex digits, got %q", f.name, f.v)
		}
	}
	if m.Since < 0 {
		return fmt.Errorf("cs: want a time in ms since the Unix epoch, got %d", m.Since)
	}
	return nil
}

// CheckName returns an error when name cannot be a member name: empty,
// over MaxNameBytes, or holding anything but printable ASCII without
// spaces.
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameBytes {
		return fmt.Errorf("name: want 1..%d bytes, got %d", MaxNameBytes, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("name: byte %d is %#x; want printable ASCII without spaces", i, c)
		}
	}
	return nil
}

func isToken(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == '+') {
			return false
		}
	}
	return true
}

func isDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
