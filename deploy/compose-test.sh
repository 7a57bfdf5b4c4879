#!/usr/bin/env bash
# docker-compose test of node loss: bring up the coordinator and three workers on a private
# network, run the load generator, then start long containers on every worker, kill worker-3,
# and check (inside the network, with `testbed node-loss-check`) that the app is told its
# containers on worker-3 are lost and that new asks go to the remaining workers.
# Waits are bounded polls for a condition, never fixed sleeps standing in for one.
set -euo pipefail
cd "$(dirname "$0")/.."

project=hybrid-sched-test
# Debian ships Compose as the standalone `docker-compose`; newer engines have the plugin.
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose -p "$project" -f docker-compose.yml)
else
  compose=(docker compose -p "$project" -f docker-compose.yml)
fi
cleanup() {
  status=$?
  if [ $status -ne 0 ]; then
    echo "compose-test: FAILED (exit $status); last logs:" >&2
    "${compose[@]}" logs --no-color --tail 40 >&2 || true
  fi
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  exit $status
}
trap cleanup EXIT

bash deploy/build-image.sh

"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
"${compose[@]}" up -d coordinator worker-1 worker-2 worker-3

wait_for_join() {
  local svc=$1
  for _ in $(seq 1 300); do
    if "${compose[@]}" logs --no-color "$svc" 2>/dev/null | grep -q '"event":"joined"'; then
      return 0
    fi
    sleep 0.2
  done
  echo "compose-test: $svc did not join within 60 s" >&2
  return 1
}
for w in worker-1 worker-2 worker-3; do wait_for_join "$w"; done
echo "compose-test: all three workers joined"

# 0. Workers see only the CA certificate and the join token, never the CA key or the store.
for w in worker-1 worker-2 worker-3; do
  seen=$("${compose[@]}" exec -T "$w" ls /cluster | tr '\n' ' ')
  [ "$seen" = "ca.pem join-token " ] || { echo "compose-test: $w sees /cluster: $seen" >&2; exit 1; }
done
# The load generator (an app) gets the app credentials without the join token.
"${compose[@]}" run --rm -T load cat /cluster/cluster.json | python3 -c '
import json, sys
c = json.load(sys.stdin)
assert "join_token" not in c and c["apps"][0]["app_secret"], sorted(c)
'
# Containers run as an unprivileged user (the image has `nobody`, uid 65534).
# (The log is read whole first: `logs | grep -q` fails under pipefail when grep exits at an early
# match while compose is still writing.)
for w in worker-1 worker-2 worker-3; do
  log=$("${compose[@]}" logs --no-color "$w")
  grep -q 'containers run as this user' <<<"$log" \
    || { echo "compose-test: $w does not switch container users" >&2; exit 1; }
done
echo "compose-test: workers see only ca.pem and join-token; the app sees no join token; containers run as nobody"

# 1. The load generator completes a mixed workload.
load_json=$("${compose[@]}" run --rm -T load testbed load --endpoint worker-1:7500 \
  --credentials-file /cluster/cluster.json --containers 60 --type hybrid --concurrency 12 \
  --task-duration-ms 300 --json)
echo "compose-test: load: $load_json"
completed=$(echo "$load_json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["completed"])')
[ "$completed" -ge 1 ] || { echo "compose-test: no container completed" >&2; exit 1; }

# 2. Node loss: the checker starts long containers on every worker and prints READY; we then kill
#    worker-3 and the checker verifies the lost events and the placement of new asks.
fifo=$(mktemp -u)
mkfifo "$fifo"
"${compose[@]}" run --rm -T load testbed node-loss-check --endpoint worker-1:7500 \
  --credentials-file /cluster/cluster.json --victim worker-3 --timeout-ms 60000 >"$fifo" &
checker=$!
result=""
while IFS= read -r line; do
  echo "compose-test: checker: $line"
  if [ "$line" = READY ]; then
    "${compose[@]}" kill worker-3 >/dev/null
    echo "compose-test: killed worker-3"
  else
    result=$line
  fi
done <"$fifo"
rm -f "$fifo"
wait "$checker"
echo "$result" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["ok"], r
assert r["lost_on_victim"] == r["started_on_victim"] > 0, r
assert r["new_grants_on_victim"] == 0 and r["new_grants"] > 0, r
print("compose-test: node loss handled:", r)
'

# 3. Any number of extra workers (`--scale worker=N`), metrics and the dashboard: two more join,
#    the coordinator counts them (admin socket, inside its container) and its dashboard and
#    metrics on the host's loopback port show them.
"${compose[@]}" up -d --scale worker=2 worker
nodes_now() {
  "${compose[@]}" exec -T coordinator coordinator status --data-dir /data --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["nodes"])' 2>/dev/null || echo 0
}
for _ in $(seq 1 300); do
  [ "$(nodes_now)" = 4 ] && break
  sleep 0.2
done
[ "$(nodes_now)" = 4 ] || { echo "compose-test: expected 4 nodes (worker-1, worker-2, 2 scaled), have $(nodes_now)" >&2; exit 1; }
echo "compose-test: two scaled workers joined (4 nodes with worker-3 lost)"
dashboard=$("${compose[@]}" port coordinator 9400)
python3 - "$dashboard" <<'PY'
import json, sys, time, urllib.request
base = "http://" + sys.argv[1]
metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
assert "coordinator_nodes_joined_total" in metrics, metrics[:400]
page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
assert "/app.js" in page, page[:400]
# The first request marks the dashboard watched; the actors publish at their next tick.
for _ in range(100):
    state = json.load(urllib.request.urlopen(base + "/api/state", timeout=10))
    if len(state["cluster"]["nodes"]) == 4:
        break
    time.sleep(0.2)
nodes = sorted(n["node_id"] for n in state["cluster"]["nodes"])
assert len(nodes) == 4 and {"worker-1", "worker-2"} <= set(nodes), nodes
print("compose-test: dashboard and metrics on", base, "show", nodes)
PY
echo "compose-test: OK"
