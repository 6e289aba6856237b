#!/usr/bin/env bash
# mixed_load.sh KVMESH_BIN [SECS]
# Short chat requests (8 random words, concurrency 32) against `kvmesh up`, first alone and then
# while 4 connections send ~66 k-token prompts (200 000 characters of real text), both with the
# long-prompt bench's wrk script. Prints "short_p99_alone_ms short_p99_mixed_ms long_rps_mixed
# short_rps_alone short_rps_mixed". Extra `kvmesh up` flags come from KVMESH_UP_FLAGS. The short
# load first runs WARMUP seconds (default 60) unmeasured: a fresh process's first minute under
# load has latency spikes of its own while its engines' block pools and index fill.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LONG=$ROOT/../shared/bench/long-prompts
BIN=$1 D=${2:-10}
PORT=${PORT:-18431}
MODEL_DIR=${MODEL_DIR:-/tmp/kvmesh-tiny-128k}
[ -d "$MODEL_DIR" ] || python3 "$ROOT/scripts/make_long_context_model.py" "$MODEL_DIR" >/dev/null
[ -s /tmp/kvmesh-corpus.txt ] || python3 "$LONG/make_corpus.py" /tmp/kvmesh-corpus.txt
# shellcheck disable=SC2086
"$BIN" up --http-port "$PORT" --num-workers 2 --speedup-ratio 1000000 --model-path "$MODEL_DIR" \
  --model-name tiny ${KVMESH_UP_FLAGS:-} >/tmp/kvmesh-mixed.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" | grep -q tiny && break; sleep 0.5; done
url=http://127.0.0.1:$PORT/v1/chat/completions
short() { MODEL=tiny WORDS=8 CHARS=0 MAXTOK=16 wrk -t1 -c32 -d"$1" -s "$LONG/wrk_chat.lua" "$url" | grep RESULT; }
long() { ${LONG_WRAP:-} env MODEL=tiny WORDS=0 CHARS=200000 MAXTOK=16 wrk -t1 -c4 -d"$1" -s "$LONG/wrk_chat.lua" "$url" | grep RESULT; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
rps() { python3 -c "print(f'{($(field req "$1") - $(field errors "$1")) / $(field secs "$1"):.1f}')"; }
short "${WARMUP:-60}s" >/dev/null
alone=$(short "${D}s")
long "$((D + 2))s" >/tmp/kvmesh-mixed-long.txt &
lp=$!
sleep 1
mixed=$(short "${D}s")
wait $lp
longres=$(cat /tmp/kvmesh-mixed-long.txt)
echo "$(field p99_ms "$alone") $(field p99_ms "$mixed") $(rps "$longres") $(rps "$alone") $(rps "$mixed")"
