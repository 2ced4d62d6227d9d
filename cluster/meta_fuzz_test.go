package cluster

import "testing"

// FuzzDecodeMeta feeds arbitrary bytes to the metadata decoder (what a
// gossip peer sends): it never panics, and what it accepts encodes back
// to metadata that decodes the same.
func FuzzDecodeMeta(f *testing.F) {
	good, _ := encodeMeta(metadata{GRPCAddr: "10.0.0.1:7070", Region: "eu", Version: "dev"})
	f.Add(good)
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		enc, err := encodeMeta(m)
		if err != nil {
			return // decodable but too long once re-encoded (escapes): refused on our side
		}
		m2, err := decodeMeta(enc)
		if err != nil || m2 != m {
			t.Fatalf("%q decoded to %+v, re-encoded %q decodes to %+v (%v)", b, m, enc, m2, err)
		}
	})
}
