package rpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/window"
)

// sampleStateFile is a state file of node1 holding one key of each
// algorithm, each with 3 hits consumed.
func sampleStateFile(t *testing.T) *stateFile {
	t.Helper()
	st := window.NewStore(window.StoreConfig{})
	f := &stateFile{kind: stateSnapshot, written: windowStart, node: "node1", instance: "0123456789abcdef",
		peers: []peerInstance{{"node2", "1111111111111111"}, {"node3", "2222222222222222"}}}
	for i, alg := range []window.Algorithm{window.FixedWindow, window.SlidingWindow, window.TokenBucket, window.LeakyBucket} {
		k := string(rune('a' + i))
		if _, err := st.Apply(k, window.Check{Algorithm: alg, Limit: 10, Window: time.Hour, Hits: 3}, windowStart); err != nil {
			t.Fatal(err)
		}
		s, _ := st.Get(k)
		f.keys, f.states = append(f.keys, k), append(f.states, s)
	}
	return f
}

func encodeStateFile(t *testing.T, f *stateFile) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := f.encode(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestStateFileRoundTrip(t *testing.T) {
	f := sampleStateFile(t)
	got, err := decodeStateFile(encodeStateFile(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if got.kind != f.kind || !got.written.Equal(f.written) || got.node != f.node || got.instance != f.instance ||
		len(got.peers) != 2 || got.peers[1] != f.peers[1] || len(got.keys) != 4 {
		t.Fatalf("decoded %+v, want %+v", got, f)
	}
	for i := range f.keys {
		if got.keys[i] != f.keys[i] || got.states[i] != f.states[i] {
			t.Errorf("key %d: %q %v, want %q %v", i, got.keys[i], got.states[i], f.keys[i], f.states[i])
		}
	}
	empty := &stateFile{kind: stateLeave, node: "n"}
	if got, err := decodeStateFile(encodeStateFile(t, empty)); err != nil || len(got.keys) != 0 || got.kind != stateLeave {
		t.Fatalf("empty file: %+v, %v", got, err)
	}
}

// Every damage is refused with ErrStateFile and a message saying what.
func TestStateFileRefusals(t *testing.T) {
	good := encodeStateFile(t, sampleStateFile(t))
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "not a sluice state file"},
		{"another file", []byte("limits:\n  api:\n"), "not a sluice state file"},
		{"header only", good[:stateHeader], "truncated: 10 bytes"},
		{"another version", edit(func(b []byte) []byte { binary.BigEndian.PutUint16(b[8:], 2); return b }), "format version 2; this sluice reads version 1 only"},
		{"a byte flipped", edit(func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }), "checksum mismatch: the file is corrupt or truncated"},
		{"cut short", good[:len(good)-7], "checksum mismatch"},
		{"bytes added", append(bytes.Clone(good), 0, 0, 0), "checksum mismatch"},
	} {
		_, err := decodeStateFile(tc.b)
		if !errors.Is(err, ErrStateFile) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrStateFile saying %q", tc.name, err, tc.want)
		}
	}
	// A body that passes its checksum but does not decode names the field.
	bad := sampleStateFile(t)
	bad.keys[2] = ""
	if _, err := decodeStateFile(encodeStateFile(t, bad)); err == nil || !strings.Contains(err.Error(), "keys[2].key: empty") {
		t.Errorf("empty key: %v", err)
	}
}

// startStateNode starts a node of name on dir with cfg's other settings,
// or returns StartNode's error; a node that starts is closed at the end.
func startStateNode(t *testing.T, name, dir string, cfg NodeConfig) (*Node, error) {
	t.Helper()
	cfg.Name, cfg.GRPCAddr, cfg.GossipAddr, cfg.StateDir = name, "127.0.0.1:0", "127.0.0.1:0", dir
	cfg.Profile, cfg.Logger, cfg.LeaveTimeout = cluster.Local, testLogger(), time.Second
	n, err := StartNode(withTestRegions(cfg))
	if err == nil {
		t.Cleanup(func() { n.Kill() })
	}
	return n, err
}

// A bad state file stops the node from starting, with an error naming the
// file and what is wrong; the file stays for a person to look at.
func TestStartNodeRefusesBadStateFile(t *testing.T) {
	good := encodeStateFile(t, sampleStateFile(t))
	flipped := bytes.Clone(good)
	flipped[len(flipped)-10] ^= 1
	other := bytes.Clone(good)
	binary.BigEndian.PutUint16(other[8:], 7)
	for _, tc := range []struct {
		name, node string
		b          []byte
		want       string
	}{
		{"corrupt", "node1", flipped, "checksum mismatch: the file is corrupt or truncated; move it aside to start without the counts it holds"},
		{"truncated", "node1", good[:len(good)/2], "checksum mismatch"},
		{"another version", "node1", other, "format version 7; this sluice reads version 1 only"},
		{"another node's", "node2", good, `written by node "node1", this node is "node2"`},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, stateFileName(tc.node))
		if err := os.WriteFile(path, tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := startStateNode(t, tc.node, dir, NodeConfig{})
		if err == nil || !errors.Is(err, ErrStateFile) || !strings.Contains(err.Error(), "state_dir: state file "+path) ||
			!strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: StartNode error %v; want one naming %s and saying %q", tc.name, err, path, tc.want)
		}
		if b, _ := os.ReadFile(path); !bytes.Equal(b, tc.b) {
			t.Errorf("%s: the refused file was changed", tc.name)
		}
	}
}

// An absent state dir is created (0700, parents too), and a temporary file
// an interrupted write left there is removed.
func TestStartNodeCreatesStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if _, err := startStateNode(t, "node1", dir, NodeConfig{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir: %v, %v; want a directory 0700", fi, err)
	}
	dir2 := t.TempDir()
	tmp := filepath.Join(dir2, ".node1.state123456")
	keep := filepath.Join(dir2, ".node1.stateful")
	for _, p := range []string{tmp, keep} {
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := startStateNode(t, "node1", dir2, NodeConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted write's %s is still there (%v)", tmp, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("%s is not a temporary file of ours, yet it went: %v", keep, err)
	}
}

func TestStateSettingsRefused(t *testing.T) {
	for _, tc := range []struct {
		cfg  NodeConfig
		want string
	}{
		{NodeConfig{Name: "n", StateInterval: time.Second}, "state_interval: needs state_dir"},
		{NodeConfig{Name: "n", StateDir: "x", StateInterval: -time.Second}, "state_interval: must be >= 0, got -1s"},
	} {
		if _, err := tc.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := startStateNode(t, "node1", file, NodeConfig{}); err == nil || !strings.Contains(err.Error(), "state_dir:") {
		t.Errorf("a file as the state dir: %v, want a state_dir error", err)
	}
}
