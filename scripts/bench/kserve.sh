#!/usr/bin/env bash
# kserve.sh KVMESH_BIN [SECS]
# The KServe edge's two figures (docs/benchmarks.md, "KServe gRPC edge"):
# 1. unary ModelInfer against /v1/completions of the same `kvmesh up` (speed-up 1e6 mock workers,
#    concurrency 64, 16 output tokens), phases alternating three times, server CPU per request:
#    first with the gRPC callers multiplexed on one HTTP/2 connection (a gRPC channel, the way
#    gRPC clients call), then with each caller on its own connection (as HTTP/1.1 needs);
# 2. one ModelStreamInfer stream with 64 streaming requests in flight on a real-time mock engine
#    (32 output tokens, about 200 ms a request alone), against one request alone.
# The server runs on CPU ${SERVER_CPUS:-0} and the load generator on CPU ${CLIENT_CPUS:-1} (taskset),
# so the gRPC client's own cost (about twice the HTTP/1.1 client's per request) does not take CPU
# from the server it measures; SERVER_CPUS= CLIENT_CPUS= (empty) lets both float.
# Prints the two JSON reports of `kvmesh bench kserve`.
set -euo pipefail
BIN=$1 D=${2:-5}
SERVER_CPUS=${SERVER_CPUS-0} CLIENT_CPUS=${CLIENT_CPUS-1}
HTTP=${PORT:-18451} GRPC=$((${PORT:-18451} + 1))
log=/tmp/kvmesh-kserve-bench.log
pid=
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT
up() {
  ${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} "$BIN" up --http-host 127.0.0.1 --http-port "$HTTP" --kserve-grpc-port "$GRPC" --num-workers 2 \
    --speedup-ratio "$1" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$HTTP/health" >/dev/null && return; sleep 0.5; done
  echo "kvmesh up did not become healthy; see $log" >&2; exit 1
}
up 1000000
"$BIN" bench kserve --grpc "127.0.0.1:$GRPC" --http "127.0.0.1:$HTTP" --concurrency 64 --max-tokens 16 \
  --duration 1 --rounds 1 >/dev/null
for connections in 1 0; do
  ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} "$BIN" bench kserve --grpc "127.0.0.1:$GRPC" \
    --http "127.0.0.1:$HTTP" --concurrency 64 --max-tokens 16 --grpc-connections "$connections" --duration "$D" --rounds 3 --server-pid "$pid"
done
stop
up 1
"$BIN" bench kserve --grpc "127.0.0.1:$GRPC" --stream --concurrency 64 --max-tokens 32 --rounds 5
