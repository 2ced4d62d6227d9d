package rpc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/renameio/v2"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/window"
)

// The state file of a node (NodeConfig.StateDir; docs/persistence.md):
// what it is, how it is written and read. When the node writes and reads
// it is in statedir.go.
//
// Layout (integers big-endian; "uvarint" and "varint" as encoding/binary):
//
//	magic    8 bytes   "SLUICEST"
//	format   2 bytes   stateFormat (1)
//	kind     1 byte    1: written by a leave no member could take the keys of; 2: a snapshot
//	written  varint    the writer's wall clock, Unix ns
//	node     uvarint length, bytes: the writer's member name
//	instance uvarint length, bytes: the writer's process (gossiped instance id)
//	peers    uvarint count, then each: name, instance (length-prefixed):
//	         a snapshot's ring members beside the writer (none in a leave's file)
//	keys     uvarint count, then each: key (length-prefixed store key),
//	         state (length-prefixed window.State.AppendBinary)
//	checksum 4 bytes   CRC-32C (Castagnoli) of everything before it

// stateMagic opens every state file.
const stateMagic = "SLUICEST"

// stateFormat is the version of the layout above. A file of another
// version is refused.
const stateFormat uint16 = 1

// stateHeader and stateTrailer are the fixed bytes before the body and
// after it.
const (
	stateHeader  = len(stateMagic) + 2
	stateTrailer = 4
)

// ErrStateFile is wrapped by every refusal of a state file: it is not one,
// of another format version, corrupt or truncated, or another node's.
var ErrStateFile = errors.New("bad state file")

var stateCRC = crc32.MakeTable(crc32.Castagnoli)

// stateKind says why a state file was written, which decides how a node
// starting from it uses it (see statedir.go).
type stateKind byte

const (
	// stateLeave: a graceful leave found no member to take the keys.
	stateLeave stateKind = 1
	// stateSnapshot: written every StateInterval while the node ran.
	stateSnapshot stateKind = 2
)

func (k stateKind) String() string {
	switch k {
	case stateLeave:
		return "leave"
	case stateSnapshot:
		return "snapshot"
	}
	return fmt.Sprintf("kind %d", byte(k))
}

// peerInstance is a member and its process (gossiped instance id).
type peerInstance struct{ name, instance string }

// stateFile is the content of a state file.
type stateFile struct {
	kind     stateKind
	written  time.Time
	node     string
	instance string
	peers    []peerInstance // a snapshot's: the writer's ring members beside it
	keys     []string       // store keys
	states   []window.State // by index of keys
}

// stateFileName is the file of the node name in its state directory: the
// name escaped as a path segment, then ".state".
func stateFileName(name string) string { return url.PathEscape(name) + ".state" }

// encode writes f in the layout above to w.
func (f *stateFile) encode(w io.Writer) error {
	h := crc32.New(stateCRC)
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 64<<10)
	var b []byte
	b = append(b, stateMagic...)
	b = binary.BigEndian.AppendUint16(b, stateFormat)
	b = append(b, byte(f.kind))
	b = binary.AppendVarint(b, f.written.UnixNano())
	b = appendBytes(b, f.node)
	b = appendBytes(b, f.instance)
	b = binary.AppendUvarint(b, uint64(len(f.peers)))
	for _, p := range f.peers {
		b = appendBytes(b, p.name)
		b = appendBytes(b, p.instance)
	}
	b = binary.AppendUvarint(b, uint64(len(f.keys)))
	for i, k := range f.keys {
		b = appendBytes(b, k)
		var st [64]byte
		enc, _ := f.states[i].AppendBinary(st[:0])
		b = binary.AppendUvarint(b, uint64(len(enc)))
		b = append(b, enc...)
		if len(b) > 32<<10 {
			if _, err := bw.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(binary.BigEndian.AppendUint32(nil, h.Sum32()))
	return err
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeStateFile decodes a state file's bytes, or says what is wrong
// with them (wrapping ErrStateFile): not a state file, another format
// version, a checksum that does not match (corrupt or truncated), or a
// field that does not decode (named).
func decodeStateFile(b []byte) (*stateFile, error) {
	if len(b) < len(stateMagic) || string(b[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("%w: not a sluice state file (it does not start with %q)", ErrStateFile, stateMagic)
	}
	if len(b) < stateHeader+stateTrailer {
		return nil, fmt.Errorf("%w: truncated: %d bytes", ErrStateFile, len(b))
	}
	if v := binary.BigEndian.Uint16(b[len(stateMagic):]); v != stateFormat {
		return nil, fmt.Errorf("%w: format version %d; this sluice reads version %d only", ErrStateFile, v, stateFormat)
	}
	body, sum := b[:len(b)-stateTrailer], binary.BigEndian.Uint32(b[len(b)-stateTrailer:])
	if crc32.Checksum(body, stateCRC) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch: the file is corrupt or truncated", ErrStateFile)
	}
	d := stateDecoder{b: body[stateHeader:], i: -1}
	f := &stateFile{kind: stateKind(d.byte("kind"))}
	if f.kind != stateLeave && f.kind != stateSnapshot {
		d.fail("kind", fmt.Sprintf("unknown kind %d", byte(f.kind)))
	}
	f.written = time.Unix(0, d.varint("written"))
	f.node = d.string("node", cluster.MaxNameBytes)
	f.instance = d.string("instance", 64)
	n := d.count("peers", 2)
	for i := 0; i < n && d.err == nil; i++ {
		d.i = i
		f.peers = append(f.peers, peerInstance{
			name:     d.string("peers[%d].name", cluster.MaxNameBytes),
			instance: d.string("peers[%d].instance", 64),
		})
	}
	d.i = -1
	n = d.count("keys", 3)
	f.keys, f.states = make([]string, 0, n), make([]window.State, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		d.i = i
		k := d.string("keys[%d].key", maxStoreKeyBytes)
		if d.err == nil && k == "" {
			d.fail("keys[%d].key", "empty")
		}
		raw := d.bytes("keys[%d].state", 64)
		var st window.State
		if d.err == nil {
			if err := st.UnmarshalBinary(raw); err != nil {
				d.fail("keys[%d].state", err.Error())
			}
		}
		f.keys, f.states = append(f.keys, k), append(f.states, st)
	}
	d.i = -1
	if d.err == nil && len(d.b) != 0 {
		d.fail("keys", fmt.Sprintf("%d bytes after the last key", len(d.b)))
	}
	if d.err != nil {
		return nil, d.err
	}
	return f, nil
}

// stateDecoder reads the fields of a state file's body; its first error
// sticks (later reads return zero values). A field name with %d is of
// entry i (formatted only in an error).
type stateDecoder struct {
	b   []byte
	i   int
	err error
}

func (d *stateDecoder) fail(field, what string) {
	if d.err == nil {
		if d.i >= 0 {
			field = fmt.Sprintf(field, d.i)
		}
		d.err = fmt.Errorf("%w: %s: %s", ErrStateFile, field, what)
	}
}

func (d *stateDecoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(field, "truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *stateDecoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(field, "truncated")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *stateDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(field, "truncated")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of entries of at least minBytes each: more than the
// bytes left could hold is refused (no allocation follows a bad count).
func (d *stateDecoder) count(field string, minBytes int) int {
	n := d.uvarint(field)
	if d.err == nil && n > uint64(len(d.b)/minBytes) {
		d.fail(field, fmt.Sprintf("%d entries cannot fit in the %d bytes left", n, len(d.b)))
		return 0
	}
	return int(n)
}

func (d *stateDecoder) bytes(field string, max int) []byte {
	n := d.uvarint(field)
	if d.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail(field, fmt.Sprintf("length %d: over %d bytes or past the end", n, max))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *stateDecoder) string(field string, max int) string { return string(d.bytes(field, max)) }

// readStateFile reads and decodes the state file at path: nil and no
// error when there is none. Its errors name the file.
func readStateFile(path string) (*stateFile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	f, err := decodeStateFile(b)
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return f, nil
}

// writeStateFile replaces the file at path with f atomically: a temporary
// file in the same directory, written, synced and renamed over path,
// then the directory synced (so the rename survives a power cut). A
// failure leaves the old file as it was.
func writeStateFile(path string, f *stateFile) error {
	dir := filepath.Dir(path)
	pf, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithPermissions(0o600))
	if err != nil {
		return err
	}
	defer func() { _ = pf.Cleanup() }() // a no-op once replaced
	if err := f.encode(pf); err != nil {
		return err
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes the directory's entries (a rename, a removal) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeTempFiles removes the temporary files a write of the state file
// of base left in dir when its process died mid-write (renameio names them
// "." + base + digits).
func removeTempFiles(dir, base string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "."+base) && strings.Trim(n[len(base)+1:], "0123456789") == "" && len(n) > len(base)+1 {
			_ = os.Remove(filepath.Join(dir, n))
		}
	}
}
