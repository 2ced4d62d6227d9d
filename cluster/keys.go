package cluster

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/memberlist"
)

// KeySize is the size of a gossip encryption key: 32 bytes, AES-256.
const KeySize = 32

// NewKey returns a new random gossip key, base64-encoded (what `sluice
// keygen` prints and a key file holds).
func NewKey() (string, error) {
	var k [KeySize]byte
	if _, err := rand.Read(k[:]); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(k[:]), nil
}

// ReadKeyFile reads a gossip key file: one base64 key of KeySize bytes per
// line, the primary (the one that encrypts) first; blank lines and lines
// starting with # are skipped. Errors name the file and line. The file
// must hold at least one key, and no key twice.
func ReadKeyFile(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(k) != KeySize {
			return nil, fmt.Errorf("%s:%d: not a base64 key of %d bytes (make one with sluice keygen)", path, line, KeySize)
		}
		if slices.ContainsFunc(keys, func(o []byte) bool { return bytes.Equal(o, k) }) {
			return nil, fmt.Errorf("%s:%d: the same key twice", path, line)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no key (make one with sluice keygen)", path)
	}
	return keys, nil
}

// SetKeys makes keys the live keyring, without a restart: keys not yet
// installed are installed, keys[0] becomes the primary (the one that
// encrypts; all installed keys decrypt), and installed keys not in keys
// are removed. Rotate in three steps, each applied on every node before
// the next: [old, new] (install), [new, old] (use), [new] (remove). It
// returns an error, and changes nothing more, on a node started without
// encryption or for an empty list.
func (c *Cluster) SetKeys(keys [][]byte) error {
	if c.keyring == nil {
		return fmt.Errorf("%w: gossip is not encrypted on this node (it was started without keys)", ErrConfig)
	}
	if len(keys) == 0 {
		return fmt.Errorf("%w: no key", ErrConfig)
	}
	for _, k := range keys {
		if err := c.keyring.AddKey(k); err != nil {
			return fmt.Errorf("cluster: install key: %w", err)
		}
	}
	if err := c.keyring.UseKey(keys[0]); err != nil {
		return fmt.Errorf("cluster: use key: %w", err)
	}
	for _, k := range c.keyring.GetKeys() {
		if !slices.ContainsFunc(keys, func(o []byte) bool { return bytes.Equal(o, k) }) {
			if err := c.keyring.RemoveKey(k); err != nil {
				return fmt.Errorf("cluster: remove key: %w", err)
			}
		}
	}
	c.log.Info("gossip keys set", "keys", len(keys))
	return nil
}

// newKeyring checks keys and builds memberlist's keyring, keys[0] primary.
func newKeyring(keys [][]byte) (*memberlist.Keyring, error) {
	for i, k := range keys {
		if len(k) != KeySize {
			return nil, fmt.Errorf("%w: gossip key %d: %d bytes, want %d (AES-256)", ErrConfig, i, len(k), KeySize)
		}
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("%w: gossip keys: %v", ErrConfig, err)
	}
	return kr, nil
}
