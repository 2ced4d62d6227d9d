//go:build e2e

package e2e

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The WAN between the regions of a region cluster: every packet a node
// sends to a node of another region is delayed by half the round-trip time
// (so a round trip between two regions takes rtt), and a cut drops every
// packet between one region and the others, both ways. Nothing else is
// touched: packets between two nodes of one region, and the test's own
// traffic (from the host, through the published ports: the nodes answer
// the bridge's gateway address), go undelayed.
//
// It is applied from the host into each container's network namespace
// with nsenter (the images are FROM scratch: no tc, no iptables inside),
// which needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and util-linux. Two
// ways, picked by SLUICE_E2E_WAN (netem, nfqueue, or empty: netem when the
// kernel has it, else nfqueue):
//
//   - netem (iproute2's tc; the kernel's sch_netem and sch_htb): a root
//     htb qdisc whose default class is undelayed, and one class per other
//     region with a netem leaf (delay rtt/2), u32 filters sending the
//     packets bound for that region's addresses to it. A cut changes the
//     netem leaves concerned to loss 100%.
//   - nfqueue (iptables with the NFQUEUE target; the kernel's
//     nfnetlink_queue): an iptables rule in the container's OUTPUT chain
//     sends the packets bound for the other regions' addresses to a
//     netfilter queue that this test process serves (nfqueue_test.go):
//     each packet is held rtt/2, then accepted, or dropped when a cut
//     separates the two regions. For kernels without sch_netem (such as
//     the Firecracker VMs the suite is developed on).
//
// When neither can be built, the test fails naming what to install or
// what the kernel lacks: a region test never passes without its WAN.
type wan struct {
	t      *testing.T
	kind   string // "netem" or "nfqueue"
	rtt    time.Duration
	oneWay time.Duration
	nodes  []*wanNode
	region map[netip.Addr]string // every node's address, to its region

	mu  sync.Mutex
	cut map[string]bool // regions cut off now
}

// wanNode is one container on the WAN.
type wanNode struct {
	name, region string
	ip           netip.Addr
	pid          int
	dev          string              // its interface on the compose network (netem)
	class        map[string]int      // other region -> htb class minor (netem)
	queue        *nfqueue            // (nfqueue)
	peers        map[string][]string // other region -> its addresses
}

// wanKind returns SLUICE_E2E_WAN, checked.
func wanKind(t *testing.T) string {
	t.Helper()
	k := os.Getenv("SLUICE_E2E_WAN")
	switch k {
	case "", "netem", "nfqueue":
		return k
	}
	t.Fatalf("SLUICE_E2E_WAN=%q: want netem, nfqueue or empty (netem when the kernel has it, else nfqueue)", k)
	return ""
}

// requireWANTools fails the test when the host cannot reach into the
// containers' network namespaces.
func requireWANTools(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatalf("the region tests build their WAN with nsenter, which is missing: install util-linux (apt-get install util-linux): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the region tests build their WAN inside the containers' network namespaces (nsenter, tc or iptables): they need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); running as uid %d", os.Geteuid())
	}
}

// nsenter runs a command in the network namespace of process pid.
func nsenter(pid int, args ...string) ([]byte, error) {
	return run(30*time.Second, nil, "nsenter", append([]string{"-t", strconv.Itoa(pid), "-n"}, args...)...)
}

// newWAN builds the WAN between the running containers names (each in
// regions[name]) of c, with round-trip time rtt between any two regions.
// Cleanup stops it (before the containers are removed).
func newWAN(t *testing.T, c *cluster, regions map[string]string, rtt time.Duration, names ...string) *wan {
	t.Helper()
	requireWANTools(t)
	w := &wan{t: t, rtt: rtt, oneWay: rtt / 2, region: map[netip.Addr]string{}, cut: map[string]bool{}}
	for _, name := range names {
		ip, err := netip.ParseAddr(c.nodes[name].ip)
		if err != nil {
			t.Fatal(err)
		}
		out, err := run(30*time.Second, nil, "docker", "inspect", "--format", "{{.State.Pid}}", c.id(name))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil || perr != nil || pid <= 0 {
			t.Fatalf("the process of %s: %q %v %v", name, out, err, perr)
		}
		w.nodes = append(w.nodes, &wanNode{name: name, region: regions[name], ip: ip, pid: pid})
		w.region[ip] = regions[name]
	}
	for _, n := range w.nodes {
		n.peers = map[string][]string{}
		for _, o := range w.nodes {
			if o.region != n.region {
				n.peers[o.region] = append(n.peers[o.region], o.ip.String()+"/32")
			}
		}
	}
	w.kind = wanKind(t)
	if w.kind == "" {
		w.kind = "nfqueue"
		out, err := w.probeNetem(w.nodes[0].pid)
		if err == nil {
			w.kind = "netem"
		} else {
			t.Logf("wan: no netem here (%v: %s); using nfqueue", err, strings.TrimSpace(string(out)))
		}
	}
	var err error
	if w.kind == "netem" {
		err = w.buildNetem()
	} else {
		err = w.buildNfqueue()
	}
	t.Cleanup(w.close)
	if err != nil {
		t.Fatalf("wan (%s): %v", w.kind, err)
	}
	t.Logf("wan (%s): %d nodes, %s between regions (%s each way), undelayed within a region and from the host", w.kind, len(w.nodes), rtt, w.oneWay)
	return w
}

// probeNetem reports whether tc can add a netem qdisc in pid's network
// namespace (on its loopback, removed at once).
func (w *wan) probeNetem(pid int) ([]byte, error) {
	if _, err := exec.LookPath("tc"); err != nil {
		return nil, fmt.Errorf("tc is missing (apt-get install iproute2)")
	}
	out, err := nsenter(pid, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
	if err == nil {
		_, err = nsenter(pid, "tc", "qdisc", "del", "dev", "lo", "root")
	}
	return out, err
}

// netemSpec is the netem leaf's settings: the one-way delay, and loss
// 100% when cut.
func (w *wan) netemSpec(cut bool) []string {
	s := []string{"netem", "delay", w.oneWay.String(), "limit", "100000"}
	if cut {
		s = append(s, "loss", "100%")
	}
	return s
}

// buildNetem sets up every node's qdiscs and filters (see wan).
func (w *wan) buildNetem() error {
	if _, err := exec.LookPath("tc"); err != nil {
		return fmt.Errorf("tc is missing: install iproute2 (apt-get install iproute2): %w", err)
	}
	for _, n := range w.nodes {
		dev, err := devOf(n)
		if err != nil {
			return err
		}
		n.dev, n.class = dev, map[string]int{}
		cmds := [][]string{
			{"qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"},
			{"class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit", "quantum", "60000"},
		}
		for i, r := range slices.Sorted(maps.Keys(n.peers)) {
			minor := 10 + i
			n.class[r] = minor
			cid := fmt.Sprintf("1:%d", minor)
			cmds = append(cmds,
				[]string{"class", "add", "dev", dev, "parent", "1:", "classid", cid, "htb", "rate", "10gbit", "quantum", "60000"},
				append([]string{"qdisc", "add", "dev", dev, "parent", cid, "handle", fmt.Sprintf("%d:", minor)}, w.netemSpec(false)...))
			for _, dst := range n.peers[r] {
				cmds = append(cmds, []string{"filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
					"u32", "match", "ip", "dst", dst, "flowid", cid})
			}
		}
		for _, cmd := range cmds {
			if out, err := nsenter(n.pid, append([]string{"tc"}, cmd...)...); err != nil {
				return fmt.Errorf("%s: tc %s: %w: %s (the kernel needs sch_htb, sch_netem and cls_u32; SLUICE_E2E_WAN=nfqueue uses iptables instead)",
					n.name, strings.Join(cmd, " "), err, out)
			}
		}
	}
	return nil
}

// devOf returns the interface of n's address in its network namespace.
func devOf(n *wanNode) (string, error) {
	out, err := nsenter(n.pid, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		return "", fmt.Errorf("%s: ip addr (apt-get install iproute2): %w", n.name, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[2] == "inet" && strings.HasPrefix(f[3], n.ip.String()+"/") {
			dev, _, _ := strings.Cut(f[1], "@")
			return dev, nil
		}
	}
	return "", fmt.Errorf("%s: no interface has %s: %s", n.name, n.ip, out)
}

// buildNfqueue binds a netfilter queue per node, then sends the node's
// packets bound for the other regions to it.
func (w *wan) buildNfqueue() error {
	ipt, err := exec.LookPath("iptables")
	if err != nil {
		return fmt.Errorf("iptables is missing: install iptables (apt-get install iptables), or give the kernel sch_netem and use tc: %w", err)
	}
	for i, n := range w.nodes {
		num := uint16(1000 + i)
		src := n.region
		q, err := openNfqueue(n.pid, num, w.oneWay, func(dst netip.Addr) bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.cut[src] || w.cut[w.region[dst]]
		})
		if err != nil {
			return fmt.Errorf("%s: %w (the kernel needs nfnetlink_queue)", n.name, err)
		}
		n.queue = q
		var dsts []string
		for _, r := range slices.Sorted(maps.Keys(n.peers)) {
			dsts = append(dsts, n.peers[r]...)
		}
		cmd := []string{ipt, "-w", "-A", "OUTPUT", "-d", strings.Join(dsts, ","), "-j", "NFQUEUE", "--queue-num", strconv.Itoa(int(num))}
		if out, err := nsenter(n.pid, cmd...); err != nil {
			return fmt.Errorf("%s: %s: %w: %s (the kernel needs the NFQUEUE target, xt_NFQUEUE)", n.name, strings.Join(cmd, " "), err, out)
		}
	}
	return nil
}

// Cut cuts region off from the others (both ways): the scenario runner's
// Cutter, through regionTarget.
func (w *wan) Cut(region string) error { return w.setCut(region, true) }

// Heal undoes Cut.
func (w *wan) Heal(region string) error { return w.setCut(region, false) }

func (w *wan) setCut(region string, on bool) error {
	w.mu.Lock()
	w.cut[region] = on
	w.mu.Unlock()
	if w.kind != "netem" {
		return nil // the queues ask w.cut for every packet
	}
	for _, n := range w.nodes {
		for r, minor := range n.class {
			if n.region != region && r != region {
				continue
			}
			w.mu.Lock()
			cut := w.cut[n.region] || w.cut[r]
			w.mu.Unlock()
			cmd := append([]string{"tc", "qdisc", "change", "dev", n.dev, "parent", fmt.Sprintf("1:%d", minor), "handle", fmt.Sprintf("%d:", minor)}, w.netemSpec(cut)...)
			if out, err := nsenter(n.pid, cmd...); err != nil {
				return fmt.Errorf("%s: %s: %w: %s", n.name, strings.Join(cmd, " "), err, out)
			}
		}
	}
	return nil
}

// dropped returns how many packets the WAN has dropped so far (cuts).
func (w *wan) dropped() int64 {
	var sum int64
	for _, n := range w.nodes {
		if n.queue != nil {
			sum += n.queue.dropped.Load()
			continue
		}
		if n.dev == "" {
			continue
		}
		out, err := nsenter(n.pid, "tc", "-s", "qdisc", "show", "dev", n.dev)
		if err != nil {
			continue
		}
		// "qdisc netem 10: parent 1:10 ...\n Sent 123 bytes 4 pkt (dropped 5, overlimits ...)"
		netem := false
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "qdisc ") {
				netem = strings.HasPrefix(line, "qdisc netem ")
				continue
			}
			if i := strings.Index(line, "(dropped "); netem && i >= 0 {
				f := strings.TrimRight(strings.Fields(line[i+len("(dropped "):])[0], ",")
				if v, err := strconv.ParseInt(f, 10, 64); err == nil {
					sum += v
				}
			}
		}
	}
	return sum
}

// close logs what the queues did and stops them.
func (w *wan) close() {
	for _, n := range w.nodes {
		if n.queue != nil {
			w.t.Logf("wan: %s: %s", n.name, n.queue.stats())
			n.queue.close()
		}
	}
}
