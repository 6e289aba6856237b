#!/usr/bin/env bash
# agent_turn_cost.sh KVMESH_BIN [SECS]
# What tokenizing and block-hashing an agent conversation's turns cost with the prefix caches and
# without them: one connection re-sends a growing conversation (the long-prompt bench's
# TURN_CHARS=1500 mode: 1 500-char user turns, 400-char replies, history up to 200 000 chars) to
# `kvmesh up --router-mode kv --tokenizer fastokens`, once with the caches on and once with
# `--tokenizer-cache-mb 0 --router-block-hash-cache-mb 0`. Reads the time from /metrics
# (tokenizer_latency_ms{operation="tokenize"} and stage_duration_seconds{stage="hash"}) and prints
# "cached_ms_per_turn uncached_ms_per_turn ratio".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LONG=$ROOT/../shared/bench/long-prompts
BIN=$1 D=${2:-20}
PORT=${PORT:-18432}
MODEL_DIR=${MODEL_DIR:-/tmp/kvmesh-tiny-128k}
[ -d "$MODEL_DIR" ] || python3 "$ROOT/scripts/make_long_context_model.py" "$MODEL_DIR" >/dev/null
[ -s /tmp/kvmesh-corpus.txt ] || python3 "$LONG/make_corpus.py" /tmp/kvmesh-corpus.txt
per_turn() { # extra flags... -> ms of tokenize + hash per request
  "$BIN" up --http-port "$PORT" --num-workers 2 --speedup-ratio 1000000 --model-path "$MODEL_DIR" \
    --model-name tiny --router-mode kv --tokenizer fastokens "$@" >/tmp/kvmesh-agent.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" | grep -q tiny && break; sleep 0.5; done
  MODEL=tiny TURN_CHARS=1500 WORDS=0 MAXTOK=16 wrk -t1 -c1 -d"${D}s" -s "$LONG/wrk_chat.lua" \
    "http://127.0.0.1:$PORT/v1/chat/completions" >/dev/null
  curl -sf "http://127.0.0.1:$PORT/metrics" | python3 -c '
import re, sys
text = sys.stdin.read()
def value(name, label):
    m = re.search(r"^dynamo_frontend_" + name + r"\{" + label + r"\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0
tokenize_ms = value("tokenizer_latency_ms_sum", "operation=\"tokenize\"")
hash_ms = value("stage_duration_seconds_sum", "stage=\"hash\"") * 1000
turns = value("stage_duration_seconds_count", "stage=\"first_token\"")
print(f"{(tokenize_ms + hash_ms) / max(turns, 1):.4f}")'
  kill $pid; wait $pid 2>/dev/null || true
}
cached=$(per_turn)
uncached=$(per_turn --tokenizer-cache-mb 0 --router-block-hash-cache-mb 0)
python3 -c "print(f'$cached $uncached {$cached / $uncached:.3f}')"
