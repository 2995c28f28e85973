#!/usr/bin/env bash
# The main job: set up, run the demo experiment on a local cluster of real processes
# (2 brokers, 16 queues, 4 consumers; one killed, one paused and resumed, one restarted),
# analyse it with the PySpark pipeline, and print the verdict and where the report is
# (rmq-chaos run prints both, once).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17 is needed by the analysis (PySpark); install a JDK 17 and retry" >&2
    exit 2
fi
ensure_venv '.[dev,pipeline]'
out="runs/demo-$(date +%Y%m%d-%H%M%S)"
echo "==> running chaos/experiments/demo.toml into $out"
exec "$VENV/bin/rmq-chaos" run chaos/experiments/demo.toml --out "$out" "$@"
