package lease

import "testing"

// ackAll acknowledges every Stand in flight, made at window made.
func ackAll(t *testing.T, k *KeyStands, made int64) {
	t.Helper()
	for _, st := range k.St.Pending() {
		if !k.OnStandAck(StandAck{Region: st.Region, Alloc: st.Alloc, Seq: st.Seq, Made: made}, -1, 1<<40) {
			t.Fatalf("ack of %v refused", st)
		}
	}
}

// A key used in one region: from its demand, the plan lowers the
// idle regions first (their bases, to 0) and raises the busy one only
// once the lowers were acknowledged, to the whole limit; the Stand's hint
// says the busy region's demand; a steady key then sends nothing until
// its stands need renewing, at less than half their reach left.
func TestPlanFollowsOneRegion(t *testing.T) {
	const limit = 60
	bases := map[string]int64{"a": 10, "b": 10, "c": 10}
	regions := []string{"a", "b", "c"}
	st, _ := NewStands(1, limit, bases, 11)
	k := NewKeyStands(limit, st)
	if got := k.Plan(10, 8, regions, bases); len(got) != 0 {
		t.Fatalf("before any window fed: %v, want nothing", got)
	}
	k.Demand = map[string]float64{"a": 60, "b": 0, "c": 0} // as fed from the windows that ended
	got := k.Plan(11, 8, regions, bases)
	var lowered []string
	for _, s := range got {
		if s.Slice != 0 || s.Region == "a" {
			t.Fatalf("first plan %v: want only b and c lowered to 0 (lower first)", got)
		}
		lowered = append(lowered, s.Region)
	}
	if len(lowered) != 2 {
		t.Fatalf("first plan %v: want b and c lowered", got)
	}
	for _, st := range got {
		k.Tell(st) // as the node does when it sends them
	}
	ackAll(t, k, 11)
	got = k.Plan(11, 8, regions, bases)
	if len(got) != 1 || got[0].Region != "a" || got[0].Slice != limit || got[0].From != 12 || got[0].Through != 19 {
		t.Fatalf("after the acks: %v, want a at 60 from 12 through 19", got)
	}
	if d, _ := k.Tell(got[0]); d != 60_000 {
		t.Fatalf("a's hint: demand %d thousandths, want 60000", d)
	}
	if h, ok := k.Said("a"); !ok || !h.Capped {
		t.Fatalf("a's hint said %v %v, want capped (its demand is the limit)", h, ok)
	}
	ackAll(t, k, 11)
	if got := k.Plan(12, 8, regions, bases); len(got) != 0 {
		t.Fatalf("steady, window 12: %v, want nothing", got)
	}
	if got := k.Plan(16, 8, regions, bases); len(got) == 0 {
		t.Fatal("window 16 (3 windows of reach left of 8): no renewal")
	}
}

// Feeding: the key's first window folds every region's demand (one that
// did not ask: what it held); after
// that only the regions that asked in the window count (a quiet region
// spent its standing slice, or was capped); a region's StandAck demand
// replaces the allocator's measure; a window fed twice, or a learning
// allocator's, changes nothing.
func TestFeedAndStandAckDemand(t *testing.T) {
	bases := map[string]int64{"a": 10, "b": 10}
	st, _ := NewStands(1, 40, bases, 1)
	k := NewKeyStands(40, st)
	a1, _ := NewAllocator(2, 5, 40, bases, map[string]int64{"b": 12}, false)
	a1.OnRequest(Request{Region: "a", Window: 5, Want: 20, Consumed: 10, Slice: 10})
	k.Feed(5, a1)
	if k.Demand["a"] != 30 || k.Demand["b"] != 10 {
		t.Fatalf("first window: %v, want a 30, b what it held, 10", k.Demand)
	}
	k.Feed(5, a1)
	if k.Demand["a"] != 30 {
		t.Fatalf("fed twice: %v", k.Demand)
	}
	a2, _ := NewAllocator(3, 6, 40, bases, nil, false)
	a2.OnRequest(Request{Region: "a", Window: 6, Want: 0, Consumed: 20, Slice: 20})
	k.Feed(6, a2)
	if k.Demand["a"] != 25 || k.Demand["b"] != 10 {
		t.Fatalf("second window: %v, want a (30+20)/2 = 25, b unchanged (it did not ask)", k.Demand)
	}
	learning, _ := NewAllocator(4, 7, 40, bases, nil, true)
	k.Feed(7, learning)
	if k.fed != 6 {
		t.Fatalf("a learning allocator was fed: %d", k.fed)
	}
	s, _ := k.St.Set("b", 8, 12, 5)
	k.OnStandAck(StandAck{Region: "b", Alloc: s.Alloc, Seq: s.Seq, Made: 7}, 3_500, 40_000)
	if k.Demand["b"] != 3.5 {
		t.Fatalf("b's StandAck said 3.5 a window: %v", k.Demand)
	}
}

// Hunger is the capped regions' want beyond their records, never the
// region the offer comes from, and nothing before any demand is known.
func TestHunger(t *testing.T) {
	bases := map[string]int64{"a": 10, "b": 10, "c": 10}
	st, _ := NewStands(1, 30, bases, 1)
	k := NewKeyStands(30, st)
	a, _ := NewAllocator(2, 5, 30, bases, nil, false)
	if h := k.Hunger(a, ""); h != nil {
		t.Fatalf("no demand yet: %v", h)
	}
	k.Demand = map[string]float64{"a": 20, "b": 11, "c": 2}
	h := k.Hunger(a, "c")
	if len(h) != 1 || h["a"] != 10 {
		t.Fatalf("hunger %v, want a 10 (b is a hit over its 10: not capped; c gives)", h)
	}
}
