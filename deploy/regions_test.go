package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/region"
)

// exampleRegions are the regions of the example set
// deploy/helm/examples: regions.yaml (shared) and region-<name>.yaml.
var exampleRegions = []string{"ra", "rb", "rc"}

// regionArgs are helm's arguments for the example release of region r.
func regionArgs(r string) []string {
	return append(slices.Clone(imageArgs), "-f", "helm/examples/regions.yaml", "-f", "helm/examples/region-"+r+".yaml")
}

// regionNode is one node of a region's render, as the other regions see it.
type regionNode struct {
	region, name string
	advertise    string // the IP it advertises
}

// regionRender is what one region's release says about the cluster.
type regionRender struct {
	region, regions, label, profile string
	caSecret, gossipSecret          string
	nodes                           []regionNode
	seeds                           []string // regions.seeds: after the release's own pods
	peers                           networkingv1.NetworkPolicySpec
	gossipPort, grpcPort            int32
	sourceRanges                    map[string][]string // per-pod Service -> loadBalancerSourceRanges
}

// TestChartRegions renders the example's three releases, one per region
// (each its own Kubernetes cluster), and checks that they make one
// cluster: helm lint passes for each; each is the secured node; they agree
// on the region list (one sluice accepts), the cluster label, the CA and
// the gossip key; each is a region of the list and every region of the
// list is one of them; member names differ between regions; every pod
// advertises its own load balancer's IP, whose Service reaches it on
// gossip (TCP and UDP) and the peer port, not-ready included; each
// region's seeds are nodes of the other regions (every other region
// named) at their advertised gossip addresses; each NetworkPolicy, and
// each load balancer's source ranges when set, let the other regions'
// nodes in (and the NetworkPolicy out) on those ports.
func TestChartRegions(t *testing.T) {
	helm := helmBinary(t)
	var renders []regionRender
	for _, r := range exampleRegions {
		lint := exec.Command(helm, append([]string{"lint", "--strict", chartDir, "--namespace", "sluice"}, regionArgs(r)...)...)
		if out, err := lint.CombinedOutput(); err != nil {
			t.Fatalf("helm lint of region %s: %v\n%s", r, err, out)
		}
		renders = append(renders, renderRegion(t, r))
	}

	first := renders[0]
	list, err := region.Parse(first.regions)
	if err != nil {
		t.Fatalf("SLUICE_REGIONS %q: sluice refuses it: %v", first.regions, err)
	}
	var names []string
	members := map[string]string{} // member name -> region
	nodesOf := map[string][]regionNode{}
	for _, rr := range renders {
		for what, pair := range map[string][2]string{
			"SLUICE_REGIONS":       {rr.regions, first.regions},
			"SLUICE_CLUSTER_LABEL": {rr.label, first.label},
			"SLUICE_PROFILE":       {rr.profile, first.profile},
			"the CA Secret":        {rr.caSecret, first.caSecret},
			"the gossip key":       {rr.gossipSecret, first.gossipSecret},
		} {
			if pair[0] != pair[1] {
				t.Errorf("region %s: %s %q, region %s's %q: every region must have the same", rr.region, what, pair[0], first.region, pair[1])
			}
		}
		if !list.Has(rr.region) || slices.Contains(names, rr.region) {
			t.Errorf("SLUICE_REGION %q: not in %q, or twice", rr.region, first.regions)
		}
		names = append(names, rr.region)
		for _, n := range rr.nodes {
			if other, ok := members[n.name]; ok {
				t.Errorf("member name %s in regions %s and %s: names must be unique in the cluster", n.name, other, rr.region)
			}
			members[n.name] = rr.region
		}
		nodesOf[rr.region] = rr.nodes
	}
	for _, reg := range list.Regions() {
		if !slices.Contains(names, reg.Name) {
			t.Errorf("region %s of the list has no release", reg.Name)
		}
	}

	for _, rr := range renders {
		gossipAt := map[string]regionNode{}
		for _, other := range renders {
			if other.region == rr.region {
				continue
			}
			for _, n := range other.nodes {
				gossipAt[net.JoinHostPort(n.advertise, fmt.Sprint(other.gossipPort))] = n
			}
		}
		seen := map[string]bool{}
		for _, s := range rr.seeds {
			n, ok := gossipAt[s]
			if !ok {
				t.Errorf("region %s: seed %s is no other region's node at its advertised gossip address (%v)", rr.region, s, keys(gossipAt))
				continue
			}
			seen[n.region] = true
		}
		for _, other := range renders {
			if other.region != rr.region && !seen[other.region] {
				t.Errorf("region %s names no node of region %s in its seeds %v", rr.region, other.region, rr.seeds)
			}
		}
		// The load balancers' source ranges, when set: the other regions'
		// nodes get through.
		for svc, ranges := range rr.sourceRanges {
			if len(ranges) == 0 {
				continue
			}
			for addr, n := range gossipAt {
				ip := net.ParseIP(n.advertise)
				if !slices.ContainsFunc(ranges, func(c string) bool {
					_, cidr, err := net.ParseCIDR(c)
					return err == nil && cidr.Contains(ip)
				}) {
					t.Errorf("region %s: Service %s's loadBalancerSourceRanges %v shut out %s (%s)", rr.region, svc, ranges, n.name, addr)
				}
			}
		}
		// The NetworkPolicy: the other regions' nodes in and out on gossip
		// and the peer port.
		for addr, n := range gossipAt {
			ip := net.ParseIP(n.advertise)
			for _, port := range []struct {
				n     int32
				proto corev1.Protocol
			}{{rr.gossipPort, corev1.ProtocolTCP}, {rr.gossipPort, corev1.ProtocolUDP}, {rr.grpcPort, corev1.ProtocolTCP}} {
				in := slices.ContainsFunc(rr.peers.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
					return peersHold(r.From, ip) && portsHold(r.Ports, port.n, port.proto)
				})
				out := slices.ContainsFunc(rr.peers.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool {
					return peersHold(r.To, ip) && portsHold(r.Ports, port.n, port.proto)
				})
				if !in || !out {
					t.Errorf("region %s's NetworkPolicy: %s (%s) in %v, out %v on %d/%s", rr.region, n.name, addr, in, out, port.n, port.proto)
				}
			}
		}
	}
}

// renderRegion renders region r's example release and reads what the
// other regions rely on.
func renderRegion(t *testing.T, r string) regionRender {
	t.Helper()
	m := mustRender(t, regionArgs(r)...)
	var file struct {
		Regions struct {
			Seeds []string `json:"seeds"`
		} `json:"regions"`
	}
	b, err := os.ReadFile("helm/examples/region-" + r + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	statefulSet := "sluice-" + r
	p := checkSecured(t, m, want{statefulSet: statefulSet, clientAuth: "mtls", tlsMode: "issue", goMemLimit: "921MiB", replicas: 3, seeds: 3,
		remoteSeeds: file.Regions.Seeds, advertise: "loadBalancer", regionPeers: true})
	rr := regionRender{
		region: p.value(t, "SLUICE_REGION"), regions: p.value(t, "SLUICE_REGIONS"), label: p.value(t, "SLUICE_CLUSTER_LABEL"),
		caSecret:     p.secretFile(t, p.c, p.value(t, "SLUICE_TLS_CA"), "ca.pem"),
		gossipSecret: p.secretFile(t, p.c, p.value(t, "SLUICE_GOSSIP_KEY_FILE"), "gossip.keys"),
		seeds:        strings.Split(p.value(t, "SLUICE_JOIN"), ",")[3:],
		peers:        m.networkPolicies["sluice"].Spec,
		sourceRanges: map[string][]string{},
	}
	if rr.region != r {
		t.Errorf("region %s's release: SLUICE_REGION %q", r, rr.region)
	}
	if e, ok := p.env("SLUICE_PROFILE"); ok {
		rr.profile = e.Value
	}
	ports := map[string]int32{}
	for _, cp := range p.c.Ports {
		ports[cp.Name] = cp.ContainerPort
	}
	rr.gossipPort, rr.grpcPort = ports["gossip-tcp"], ports["grpc"]

	// Each pod: its file names its Service's load balancer IP, and that
	// Service reaches the pod on gossip and the peer port.
	for i := range int(*p.ss.Spec.Replicas) {
		pod := fmt.Sprintf("%s-%d", statefulSet, i)
		var cfg map[string]string
		data := p.configFile(t, p.c, strings.ReplaceAll(p.value(t, "SLUICE_CONFIG"), "$(SLUICE_NAME)", pod))
		if err := yaml.UnmarshalStrict([]byte(data), &cfg); err != nil || len(cfg) != 1 || net.ParseIP(cfg["advertise-addr"]) == nil {
			t.Fatalf("pod %s's file %q (%v): want advertise-addr: IP alone", pod, data, err)
		}
		addr := cfg["advertise-addr"]
		svc := m.services[pod]
		if svc == nil {
			t.Fatalf("no Service %s for the pod", pod)
		}
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerIP != addr { //nolint:staticcheck // the field the chart sets
			t.Errorf("Service %s: type %s at %q, want LoadBalancer at %s", pod, svc.Spec.Type, svc.Spec.LoadBalancerIP, addr) //nolint:staticcheck
		}
		if !svc.Spec.PublishNotReadyAddresses || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
			t.Errorf("Service %s: publishNotReadyAddresses %v (a joining node must be reached), externalTrafficPolicy %q (want Local: the pod sees the caller's address)",
				pod, svc.Spec.PublishNotReadyAddresses, svc.Spec.ExternalTrafficPolicy)
		}
		for k, v := range svc.Spec.Selector {
			if want := p.ss.Spec.Template.Labels[k]; k != "statefulset.kubernetes.io/pod-name" && want != v {
				t.Errorf("Service %s selects %s=%s, not the pods", pod, k, v)
			}
		}
		if svc.Spec.Selector["statefulset.kubernetes.io/pod-name"] != pod {
			t.Errorf("Service %s selects %v, not its pod alone", pod, svc.Spec.Selector)
		}
		for _, want := range []struct {
			target string
			proto  corev1.Protocol
		}{{"gossip-tcp", corev1.ProtocolTCP}, {"gossip-udp", corev1.ProtocolUDP}, {"grpc", corev1.ProtocolTCP}} {
			if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
				return sp.TargetPort.String() == want.target && sp.Protocol == want.proto && sp.Port == ports[want.target]
			}) {
				t.Errorf("Service %s has no port %d/%s to the pod's %s (sluice advertises the port it listens on)", pod, ports[want.target], want.proto, want.target)
			}
		}
		rr.sourceRanges[pod] = svc.Spec.LoadBalancerSourceRanges
		rr.nodes = append(rr.nodes, regionNode{region: r, name: pod, advertise: addr})
	}
	return rr
}

// peersHold reports whether one of peers is an ipBlock holding ip.
func peersHold(peers []networkingv1.NetworkPolicyPeer, ip net.IP) bool {
	return slices.ContainsFunc(peers, func(p networkingv1.NetworkPolicyPeer) bool {
		if p.IPBlock == nil {
			return false
		}
		_, cidr, err := net.ParseCIDR(p.IPBlock.CIDR)
		return err == nil && cidr.Contains(ip) && !slices.ContainsFunc(p.IPBlock.Except, func(e string) bool {
			_, ex, err := net.ParseCIDR(e)
			return err == nil && ex.Contains(ip)
		})
	})
}

// portsHold reports whether ports open port n of proto.
func portsHold(ports []networkingv1.NetworkPolicyPort, n int32, proto corev1.Protocol) bool {
	return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.IntValue() == int(n) && p.Protocol != nil && *p.Protocol == proto
	})
}
