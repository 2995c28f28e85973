#!/usr/bin/env bash
# Install real RocketMQ clients for the interop tests and experiments, each in its own environment:
#   .venv-real/               Apache's C++ client 2.1.0 (PyPI rocketmq-python-cvs, module `rocketmq`, ctypes)
#   interop/js/node_modules/  ali-ons 3.12.0 (pure JS, npm)
# Both packages install a top-level module named `rocketmq`, so neither goes into the project's .venv.
# Idempotent: a stamp file per environment skips work already done. Skip one with SKIP_CPP=1 / SKIP_JS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

CPP_PKG="rocketmq-python-cvs==2.1.0.3"
JS_PKG="ali-ons@3.12.0"  # pinned in interop/js/package.json
REAL_VENV="${REAL_VENV:-.venv-real}"

if [ "${SKIP_CPP:-0}" != 1 ]; then
    stamp="$REAL_VENV/.installed-${CPP_PKG//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        py="$(find_python)"
        echo "==> creating $REAL_VENV with $py and installing $CPP_PKG"
        [ -x "$REAL_VENV/bin/python" ] || "$py" -m venv "$REAL_VENV"
        echo '*' >"$REAL_VENV/.gitignore"
        "$REAL_VENV/bin/python" -m pip install --disable-pip-version-check -q "$CPP_PKG"
        # Loading the library is the real check: a missing shared library fails here, not in a test.
        "$REAL_VENV/bin/python" -c 'import rocketmq.client as c; c.PushConsumer, c.Producer'
        touch "$stamp"
    fi
    echo "==> C++ client ready: $REAL_VENV/bin/python"
fi

if [ "${SKIP_JS:-0}" != 1 ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "error: npm is required for $JS_PKG (install Node.js 18 or newer, or set SKIP_JS=1)" >&2
        exit 1
    fi
    stamp="interop/js/node_modules/.installed-${JS_PKG//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        echo "==> installing $JS_PKG into interop/js/node_modules"
        (cd interop/js && npm install --no-audit --no-fund --no-package-lock --loglevel=error)
        node -e 'require(process.argv[1])' "$PWD/interop/js/node_modules/ali-ons"
        touch "$stamp"
    fi
    echo "==> JS client ready: interop/js/node_modules/ali-ons"
fi
