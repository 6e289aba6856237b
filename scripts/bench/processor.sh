#!/usr/bin/env bash
# Throughput of the processor host: streaming chat through a pass-through Python processor
# (tests/python/processors/seed_processor.py: the model's chat template, its tokenizer.json,
# detokenized chunks) against the built-in Rust path of the same frontend.
#
# Usage: scripts/bench/processor.sh [BIN_DIR]        (default target/release)
# Env:   DURATION=10 WARMUP=3 CONCURRENCY=64 THREADS=2 MAX_TOKENS=16 PYTHON=.venv/bin/python
#        MODES="builtin one two"   (builtin: no processor; one: one host; two: two hosts)
#
# The mesh: a private nats-server, file discovery in a temporary directory, two kvmesh-mocker
# workers at speed-up 1e6, kvmesh-frontend with --spawn-processor-host false and the hosts started
# here (so their PIDs are known). Client: wrk with scripts/bench/chat.lua (streaming, keep-alive,
# ignore_eos, ~31-token prompts). CPU is utime+stime from /proc/PID/stat over the measured
# window: each host, the frontend, the workers. Requests per host come from the frontend's
# kvmesh_processor_requests_total series. Prints one JSON line per mode.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${1:-$REPO/target/release}
DURATION=${DURATION:-10}; WARMUP=${WARMUP:-3}; CONCURRENCY=${CONCURRENCY:-64}; THREADS=${THREADS:-2}
MAX_TOKENS=${MAX_TOKENS:-16}; MODES=${MODES:-"builtin one two"}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
TCK=$(getconf CLK_TCK)
WORK=$(mktemp -d /tmp/kvmesh-processor-bench.XXXXXX)
PIDS=()

log() { echo "[bench] $*" >&2; }
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() {   # utime+stime of the given PIDs
  local t=0 p f a
  for p in "$@"; do
    f=$(cat /proc/$p/stat 2>/dev/null) || continue
    f=${f##*) }; read -ra a <<< "$f"; t=$((t + a[11] + a[12]))
  done
  echo $t
}
for tool in wrk nats-server curl; do command -v $tool >/dev/null || { log "$tool not found"; exit 1; }; done
[ -x "$PYTHON" ] || { log "no Python with the test requirements at $PYTHON (scripts/test.sh makes .venv)"; exit 1; }

NATS_PORT=$(free_port)
nats-server -js -sd "$WORK/nats" -a 127.0.0.1 -p "$NATS_PORT" > "$WORK/nats.log" 2>&1 & PIDS+=($!)
export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=$WORK/kv NATS_SERVER=nats://127.0.0.1:$NATS_PORT
export VIRTUAL_ENV=$("$PYTHON" -c 'import sys; print(sys.prefix)') PYTHONPATH=$REPO/tests/python/processors
export DYN_NAMESPACE=bench RUST_LOG=warn
sleep 0.5

MOCKERS=()
for i in 1 2; do
  "$BIN/kvmesh-mocker" --model-path "$REPO/models/tiny" --model-name tiny --endpoint dyn://bench.backend.generate \
    --speedup-ratio 1000000 --tcp-rpc-port "$(free_port)" > "$WORK/mocker$i.log" 2>&1 & PIDS+=($!); MOCKERS+=($!)
done

run_mode() {   # mode: builtin | one | two
  local mode=$1 hosts=() host_ports=() processor=seed_processor:provider n=0
  case $mode in builtin) processor=dynamo ;; one) n=1 ;; two) n=2 ;; esac
  for i in $(seq 1 $n); do
    host_ports+=("$(free_port)")
    "$BIN/kvmesh-processor-host" --dyn-chat-processor "$processor" --tcp-rpc-port "${host_ports[-1]}" \
      > "$WORK/host-$mode-$i.log" 2>&1 & PIDS+=($!); hosts+=($!)
  done
  local port; port=$(free_port)
  "$BIN/kvmesh-frontend" --http-host 127.0.0.1 --http-port "$port" --dyn-chat-processor "$processor" \
    --spawn-processor-host false > "$WORK/frontend-$mode.log" 2>&1 & local frontend=$!; PIDS+=($frontend)
  local url=http://127.0.0.1:$port/v1/chat/completions ready=0
  local body='{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
  for _ in $(seq 1 240); do
    local ok=0
    for _ in 1 2 3 4; do   # four in a row: every host built its engine
      [ "$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$url" -H 'content-type: application/json' -d "$body")" = 200 ] && ok=$((ok + 1))
    done
    [ $ok = 4 ] && { ready=1; break; }
    sleep 0.25
  done
  [ $ready = 1 ] || { log "$mode: not serving; see $WORK"; return 1; }
  export BENCH_STREAM=1 BENCH_MAX_TOKENS=$MAX_TOKENS
  wrk -t"$THREADS" -c"$CONCURRENCY" -d"${WARMUP}s" -s "$HERE/chat.lua" "$url" > /dev/null 2>&1
  local metrics_before; metrics_before=$(curl -s "http://127.0.0.1:$port/metrics")
  local host_ticks=() frontend_ticks mocker_ticks h
  for h in "${hosts[@]}"; do host_ticks+=("$(ticks "$h")"); done
  frontend_ticks=$(ticks "$frontend"); mocker_ticks=$(ticks "${MOCKERS[@]}")
  local out; out=$(wrk -t"$THREADS" -c"$CONCURRENCY" -d"${DURATION}s" -s "$HERE/chat.lua" "$url" 2>&1)
  local host_after=()
  for h in "${hosts[@]}"; do host_after+=("$(ticks "$h")"); done
  local frontend_after mocker_after metrics_after
  frontend_after=$(ticks "$frontend"); mocker_after=$(ticks "${MOCKERS[@]}")
  metrics_after=$(curl -s "http://127.0.0.1:$port/metrics")
  MODE=$mode OUT=$out TCK=$TCK HOST_PORTS="${host_ports[*]}" HOSTS_BEFORE="${host_ticks[*]}" HOSTS_AFTER="${host_after[*]}" \
  FRONTEND="$frontend_ticks $frontend_after" MOCKERS="$mocker_ticks $mocker_after" \
  METRICS_BEFORE=$metrics_before METRICS_AFTER=$metrics_after python3 - <<'PY'
import json, os, re
out = os.environ["OUT"]
requests = int(re.search(r"(\d+) requests in", out).group(1))
secs = float(re.search(r"requests in ([\d.]+)s", out).group(1))
errors = sum(int(n) for n in re.findall(r"(?:Non-2xx or 3xx responses|Socket errors:.*?timeout) (\d+)", out))
tck = int(os.environ["TCK"])
ms = lambda before, after: (int(after) - int(before)) / tck * 1000 / max(requests, 1)
served = lambda text: {m[0]: float(m[1]) for m in re.findall(
    r'^kvmesh_processor_requests_total\{processor_host="[^"]*:(\d+)"\} (\S+)$', text, re.M)}
before, after = served(os.environ["METRICS_BEFORE"]), served(os.environ["METRICS_AFTER"])
ports = os.environ["HOST_PORTS"].split()
per_host = [int(after.get(p, 0) - before.get(p, 0)) for p in ports]
hosts = list(zip(os.environ["HOSTS_BEFORE"].split(), os.environ["HOSTS_AFTER"].split()))
host_cpu = [(int(a) - int(b)) / tck * 1000 for b, a in hosts]
result = {
    "mode": os.environ["MODE"], "rps": round(requests / secs, 1), "errors": errors,
    "frontend_cpu_ms_per_req": round(ms(*os.environ["FRONTEND"].split()), 3),
    "workers_cpu_ms_per_req": round(ms(*os.environ["MOCKERS"].split()), 3),
    "host_cpu_ms_per_req": [round(c / max(n, 1), 3) for c, n in zip(host_cpu, per_host)],
    "host_requests": per_host, "host_rps": [round(n / secs, 1) for n in per_host],
}
print(json.dumps(result))
PY
  kill "$frontend" "${hosts[@]}" 2>/dev/null; wait "$frontend" "${hosts[@]}" 2>/dev/null
}

for mode in $MODES; do run_mode "$mode"; done
