#!/usr/bin/env bash
# The lab's driver for Apache's Java RocketMQ clients: runs the JVM of the client --kind names, in this
# process (exec: the lab's signals reach the JVM itself).
#
#   interop/java/consumer.sh --kind java|java5|java-lite --namesrv HOST:PORT --group G --topic T [options]
#   interop/java/consumer.sh --kind java-grpc --endpoints HOST:PORT --group G --topic T [options]
#   interop/java/consumer.sh --kind KIND --help
#
# The class path folders are built by scripts/setup_java_clients.sh into <checkout>/.cache/java/lib
# (RMQLAB_JAVA_LIB names another). JAVA_OPTS replaces the JVM options below (a small consumer: about
# 100-150 MB resident); JAVA_OPTS_EXTRA adds to them; JAVA names the java to run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="${RMQLAB_JAVA_LIB:-$here/../../.cache/java/lib}"

kind=java
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --kind) kind="${args[i + 1]:-}" ;;
        --kind=*) kind="${args[i]#--kind=}" ;;
    esac
done
case "$kind" in
    java | java-lite) module=client4 main=rmqlab.interop.remoting.Main ;;
    java5) module=client5 main=rmqlab.interop.remoting.Main ;;
    java-grpc) module=grpc main=rmqlab.interop.grpc.Main ;;
    *)
        echo "consumer.sh: unknown --kind '$kind' (java, java5, java-lite or java-grpc)" >&2
        exit 2
        ;;
esac
if [ ! -d "$lib/$module" ]; then
    echo "consumer.sh: no $lib/$module: run scripts/setup_java_clients.sh first" >&2
    exit 2
fi

# Small heap, one GC thread, the client compiler only, small thread stacks, bounded metaspace and direct
# memory (Netty). The client's threads (consume, pull, rebalance, Netty) still cost most of the rest.
default_opts=(
    -Xms8m -Xmx64m -Xss256k
    -XX:+UseSerialGC
    -XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:ReservedCodeCacheSize=32m
    -XX:MaxMetaspaceSize=96m -XX:CompressedClassSpaceSize=32m
    -XX:MaxDirectMemorySize=32m
    -XX:+ExitOnOutOfMemoryError
    -Dio.netty.allocator.numDirectArenas=1 -Dio.netty.allocator.numHeapArenas=1
)
# shellcheck disable=SC2206  # JAVA_OPTS is a list of words
opts=(${JAVA_OPTS:-${default_opts[*]}} ${JAVA_OPTS_EXTRA:-})
exec "${JAVA:-java}" "${opts[@]}" -cp "$lib/$module/*" "$main" "$@"
