#!/usr/bin/env bash
# Runs every kvmesh test: formatting, lints, Rust unit and integration tests (against a real etcd
# and a real NATS server with JetStream, started here on private loopback ports unless
# ETCD_ENDPOINTS / NATS_SERVER already point at running servers), 10 s of fuzzing per fuzz target
# (scripts/fuzz.sh), and the Python client tests
# (official openai SDK against the real binaries).
#
# Needs: cargo, etcd, nats-server, python3 (CI installs them: see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/kvmesh-test.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "error: $name did not start" >&2; return 1
}

if [ -z "${ETCD_ENDPOINTS:-}" ]; then
  port=$(free_port); peer=$(free_port)
  etcd --data-dir "$work/etcd" --name kvmesh-test \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "kvmesh-test=http://127.0.0.1:$peer" >"$work/etcd.log" 2>&1 &
  pids+=($!)
  export ETCD_ENDPOINTS="http://127.0.0.1:$port"
  wait_for etcd curl -sf "$ETCD_ENDPOINTS/health"
fi
if [ -z "${NATS_SERVER:-}" ]; then
  port=$(free_port); monitor=$(free_port)
  nats-server -js -sd "$work/nats" -a 127.0.0.1 -p "$port" -m "$monitor" >"$work/nats.log" 2>&1 &
  pids+=($!)
  export NATS_SERVER="nats://127.0.0.1:$port"
  wait_for nats curl -sf "http://127.0.0.1:$monitor/healthz"
fi
echo "etcd: $ETCD_ENDPOINTS  nats: $NATS_SERVER"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --bins --locked
cargo test --workspace --locked
# Every fuzz target from its committed corpus (the corpora were just replayed above): 10 s each
# here, to keep a CI run within its time (FUZZ_SECONDS overrides; scripts/fuzz.sh alone runs 30 s).
FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/fuzz.sh

venv=${KVMESH_VENV:-$root/.venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q -r tests/python/requirements.txt
# tritonclient must decode kvmesh's KServe outputs under numpy 1 as well as numpy 2.
numpy1_venv=${venv}-numpy1
if [ ! -x "$numpy1_venv/bin/python" ]; then
  python3 -m venv "$numpy1_venv"
fi
"$numpy1_venv/bin/pip" install -q "tritonclient[grpc]>=2.60" "numpy<2"
export KVMESH_NUMPY1_PYTHON="$numpy1_venv/bin/python"
# aiperf (pinned) in a venv of its own: its dependencies are many and pinned tightly.
aiperf_venv=${venv}-aiperf
if [ ! -x "$aiperf_venv/bin/aiperf" ]; then
  python3 -m venv "$aiperf_venv"
  "$aiperf_venv/bin/pip" install -q "aiperf==0.13.0"
fi
export KVMESH_AIPERF="$aiperf_venv/bin/aiperf"
# keyed_venv DIR LABEL INSTALLER FILES...: (re)makes DIR with INSTALLER when FILES changed since
# it was made (their hash is kept in DIR/.kvmesh-key); returns 1 when DIR was already up to date.
keyed_venv() {
  local dir=$1 label=$2 installer=$3; shift 3
  local key started
  key=$(cat "$@" | sha256sum | cut -c1-16)
  [ "$(cat "$dir/.kvmesh-key" 2>/dev/null)" = "$key" ] && return 1
  rm -rf "$dir"
  started=$(date +%s)
  # `exit`, not `set -e`: the callers test this function's status, which turns `-e` off inside it.
  "$installer" "$dir" || { echo "error: the $label environment did not install" >&2; exit 1; }
  echo "$key" >"$dir/.kvmesh-key"
  echo "$label environment installed in $(($(date +%s) - started)) s"
}
# vLLM's CPU build and the Python vLLM worker (workers/vllm) in a venv of their own: about
# 4 minutes and 6 GB to install, so it is kept and rebuilt only when its pins or its install script
# change. The worker package itself is reinstalled every run (seconds).
vllm_venv=${venv}-vllm
if ! keyed_venv "$vllm_venv" vLLM scripts/install_vllm_cpu.sh \
    workers/vllm/engine-requirements.txt scripts/install_vllm_cpu.sh; then
  "$vllm_venv/bin/pip" install -q --force-reinstall --no-deps ./workers/vllm
fi
export KVMESH_VLLM_PYTHON="$vllm_venv/bin/python"
# SGLang (its tokenizer, template handling and parsers, none of its kernels) for the processor
# host's built-in `sglang` processor, in a venv of its own: about 3 minutes and 6 GB to install,
# kept and rebuilt only when its pins or its install script change.
sglang_venv=${venv}-sglang
keyed_venv "$sglang_venv" SGLang scripts/install_sglang_cpu.sh \
  scripts/sglang-requirements.txt scripts/install_sglang_cpu.sh || true
export KVMESH_SGLANG_PYTHON="$sglang_venv/bin/python"
KVMESH_BIN_DIR="${CARGO_TARGET_DIR:-$root/target}/debug" "$venv/bin/python" -m pytest -q tests/python
