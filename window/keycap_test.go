package window

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The scenario in the store: with a cap of 10000 keys and the
// default policy (deny), 20000 new keys in the victim's name within the
// window never give an exhausted victim one extra admit; every new key
// past the cap is refused (not admitted, NoRoom) and counted.
func TestKeyCapDenyKeepsExhaustedVictim(t *testing.T) {
	const capKeys = 10_000
	s := NewStore(StoreConfig{MaxKeys: capKeys}) // OnKeyCap zero value: deny
	c := Check{Algorithm: FixedWindow, Limit: 3, Window: time.Hour, Hits: 1}
	victim := "api\x00victim"
	for i := range 3 {
		if d := mustApply(t, s, victim, c, t0); !d.Allowed {
			t.Fatalf("victim hit %d refused before its limit", i)
		}
	}
	extra, refused, admitted := 0, 0, 0
	for i := range 20_000 {
		now := t0.Add(time.Duration(i) * time.Millisecond) // 20 s: inside the hour
		d := mustApply(t, s, fmt.Sprintf("api\x00attacker-%d", i), c, now)
		switch {
		case d.NoRoom:
			if d.Allowed || d.Remaining != 0 || d.RetryAfter != NoRoomRetry {
				t.Fatalf("key %d: NoRoom answered %+v, want not allowed, 0 remaining, retry after %s", i, d, NoRoomRetry)
			}
			refused++
		case d.Allowed:
			admitted++
		default:
			t.Fatalf("key %d: a fresh key denied without NoRoom: %+v", i, d)
		}
		if mustApply(t, s, victim, c, now).Allowed {
			extra++
		}
	}
	if extra != 0 {
		t.Fatalf("the exhausted victim got %d extra admits during the flood", extra)
	}
	st := s.Stats()
	if st.Keys > capKeys+shardCount || st.Keys != admitted+1 {
		t.Fatalf("%d keys held (admitted %d + the victim), cap %d", st.Keys, admitted, capKeys)
	}
	if refused == 0 || st.Refused != int64(refused) || st.EvictedLive != 0 {
		t.Fatalf("refused %d, stats %+v: want every refusal counted and no eviction", refused, st)
	}
	// Under evict (the old behaviour) a flood does hand the victim a fresh
	// budget: the reason deny is the default. (How many new keys it takes
	// depends on where the clock hand meets the victim; Get does not mark
	// it used.)
	s = NewStore(StoreConfig{MaxKeys: capKeys, OnKeyCap: KeyCapEvict})
	for range 3 {
		mustApply(t, s, victim, c, t0)
	}
	flooded := 0
	for _, held := s.Get(victim); held && flooded < 1_000_000; _, held = s.Get(victim) {
		mustApply(t, s, fmt.Sprintf("api\x00attacker-%d", flooded), c, t0)
		flooded++
	}
	if !mustApply(t, s, victim, c, t0).Allowed || s.Stats().EvictedLive == 0 {
		t.Fatalf("evict: the victim was not evicted by %d new keys (stats %+v); the test shows nothing", flooded, s.Stats())
	}
}

// Deny makes room with keys back at full capacity before it refuses.
func TestKeyCapDenySweepsExpiredFirst(t *testing.T) {
	s := NewStore(StoreConfig{MaxKeys: shardCount}) // 1 per shard
	c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Second, Hits: 1}
	for i := range 4000 {
		mustApply(t, s, fmt.Sprint("a", i), c, t0)
	}
	full := s.Len()
	for i := range 4000 {
		if d := mustApply(t, s, fmt.Sprint("b", i), c, t0.Add(time.Second)); d.NoRoom {
			// The shard's one key of window 1 expired: it goes first, so
			// a refusal means this shard already took a key of window 2.
			continue
		}
	}
	if st := s.Stats(); st.EvictedLive != 0 || st.Swept != int64(full) || st.Keys != shardCount {
		t.Fatalf("stats %+v: want the %d expired keys swept, none evicted live, the shards full again", st, full)
	}
	// A peek or a denied check of a new key inserts nothing, so it is
	// never refused for room.
	if d := mustApply(t, s, "peek", Check{Algorithm: FixedWindow, Limit: 5, Window: time.Second}, t0.Add(time.Second)); d.NoRoom || !d.Allowed {
		t.Fatalf("peek of a new key in a full store: %+v", d)
	}
}

// A group (a limit name) holds at most its share: past it, its new keys
// are refused under either policy, while other groups still get room.
func TestMaxKeysPerGroup(t *testing.T) {
	group := func(k string) string { name, _, _ := strings.Cut(k, "\x00"); return name }
	for _, pol := range []KeyCapPolicy{KeyCapDeny, KeyCapEvict} {
		s := NewStore(StoreConfig{MaxKeys: 16 * shardCount, MaxKeysPerGroup: 4 * shardCount, Group: group, OnKeyCap: pol})
		c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Hour, Hits: 1}
		refused := 0
		for i := range 20_000 {
			if mustApply(t, s, fmt.Sprint("hog\x00", i), c, t0).NoRoom {
				refused++
			}
		}
		st := s.Stats()
		if st.Keys > 4*shardCount || st.Keys < 3*shardCount || int64(refused) != st.Refused || st.EvictedLive != 0 {
			t.Fatalf("%s: the hog holds %d keys (share %d), refused %d, stats %+v", pol, st.Keys, 4*shardCount, refused, st)
		}
		for i := range 500 {
			if d := mustApply(t, s, fmt.Sprintf("other%d\x00%d", i%100, i), c, t0); d.NoRoom || !d.Allowed {
				t.Fatalf("%s: key %d of other groups refused after the hog took its share: %+v", pol, i, d)
			}
		}
		// Removing the hog's keys gives its share back.
		for k := range s.All() {
			if group(k) == "hog" {
				s.Take(k)
			}
		}
		if d := mustApply(t, s, "hog\x00again", c, t0); d.NoRoom {
			t.Fatalf("%s: the hog's share was not given back by Take", pol)
		}
	}
}

// A merge (a hand-off) never drops consumed hits for room: under deny it
// goes over the cap and says so.
func TestMergeStateOverCap(t *testing.T) {
	s := NewStore(StoreConfig{MaxKeys: shardCount})
	c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Hour, Hits: 2}
	src := NewStore(StoreConfig{})
	mustApply(t, src, "moved", c, t0)
	st, _ := src.Get("moved")
	for i := range 3000 {
		mustApply(t, s, fmt.Sprint("k", i), c, t0)
	}
	if got := s.MergeState("moved", st, t0); got != st {
		t.Fatalf("merged %v, want %v", got, st)
	}
	d := mustApply(t, s, "moved", Check{Algorithm: FixedWindow, Limit: 5, Window: time.Hour}, t0)
	if d.Remaining != 3 || s.Stats().MergedOverCap != 1 {
		t.Fatalf("after the merge: remaining %d (want 3), stats %+v", d.Remaining, s.Stats())
	}
}

func TestParseKeyCapPolicy(t *testing.T) {
	for _, p := range []KeyCapPolicy{KeyCapDeny, KeyCapEvict} {
		if got, err := ParseKeyCapPolicy(p.String()); err != nil || got != p {
			t.Fatalf("%s: %v, %v", p, got, err)
		}
	}
	if _, err := ParseKeyCapPolicy("lru"); err == nil || !strings.Contains(err.Error(), `"lru"`) {
		t.Fatalf("lru: %v", err)
	}
}

// Group counts survive keys whose bytes are reused: ApplyBytes with one
// buffer, and removals that overwrite the entries (the counts never keep
// an alias of either).
func TestGroupCountsWithReusedBuffers(t *testing.T) {
	group := func(k string) string { name, _, _ := strings.Cut(k, "\x00"); return name }
	s := NewStore(StoreConfig{MaxKeys: 64 * shardCount, MaxKeysPerGroup: 2 * shardCount, Group: group})
	c := Check{Algorithm: FixedWindow, Limit: 5, Window: time.Second, Hits: 1}
	buf := make([]byte, 0, 64)
	for round := range 3 {
		for i := range 3000 {
			buf = fmt.Appendf(buf[:0], "g%d\x00k%d", i%3, i)
			if _, err := s.ApplyBytes(buf, c, t0.Add(time.Duration(round)*time.Second)); err != nil {
				t.Fatal(err)
			}
			copy(buf, "XXXXXXXXXXXX") // scribble over the caller's buffer
		}
		// Each group holds at most its share, and the counts add up to
		// what the shards hold.
		total := 0
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			sum := 0
			for g, n := range sh.t.groups {
				if !strings.HasPrefix(g, "g") || *n > 2 {
					t.Fatalf("round %d shard %d: group %q holds %d", round, i, g, *n)
				}
				sum += int(*n)
			}
			if sum != sh.t.n {
				t.Fatalf("round %d shard %d: groups count %d keys, the shard holds %d", round, i, sum, sh.t.n)
			}
			total += sum
			sh.mu.Unlock()
		}
		if total == 0 {
			t.Fatal("nothing stored")
		}
	}
}
