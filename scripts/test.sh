#!/usr/bin/env bash
# Set up a virtual environment (once) and run the linter and the whole test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/protocol -x`.
#
# The container tests (tests/docker, part of the whole suite) need a Docker engine and the lab's image:
# when they are to run, this script makes sure an engine answers (installing and starting Debian's as
# root where there is none) and that the image is built from this checkout (in the background, while the
# other tests run), and fails when it cannot.
# RMQ_DOCKER=off skips all of that (and those tests) on a machine without an engine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
ensure_venv '.[dev,docs,pipeline,v5]'
# The pages' browser tests drive headless Chromium (Debian's) through playwright.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing headless Chromium for the browser tests"
    apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
fi
echo "==> real RocketMQ clients for the interop tests (their own environments)"
bash scripts/setup_real_clients.sh
# Whether the container tests are among those to run: pytest's options (e.g. -x, --durations=20) run the
# whole suite; paths run the container tests only when one of them is tests/ or under tests/docker.
wants_docker() {
    local a paths=0
    for a in "$@"; do
        case "$a" in
        -*) ;;
        tests | tests/ | tests/docker*) return 0 ;;
        *) paths=1 ;;
        esac
    done
    [ "$paths" = 0 ]
}
if [ "${RMQ_DOCKER:-}" != off ] && wants_docker "$@"; then
    source scripts/docker/engine.sh
    ensure_engine
    if ! "$VENV/bin/python" -m rmqlab.chaos.container check >/dev/null 2>&1; then
        # The image builds beside the tests that need none; the container tests wait for it
        # (tests/docker/conftest.py reads the status file) and fail with its log if it failed.
        mkdir -p .cache/docker
        export RMQ_IMAGE_BUILD="$PWD/.cache/docker/image-build"
        rm -f "$RMQ_IMAGE_BUILD.status"
        echo "==> building the image in the background (log: $RMQ_IMAGE_BUILD.log)"
        (
            set +e
            nice bash scripts/docker/build_image.sh >"$RMQ_IMAGE_BUILD.log" 2>&1
            echo $? >"$RMQ_IMAGE_BUILD.status"
        ) &
        build=$!
        trap 'kill "$build" 2>/dev/null || true' EXIT
    fi
fi
echo "==> ruff"
"$VENV/bin/ruff" check .
echo "==> pytest"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
