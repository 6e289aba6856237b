#!/usr/bin/env bash
# short_load_runs.sh KVMESH_BIN [RUNS] [SECS] [kvmesh up flags...]
# Successive short-prompt loads (8 random words, concurrency 32, the long-prompt bench's wrk
# script) on one fresh `kvmesh up`, printing each run's p99 and the process's RSS after it: how a
# fresh process behaves while its caches fill (docs/benchmarks.md, "eighth round").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LONG=$ROOT/../shared/bench/long-prompts
BIN=$1 RUNS=${2:-5} D=${3:-12}
shift $(($# < 3 ? $# : 3))
PORT=${PORT:-18441}
MODEL_DIR=${MODEL_DIR:-/tmp/kvmesh-tiny-128k}
[ -d "$MODEL_DIR" ] || python3 "$ROOT/scripts/make_long_context_model.py" "$MODEL_DIR" >/dev/null
"$BIN" up --http-port "$PORT" --num-workers 2 --speedup-ratio 1000000 --model-path "$MODEL_DIR" \
  --model-name tiny "$@" >/tmp/kvmesh-short-runs.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" | grep -q tiny && break; sleep 0.5; done
for run in $(seq 1 "$RUNS"); do
  res=$(MODEL=tiny WORDS=8 CHARS=0 MAXTOK=16 wrk -t1 -c32 -d"${D}s" -s "$LONG/wrk_chat.lua" \
    "http://127.0.0.1:$PORT/v1/chat/completions" | grep RESULT)
  rss=$(($(awk '/VmRSS/{print $2}' "/proc/$pid/status") / 1024))
  echo "run $run: $(sed -n 's/.*\(p99_ms=[0-9.]*\).*/\1/p' <<<"$res") $(sed -n 's/.*\(req=[0-9]*\).*/\1/p' <<<"$res") rss_mb=$rss"
done
