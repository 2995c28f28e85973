# Shared by the scripts: find Python 3.11+, create .venv and install the project into it.
# shellcheck shell=bash
VENV="${VENV:-.venv}"
export MPLCONFIGDIR="${MPLCONFIGDIR:-${TMPDIR:-/tmp}/rmqlab-mpl}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

find_python() {
    for py in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            echo "$py"
            return 0
        fi
    done
    echo "error: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

ensure_venv() {
    local extras="$1"
    local stamp="$VENV/.installed-$(echo "$extras" | tr -c 'a-z' '_')"
    if [ ! -x "$VENV/bin/python" ]; then
        local py
        py="$(find_python)"
        echo "==> creating $VENV with $py"
        "$py" -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "==> installing the project with $extras (first time: a few minutes, pyspark is large)"
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$extras"
        touch "$stamp"
    fi
}
