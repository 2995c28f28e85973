#!/usr/bin/env bash
# Build the lab's image (rocketmq-rebalance-lab:latest) on any machine with a Docker engine, offline.
#
#   bash scripts/docker/build_image.sh [--base IMAGE] [--tag NAME]
#
# The tag is --tag, else $RMQ_IMAGE (which `python -m rmqlab.chaos.container check`, the container
# tests and the compose file read too: a checkout of its own on a shared engine), else
# rocketmq-rebalance-lab:latest.
#
# The base is --base (or $RMQ_BASE_IMAGE), else python:3.11-slim when it is present or can be pulled,
# else a Debian bookworm built here by scripts/docker/base_image.sh (no registry needed). The package's
# dependencies and build backend are built as wheels on this machine (wheels/) and installed in the
# image without an index; the package itself is built in the image from the sources it copies. The image is labelled with the checkout's source digest, which `rmq-chaos run --backend
# docker` compares with its own before it starts.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/_env.sh
source scripts/docker/engine.sh
base="${RMQ_BASE_IMAGE:-}"
tag="${RMQ_IMAGE:-rocketmq-rebalance-lab:latest}"
while [ $# -gt 0 ]; do
    case "$1" in
    --base) base="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    *) echo "usage: $0 [--base IMAGE] [--tag NAME]" >&2; exit 2 ;;
    esac
done
ensure_engine
# A venv that already has the package (scripts/test.sh's, whose tests may be running now) is left alone.
"$VENV/bin/python" -c 'import rmqlab.chaos.container' >/dev/null 2>&1 || ensure_venv '.'
start=$(date +%s)
if [ -z "$base" ]; then
    if docker image inspect python:3.11-slim >/dev/null 2>&1 ||
        timeout 30 docker pull -q python:3.11-slim >/dev/null 2>&1; then
        base=python:3.11-slim
    else
        echo "==> no registry reachable for python:3.11-slim: a Debian base built from packages instead"
        bash scripts/docker/base_image.sh rmqlab-base:bookworm
        base=rmqlab-base:bookworm
    fi
fi
echo "==> wheels of the package's dependencies and build backend (wheels/)"
rm -rf wheels
"$VENV/bin/python" -m pip wheel --disable-pip-version-check -q . 'setuptools>=77' wheel -w wheels
# The image builds the package from the sources its Dockerfile copies, not from a wheel of this tree.
rm -rf build ./*.egg-info wheels/rocketmq_rebalance_lab-*.whl
digest="$("$VENV/bin/python" -m rmqlab.chaos.container digest)"
echo "==> docker build -t $tag (base $base, sources ${digest:0:12})"
previous="$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
docker build -q --build-arg BASE_IMAGE="$base" --build-arg SOURCE_DIGEST="$digest" -t "$tag" . >/dev/null
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true # the build it replaces, unless a container uses it
fi
size="$(docker image inspect --format '{{.Size}}' "$tag")"
echo "==> $tag built in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB (base $base)"
