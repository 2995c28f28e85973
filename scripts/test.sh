#!/usr/bin/env bash
# Set up a virtual environment (once) and run the linter and the whole test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/protocol -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
ensure_venv '.[dev,pipeline]'
echo "==> real RocketMQ clients for the interop tests (their own environments)"
bash scripts/setup_real_clients.sh
echo "==> ruff"
"$VENV/bin/ruff" check .
echo "==> pytest"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
