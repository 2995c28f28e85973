# Sourced by the docker scripts: make sure a Docker engine answers, or say exactly why not.
# shellcheck shell=bash
#
# ensure_engine: `docker info` must work. Where it does not and we are root, install Debian's engine
# (docker.io, docker-compose, iptables, debootstrap) when it is missing and start dockerd in the
# background (its log in .cache/docker/dockerd.log). With no way to get an engine it fails: CI must
# not pass without having run the container tests.

engine_problem() {
    local err
    if ! command -v docker >/dev/null 2>&1; then
        echo "the docker command is not installed"
        return 0
    fi
    if err="$(docker info --format '{{.ServerVersion}}' 2>&1 >/dev/null)"; then
        return 1
    fi
    case "$err" in
    *"permission denied"*) echo "no permission to use the Docker engine's socket (join the docker group, or run as root)" ;;
    *) echo "the Docker engine does not answer: ${err%%$'\n'*}" ;;
    esac
}

ensure_engine() {
    local problem
    problem="$(engine_problem)" || return 0
    if [ "$(id -u)" != 0 ]; then
        echo "error: $problem; start a Docker engine (or run as root to let this script install and start one)" >&2
        return 1
    fi
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1 ||
        ! command -v debootstrap >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "error: $problem, and this is not a Debian-like system where the engine could be installed" >&2
            return 1
        fi
        echo "==> installing a Docker engine (docker.io, docker-compose, iptables, debootstrap)"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                docker.io docker-compose iptables debootstrap >/dev/null || {
            echo "error: could not install a Docker engine with apt-get" >&2
            return 1
        }
    fi
    if ! engine_problem >/dev/null; then
        return 0
    fi
    mkdir -p .cache/docker
    echo "==> starting dockerd in the background (log: .cache/docker/dockerd.log)"
    nohup dockerd >.cache/docker/dockerd.log 2>&1 &
    local i
    for i in $(seq 1 60); do
        if ! engine_problem >/dev/null; then
            return 0
        fi
        sleep 1
    done
    echo "error: dockerd did not answer within 60 s: $(engine_problem); see .cache/docker/dockerd.log" >&2
    return 1
}
