#!/usr/bin/env bash
# Issue 19's figures: runs the scenario runner against in-process clusters of
# 3 regions 100 ms apart (sluice scenario --simulate), one and three nodes per
# region, and prints one line per run. Usage: scripts/bench-regions.sh BIN [ROUNDS]
#   - load.yaml (100 keys, 1000 checks/s per region, global) with the WAN and
#     without it (--no-wan), alternated ROUNDS times (default 3): in-region
#     latency under load, back to back;
#   - the five done-when scenarios (steady, skew, flood, cut, clocks) with
#     scope global, steady and flood with regional and exact, and cut with
#     exact (degraded answers in the cut-off region).
# Every run stops by itself (the scenario's duration plus startup; each is
# bounded by timeout 180 s). JSON reports go to $OUT (default a temp dir).
set -euo pipefail
BIN=${1:?usage: bench-regions.sh BIN [ROUNDS]}
ROUNDS=${2:-3}
OUT=${OUT:-$(mktemp -d)}
DATA=$(dirname "$0")/../scenario/testdata
run() { # name, args...
  local name=$1; shift
  if timeout 180 "$BIN" scenario --simulate "$@" --json >"$OUT/$name.json" 2>"$OUT/$name.err"; then
    python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["totals"]
worst = max(x["p99_ms"] for x in r["regions"])
print(f"{sys.argv[2]:32s} checks {t['checks']:6d} admitted {t['admitted']:5d} oracle {t['oracle_admitted']:5d} "
      f"over {t['over']:4d} (max {t['max_over']:3d}) under {t['under']:5d} util {t['utilisation']:.3f} "
      f"slice_exh {t['slice_exhausted']:6d} degraded {t['degraded']} errors {t['errors']} "
      f"xregion/check {t['messages_per_check']:.3f} p50 {t['p50_ms']:.2f} p99 {t['p99_ms']:.2f} worst-region-p99 {worst:.2f} ms lag {t['max_lag_ms']:.0f} ms")
PY
  else
    echo "$name: FAILED ($(tail -1 "$OUT/$name.err"))"
  fi
}
for n in 1 3; do
  for r in $(seq "$ROUNDS"); do
    run "load-n$n-r$r-wan" --nodes-per-region "$n" --file "$DATA/load.yaml"
    run "load-n$n-r$r-nowan" --nodes-per-region "$n" --no-wan --file "$DATA/load.yaml"
  done
  for s in steady skew flood cut clocks; do
    run "$s-n$n-global" --nodes-per-region "$n" --file "$DATA/$s.yaml"
  done
  for s in steady flood; do
    for sc in regional exact; do
      run "$s-n$n-$sc" --nodes-per-region "$n" --scope "$sc" --file "$DATA/$s.yaml"
    done
  done
  # exact with a region cut off from the home region: degraded answers
  # there, at most one limit per window more (exit 1: above exact's bound 0)
  run "cut-n$n-exact" --nodes-per-region "$n" --scope exact --file "$DATA/cut.yaml" || true
done
echo "reports: $OUT"
