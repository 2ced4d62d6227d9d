package rpc

import (
	"testing"

	"github.com/sluicehq/sluice/cluster"
)

// A member of the ring that is another process than before (restarted
// before the cluster declared the old one dead: the ring did not change)
// makes the owner copy every key again (issue 35: with two nodes per
// region killed in turn, the copies a restarted replica held were lost
// and the next owner's death lost the keys' counts). Not this node, not a
// member that joined or left, not a member whose instance is not known.
func TestRestartedMember(t *testing.T) {
	m := func(name, inst string) cluster.Member { return cluster.Member{Name: name, Instance: inst} }
	for _, c := range []struct {
		name        string
		before, now []cluster.Member
		want        bool
	}{
		{"same processes", []cluster.Member{m("a", "1"), m("b", "2")}, []cluster.Member{m("a", "1"), m("b", "2")}, false},
		{"b restarted", []cluster.Member{m("a", "1"), m("b", "2")}, []cluster.Member{m("a", "1"), m("b", "3")}, true},
		{"self restarted (not a peer)", []cluster.Member{m("a", "1"), m("b", "2")}, []cluster.Member{m("a", "9"), m("b", "2")}, false},
		{"c joined", []cluster.Member{m("a", "1")}, []cluster.Member{m("a", "1"), m("c", "4")}, false},
		{"instance unknown before", []cluster.Member{m("a", "1"), m("b", "")}, []cluster.Member{m("a", "1"), m("b", "3")}, false},
	} {
		if got := restartedMember(c.before, c.now, "a"); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
