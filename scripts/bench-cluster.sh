#!/usr/bin/env bash
# make bench-cluster: start three nodes on loopback, run the four `sluice
# bench` workloads against them (the load shape of the gRPC echo ceiling:
# 64 closed-loop goroutines, one connection per node, round-robin, 2 s
# warm-up, 10 s measured), and write the results table into BENCHMARKS.md
# between the bench-cluster markers. Server CPU per check comes from
# /proc/PID/stat (utime + stime) around each workload.
#
#   scripts/bench-cluster.sh [bin/sluice]
#   DUR=3s WARMUP=1s scripts/bench-cluster.sh     # a quick run
#
# Ports: gRPC 127.0.0.1:7270-7272, gossip 127.0.0.1:7370-7372. Every node it
# starts is stopped by PID on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-bin/sluice}
DUR=${DUR:-10s}
WARMUP=${WARMUP:-2s}
CONC=${CONC:-64}
OUT=${OUT:-BENCHMARKS.md}
with_workdir

addrs=127.0.0.1:7270,127.0.0.1:7271,127.0.0.1:7272
for i in 0 1 2; do
  join=""
  [ "$i" -gt 0 ] && join=127.0.0.1:7370
  "$bin" serve --name "bench$((i + 1))" --grpc-addr "127.0.0.1:$((7270 + i))" --gossip-addr "127.0.0.1:$((7370 + i))" --http-addr "" \
    --join "$join" --log-level warn --leave-timeout 1s 2>>"$work/nodes.log" &
  pids+=($!)
done
wait_rings "$bin" 127.0.0.1:7270 127.0.0.1:7271 127.0.0.1:7272 || { cat "$work/nodes.log"; echo "bench-cluster: the rings never agreed" >&2; exit 1; }

cpu_ticks() { # utime + stime of the node processes, in clock ticks
  local t=0 p
  for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
hz=$(getconf CLK_TCK)

rows=""
# Each workload through any node (round robin, as Envoy calls: --route any),
# then spread, batched and exact straight to the owners (--route owner, as
# the Go client and sluice proxy send: docs/routing.md).
for run in spread:any hot:any batched:any exact:any spread:owner batched:owner exact:owner; do
  w=${run%%:*} route=${run##*:}
  before=$(cpu_ticks)
  "$bin" bench --addrs "$addrs" --workload "$w" --route "$route" --concurrency "$CONC" --duration "$DUR" --warmup "$WARMUP" --json >"$work/$w-$route.json"
  after=$(cpu_ticks)
  echo "$w --route $route: $(cat "$work/$w-$route.json")"
  rows+=$(python3 - "$work/$w-$route.json" "$before" "$after" "$hz" "${WARMUP%s}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
before, after, hz = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
warmup_s = float(sys.argv[5])
cpu_s = (after - before) / hz  # over warm-up and window (exact: the whole run)
checks = s["checks_per_sec"] * s["window_s"]
if s["workload"] != "exact":  # the warm-up ran at about the window's rate
    checks *= 1 + warmup_s / s["window_s"]
extra = ""
if s["workload"] == "exact":
    per = s.get("allowed_per_key", {})
    extra = "allowed per key: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items()))
print(f"| {s['workload']} | {s['route']} | {100 * s['owned']:.0f} % | {s['checks_per_rpc']} | {s['checks_per_sec']:,.0f} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | "
      f"{s['p99_ms']:.2f} | {s['max_ms']:.2f} | {s['allowed']:,} | {s['denied']:,} | {s['errors']:,} | {cpu_s:.2f} | {1e6 * cpu_s / checks:.1f} | {extra} |")
PY
)$'\n'
done

table="<!-- bench-cluster:start -->
Written by \`make bench-cluster\` on $(date -u +%Y-%m-%dT%H:%M:%SZ): $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),
$(go version | cut -d' ' -f3). Three nodes on 127.0.0.1, started by the script; each workload ran
\`$bin bench --addrs $addrs --workload W --route R --concurrency $CONC --duration $DUR --warmup $WARMUP --json\`.
Server CPU is utime + stime of the three node processes over the warm-up and the window
(for exact: the whole run); per check, over the checks of both (the warm-up counted at the
window's rate). The column decided by the node called is the share of checks that took no
forwarding hop.

| workload | route | decided by the node called | checks/RPC | checks/s | p50 ms | p90 ms | p99 ms | max ms | allowed | denied | errors | server CPU s | server CPU µs/check | notes |
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
${rows%$'\n'}
<!-- bench-cluster:end -->"

python3 - "$OUT" "$table" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
try:
    text = open(path).read()
except FileNotFoundError:
    text = "# Benchmarks\n"
if "<!-- bench-cluster:start -->" in text:
    text = re.sub(r"<!-- bench-cluster:start -->.*?<!-- bench-cluster:end -->", lambda m: table, text, flags=re.S)
else:
    text = text.rstrip("\n") + "\n\n## The cluster: `make bench-cluster`\n\n" + table + "\n"
open(path, "w").write(text)
PY
echo "bench-cluster: results written to $OUT"
