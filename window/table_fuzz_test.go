package window

import (
	"fmt"
	"math"
	"testing"
)

// FuzzTable drives a table with a sequence of inserts, lookups, updates,
// removals, evictions and sweeps (decoded from the input, 3 bytes an op)
// under a hash that collides a lot, and checks it against a Go map after
// every op: the same keys, each found with its own state, short and long
// keys alike.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 3, 4, 1, 1, 2, 2, 3, 4, 3, 0, 0, 4, 9, 9})
	f.Add([]byte("a seed of some length to get going with many ops, insert and sweep"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		var tb table
		tb.minExpires = math.MaxInt64
		ref := map[string]int64{} // key -> expiry (its state's at + 1)
		hash := func(k string) uint64 {
			var h uint64
			for i := 0; i < len(k); i++ {
				h = h*31 + uint64(k[i])
			}
			return (h % 13) << 59 // 13 tags at most: long runs that wrap
		}
		key := func(b byte) string {
			if b&1 == 1 {
				return fmt.Sprintf("a key far longer than twenty bytes #%d", b>>1)
			}
			return fmt.Sprintf("k%d", b>>1)
		}
		for i := 0; i+2 < len(ops); i += 3 {
			op, k, arg := ops[i]%5, key(ops[i+1]), int64(ops[i+2])
			slot, found := tb.find(hash(k), k)
			if _, want := ref[k]; found != want {
				t.Fatalf("op %d: find(%q) = %v, want %v", i/3, k, found, want)
			}
			switch op {
			case 0: // insert or update
				st := state{at: arg, a: 1, spec: makeSpec(FixedWindow, 1)}
				if found {
					tb.slots[slot].st = st
					tb.slots[slot].setUsed(true)
				} else {
					tb.insert(hash(k), k, i%2 == 0, st)
				}
				tb.noteExpiry(arg + 1)
				ref[k] = arg + 1
			case 1: // remove
				if found {
					tb.remove(slot)
					delete(ref, k)
				}
			case 2: // evict one
				if tb.n > 0 {
					s := tb.evict()
					ek := tb.keyOf(&tb.slots[s])
					if _, ok := ref[ek]; !ok {
						t.Fatalf("op %d: evict chose %q, not in the table", i/3, ek)
					}
					tb.remove(s)
					delete(ref, ek)
				}
			case 3: // sweep at arg
				want := 0
				for rk, exp := range ref {
					if exp <= arg {
						delete(ref, rk)
						want++
					}
				}
				if got := tb.sweep(arg); got != want {
					t.Fatalf("op %d: sweep(%d) removed %d, want %d", i/3, arg, got, want)
				}
			case 4: // look up only
			}
			if tb.n != len(ref) {
				t.Fatalf("op %d: %d entries, want %d", i/3, tb.n, len(ref))
			}
		}
		for rk, exp := range ref {
			slot, ok := tb.find(hash(rk), rk)
			if !ok || tb.slots[slot].st.expires() != exp || tb.keyOf(&tb.slots[slot]) != rk {
				t.Fatalf("end: %q lost or wrong (found %v)", rk, ok)
			}
		}
	})
}
