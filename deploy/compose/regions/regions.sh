#!/bin/sh
# The three-region set of deploy/compose/regions (docs/regions.md, "Try
# three regions in containers"):
#
#   regions.sh up               start us, eu and ap and wait until they are healthy
#                               (make regions-up builds bin/sluice-static and the image, then runs this)
#   regions.sh members          what us-east's node sees
#   regions.sh wan on [RTT_MS]  delay the traffic between regions: RTT_MS round trip (default 100)
#   regions.sh wan off          remove the delay
#   regions.sh wan show         the nodes' qdiscs
#   regions.sh down             stop and remove the containers and networks
#
# The WAN delay is put into each container's network namespace from the
# host (the images are FROM scratch: no tc inside): on each node's
# interface on the "wan" network, the packets bound for the other regions'
# nodes go through tc netem, delayed half the round trip; nothing else is
# touched (your own calls through the published ports are not delayed).
# It needs root (nsenter into another network namespace: CAP_SYS_ADMIN and
# CAP_NET_ADMIN, so sudo), nsenter (util-linux), tc (iproute2) and a
# kernel with sch_htb, sch_netem and cls_u32. Kernels without sch_netem
# (e.g. some Firecracker VMs) cannot do it: `wan on` exits 3 saying so and
# changes nothing. (The e2e suite delays with an iptables NFQUEUE rule
# there instead, whose queue the test process serves: e2e/wan_test.go.)
#
# Settings, from the environment (the same for every command):
#   SLUICE_REGIONS_PROJECT  compose project name (default sluice-regions)
#   SLUICE_IMAGE            image (default sluice:dev, what make docker builds)
#   SLUICE_REGIONS_NET      first three octets of the /24 of the networks (default 172.28.47)
#   SLUICE_REGIONS_GRPC_US, _EU, _AP / SLUICE_REGIONS_HTTP_US, _EU, _AP  published ports
#   SLUICE_BIN              the sluice CLI on this host (default bin/sluice)
set -eu

DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$DIR/../../.." && pwd)
FILE="$DIR/docker-compose.yml"
PROJECT=${SLUICE_REGIONS_PROJECT:-sluice-regions}
SLUICE_BIN=${SLUICE_BIN:-$ROOT/bin/sluice}
GRPC_US=${SLUICE_REGIONS_GRPC_US:-7670}
GRPC_EU=${SLUICE_REGIONS_GRPC_EU:-7671}
GRPC_AP=${SLUICE_REGIONS_GRPC_AP:-7672}
HTTP_US=${SLUICE_REGIONS_HTTP_US:-7680}
HTTP_EU=${SLUICE_REGIONS_HTTP_EU:-7681}
HTTP_AP=${SLUICE_REGIONS_HTTP_AP:-7682}
# service:region, one node per region.
NODES="us:us-east eu:eu-west ap:ap-south"
SERVICES="us eu ap"

die() { echo "regions.sh: $*" >&2; exit 1; }

if command -v docker-compose >/dev/null 2>&1; then
	compose() { docker-compose -p "$PROJECT" -f "$FILE" "$@"; }
elif docker compose version >/dev/null 2>&1; then
	compose() { docker compose -p "$PROJECT" -f "$FILE" "$@"; }
else
	die "needs docker-compose (v1) or the docker compose plugin"
fi

# cid SERVICE: the service's container id, or nothing.
cid() { compose ps -q "$1" 2>/dev/null | head -n 1; }

region_of() {
	for n in $NODES; do
		[ "${n%%:*}" = "$1" ] && { echo "${n#*:}"; return; }
	done
}

up() {
	compose up -d
	echo "waiting for us, eu and ap to be healthy (joined, ring settled)..."
	i=0
	while :; do
		healthy=0
		for s in $SERVICES; do
			id=$(cid "$s")
			[ -n "$id" ] || die "no container for $s"
			st=$(docker inspect --format '{{.State.Status}} {{.State.Health.Status}}' "$id")
			case "$st" in
			"running healthy") healthy=$((healthy + 1)) ;;
			exited*|dead*)
				compose logs --no-color --tail 20 "$s" >&2 || true
				die "$s exited: its last log lines are above" ;;
			esac
		done
		[ "$healthy" -eq 3 ] && break
		i=$((i + 1))
		if [ "$i" -ge 240 ]; then
			compose logs --no-color --tail 20 >&2 || true
			die "not every node healthy after 120 s"
		fi
		sleep 0.5
	done
	members || true
	cat <<EOF

Three regions, one node each, plaintext (--insecure: a try-it set):
  us-east  gRPC 127.0.0.1:$GRPC_US  HTTP 127.0.0.1:$HTTP_US  (the home region)
  eu-west  gRPC 127.0.0.1:$GRPC_EU  HTTP 127.0.0.1:$HTTP_EU
  ap-south gRPC 127.0.0.1:$GRPC_AP  HTTP 127.0.0.1:$HTTP_AP
Named limits (deploy/compose/regions/limits.yaml): hourly (global), hourly-regional, hourly-exact, 30 per hour each.
  $SLUICE_BIN check --addr 127.0.0.1:$GRPC_EU --name hourly --key user:1 --named --count 5
The WAN delay between regions (root): sudo $0 wan on 100
Stop: $0 down
EOF
}

members() {
	if [ -x "$SLUICE_BIN" ]; then
		"$SLUICE_BIN" members --addr "127.0.0.1:$GRPC_US"
	else
		curl -sf "http://127.0.0.1:$HTTP_US/v1/members" && echo
	fi
}

# wanIP ID: the container's address on the project's "wan" network.
wanIP() {
	docker inspect --format '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.IPAddress}}{{"\n"}}{{end}}' "$1" |
		awk '$1 ~ /_wan$/ { print $2 }'
}

# devOf PID IP: the interface holding IP in PID's network namespace.
devOf() {
	nsenter -t "$1" -n ip -o -4 addr show | awk -v ip="$2" '{ split($4, a, "/"); if (a[1] == ip) { split($2, d, "@"); print d[1] } }'
}

wan_tools() {
	[ "$(id -u)" -eq 0 ] || die "wan: needs root to enter the containers' network namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN): sudo $0 wan $*"
	command -v nsenter >/dev/null 2>&1 || die "wan: needs nsenter (apt-get install util-linux)"
	command -v tc >/dev/null 2>&1 || die "wan: needs tc (apt-get install iproute2)"
	command -v ip >/dev/null 2>&1 || die "wan: needs ip (apt-get install iproute2)"
}

# wan_nodes: one line per node, "service region pid ip dev".
wan_nodes() {
	for s in $SERVICES; do
		id=$(cid "$s")
		[ -n "$id" ] || die "wan: no container for $s (regions.sh up first)"
		pid=$(docker inspect --format '{{.State.Pid}}' "$id")
		[ "$pid" -gt 0 ] 2>/dev/null || die "wan: $s is not running"
		ip=$(wanIP "$id")
		[ -n "$ip" ] || die "wan: $s has no address on a *_wan network"
		dev=$(devOf "$pid" "$ip")
		[ -n "$dev" ] || die "wan: no interface of $s holds $ip"
		echo "$s $(region_of "$s") $pid $ip $dev"
	done
}

wan_off() {
	wan_nodes | while read -r s r pid ip dev; do
		nsenter -t "$pid" -n tc qdisc del dev "$dev" root 2>/dev/null || true
		echo "$s ($r): no delay on $dev"
	done
}

wan_on() {
	rtt=${1:-100}
	case "$rtt" in '' | *[!0-9]*) die "wan on: RTT_MS must be a whole number of milliseconds, got '$rtt'" ;; esac
	oneway="$((rtt * 500))us"
	nodes=$(wan_nodes)
	# Probe netem once (on the first node's loopback) before changing anything.
	pid0=$(echo "$nodes" | awk 'NR == 1 { print $3 }')
	if ! out=$(nsenter -t "$pid0" -n tc qdisc add dev lo root netem delay 1ms 2>&1); then
		echo "regions.sh: wan: this kernel has no netem qdisc (sch_netem): $out" >&2
		echo "  load it (modprobe sch_netem) or use a kernel built with CONFIG_NET_SCH_NETEM; nothing was changed." >&2
		echo "  (The e2e suite's region tests delay with iptables NFQUEUE instead: e2e/wan_test.go.)" >&2
		exit 3
	fi
	nsenter -t "$pid0" -n tc qdisc del dev lo root
	echo "$nodes" | while read -r s r pid ip dev; do
		t() { nsenter -t "$pid" -n tc "$@" || die "wan: $s: tc $* failed (the kernel needs sch_htb, sch_netem and cls_u32)"; }
		nsenter -t "$pid" -n tc qdisc del dev "$dev" root 2>/dev/null || true
		# An htb root whose default class is undelayed; class 1:2, with a
		# netem leaf, takes the packets bound for the other regions.
		t qdisc add dev "$dev" root handle 1: htb default 1
		t class add dev "$dev" parent 1: classid 1:1 htb rate 10gbit quantum 60000
		t class add dev "$dev" parent 1: classid 1:2 htb rate 10gbit quantum 60000
		t qdisc add dev "$dev" parent 1:2 handle 2: netem delay "$oneway" limit 100000
		echo "$nodes" | while read -r s2 r2 pid2 ip2 dev2; do
			[ "$r2" = "$r" ] && continue
			t filter add dev "$dev" parent 1: protocol ip prio 1 u32 match ip dst "$ip2/32" flowid 1:2
		done
		others=$(echo "$nodes" | awk -v r="$r" '$2 != r { printf "%s%s (%s)", sep, $1, $4; sep = ", " }')
		echo "$s ($r, $ip on $dev): packets to $others delayed $oneway"
	done
	echo "WAN on: a round trip of ${rtt} ms between any two regions, none within a region or from this host."
}

wan_show() {
	wan_nodes | while read -r s r pid ip dev; do
		echo "== $s ($r, $ip on $dev)"
		nsenter -t "$pid" -n tc qdisc show dev "$dev"
		nsenter -t "$pid" -n tc filter show dev "$dev" 2>/dev/null | grep -E 'match|flowid' || true
	done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up) up ;;
down) compose down -v --remove-orphans --timeout 20 ;;
members) members ;;
wan)
	sub=${1:-}
	[ $# -gt 0 ] && shift
	wan_tools "$sub" "$@"
	case "$sub" in
	on) wan_on "$@" ;;
	off) wan_off ;;
	show) wan_show ;;
	*) die "usage: $0 wan on [RTT_MS] | wan off | wan show" ;;
	esac ;;
*) die "usage: $0 up | down | members | wan on [RTT_MS] | wan off | wan show" ;;
esac
