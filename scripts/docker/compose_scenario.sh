#!/usr/bin/env bash
# The compose cluster, run for real and analysed: four consumers balance, one container is killed, one
# is paused for less than the channel expiry, the producer stops, the group drains, the cluster goes
# down, and rmq-analyze judges the run directory. Exit 0 only when nothing was lost and the kill
# converged (the analysis' verdict and two explicit checks of summary.json).
#
#   bash scripts/docker/compose_scenario.sh [--no-report]   # builds the image first when it is stale
#
# --no-report writes summary.json only (what the checks read; CI uses it).
#
# Every hand-driven fault goes through `rmq-chaos nemesis`, which records it for the analysis. The
# cluster is removed at the end, also after a failure or Ctrl-C. Needs Java 17 for the analysis.
set -euo pipefail
cd "$(dirname "$0")/../.."
analyze_flags=()
case "${1:-}" in
--no-report) analyze_flags=(--no-report) ;;
"") ;;
*) echo "usage: $0 [--no-report]" >&2; exit 2 ;;
esac
source scripts/_env.sh
source scripts/docker/engine.sh
ensure_engine
ensure_venv '.[dev,pipeline]'
if ! "$VENV/bin/python" -m rmqlab.chaos.container check >/dev/null 2>&1; then
    bash scripts/docker/build_image.sh
fi
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    compose=(docker-compose)
fi
export RUN_ID="compose-scenario-$(date +%Y%m%d-%H%M%S)"
export RUNS_DIR="$PWD/runs"
export RMQ_USER="$(id -u):$(id -g)"
export TIME_SCALE=0.05 RATE=50 COUNT=100000
run="$RUNS_DIR/$RUN_ID"
project="rmqlab-scenario-$$"
mkdir -p "$run"
dc() { "${compose[@]}" -p "$project" -f docker-compose.yml "$@"; }
cleanup() {
    dc down --remove-orphans --timeout 5 >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
chaos() { "$VENV/bin/rmq-chaos" "$@"; }
step() { echo "==> [$(( $(date +%s) - t0 ))s] $*"; }
t0=$(date +%s)

step "docker compose up --scale consumer=4 (run directory $run)"
dc up -d --no-build --scale consumer=4 >/dev/null 2>&1 || { dc up -d --no-build --scale consumer=4; exit 1; }
chaos wait "$run" --group GID_compose --balanced 4 --timeout 60
step "the group is balanced; messages flow"
sleep 3
# Start-up followed the healthchecks (depends_on: service_healthy): say what each container's is now.
health() {
    local service id
    for service in "$@"; do
        for id in $(dc ps -q "$service"); do
            printf ' %s=%s' "$service" "$(docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id")"
        done
    done
}
states="$(health run-dir namesrv broker-a broker-b setup producer consumer)"
step "health:$states"
for server in namesrv broker-a broker-b; do
    case "$states" in
    *" $server=healthy"*) ;;
    *) echo "compose scenario: $server is not healthy" >&2; exit 1 ;;
    esac
done
# Read the whole list first: `| head` would close the pipe on compose (SIGPIPE, fatal under pipefail).
mapfile -t replicas < <(dc ps -q consumer)
victim="${replicas[0]}"
frozen="${replicas[1]}"
step "kill one consumer container"
chaos nemesis kill "$victim" --run-dir "$run"
chaos wait "$run" --group GID_compose --balanced 3 --timeout 30
step "pause another for 3 s (the channel expiry is 120 s x $TIME_SCALE = 6 s)"
chaos nemesis pause "$frozen" --run-dir "$run"
sleep 3
chaos nemesis resume "$frozen" --run-dir "$run"
sleep 3
step "stop the producer and drain"
dc stop --timeout 10 producer >/dev/null 2>&1
chaos wait "$run" --drained --timeout 60
step "bring everything down"
# The clients go first and unannounced (SIGKILL, no nemesis), as rmq-chaos ends a run: the end of
# the experiment is not a change of membership the group would have to converge after.
dc kill consumer >/dev/null 2>&1
dc down --timeout 10 >/dev/null 2>&1
step "rmq-analyze $run"
set +e
"$VENV/bin/rmq-analyze" "$run" "${analyze_flags[@]}"
rc=$?
set -e
"$VENV/bin/python" - "$run/summary.json" <<'PY'
import json, sys
group = json.load(open(sys.argv[1]))["groups"]["GID_compose"]
kills = [c for c in group["convergence"] if c["cause"].startswith("kill ")]
problems = []
if group["sent"] == 0 or group["lost"] != 0:
    problems.append(f"sent {group['sent']}, lost {group['lost']}")
if len(kills) != 1 or not kills[0]["converged"]:
    problems.append(f"the kill's convergence: {kills}")
if problems:
    sys.exit("compose scenario: " + "; ".join(problems))
print(f"compose scenario: sent {group['sent']}, lost 0, duplicates {group['duplicates']}, "
      f"the kill converged in {kills[0]['convergence_ms']} ms")
PY
step "done (rmq-analyze exit $rc)"
exit $rc
