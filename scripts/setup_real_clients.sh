#!/usr/bin/env bash
# Install real RocketMQ clients for the interop tests and experiments, each in its own environment:
#   .venv-real/               Apache's C++ client 2.1.0 (PyPI rocketmq-python-cvs, module `rocketmq`, ctypes)
#   interop/js/node_modules/  ali-ons 3.12.0 (pure JS, npm)
#   .venv-v5/                 Apache's RocketMQ 5 Python client 5.1.2 (PyPI rocketmq-python-client, gRPC)
#   interop/js5/node_modules/ Apache's RocketMQ 5 Node.js client 1.0.8 (npm rocketmq-client-nodejs, gRPC)
#   .cache/java/lib/          Apache's Java clients (Maven Central; scripts/setup_java_clients.sh)
#   .cache/go/                the driver of Apache's Go client (Go module proxy; scripts/setup_go_client.sh)
#   .cache/apache/            Apache's name server and broker, the apache-* engines (Maven Central;
#                             scripts/setup_apache_engine.sh)
# Maven and Go keep what they download in their own caches (~/.m2, Go's module cache), so a second
# checkout on the same machine builds without fetching again.
# The C++ and v5 Python packages both install a top-level module named `rocketmq`, so each has its own venv.
# Idempotent: a stamp file per environment skips work already done. Skip one with SKIP_CPP=1 / SKIP_JS=1 /
# SKIP_PY5=1 / SKIP_JS5=1 / SKIP_JAVA=1 / SKIP_GO=1 / SKIP_APACHE=1 (their tests then skip, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

CPP_PKG="rocketmq-python-cvs==2.1.0.3"
JS_PKG="ali-ons@3.12.0"  # pinned in interop/js/package.json
PY5_PKG="rocketmq-python-client==5.1.2"
JS5_PKG="rocketmq-client-nodejs@1.0.8"  # pinned in interop/js5/package.json
REAL_VENV="${REAL_VENV:-.venv-real}"
V5_VENV="${V5_VENV:-.venv-v5}"

# python_client VENV PACKAGE CHECK LABEL: a venv of its own with PACKAGE, checked by running CHECK in it.
python_client() {
    local venv="$1" pkg="$2" check="$3" label="$4"
    local stamp="$venv/.installed-${pkg//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        local py
        py="$(find_python)"
        echo "==> creating $venv with $py and installing $pkg"
        [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
        echo '*' >"$venv/.gitignore"
        "$venv/bin/python" -m pip install --disable-pip-version-check -q "$pkg"
        # Loading the library is the real check: a missing shared library fails here, not in a test.
        "$venv/bin/python" -c "$check"
        touch "$stamp"
    fi
    echo "==> $label ready: $venv/bin/python"
}

# node_client DIR PACKAGE MODULE LABEL SKIP_VAR: DIR/package.json's dependencies installed into
# DIR/node_modules, checked by requiring MODULE.
node_client() {
    local dir="$1" pkg="$2" module="$3" label="$4" skip_var="$5"
    if ! command -v npm >/dev/null 2>&1; then
        echo "error: npm is required for $pkg (install Node.js 18 or newer, or set $skip_var=1)" >&2
        exit 1
    fi
    local stamp="$dir/node_modules/.installed-${pkg//[^a-z0-9.]/_}"
    if [ ! -f "$stamp" ]; then
        echo "==> installing $pkg into $dir/node_modules"
        (cd "$dir" && npm install --no-audit --no-fund --no-package-lock --loglevel=error)
        node -e 'require(process.argv[1])' "$PWD/$dir/node_modules/$module"
        touch "$stamp"
    fi
    echo "==> $label ready: $dir/node_modules/$module"
}

if [ "${SKIP_CPP:-0}" != 1 ]; then
    python_client "$REAL_VENV" "$CPP_PKG" 'import rocketmq.client as c; c.PushConsumer, c.Producer' "C++ client"
fi
if [ "${SKIP_JS:-0}" != 1 ]; then
    node_client interop/js "$JS_PKG" ali-ons "JS client" SKIP_JS
fi
if [ "${SKIP_PY5:-0}" != 1 ]; then
    python_client "$V5_VENV" "$PY5_PKG" 'from rocketmq import PushConsumer, SimpleConsumer, Producer' \
        "v5 Python client"
fi
if [ "${SKIP_JS5:-0}" != 1 ]; then
    node_client interop/js5 "$JS5_PKG" rocketmq-client-nodejs "v5 Node.js client" SKIP_JS5
fi
if [ "${SKIP_JAVA:-0}" != 1 ]; then
    bash scripts/setup_java_clients.sh || {
        echo "error: Apache's Java clients could not be built (set SKIP_JAVA=1 to go on without them)" >&2
        exit 1
    }
fi
if [ "${SKIP_GO:-0}" != 1 ]; then
    bash scripts/setup_go_client.sh || {
        echo "error: Apache's Go client could not be built (set SKIP_GO=1 to go on without it)" >&2
        exit 1
    }
fi
if [ "${SKIP_APACHE:-0}" != 1 ]; then
    bash scripts/setup_apache_engine.sh || {
        echo "error: Apache's broker could not be fetched (set SKIP_APACHE=1 to go on without it)" >&2
        exit 1
    }
fi
