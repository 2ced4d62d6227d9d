#!/usr/bin/env bash
# Renders deploy/grafana/sluice.json against a real sluice, without Grafana:
# starts a local three-node cluster (scripts/run-local.sh), a Prometheus
# (/usr/bin/prometheus, Debian's package) scraping the three /metrics every
# second, loads the cluster with sluice bench (plus checks that are denied
# and shadow-denied), then draws every panel with tools/dashrender into one
# PNG and lists the panels whose queries returned no series. Stops
# everything it started; every step is bounded in time.
#   scripts/render-dashboard.sh [OUT.png]     (default docs/img/dashboard.png)
# Environment: SLUICE_RUN_GRPC_PORT, SLUICE_RUN_GOSSIP_PORT, SLUICE_RUN_HTTP_PORT
# (as run-local.sh), RENDER_LOAD (bench duration, default 60s), PROMETHEUS
# (the binary, default prometheus on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
out=${1:-docs/img/dashboard.png}
bin=bin/sluice
load=${RENDER_LOAD:-60s}
prometheus=${PROMETHEUS:-$(command -v prometheus || echo /usr/bin/prometheus)}
g=${SLUICE_RUN_GRPC_PORT:-7070}
h=${SLUICE_RUN_HTTP_PORT:-7080}
addrs=127.0.0.1:$g,127.0.0.1:$((g + 1)),127.0.0.1:$((g + 2))

free_port() {
  local p
  for p in $(seq 19090 19190); do
    (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}

with_workdir
timeout 300 make build >/dev/null
(cd tools/dashrender && timeout 300 go build -o "$work/dashrender" .)

echo "starting the cluster..."
timeout 600 scripts/run-local.sh "$bin" >"$work/cluster.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 150); do
  grep -q 'sluice is running' "$work/cluster.log" && break
  sleep 0.2
done
grep -q 'sluice is running' "$work/cluster.log" || { cat "$work/cluster.log" >&2; echo "the cluster did not start" >&2; exit 1; }

pport=$(free_port)
cat >"$work/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: sluice
    static_configs:
      - targets: ['127.0.0.1:$h', '127.0.0.1:$((h + 1))', '127.0.0.1:$((h + 2))']
YML
echo "starting prometheus on 127.0.0.1:$pport..."
timeout 600 "$prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fsS -m 1 "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS -m 1 "http://127.0.0.1:$pport/-/ready" >/dev/null || { cat "$work/prometheus.log" >&2; exit 1; }
sleep 5 # a few idle scrapes before the load

echo "loading the cluster for $load (sluice bench, and denied checks)..."
(
  end=$((SECONDS + ${load%s}))
  while [ $SECONDS -lt $end ]; do
    # api: token bucket, burst 60 (examples/limits.yaml): most of these are denied;
    # auth.signup is in shadow mode: shadow_denied past 5.
    timeout 10 "$bin" check --addr "127.0.0.1:$((g + 1))" --name api --key user:42 --named --count 80 >/dev/null || true
    timeout 10 "$bin" check --addr "127.0.0.1:$((g + 2))" --name auth.signup --key ip:10.0.0.1 --named --count 10 >/dev/null || true
    sleep 2
  done
) &
pids+=($!)
timeout $((${load%s} + 30)) "$bin" bench --addrs "$addrs" --duration "$load" --concurrency 16 --progress-every 0 |
  tail -n 4
sleep 5 # the last scrapes

echo "rendering..."
mkdir -p "$(dirname "$out")"
timeout 120 "$work/dashrender" --dashboard deploy/grafana/sluice.json --prometheus "http://127.0.0.1:$pport" \
  --out "$out" --range "$((${load%s} + 30))s" --step 1s --rate-interval 10s \
  --var 'instance=127.0.0.1:.*' --var 'region=.*' --var 'proxy=.*'
