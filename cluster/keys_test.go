package cluster

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// mockNet makes the transports of names on one in-memory network up front
// (MockNetwork is not safe for adding transports while others run).
func mockNet(names ...string) map[string]*memberlist.MockTransport {
	mn := &memberlist.MockNetwork{}
	ts := map[string]*memberlist.MockTransport{}
	for _, n := range names {
		ts[n] = mn.NewTransport(n)
	}
	return ts
}

// startKeyed starts node name on its transport with its own keys and label.
func startKeyed(t *testing.T, ts map[string]*memberlist.MockTransport, name string, keys [][]byte, label string) *Cluster {
	t.Helper()
	c, err := New(Config{Name: name, GRPCAddr: "127.0.0.1:7070", Profile: Local, Keys: keys, Label: label,
		Transport: ts[name], Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown() })
	return c
}

func key(t *testing.T) []byte {
	t.Helper()
	s, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := base64.StdEncoding.DecodeString(s)
	return k
}

func join(c *Cluster, seed *Cluster, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	_, err := c.Join(ctx, []string{seed.GossipAddr()})
	return err
}

// Encrypted gossip: nodes that share a key form a cluster; a node without
// it, or with another label, is never heard.
func TestEncryptedGossipAndLabels(t *testing.T) {
	k1, k2 := key(t), key(t)
	mn := mockNet("a", "b", "wrongkey", "plain", "otherlabel")
	a := startKeyed(t, mn, "a", [][]byte{k1}, "prod")
	b := startKeyed(t, mn, "b", [][]byte{k1}, "prod")
	if err := join(b, a, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a and b together", func() bool { return len(a.Members()) == 2 && len(b.Members()) == 2 })

	for _, tc := range []struct {
		name  string
		keys  [][]byte
		label string
	}{{"wrongkey", [][]byte{k2}, "prod"}, {"plain", nil, "prod"}, {"otherlabel", [][]byte{k1}, "staging"}} {
		c := startKeyed(t, mn, tc.name, tc.keys, tc.label)
		if err := join(c, a, 1500*time.Millisecond); err == nil {
			t.Errorf("%s joined", tc.name)
		}
		if len(a.Members()) != 2 {
			t.Errorf("after %s tried: a sees %d members", tc.name, len(a.Members()))
		}
	}
}

// Keys rotate live in three steps (install, use, remove) without losing a
// member; afterwards only the new key admits a node.
func TestKeyRotation(t *testing.T) {
	old, nw := key(t), key(t)
	mn := mockNet("a", "b", "c", "stale", "p")
	a := startKeyed(t, mn, "a", [][]byte{old}, "")
	b := startKeyed(t, mn, "b", [][]byte{old}, "")
	if err := join(b, a, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a and b together", func() bool { return len(a.Members()) == 2 })
	for _, step := range [][][]byte{{old, nw}, {nw, old}, {nw}} {
		for _, c := range []*Cluster{a, b} {
			if err := c.SetKeys(step); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := a.keyring.GetKeys(); len(got) != 1 || string(got[0]) != string(nw) {
		t.Fatalf("a's keyring holds %d keys after rotation", len(got))
	}
	// Gossip still flows: a third node with the new key joins and is seen
	// by both; one with the old key is not.
	c := startKeyed(t, mn, "c", [][]byte{nw}, "")
	if err := join(c, b, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "three members everywhere", func() bool {
		return len(a.Members()) == 3 && len(b.Members()) == 3 && len(c.Members()) == 3
	})
	stale := startKeyed(t, mn, "stale", [][]byte{old}, "")
	if err := join(stale, a, 1500*time.Millisecond); err == nil {
		t.Fatal("a node with the removed key joined")
	}
	plain := startKeyed(t, mn, "p", nil, "")
	if err := plain.SetKeys([][]byte{nw}); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetKeys on a plaintext node: %v", err)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	k1, _ := NewKey()
	k2, _ := NewKey()
	write := func(s string) string {
		p := filepath.Join(dir, fmt.Sprint(len(s), ".keys"))
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := ReadKeyFile(write("# primary first\n" + k1 + "\n\n" + k2 + "\n"))
	if err != nil || len(keys) != 2 || base64.StdEncoding.EncodeToString(keys[0]) != k1 {
		t.Fatalf("ReadKeyFile: %d keys, %v", len(keys), err)
	}
	for _, tc := range []struct{ data, want string }{
		{"# nothing\n", "no key"},
		{k1 + "\nnot-base64!\n", ":2: not a base64 key of 32 bytes"},
		{base64.StdEncoding.EncodeToString([]byte("short")) + "\n", ":1: not a base64 key"},
		{k1 + "\n" + k1 + "\n", ":2: the same key twice"},
	} {
		if _, err := ReadKeyFile(write(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadKeyFile(%q) = %v, want %q", tc.data, err, tc.want)
		}
	}
	if _, err := New(Config{Name: "a", GRPCAddr: "x:1", Keys: [][]byte{[]byte("short")}, Transport: (&memberlist.MockNetwork{}).NewTransport("a")}); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with a short key: %v", err)
	}
}
