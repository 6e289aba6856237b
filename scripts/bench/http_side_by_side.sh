#!/usr/bin/env bash
# Side-by-side HTTP-edge benchmark: NVIDIA Dynamo 1.6.1 (frontend + 2 mock workers, from
# ../shared/bench/dynamo-reference) against `kvmesh up --num-workers 2`, both with the mock engine
# at speed-up 1e6, model `tiny`, on 127.0.0.1:8000, measured the same way in one invocation.
#
# Usage: scripts/bench/http_side_by_side.sh [path/to/kvmesh]     (default target/release/kvmesh)
# Env:   REPEATS=3 DURATION=10 WARMUP=3 CONCURRENCY=64 THREADS=2 MAX_TOKENS=16
#        MODES="nonstream stream"   (also: stream_close = streaming, new connection per request)
#        SYSTEMS="dynamo kvmesh"    DYNAMO_REF=/tmp/dynamo-ref   OUT_DIR=<mktemp -d>
#        QUIET_PCT=20 QUIET_MAX_WAIT=90  (before each run, wait up to QUIET_MAX_WAIT s for a second
#        in which other processes use < QUIET_PCT % of one core; 0 disables the wait)
#        DYNAMO_REF_SCRIPTS=<repo>/../shared/bench/dynamo-reference
#        KVMESH_EXTRA_ARGS=""  e.g. "--model-path /tmp/dynamo-ref/tiny-model --model-name tiny" to serve
#        the reference's tokenizer (31-token prompts) instead of kvmesh's bundled tiny (42 tokens)
#
# Client: wrk (Debian package `wrk`) with scripts/bench/chat.lua: closed loop, keep-alive,
# CONCURRENCY connections on THREADS threads, POST /v1/chat/completions, ~31-token prompts,
# max_tokens 16 with ignore_eos. Each round starts each system fresh; per mode: WARMUP s of load
# (discarded), then DURATION s measured. Rounds alternate the systems, so background load on a
# shared machine hits both alike. CPU: utime+stime from /proc/PID/stat before/after the measured
# window: Dynamo's frontend process alone ("frontend process") and frontend + mockers; kvmesh up's
# single process, which also runs the mock workers ("whole process"). The host's busy CPU over the
# window is recorded too, so load from anything else (other_cpu_pct) is visible.
#
# Output: one JSON line per (round, system, mode), one per (system, mode) with the medians over
# rounds, then markdown rows for docs/benchmarks.md. Everything also lands in $OUT_DIR.
# Downloads nothing, except that the Dynamo reference's install.sh runs (pip) when it is missing.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KVMESH_BIN=${1:-${KVMESH_BIN:-$REPO/target/release/kvmesh}}
REF=${DYNAMO_REF_SCRIPTS:-$REPO/../shared/bench/dynamo-reference}
export DYNAMO_REF=${DYNAMO_REF:-/tmp/dynamo-ref}
REPEATS=${REPEATS:-3}; DURATION=${DURATION:-10}; WARMUP=${WARMUP:-3}
CONCURRENCY=${CONCURRENCY:-64}; THREADS=${THREADS:-2}; MAX_TOKENS=${MAX_TOKENS:-16}
MODES=${MODES:-"nonstream stream"}; SYSTEMS=${SYSTEMS:-"dynamo kvmesh"}
QUIET_PCT=${QUIET_PCT:-20}; QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-90}
PORT=8000   # the reference's start_stack.sh binds 8000; kvmesh uses the same port
URL=http://127.0.0.1:$PORT/v1/chat/completions
OUT=${OUT_DIR:-$(mktemp -d /tmp/http_side_by_side.XXXXXX)}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl; : > "$RESULTS"
TCK=$(getconf CLK_TCK)

log() { echo "[bench] $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v wrk >/dev/null || die "wrk not found: apt-get install -y wrk (oha is not packaged)"
command -v curl >/dev/null || die "curl not found"
command -v python3 >/dev/null || die "python3 not found"

# ---------- helpers ----------
proc_ticks() {   # sum of utime+stime (clock ticks) of the given PIDs
  local t=0 p f a
  for p in "$@"; do
    f=$(cat /proc/$p/stat 2>/dev/null) || { echo -1; return; }
    f=${f##*) }   # fields after "comm)"; utime and stime (fields 14, 15) are a[11], a[12] here
    read -ra a <<< "$f"; t=$((t + a[11] + a[12]))
  done
  echo $t
}
host_busy_ticks() {   # all CPUs: user+nice+system+irq+softirq+steal
  local _c u n s i w q sq st rest
  read -r _c u n s i w q sq st rest < /proc/stat
  echo $((u + n + s + q + sq + st))
}
port_in_use() { (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; }
wait_port_free() {
  for _ in $(seq 1 40); do port_in_use || return 0; sleep 0.25; done
  return 1
}
chat_body() {   # $1 = 1 for streaming; same shape as chat.lua's requests
  local s=""
  [ "$1" = 1 ] && s=',"stream":true,"stream_options":{"include_usage":true}'
  printf '{"model":"tiny","messages":[{"role":"user","content":"Request 0: alpha beta gamma delta epsilon zeta theta kappa"}],"max_tokens":%s,"ignore_eos":true%s}' "$MAX_TOKENS" "$s"
}
wait_ready() {   # until a chat request answers 200 (or $1 s)
  local code
  for _ in $(seq 1 $(($1 * 4))); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$URL" -H 'content-type: application/json' -d "$(chat_body 0)")
    [ "$code" = 200 ] && return 0
    sleep 0.25
  done
  return 1
}
# One request of the mode's shape; prints "prompt_tokens completion_tokens" from its usage.
check_usage() {
  curl -s -m 10 -N "$URL" -H 'content-type: application/json' -d "$(chat_body "$1")" | python3 -c '
import json, sys
raw = sys.stdin.read(); u = None
if raw.lstrip().startswith("{"):
    u = json.loads(raw).get("usage")
else:
    for ev in raw.split("\n\n"):
        ev = ev.strip()
        if ev.startswith("data:") and ev[5:].strip() != "[DONE]":
            u = json.loads(ev[5:]).get("usage") or u
    if "[DONE]" not in raw: u = None
print(u["prompt_tokens"], u["completion_tokens"]) if u else print("0 0")'
}

# ---------- environment ----------
NPROC=$(nproc)
CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
KVMESH_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)
[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null | head -1)" ] && KVMESH_REV="$KVMESH_REV+dirty"
WRK_VERSION=$(wrk -v 2>&1 | head -1 | awk '{print $2}')
log "out: $OUT  nproc=$NPROC cpu='$CPU_MODEL' date=$DATE loadavg=$LOADAVG"

# ---------- system control ----------
SYS_PID=""; SCOPE_PIDS=""; ALL_PIDS=""; CPU_SCOPE=""; SYS_VERSION=""
stop_system() {
  case "$1" in
    dynamo) "$REF/stop_stack.sh" >/dev/null 2>&1 ;;
    kvmesh) [ -n "$SYS_PID" ] && kill "$SYS_PID" 2>/dev/null && wait "$SYS_PID" 2>/dev/null ;;
  esac
  SYS_PID=""; SCOPE_PIDS=""; ALL_PIDS=""
  wait_port_free || log "warning: port $PORT still in use after stopping $1"
}
CURRENT=""
cleanup() { [ -n "$CURRENT" ] && stop_system "$CURRENT"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_system() {   # returns 0 when serving, 2 when skipped
  port_in_use && die "port $PORT is already in use by something this script did not start"
  case "$1" in
    dynamo)
      [ -x "$REF/start_stack.sh" ] || { log "skip dynamo: no reference scripts at $REF"; return 2; }
      if ! "$DYNAMO_REF/venv/bin/python" -c 'import dynamo.frontend, dynamo.mocker' 2>/dev/null; then
        log "Dynamo reference not installed in $DYNAMO_REF: running $REF/install.sh (~2 min, pip)"
        "$REF/install.sh" > "$OUT/dynamo-install.log" 2>&1 || die "install.sh failed, see $OUT/dynamo-install.log"
      fi
      SYS_VERSION="ai-dynamo $("$DYNAMO_REF/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("ai-dynamo"))')"
      CURRENT=dynamo
      "$REF/start_stack.sh" round-robin 2 --speedup-ratio 1000000 > "$OUT/dynamo-start.log" 2>&1 \
        || die "Dynamo stack did not come up; see $OUT/dynamo-start.log and $DYNAMO_REF/logs/"
      SCOPE_PIDS=$(cat "$DYNAMO_REF/logs/frontend.pid")
      ALL_PIDS="$SCOPE_PIDS $(cat "$DYNAMO_REF"/logs/mocker*.pid | tr '\n' ' ')"
      CPU_SCOPE="frontend process"
      ;;
    kvmesh)
      [ -x "$KVMESH_BIN" ] || {
        log "skip kvmesh: no binary at $KVMESH_BIN (build it: cargo build --release --bin kvmesh)"; return 2; }
      SYS_VERSION="kvmesh $KVMESH_REV"
      [ -n "${KVMESH_EXTRA_ARGS:-}" ] && log "kvmesh extra args: $KVMESH_EXTRA_ARGS"
      CURRENT=kvmesh
      # shellcheck disable=SC2086  # KVMESH_EXTRA_ARGS is a word list
      "$KVMESH_BIN" up --num-workers 2 --speedup-ratio 1000000 --http-host 127.0.0.1 --http-port $PORT \
        ${KVMESH_EXTRA_ARGS:-} > "$OUT/kvmesh.log" 2>&1 &
      SYS_PID=$!
      wait_ready 60 || die "kvmesh up did not answer a chat request within 60 s; see $OUT/kvmesh.log"
      SCOPE_PIDS=$SYS_PID; ALL_PIDS=$SYS_PID
      CPU_SCOPE="whole process (frontend + 2 mock workers)"
      ;;
  esac
  wait_ready 30 || die "$1 is not answering chat requests"
  return 0
}

# Wait (bounded) for a 1-s sample in which processes other than the system under test are quiet.
wait_quiet() {
  [ "$QUIET_MAX_WAIT" -gt 0 ] || return 0
  local start=$SECONDS h0 a0 h1 a1 other
  while :; do
    h0=$(host_busy_ticks); a0=$(proc_ticks $ALL_PIDS); sleep 1
    h1=$(host_busy_ticks); a1=$(proc_ticks $ALL_PIDS)
    other=$(( (h1 - h0 - (a1 - a0)) * 100 / TCK ))
    [ "$other" -lt "$QUIET_PCT" ] && return 0
    if [ $((SECONDS - start)) -ge "$QUIET_MAX_WAIT" ]; then
      log "warning: other processes still use ${other}% CPU after ${QUIET_MAX_WAIT} s; measuring anyway"
      return 0
    fi
    log "other processes use ${other}% CPU; waiting for a quiet moment"
    sleep 4
  done
}

# ---------- one measurement ----------
measure() {   # $1 system, $2 mode, $3 round
  local sys=$1 mode=$2 round=$3 stream=0 close=0
  case "$mode" in
    nonstream) ;;
    stream) stream=1 ;;
    stream_close) stream=1; close=1 ;;
    *) die "unknown mode $mode" ;;
  esac
  local usage; usage=$(check_usage $stream)
  [ "${usage#* }" = "$MAX_TOKENS" ] || log "warning: $sys $mode: check request returned usage '$usage', expected $MAX_TOKENS completion tokens"
  export BENCH_MODEL=tiny BENCH_MAX_TOKENS=$MAX_TOKENS BENCH_STREAM=$stream BENCH_CLOSE=$close
  local wrk_args=(-t"$THREADS" -c"$CONCURRENCY" --timeout 10s -s "$HERE/chat.lua" "$URL")
  wait_quiet
  wrk -d"${WARMUP}s" "${wrk_args[@]}" > /dev/null 2>&1
  local f=$OUT/wrk-$sys-$mode-$round
  local t0 a0 s0 h0 t1 a1 s1 h1
  t0=$(date +%s.%N); a0=$(proc_ticks $ALL_PIDS); s0=$(proc_ticks $SCOPE_PIDS); h0=$(host_busy_ticks)
  local TIMEFORMAT='%U %S'
  { time wrk -d"${DURATION}s" "${wrk_args[@]}" > "$f.out" 2> "$f.err"; } 2> "$f.time"
  s1=$(proc_ticks $SCOPE_PIDS); a1=$(proc_ticks $ALL_PIDS); h1=$(host_busy_ticks); t1=$(date +%s.%N)
  local line; line=$(grep '^{' "$f.out" | tail -1)
  [ -n "$line" ] || { log "warning: $sys $mode: no wrk result (see $f.out / $f.err)"; return; }
  [ "$s0" -ge 0 ] && [ "$s1" -ge 0 ] || log "warning: $sys $mode: a measured process exited"
  WRK="$line" SYS=$sys MODE=$mode ROUND=$round STREAM=$stream CLOSE=$close USAGE="$usage" \
  T0=$t0 T1=$t1 S0=$s0 S1=$s1 A0=$a0 A1=$a1 H0=$h0 H1=$h1 CLIENT="$(cat "$f.time")" TCK=$TCK \
  SCOPE="$CPU_SCOPE" VERSION="$SYS_VERSION" NPROC=$NPROC CPU_MODEL="$CPU_MODEL" DATE="$DATE" \
  LOADAVG="$LOADAVG" WRK_VERSION="$WRK_VERSION" THREADS=$THREADS CONCURRENCY=$CONCURRENCY python3 - >> "$RESULTS" <<'EOF'
import json, os
e = os.environ; w = json.loads(e["WRK"]); tck = float(e["TCK"])
window = float(e["T1"]) - float(e["T0"])
front = (int(e["S1"]) - int(e["S0"])) / tck
allsrv = (int(e["A1"]) - int(e["A0"])) / tck
host = (int(e["H1"]) - int(e["H0"])) / tck
u, s = (float(x) for x in e["CLIENT"].split())
client = u + s
n = max(1, w["requests"])
pt, ct = (int(x) for x in e["USAGE"].split())
r = {"system": e["SYS"], "version": e["VERSION"], "mode": e["MODE"], "round": int(e["ROUND"]),
     "stream": e["STREAM"] == "1", "keepalive": e["CLOSE"] != "1",
     "client": "wrk " + e["WRK_VERSION"], "threads": int(e["THREADS"]),
     "concurrency": int(e["CONCURRENCY"]), "prompt_tokens": pt, "completion_tokens": ct,
     **w,
     "cpu_scope": e["SCOPE"], "frontend_cpu_s": round(front, 3),
     "frontend_cpu_ms_per_req": round(front * 1000 / n, 3),
     "frontend_cpu_pct": round(front / window * 100, 1),
     "server_all_cpu_s": round(allsrv, 3), "server_all_cpu_ms_per_req": round(allsrv * 1000 / n, 3),
     "client_cpu_pct": round(client / window * 100, 1),
     "host_busy_pct": round(host / window * 100, 1),
     "other_cpu_pct": round(max(0.0, host - allsrv - client) / window * 100, 1),
     "window_s": round(window, 3), "nproc": int(e["NPROC"]), "cpu_model": e["CPU_MODEL"],
     "date": e["DATE"], "loadavg_at_start": e["LOADAVG"]}
print(json.dumps(r))
EOF
  tail -1 "$RESULTS"
}

# ---------- run ----------
for round in $(seq 1 "$REPEATS"); do
  for sys in $SYSTEMS; do
    start_system "$sys"; rc=$?
    if [ $rc -eq 2 ]; then
      echo "{\"system\":\"$sys\",\"round\":$round,\"skipped\":true}" | tee -a "$RESULTS"; continue
    fi
    log "round $round: $sys up ($SYS_VERSION; cpu scope: $CPU_SCOPE; pids $ALL_PIDS)"
    for mode in $MODES; do measure "$sys" "$mode" "$round"; done
    stop_system "$sys"; CURRENT=""
  done
done

# ---------- medians + markdown ----------
CONCURRENCY=$CONCURRENCY THREADS=$THREADS DURATION=$DURATION REPEATS=$REPEATS RESULTS=$RESULTS \
python3 - <<'EOF' | tee "$OUT/summary.txt"
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["RESULTS"]) if l.strip()]
rows = [r for r in rows if not r.get("skipped")]
conc, thr = int(os.environ["CONCURRENCY"]), int(os.environ["THREADS"])
groups = {}
for r in rows:
    groups.setdefault((r["system"], r["mode"]), []).append(r)
keys = ["req_per_s", "lat_ms_p50", "lat_ms_p90", "lat_ms_p99", "frontend_cpu_ms_per_req",
        "server_all_cpu_ms_per_req", "frontend_cpu_pct", "client_cpu_pct", "host_busy_pct", "other_cpu_pct"]
med = {}
for (sysname, mode), rs in groups.items():
    m = {k: round(statistics.median(r[k] for r in rs), 3) for k in keys}
    base = rs[0]
    m = {"system": sysname, "version": base["version"], "mode": mode, "rounds": len(rs), "stat": "median",
         "stream": base["stream"], "keepalive": base["keepalive"], "client": base["client"],
         "concurrency": conc, "threads": thr, "duration_s": int(os.environ["DURATION"]),
         "prompt_tokens": base["prompt_tokens"], "completion_tokens": base["completion_tokens"],
         "errors": sum(sum(r["errors"].values()) for r in rs), **m, "cpu_scope": base["cpu_scope"],
         "nproc": base["nproc"], "cpu_model": base["cpu_model"], "date": base["date"]}
    med[(sysname, mode)] = m
    print(json.dumps(m))
print()
mode_txt = {"nonstream": "no", "stream": "yes (keep-alive)", "stream_close": "yes (new connection each)"}
print(f"Measured {rows[0]['date'] if rows else '?'} on {rows[0]['nproc'] if rows else '?'} x "
      f"{rows[0]['cpu_model'] if rows else '?'}; wrk -t{thr} -c{conc}, "
      f"{os.environ['DURATION']} s per run, medians of {os.environ['REPEATS']} rounds.")
print()
print("| system | stream | concurrency | req/s | p50 ms | p99 ms | frontend CPU ms/request (scope) "
      "| frontend + workers CPU ms/request | client CPU % | other load CPU % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (sysname, mode), m in sorted(med.items()):
    scope = "whole process" if sysname == "kvmesh" else "frontend process"
    print(f"| {m['version']} | {mode_txt.get(mode, mode)} | {conc} | {m['req_per_s']:.0f} | "
          f"{m['lat_ms_p50']:.1f} | {m['lat_ms_p99']:.1f} | {m['frontend_cpu_ms_per_req']:.3f} ({scope}) | "
          f"{m['server_all_cpu_ms_per_req']:.3f} | {m['client_cpu_pct']:.0f} | {m['other_cpu_pct']:.0f} |")
d, k = med.get(("dynamo", "nonstream")), med.get(("kvmesh", "nonstream"))
if d and k:
    ratio = k["req_per_s"] / d["req_per_s"]
    print()
    print(f"Non-streaming: kvmesh/Dynamo req/s = {ratio:.2f}x (target >= 5x: "
          f"{'met' if ratio >= 5 else 'NOT met'}); kvmesh whole-process CPU = "
          f"{k['frontend_cpu_ms_per_req']:.3f} ms/request (target <= 0.2: "
          f"{'met' if k['frontend_cpu_ms_per_req'] <= 0.2 else 'NOT met'}).")
if any(m["other_cpu_pct"] > 10 for m in med.values()):
    print()
    print("WARNING: other processes used > 10% CPU during some runs; figures are contaminated by background load.")
EOF
log "results: $RESULTS"
