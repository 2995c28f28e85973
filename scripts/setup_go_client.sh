#!/usr/bin/env bash
# Build the lab's driver for Apache's Go client (interop/go; github.com/apache/rocketmq-client-go/v2 pinned in
# its go.mod and go.sum) into
#   .cache/go/rocketmq-go-consumer
# Idempotent: a stamp records the Go version and a hash of the driver's sources; nothing is built while
# it matches. The modules come through the Go module proxy (GOPROXY) into Go's module cache.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
    echo "error: go is required to build the Go client's driver (Go 1.22 or newer)" >&2
    exit 1
fi
OUT=.cache/go
BIN="$OUT/rocketmq-go-consumer"
want="$(go version) $(cat interop/go/go.mod interop/go/go.sum interop/go/*.go | sha256sum | cut -d' ' -f1)"
if [ -x "$BIN" ] && [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$want" ]; then
    echo "==> Go client driver ready: $BIN"
    exit 0
fi
echo "==> building the Go client driver (rocketmq-client-go $(sed -n 's#^require github.com/apache/rocketmq-client-go/v2 ##p' interop/go/go.mod))"
mkdir -p "$OUT"
rm -f "$OUT/.stamp"
# -mod=readonly: the pinned versions and their checksums exactly as committed.
(cd interop/go && nice go build -trimpath -mod=readonly -o "../../$BIN.partial" .)
mv "$BIN.partial" "$BIN"
echo "$want" >"$OUT/.stamp"
echo "==> Go client driver ready: $BIN"
