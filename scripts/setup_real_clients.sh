#!/usr/bin/env bash
# Install real RocketMQ clients for the interop tests and experiments, each in its own environment:
#   .venv-real/               Apache's C++ client 2.1.0 (PyPI rocketmq-python-cvs, module `rocketmq`, ctypes)
#   interop/js/node_modules/  ali-ons 3.12.0 (pure JS, npm)
#   .venv-v5/                 Apache's RocketMQ 5 Python client 5.1.2 (PyPI rocketmq-python-client, gRPC)
#   interop/js5/node_modules/ Apache's RocketMQ 5 Node.js client 1.0.8 (npm rocketmq-client-nodejs, gRPC)
# The C++ and v5 Python packages both install a top-level module named `rocketmq`, so each has its own venv.
# Idempotent: a stamp file per environment skips work already done. Skip one with SKIP_CPP=1 / SKIP_JS=1 /
# SKIP_PY5=1 / SKIP_JS5=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

CPP_PKG="rocketmq-python-cvs==2.1.0.3"
JS_PKG="ali-ons@3.12.0"  # pinned in interop/js/package.json
PY5_PKG="rocketmq-python-client==5.1.2"
JS5_PKG="rocketmq-client-nodejs@1.0.8"  # pinned in interop/js5/package.json
REAL_VENV="${REAL_VENV:-.venv-real}"
V5_VENV="${V5_VENV:-.venv-v5}"

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

if [ "${SKIP_PY5:-0}" != 1 ]; then
    stamp="$V5_VENV/.installed-${PY5_PKG//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        py="$(find_python)"
        echo "==> creating $V5_VENV with $py and installing $PY5_PKG"
        [ -x "$V5_VENV/bin/python" ] || "$py" -m venv "$V5_VENV"
        echo '*' >"$V5_VENV/.gitignore"
        "$V5_VENV/bin/python" -m pip install --disable-pip-version-check -q "$PY5_PKG"
        "$V5_VENV/bin/python" -c 'from rocketmq import PushConsumer, SimpleConsumer, Producer'
        touch "$stamp"
    fi
    echo "==> v5 Python client ready: $V5_VENV/bin/python"
fi

if [ "${SKIP_JS5:-0}" != 1 ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "error: npm is required for $JS5_PKG (install Node.js 18 or newer, or set SKIP_JS5=1)" >&2
        exit 1
    fi
    stamp="interop/js5/node_modules/.installed-${JS5_PKG//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        echo "==> installing $JS5_PKG into interop/js5/node_modules"
        (cd interop/js5 && npm install --no-audit --no-fund --no-package-lock --loglevel=error)
        node -e 'require(process.argv[1])' "$PWD/interop/js5/node_modules/rocketmq-client-nodejs"
        touch "$stamp"
    fi
    echo "==> v5 Node.js client ready: interop/js5/node_modules/rocketmq-client-nodejs"
fi
