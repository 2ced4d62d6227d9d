# Shell helpers shared by the scripts in this folder; source it.

# wait_rings BIN ADDR...: wait (bounded: 20 s) until every node at ADDR sees
# all of them alive and their rings have one fingerprint. Returns 1 on
# timeout.
wait_rings() {
  local bin=$1 n rings t a
  shift
  n=$#
  for _ in $(seq 1 100); do
    rings=""
    for a in "$@"; do
      t=$("$bin" members --addr "$a" --timeout 1s 2>/dev/null || true)
      [ "$(grep -c ' alive ' <<<"$t")" = "$n" ] && rings+="$(grep '^ring ' <<<"$t")"$'\n'
    done
    if [ "$(grep -c '^ring ' <<<"$rings")" = "$n" ] && [ "$(sort -u <<<"${rings%$'\n'}" | wc -l)" = 1 ]; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# stop_pids PID...: SIGTERM each process, then wait for all of them.
stop_pids() {
  local p
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# with_workdir: make a scratch folder in $work and an empty $pids list, and
# on exit stop every process in $pids and remove the folder.
with_workdir() {
  work=$(mktemp -d)
  pids=()
  trap 'stop_pids "${pids[@]}"; rm -rf "$work"' EXIT
}
