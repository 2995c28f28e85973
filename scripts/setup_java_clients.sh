#!/usr/bin/env bash
# Build Apache's Java RocketMQ clients for the lab (the drivers of interop/java, run by
# interop/java/consumer.sh), from Maven Central, into one class path folder per client:
#   .cache/java/lib/client4/  rocketmq-client 4.9.8       (kinds java, java-lite)
#   .cache/java/lib/client5/  rocketmq-client 5.5.0       (kind java5)
#   .cache/java/lib/grpc/     rocketmq-client-java 5.2.0  (kind java-grpc, through rmq-proxy)
# Needs java (11 or newer) and mvn; Maven keeps what it downloads in its own cache (~/.m2).
# Idempotent: a stamp over the poms, the sources and this script skips the build when nothing changed.
# MAVEN_ARGS adds options to the mvn command line (e.g. -o to build offline from ~/.m2).
set -euo pipefail
cd "$(dirname "$0")/.."

SRC=interop/java
CACHE=.cache/java
MODULES=(client4 client5 grpc)

for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: $tool is required for the Java clients (install a JDK 11+ and Maven 3.6+)" >&2
        exit 1
    fi
done

stamp_of_sources() {
    # Contents and paths relative to the checkout: the same wherever the checkout is.
    find "$SRC" -type f \( -name pom.xml -o -name '*.java' \) | LC_ALL=C sort |
        while read -r f; do
            echo "$f"
            cat "$f"
        done | cat - scripts/setup_java_clients.sh | sha256sum | cut -d' ' -f1
}

up_to_date() {
    [ -f "$CACHE/lib/.stamp" ] && [ "$(cat "$CACHE/lib/.stamp")" = "$1" ] || return 1
    for m in "${MODULES[@]}"; do
        [ -f "$CACHE/lib/$m/$m-1.jar" ] || return 1
    done
}

mkdir -p "$CACHE"
stamp="$(stamp_of_sources)"
if up_to_date "$stamp"; then
    echo "==> Java clients up to date: $CACHE/lib"
    exit 0
fi
# One build at a time (two test sessions may start together); the second finds it done.
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if up_to_date "$stamp"; then
    echo "==> Java clients up to date: $CACHE/lib"
    exit 0
fi

echo "==> building the Java clients into $CACHE/lib (first time: Maven downloads ~120 MB)"
staging="$CACHE/staging"
rm -rf "$staging"
# Quiet but for errors (and without the bare colour resets some Maven builds print even so).
# shellcheck disable=SC2086  # MAVEN_ARGS is a list of words
mvn -B -q -f "$SRC/pom.xml" package -Dlab.cache="$PWD/$staging" ${MAVEN_ARGS:-} 2>&1 | sed 's/\x1b\[0m//g'
for m in "${MODULES[@]}"; do
    if [ ! -f "$staging/lib/$m/$m-1.jar" ]; then
        echo "error: the build made no $staging/lib/$m/$m-1.jar" >&2
        exit 1
    fi
done
rm -rf "$CACHE/lib"
mv "$staging/lib" "$CACHE/lib"
rm -rf "$staging"
echo "$stamp" >"$CACHE/lib/.stamp"
# Loading the drivers is the real check: a missing class fails here, not in a test.
for kind in java java5 java-grpc; do
    "$SRC/consumer.sh" --kind "$kind" --help >/dev/null
done
echo "==> Java clients ready: $CACHE/lib (${MODULES[*]})"
