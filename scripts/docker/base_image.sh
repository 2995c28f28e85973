#!/usr/bin/env bash
# Build the lab's base image from Debian's own packages, for machines that cannot pull from a container
# registry: debootstrap a minimal bookworm with python3 and python3-venv, then `docker import` it.
#
#   bash scripts/docker/base_image.sh [IMAGE]        # default rmqlab-base:bookworm
#
# The root file system is kept as a tarball outside the checkout ($RMQ_CACHE_DIR, by default
# ~/.cache/rocketmq-rebalance-lab), so a fresh engine on the same machine, or a fresh clone (as CI
# makes), only imports it instead of spending two minutes in debootstrap. The Debian mirror is the one this machine's apt uses, when it can
# be read from its sources; otherwise debootstrap's own default.
set -euo pipefail
cd "$(dirname "$0")/../.."
image="${1:-rmqlab-base:bookworm}"
suite="${RMQ_BASE_SUITE:-bookworm}"
cache="${RMQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rocketmq-rebalance-lab}/base-$suite.tar"

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "==> base image $image is present"
    exit 0
fi
if [ ! -s "$cache" ]; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "error: debootstrap is not installed (apt-get install debootstrap), and no base image $image exists" >&2
        exit 2
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "error: debootstrap needs root to build the base image $image" >&2
        exit 2
    fi
    mirror=""
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
        [ -f "$f" ] || continue
        mirror="$(sed -n -E 's/^URIs:[[:space:]]*([^[:space:]]+\/debian)$/\1/p; s/^deb[[:space:]]+([^[:space:]]+\/debian)[[:space:]]+.*/\1/p' "$f" | head -n 1)"
        [ -n "$mirror" ] && break
    done
    root="$(mktemp -d "${TMPDIR:-/tmp}/rmqlab-base.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    echo "==> debootstrap $suite (minbase + python3, python3-venv, ca-certificates) into $root; about 2 minutes"
    start=$(date +%s)
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$suite" "$root" ${mirror:+"$mirror"} >"$root.log" 2>&1 || {
        tail -n 20 "$root.log" >&2
        echo "error: debootstrap failed (full log: $root.log)" >&2
        exit 1
    }
    rm -f "$root.log"
    # What a container never needs: package lists and caches, documentation, locales.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/*
    mkdir -p "$(dirname "$cache")"
    tar --numeric-owner -C "$root" -cf "$cache.tmp" .
    mv "$cache.tmp" "$cache"
    echo "==> root file system built in $(( $(date +%s) - start )) s: $cache ($(du -h "$cache" | cut -f1))"
fi
docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' "$cache" "$image" >/dev/null
echo "==> base image $image imported from $cache"
