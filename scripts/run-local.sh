#!/usr/bin/env bash
# Starts a local three-node sluice cluster on loopback and stops all three
# on Ctrl-C (or when any of them exits).
#   node1: gRPC 127.0.0.1:7070, gossip 127.0.0.1:7946, HTTP 127.0.0.1:7080
#   node2: gRPC 127.0.0.1:7071, gossip 127.0.0.1:7947, HTTP 127.0.0.1:7081
#   node3: gRPC 127.0.0.1:7072, gossip 127.0.0.1:7948, HTTP 127.0.0.1:7082
# with the named limits of examples/limits.yaml (SLUICE_RUN_LIMITS to change).
# Each also serves Envoy's rate limit service with the rules in
# examples/rls (SLUICE_RUN_RLS_CONFIG=PATH for others).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-bin/sluice}
base_grpc=${SLUICE_RUN_GRPC_PORT:-7070}
base_gossip=${SLUICE_RUN_GOSSIP_PORT:-7946}
base_http=${SLUICE_RUN_HTTP_PORT:-7080}
limits=${SLUICE_RUN_LIMITS:-examples/limits.yaml}
rls_config=${SLUICE_RUN_RLS_CONFIG:-$(dirname "$0")/../examples/rls}
pids=()

stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping the cluster..."
  stop_pids "${pids[@]}"
  echo "stopped."
}
trap stop INT TERM EXIT

seeds=""
for i in 1 2 3; do
  grpc=127.0.0.1:$((base_grpc + i - 1))
  gossip=127.0.0.1:$((base_gossip + i - 1))
  "$bin" serve --name "node$i" --grpc-addr "$grpc" --gossip-addr "$gossip" \
    --http-addr "127.0.0.1:$((base_http + i - 1))" --limits "$limits" --rls-config "$rls_config" \
    --join "$seeds" --log-level "${SLUICE_LOG_LEVEL:-warn}" --leave-timeout 1s &
  pids+=($!)
  seeds="127.0.0.1:$base_gossip"
done

# Wait until all three nodes see three members and agree on the ring, so
# the first checks already go to the final owners.
wait_rings "$bin" "127.0.0.1:$base_grpc" "127.0.0.1:$((base_grpc + 1))" "127.0.0.1:$((base_grpc + 2))" ||
  echo "warning: the three nodes do not agree on the ring yet" >&2
"$bin" members --addr "127.0.0.1:$base_grpc"

cat <<MSG

sluice is running: three nodes on 127.0.0.1:$base_grpc, $((base_grpc + 1)) and $((base_grpc + 2)) (gRPC),
HTTP on 127.0.0.1:$base_http, $((base_http + 1)) and $((base_http + 2)), named limits from $limits.
In another terminal, send a check to any of them, e.g.:

  $bin check --addr 127.0.0.1:$((base_grpc + 1)) --name api --key user:42 --limit 10 --window 1m --count 12
  $bin members --addr 127.0.0.1:$base_grpc

Ctrl-C stops all three.
MSG
wait -n "${pids[@]}" || true
