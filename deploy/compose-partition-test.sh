#!/usr/bin/env bash
# docker-compose test of a network partition ("Lost means gone", docs/reliability.md): with a
# GUARANTEED container running on worker-3, `docker network disconnect` cuts worker-3 off the
# cluster network for longer than the coordinator's node timeout (5 s in docker-compose.yml),
# then `docker network connect` brings it back. Checks:
#   - the app is told the container is lost (testbed partition-check --phase before);
#   - during the partition the container's processes still run on the cut-off worker (it cannot
#     know), and after the re-join they are gone (join_accepted.lost_containers), the worker
#     logging that it killed a container the coordinator reported lost;
#   - worker-3 re-joined and gets new grants: its whole capacity (2,000 millicores) as one
#     GUARANTEED container, started and running, and a QUEUEABLE grant (--phase after);
#   - GUARANTEED work never exceeded worker-3's capacity: the node refuses GUARANTEED work past
#     its capacity, the full-capacity container started, and `ps` shows only it (the lost 1,500-
#     millicore container's processes are gone), so 2,000 of 2,000 and never 3,500;
#   - then all three workers cut off at once for twice the node timeout: every node silent is
#     presumed the coordinator's or the network's fault, none is declared lost, all re-join, and
#     the GUARANTEED container runs on.
# Waits are bounded polls for a condition, never fixed sleeps standing in for one.
# IMAGE (default hybrid-scheduler:partition-test) is the image tag built and run, so that a run
# does not replace the image another compose run on the same engine is using.
set -euo pipefail
cd "$(dirname "$0")/.."

project=hybrid-sched-partition
export IMAGE="${IMAGE:-hybrid-scheduler:partition-test}"
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose -p "$project" -f docker-compose.yml)
else
  compose=(docker compose -p "$project" -f docker-compose.yml)
fi
victim=worker-3
started=$(date +%s)
cleanup() {
  status=$?
  if [ $status -ne 0 ]; then
    echo "partition-test: FAILED (exit $status); last logs:" >&2
    "${compose[@]}" logs --no-color --tail 40 >&2 || true
    mkdir -p target
    "${compose[@]}" logs --no-color >target/compose-partition-test.log 2>&1 || true
    echo "partition-test: all logs in target/compose-partition-test.log" >&2
  fi
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  exit $status
}
trap cleanup EXIT

if [ "${SKIP_IMAGE_BUILD:-0}" != 1 ]; then
  bash deploy/build-image.sh
fi

"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
"${compose[@]}" up -d coordinator worker-1 worker-2 "$victim"

# Poll (bounded: 300 x 0.2 s) until `cmd` succeeds.
poll() {
  local what=$1; shift
  for _ in $(seq 1 300); do
    if "$@"; then return 0; fi
    sleep 0.2
  done
  echo "partition-test: timed out waiting for $what" >&2
  return 1
}
joins() { "${compose[@]}" logs --no-color "$1" 2>/dev/null | grep -c 'joined the cluster' || true; }
joined_at_least() { [ "$(joins "$1")" -ge "$2" ]; }
# Processes in the victim whose command line carries a marker (busybox ps; the grep itself
# does not run in the container).
count_in_victim() {
  local out
  out=$("${compose[@]}" exec -T "$victim" ps -o args) || return 1
  # PID 1 (tini) is always there: an empty list means ps did not run.
  [ -n "$out" ] || return 1
  echo "$out" | grep -c "echo $1" || true
}
has_count() { local n; n=$(count_in_victim "$1") && [ "$n" -eq "$2" ]; }

for w in worker-1 worker-2 "$victim"; do poll "$w to join" joined_at_least "$w" 1; done
echo "partition-test: all three workers joined"

cid=$("${compose[@]}" ps -q "$victim")
network=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$cid")
echo "partition-test: $victim is container ${cid:0:12} on network $network"

# Phase 1: a GUARANTEED container on the victim; on READY cut the victim off and wait (in the
# checker) for the app to be told the container is lost.
fifo=$(mktemp -u)
mkfifo "$fifo"
"${compose[@]}" run --rm -T load testbed partition-check --phase before --endpoint worker-1:7500 \
  --credentials-file /cluster/cluster.json --victim "$victim" --old-cpu-millis 1500 \
  --marker partition-old --timeout-ms 60000 >"$fifo" &
checker=$!
result=""
cut_at=0
while IFS= read -r line; do
  echo "partition-test: checker: $line"
  case "$line" in
    READY*)
      poll "the GUARANTEED container's processes on $victim" has_count partition-old 1
      docker network disconnect "$network" "$cid"
      cut_at=$(date +%s.%N)
      echo "partition-test: disconnected $victim from $network"
      ;;
    *) result=$line ;;
  esac
done <"$fifo"
rm -f "$fifo"
wait "$checker"
lost_after=$(python3 -c "import time; print(round(time.time() - $cut_at, 1))")
echo "$result" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["ok"] and r["phase"] == "before", r
'
echo "partition-test: the app was told the container is lost ${lost_after} s after the cut"
# Cut off, the worker cannot know: the container still runs.
[ "$(count_in_victim partition-old)" -eq 1 ] \
  || { echo "partition-test: the container stopped before the re-join" >&2; exit 1; }
joins_before=$(joins "$victim")

# Keep the cut for longer than the node timeout measured from the cut itself (the coordinator
# counts from the victim's last heartbeat, a little before): the length of the partition is
# what is under test here, so this wait is on the clock.
node_timeout_s=5
while python3 -c "import sys, time; sys.exit(0 if time.time() - $cut_at < $node_timeout_s + 1 else 1)"; do
  sleep 0.2
done
partitioned=$(python3 -c "import time; print(round(time.time() - $cut_at, 1))")
# Reconnect under the service's DNS name (compose set it as an alias at `up`).
docker network connect --alias "$victim" "$network" "$cid"
echo "partition-test: reconnected $victim after ${partitioned} s cut off (node timeout ${node_timeout_s} s)"
poll "$victim to re-join" joined_at_least "$victim" $((joins_before + 1))
poll "the lost container's processes to be gone" has_count partition-old 0
# (grep -c reads everything: grep -q would close the pipe early and, under pipefail, fail the
# pipeline through docker-compose's SIGPIPE.)
killed=$("${compose[@]}" logs --no-color "$victim" | grep -c 'killed a container the coordinator reported lost' || true)
[ "$killed" -ge 1 ] || { echo "partition-test: $victim did not log killing the lost container" >&2; exit 1; }
echo "partition-test: $victim re-joined and killed the container it had been told was lost"

# Phase 2: the victim's whole capacity as one GUARANTEED container, and a QUEUEABLE grant.
after=$("${compose[@]}" run --rm -T load testbed partition-check --phase after \
  --endpoint worker-1:7500 --credentials-file /cluster/cluster.json --victim "$victim" \
  --capacity-cpu-millis 2000 --marker partition-new --timeout-ms 30000 | tail -n 1)
echo "partition-test: checker: $after"
echo "$after" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["ok"] and r["guaranteed_cpu_millis"] == 2000, r
'
poll "the new full-capacity container's processes" has_count partition-new 1
[ "$(count_in_victim partition-old)" -eq 0 ] || { echo "partition-test: the lost container is back" >&2; exit 1; }
echo "partition-test: full capacity granted and running again (2000/2000 millicores GUARANTEED on $victim)"

# Phase 3: the coordinator cut off from every worker at once (all three disconnected together)
# for twice the node timeout. Every node silent is presumed the coordinator's or the network's
# fault (the loss guard, docs/reliability.md "Silence the coordinator caused is not blamed on
# its nodes"): nobody is declared lost, the workers re-join when the network heals, and the
# GUARANTEED container on the victim runs on.
lost_lines() { "${compose[@]}" logs --no-color coordinator 2>/dev/null | grep -c 'node lost' || true; }
lost_before=$(lost_lines)
declare -A rejoins_before cids
for w in worker-1 worker-2 "$victim"; do
  rejoins_before[$w]=$(joins "$w")
  cids[$w]=$("${compose[@]}" ps -q "$w")
done
for w in worker-1 worker-2 "$victim"; do docker network disconnect "$network" "${cids[$w]}"; done
cut_at=$(date +%s.%N)
echo "partition-test: disconnected all three workers from $network"
# The length of the outage is what is under test: this wait is on the clock.
while python3 -c "import sys, time; sys.exit(0 if time.time() - $cut_at < 2 * $node_timeout_s + 1 else 1)"; do
  sleep 0.2
done
for w in worker-1 worker-2 "$victim"; do docker network connect --alias "$w" "$network" "${cids[$w]}"; done
echo "partition-test: reconnected all three after $(python3 -c "import time; print(round(time.time() - $cut_at, 1))") s"
for w in worker-1 worker-2 "$victim"; do poll "$w to re-join" joined_at_least "$w" $((rejoins_before[$w] + 1)); done
"${compose[@]}" logs --no-color coordinator | grep -q 'every node silent' \
  || { echo "partition-test: the coordinator did not notice that every node was silent" >&2; exit 1; }
[ "$(lost_lines)" -eq "$lost_before" ] \
  || { echo "partition-test: the coordinator declared nodes lost while cut off from all of them" >&2; exit 1; }
[ "$(count_in_victim partition-new)" -eq 1 ] \
  || { echo "partition-test: the GUARANTEED container did not survive the coordinator's partition" >&2; exit 1; }
echo "partition-test: cut off from every worker for $((2 * node_timeout_s)) s, the coordinator declared no node lost and the container runs on"
echo "partition-test: OK in $(( $(date +%s) - started )) s: lost reported, processes gone after the re-join, full capacity granted and running again, nobody lost when every node went silent"
