#!/usr/bin/env bash
# Issue 35's sequence on the real binary: three regions ra, rb, rc, a
# node each on 127.0.0.1 (default flags); 12 keys at 30 per hour (fixed
# window, global); 35 checks per key through ra's node; ra's node stopped
# (SIGTERM, or kill -9 with SIG=KILL) and started again under its name
# after DOWN seconds; 35 more checks per key through ra, then 35 through
# rb. Prints how many were allowed in each phase: one central limiter
# allows 360, 0 and 0.
#   scripts/restart-region.sh [bin/sluice]      SIG=KILL DOWN=8 BASE=7370
set -euo pipefail
B=${1:-bin/sluice}
SIG=${SIG:-TERM}
DOWN=${DOWN:-1}
P=${BASE:-7370}
R=ra,rb,rc
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
start() { # name offset [join-offset]
  "$B" serve --name "$1" --region "$1" --regions $R --grpc-addr 127.0.0.1:$((P + $2)) \
    --gossip-addr 127.0.0.1:$((P + 10 + $2)) --http-addr 127.0.0.1:$((P + 20 + $2)) \
    ${3:+--join 127.0.0.1:$((P + 10 + $3))} >"$dir/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}
ready() { for _ in $(seq 1 300); do curl -sf 127.0.0.1:$((P + 20 + $1))/readyz >/dev/null && return; sleep 0.2; done; echo "node $1 not ready" >&2; exit 1; }
count() { # grpc-offset checks-per-key -> allowed
  local n=0
  for k in $(seq 1 12); do
    for _ in $(seq 1 "$2"); do
      if "$B" check --addr 127.0.0.1:$((P + $1)) --name login --key user:$k --limit 30 --window 1h --json | grep -q '"allowed":true'; then
        n=$((n + 1))
      else
        sleep 0.05
      fi
    done
  done
  echo $n
}
start ra 0; start rb 1 0; start rc 2 0
ready 0; ready 1; ready 2; sleep 1
echo "through ra: $(count 0 35) allowed"
kill -s "$SIG" "$pid_ra"; wait "$pid_ra" 2>/dev/null || true
sleep "$DOWN"
start ra 0 1; ready 0
echo "through ra after its node's restart ($SIG, down ${DOWN}s): $(count 0 35) allowed"
echo "through rb: $(count 1 35) allowed"
