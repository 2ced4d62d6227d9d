package window

import (
	"bytes"
	"testing"
	"time"
)

// FuzzStateDecode feeds arbitrary bytes to State.UnmarshalBinary (what a
// hand-off receives from the network): it never panics, refuses or keeps
// the state unchanged on error, and what it accepts re-encodes to the same
// bytes, merges with itself, and can be applied to without panicking.
func FuzzStateDecode(f *testing.F) {
	var st state
	st.apply(Check{Algorithm: TokenBucket, Limit: 10, Window: time.Minute, Hits: 3}, 1_700_000_000_000_000_000)
	enc, _ := State{st}.AppendBinary(nil)
	f.Add(enc)
	f.Add([]byte{1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s State
		if err := s.UnmarshalBinary(b); err != nil {
			if !s.IsZero() {
				t.Fatalf("a refused encoding changed the state: %+v", s)
			}
			return
		}
		again, _ := s.AppendBinary(nil)
		if !bytes.Equal(again, b) {
			var s2 State
			if err := s2.UnmarshalBinary(again); err != nil || s2 != s {
				t.Fatalf("re-encoding %x gives %x, which decodes to %+v (%v)", b, again, s2, err)
			}
		}
		_ = Merge(s, s)
		_ = s.st.expires()
		if s.IsZero() {
			return
		}
		c := Check{Algorithm: s.Algorithm(), Limit: 5, Window: time.Duration(s.st.window()), Hits: 1}
		if c.Validate() != nil {
			return
		}
		cp := s.st
		r := cp.apply(c, s.st.at)
		if r.remaining < 0 || r.remaining > c.Capacity() || (r.retry < 0 && r.retry != -1) {
			t.Fatalf("decoded %+v then %+v: %+v", s.st, c, r)
		}
	})
}
