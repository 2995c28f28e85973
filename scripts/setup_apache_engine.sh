#!/usr/bin/env bash
# Fetch Apache RocketMQ's name server and broker (with their dependencies) for the lab's "apache-*"
# engines, one class-path folder per version:
#   .cache/apache/<version>/lib/   every runtime jar of rocketmq-namesrv and rocketmq-broker <version>
# The versions are those of interop/apache/engine.py's ENGINES: 4.9.7 (the newest 4.9 whose broker and
# name server Maven Central serves) and 5.5.0 (the newest 5.x whose whole closure it serves).
# Idempotent: a stamp per version records the pom it was made from; nothing is fetched while it matches.
# APACHE_VERSIONS="4.9.7" limits the run to some versions; MAVEN_OPTS and ~/.m2/settings.xml apply as
# for any Maven build (MAVEN_REPO_LOCAL sets the local repository).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSIONS="${APACHE_VERSIONS:-4.9.7 5.5.0}"
POM=interop/apache/pom.xml
CACHE=.cache/apache

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "error: $1 is required ($2)" >&2
        exit 1
    fi
}
need java "a JDK 17 or newer runs the engines"
need mvn "Maven 3.6 or newer fetches the jars"

# has_class DIR PATH: whether a jar in DIR holds PATH.
has_class() {
    local jar
    for jar in "$1"/*.jar; do
        if unzip -l "$jar" "$2" >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

pom_sum="$(sha256sum "$POM" | cut -d' ' -f1)"
mvn_args=(-B -q -f "$POM")
if [ -n "${MAVEN_REPO_LOCAL:-}" ]; then
    mvn_args+=("-Dmaven.repo.local=$MAVEN_REPO_LOCAL")
fi

for version in $VERSIONS; do
    dir="$CACHE/$version"
    stamp="$dir/.complete"
    want="$version $pom_sum"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dir/lib" ]; then
        echo "==> Apache RocketMQ $version ready: $dir/lib ($(find "$dir/lib" -name '*.jar' | wc -l) jars)"
        continue
    fi
    echo "==> fetching Apache RocketMQ $version (rocketmq-namesrv, rocketmq-broker and their dependencies)"
    mkdir -p "$dir"
    rm -rf "$dir/lib.partial" "$stamp"
    if ! nice mvn "${mvn_args[@]}" "-Drocketmq.version=$version" "-Dlib.dir=$PWD/$dir/lib.partial" \
        process-resources >"$dir/maven.log" 2>&1; then
        cat "$dir/maven.log" >&2
        echo "error: Maven could not fetch Apache RocketMQ $version (log: $dir/maven.log)" >&2
        exit 1
    fi
    # Both entry points must be on the class path; a half-resolved closure fails here, not in a test.
    for cls in org.apache.rocketmq.namesrv.NamesrvStartup org.apache.rocketmq.broker.BrokerStartup; do
        if ! has_class "$dir/lib.partial" "${cls//.//}.class"; then
            echo "error: $cls is in none of the jars fetched for $version" >&2
            exit 1
        fi
    done
    rm -rf "$dir/lib"
    mv "$dir/lib.partial" "$dir/lib"
    echo "$want" >"$stamp"
    echo "==> Apache RocketMQ $version ready: $dir/lib ($(find "$dir/lib" -name '*.jar' | wc -l) jars)"
done
