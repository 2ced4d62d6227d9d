#!/usr/bin/env bash
# Smoke test of a running node with clients we did not write:
#   1. grpcurl lists the services through server reflection,
#   2. grpcurl gets a decision from sluice.v1.RateLimitService/Check,
#   3. grpcurl asks grpc.health.v1 and gets SERVING, and the node's
#      routing table from sluice.v1.RateLimitService/Routes,
#   4. grpcurl sends bad input and gets InvalidArgument naming the field,
#   5. grpcurl resets a key through the admin API (loopback, no credentials)
#      and the next check starts afresh; sluice validate takes the examples,
# then `make run` is started as the README says and `sluice check` is sent
# to it, and grpcurl calls Envoy's RLS v3 ShouldRateLimit (rules from
# examples/rls) until it answers OVER_LIMIT. Needs grpcurl on PATH (or
# GRPCURL=...). Ports are OS-picked for the single node; `make run` uses
# its README ports 7070-7072 / 7946-7948.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-bin/sluice}
grpcurl=${GRPCURL:-grpcurl}
with_workdir
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

# A single node on OS-picked ports; its log tells the gRPC address.
"$bin" serve --name smoke --grpc-addr 127.0.0.1:0 --gossip-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --rls-config examples/rls 2>"$work/node.log" &
pids+=($!)
addr=""
for _ in $(seq 1 100); do
  addr=$(sed -n 's/.*msg="node started".* grpc_addr=\([^ ]*\).*/\1/p' "$work/node.log" | head -n1)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { cat "$work/node.log"; fail "node did not start"; }
http=$(sed -n 's/.*msg="node started".* http_addr=\([^ ]*\).*/\1/p' "$work/node.log" | head -n1)
echo "smoke: node at $addr (HTTP $http)"

services=$("$grpcurl" -plaintext "$addr" list)
echo "$services"
for s in sluice.v1.RateLimitService sluice.v1.PeerService sluice.v1.AdminService sluice.v1.AdminPeerService grpc.health.v1.Health grpc.reflection.v1.ServerReflection envoy.service.ratelimit.v3.RateLimitService; do
  grep -qx "$s" <<<"$services" || fail "reflection does not list $s"
done

answer=$("$grpcurl" -plaintext -d '{"checks":[{"name":"api","key":"user:42","hits":1,"limit":10,"window_ms":60000,"algorithm":"ALGORITHM_TOKEN_BUCKET"}]}' \
  "$addr" sluice.v1.RateLimitService/Check)
echo "$answer"
grep -q '"allowed": true' <<<"$answer" || fail "Check did not allow the first hit"
grep -q '"remaining": "9"' <<<"$answer" || fail "Check did not answer remaining 9"
grep -q '"owner": "smoke"' <<<"$answer" || fail "Check did not name the owner"

health=$("$grpcurl" -plaintext "$addr" grpc.health.v1.Health/Check)
grep -q SERVING <<<"$health" || fail "health is not SERVING: $health"

# The routing table a ring-aware client routes by (docs/routing.md).
routes=$("$grpcurl" -plaintext "$addr" sluice.v1.RateLimitService/Routes)
echo "$routes"
grep -q '"self": "smoke"' <<<"$routes" || fail "Routes does not name the node"
grep -q '"hash": "xxhash64"' <<<"$routes" || fail "Routes does not give the hash"
grep -q '"ringFingerprint": "[0-9a-f]\{16\}"' <<<"$routes" || fail "Routes gives no ring fingerprint"

if bad=$("$grpcurl" -plaintext -d '{"checks":[{"name":"api","key":"k","hits":1,"limit":0,"window_ms":60000}]}' \
  "$addr" sluice.v1.RateLimitService/Check 2>&1); then
  fail "limit 0 was accepted"
fi
echo "$bad"
grep -q 'InvalidArgument' <<<"$bad" || fail "limit 0 did not give InvalidArgument"
grep -q 'checks\[0\].limit' <<<"$bad" || fail "the error does not name checks[0].limit"
"$grpcurl" -plaintext "$addr" grpc.health.v1.Health/Check | grep -q SERVING || fail "node stopped serving after bad input"
echo "smoke: grpcurl OK"

# The HTTP face: the same check in JSON, a refusal naming the field, health.
answer=$(curl -sS -X POST "http://$http/v1/check" -d '{"checks":[{"name":"api","key":"user:42","limit":10,"window_ms":60000,"algorithm":"ALGORITHM_TOKEN_BUCKET"}]}')
echo "$answer"
grep -Eq '"remaining": ?"8"' <<<"$answer" || fail "POST /v1/check did not answer remaining 8 after the grpcurl check"
code=$(curl -sS -o "$work/bad.json" -w '%{http_code}' -X POST "http://$http/v1/check" -d '{"checks":[{"name":"api","key":"k","limit":-1,"window_ms":60000}]}')
[ "$code" = 400 ] && grep -q 'checks\[0\].limit' "$work/bad.json" || fail "limit -1 over HTTP: $code $(cat "$work/bad.json")"
[ "$(curl -sS "http://$http/healthz")" = ok ] || fail "/healthz is not ok"
curl -sS "http://$http/readyz" | grep -q ready || fail "/readyz is not ready"
# (read whole first: with pipefail, grep -q quitting early would fail curl)
metrics=$(curl -sS "http://$http/metrics")
grep -q '^sluice_checks_total{name="(inline)",outcome="allowed"} 2$' <<<"$metrics" || fail "/metrics does not count the two checks"
# The build make build stamped: sluice --version, and the node's
# sluice_build_info (make smoke builds bin/sluice from this checkout).
want_version=$(git describe --tags --always --dirty 2>/dev/null || true)
if [ -n "$want_version" ]; then
  "$bin" --version | head -n1 | grep -qx "sluice $want_version" || fail "sluice --version: $("$bin" --version | head -n1), want sluice $want_version"
  grep -q "^sluice_build_info{goversion=\"go[0-9.]*\",revision=\"$(git rev-parse HEAD)\",version=\"$want_version\"} 1$" <<<"$metrics" ||
    fail "/metrics: $(grep sluice_build_info <<<"$metrics"), want version $want_version"
fi
"$bin" healthcheck --addr "$addr" || fail "sluice healthcheck failed on a serving node"
hroutes=$(curl -sS "http://$http/v1/routes")
grep -q '"self":"smoke"' <<<"$hroutes" || fail "GET /v1/routes: $hroutes"
echo "smoke: HTTP OK"

# The admin API (docs/admin.md) on loopback of a node with no credentials:
# grpcurl resets the key, and the next check starts afresh.
reset=$("$grpcurl" -plaintext -d '{"name":"api","key":"user:42"}' "$addr" sluice.v1.AdminService/ResetKey)
echo "$reset"
grep -q '"complete": true' <<<"$reset" || fail "ResetKey was not complete"
answer=$(curl -sS -X POST "http://$http/v1/check" -d '{"checks":[{"name":"api","key":"user:42","limit":10,"window_ms":60000,"algorithm":"ALGORITHM_TOKEN_BUCKET"}]}')
grep -Eq '"remaining": ?"9"' <<<"$answer" || fail "after ResetKey the check did not start afresh (remaining 9): $answer"
metrics=$(curl -sS "http://$http/metrics")
grep -q '^sluice_admin_resets_total{result="complete"} 1$' <<<"$metrics" || fail "/metrics does not count the reset"
"$bin" validate examples/limits.yaml || fail "sluice validate refused examples/limits.yaml"
"$bin" validate examples/rls || fail "sluice validate refused examples/rls"
echo "smoke: admin OK"

# `make run` and `sluice check` against it, as the README says.
setsid make --no-print-directory run >"$work/run.log" 2>&1 &
runpid=$!
for _ in $(seq 1 150); do
  grep -q "sluice is running" "$work/run.log" && break
  sleep 0.2
done
grep -q "sluice is running" "$work/run.log" || { cat "$work/run.log"; kill -INT -- -"$runpid"; fail "make run did not start"; }
members=$("$bin" members --addr 127.0.0.1:7070 --json)
echo "$members"
[ "$(grep -o '"state":"alive"' <<<"$members" | wc -l)" = 3 ] || { kill -INT -- -"$runpid"; fail "make run: not 3 alive members"; }
# A token bucket, so that no window edge can fall between the 12 checks.
out=$("$bin" check --addr 127.0.0.1:7071 --name api --key user:42 --limit 10 --window 1m --algorithm token_bucket --count 12 --json)
echo "$out"
allowed=$(grep -c '"allowed":true' <<<"$out" || true)
# A named limit of examples/limits.yaml over HTTP: api gives tier:pro: keys 300.
named=$(curl -sS -X POST 127.0.0.1:7082/v1/check -d '{"checks":[{"name":"api","key":"tier:pro:acme"}]}')
echo "$named"
# Envoy's RLS v3 through reflection, entering at node2: examples/rls/edge.yaml
# allows 10 requests per minute per remote_address. 10 hits fill the
# minute, the next is over it (tried once more with a fresh address if a
# minute began in between).
rls_over=""
for ip in 203.0.113.7 203.0.113.8; do
  rls() {
    "$grpcurl" -plaintext -d "{\"domain\":\"edge\",\"hits_addend\":$1,\"descriptors\":[{\"entries\":[{\"key\":\"remote_address\",\"value\":\"$ip\"}]}]}" \
      127.0.0.1:7071 envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
  }
  first=$(rls 10) || { kill -INT -- -"$runpid"; fail "ShouldRateLimit failed: $first"; }
  echo "$first"
  grep -q '"overallCode": "OK"' <<<"$first" || { kill -INT -- -"$runpid"; fail "ShouldRateLimit: the first 10 hits were not OK"; }
  second=$(rls 1) || { kill -INT -- -"$runpid"; fail "ShouldRateLimit failed: $second"; }
  echo "$second"
  if grep -q '"overallCode": "OVER_LIMIT"' <<<"$second"; then rls_over=yes; break; fi
done
kill -INT -- -"$runpid"
wait "$runpid" || true
[ "$allowed" = 10 ] || fail "make run: $allowed of 12 allowed, want 10"
grep -Eq '"limit": ?"300"' <<<"$named" || fail "make run: the named limit api did not give tier:pro: keys 300"
[ -n "$rls_over" ] || fail "ShouldRateLimit did not answer OVER_LIMIT after the limit"
# make may return before the nodes it started have finished leaving (each
# hands its keys off and leaves the gossip, about a second): give them 15 s.
for _ in $(seq 1 75); do
  pgrep -f "sluice serve --name node" >/dev/null || break
  sleep 0.2
done
if pgrep -f "sluice serve --name node" >/dev/null; then fail "make run left nodes running 15 s after Ctrl-C"; fi
# make run logs at warn: a start and a Ctrl-C with nothing wrong log nothing
# (a node joining, every node leaving at once and dropping its keys).
if grep -E 'level=(WARN|ERROR)' "$work/run.log"; then fail "make run logged warnings or errors (above)"; fi
echo "smoke: make run OK (sluice check, RLS ShouldRateLimit OVER_LIMIT)"
