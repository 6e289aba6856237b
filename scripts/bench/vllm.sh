#!/usr/bin/env bash
# vLLM behind kvmesh against vLLM's own OpenAI server: the same tiny random-weight model
# (kvmesh_vllm.tiny_model, models/tiny's tokenizer), the same engine arguments, the same machine,
# the same client (scripts/bench/vllm_load.py: closed-loop streaming chat, ignore_eos).
#
#   vllm-openai   python -m vllm.entrypoints.openai.api_server (vLLM's own HTTP server)
#   kvmesh        kvmesh-frontend --router-mode kv + one kvmesh-vllm-worker (etcd, NATS)
#
# Usage: scripts/bench/vllm.sh [BIN_DIR]     (default target/release)
# Env:   VLLM_VENV=.venv-vllm  CONCURRENCY="1 4 8"  DURATION=30 WARMUP=5 MAX_TOKENS=32
#        PROMPT_WORDS=100  CLIENT_PYTHON=.venv/bin/python (needs the openai package)
# Needs etcd and nats-server on PATH (started here on private ports).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${1:-$REPO/target/release}
VLLM_VENV=${VLLM_VENV:-$REPO/.venv-vllm}
CLIENT_PYTHON=${CLIENT_PYTHON:-$REPO/.venv/bin/python}
CONCURRENCY=${CONCURRENCY:-"1 4 8"}; DURATION=${DURATION:-30}; WARMUP=${WARMUP:-5}
MAX_TOKENS=${MAX_TOKENS:-32}; PROMPT_WORDS=${PROMPT_WORDS:-100}
WORK=$(mktemp -d /tmp/kvmesh-vllm-bench.XXXXXX)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
log() { echo "[bench] $*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 600); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done; log "timeout: $1"; return 1; }

export VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 OMP_NUM_THREADS=1
MODEL="$WORK/tiny-vllm"
"$VLLM_VENV/bin/python" -m kvmesh_vllm.tiny_model "$MODEL" --tokenizer-from "$REPO/models/tiny" >/dev/null 2>&1
ENGINE_ARGS=(--model "$MODEL" --max-model-len 1024 --block-size 32 --enable-prefix-caching --enforce-eager
             --distributed-executor-backend uni --num-gpu-blocks-override 512 --max-num-seqs 16 --seed 0)

load() {  # name base_url
  for c in $CONCURRENCY; do
    result=$("$CLIENT_PYTHON" "$HERE/vllm_load.py" "$2" tiny --concurrency "$c" --duration "$DURATION" \
      --warmup "$WARMUP" --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS")
    echo "{\"server\": \"$1\", \"result\": $result}"
  done
}

log "vLLM's own OpenAI server"
port=$(free_port)
"$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port "$port" \
  --served-model-name tiny "${ENGINE_ARGS[@]}" >"$WORK/vllm-openai.log" 2>&1 &
server=$!; PIDS+=($server)
wait_http "http://127.0.0.1:$port/v1/models"
load vllm-openai "http://127.0.0.1:$port/v1"
kill "$server"; wait "$server" 2>/dev/null || true

log "kvmesh: frontend (kv) + kvmesh-vllm-worker"
etcd_port=$(free_port); peer=$(free_port); nats_port=$(free_port)
etcd --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "default=http://127.0.0.1:$peer" \
  >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
nats-server -js -sd "$WORK/nats" -a 127.0.0.1 -p "$nats_port" >"$WORK/nats.log" 2>&1 &
PIDS+=($!)
export ETCD_ENDPOINTS="http://127.0.0.1:$etcd_port" NATS_SERVER="nats://127.0.0.1:$nats_port" DYN_NAMESPACE=bench
wait_http "$ETCD_ENDPOINTS/health"
"$VLLM_VENV/bin/kvmesh-vllm-worker" --model-name tiny --kv-bridge-bin "$BIN/kvmesh-kv-bridge" \
  -- "${ENGINE_ARGS[@]}" >"$WORK/worker.log" 2>&1 &
PIDS+=($!)
port=$(free_port)
"$BIN/kvmesh-frontend" --http-host 127.0.0.1 --http-port "$port" --router-mode kv >"$WORK/frontend.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"num_instances":1' && break
  sleep 0.5
done
load kvmesh "http://127.0.0.1:$port/v1"
