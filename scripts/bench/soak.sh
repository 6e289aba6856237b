#!/usr/bin/env bash
# Soak run (not in CI; docs/benchmarks.md, "Soak"): `kvmesh up` with two mock workers (speed-up
# 1e6, model `tiny`) driven for MINUTES minutes at FRACTION of the maximum rate measured just
# before, reporting errors and the growth of the process's resident memory from the first minute
# to the last.
#
# Usage: scripts/bench/soak.sh [path/to/kvmesh]     (default target/release/kvmesh)
# Env:   MINUTES=10 FRACTION=0.8 THREADS=2 MAX_TOKENS=16 PORT=8000 OUT_DIR=<mktemp -d>
#        RAMP="8 16 32 64 128" RAMP_SECONDS=10   (closed-loop concurrencies tried for the maximum)
#        STREAM=0 (1: streaming requests)  MAX_RSS_GROWTH_PCT=5
#
# Method: wrk with scripts/bench/chat.lua (POST /v1/chat/completions, ~31-token prompts,
# max_tokens 16, ignore_eos). The maximum is the best req/s over the RAMP concurrencies (closed
# loop). The soak then holds FRACTION of it open loop (chat.lua's BENCH_RATE: requests paced by a
# monotonic clock over four times the connections the maximum needed), after one 10 s probe, in
# one-minute wrk segments; each minute's achieved rate is recorded. RSS (VmRSS of the kvmesh process) is sampled every 2 s; growth is the
# mean of the last minute over the mean of the first. Errors: wrk's connect, read, write and
# timeout errors and non-2xx answers. Exit status 1 when there was an error or the growth is over
# MAX_RSS_GROWTH_PCT.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${1:-$REPO/target/release/kvmesh}
MINUTES=${MINUTES:-10}; FRACTION=${FRACTION:-0.8}; THREADS=${THREADS:-2}
MAX_TOKENS=${MAX_TOKENS:-16}; PORT=${PORT:-8000}; STREAM=${STREAM:-0}
RAMP=${RAMP:-"8 16 32 64 128"}; RAMP_SECONDS=${RAMP_SECONDS:-10}
MAX_RSS_GROWTH_PCT=${MAX_RSS_GROWTH_PCT:-5}
OUT=${OUT_DIR:-$(mktemp -d /tmp/kvmesh-soak.XXXXXX)}
URL=http://127.0.0.1:$PORT/v1/chat/completions
mkdir -p "$OUT"

log() { echo "[soak] $*" >&2; }
die() { log "error: $*"; exit 1; }
command -v wrk >/dev/null || die "wrk not found: apt-get install -y wrk"
[ -x "$BIN" ] || die "no kvmesh binary at $BIN (cargo build --release --bin kvmesh)"
(exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && die "port $PORT is already in use"

PID=""; SAMPLER=""
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$BIN" up --num-workers 2 --speedup-ratio 1000000 --http-host 127.0.0.1 --http-port "$PORT" \
  > "$OUT/kvmesh.log" 2>&1 &
PID=$!
body='{"model":"tiny","messages":[{"role":"user","content":"ready?"}],"max_tokens":1}'
for _ in $(seq 1 240); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$URL" -H 'content-type: application/json' -d "$body")
  [ "$code" = 200 ] && break
  kill -0 "$PID" 2>/dev/null || die "kvmesh up exited; see $OUT/kvmesh.log"
  sleep 0.25
done
[ "$code" = 200 ] || die "kvmesh up did not answer within 60 s; see $OUT/kvmesh.log"

# One wrk run: concurrency, seconds, rate (0: closed loop); prints chat.lua's JSON line.
run_wrk() {
  BENCH_STREAM=$STREAM BENCH_MAX_TOKENS=$MAX_TOKENS BENCH_RATE=$3 BENCH_THREADS=$THREADS \
    wrk -t"$THREADS" -c"$1" -d"$2"s --timeout 10s -s "$HERE/chat.lua" "$URL" 2>&1 | tail -n 1
}
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

log "ramp: concurrency $RAMP, ${RAMP_SECONDS}s each"
max_rps=0; max_c=0
for c in $RAMP; do
  line=$(run_wrk "$c" "$RAMP_SECONDS" 0)
  echo "$line" >> "$OUT/ramp.jsonl"
  rps=$(field "$line" req_per_s)
  log "  c=$c: $rps req/s"
  if python3 -c "import sys; sys.exit(not float('$rps') > float('$max_rps'))"; then
    max_rps=$rps; max_c=$c
  fi
done
target=$(python3 -c "print(round($max_rps * $FRACTION, 1))")
log "maximum $max_rps req/s at c=$max_c; target $target req/s"

# Enough connections for the target rate at four times the latency seen at the maximum (at least
# 16), so that a slow moment does not lower the rate.
conc=$(python3 -c "print(max(16, round(4 * $target * $max_c / $max_rps)))")
line=$(run_wrk "$conc" 10 "$target")
log "  probe: c=$conc at $target req/s -> $(field "$line" req_per_s) req/s"

: > "$OUT/rss.tsv"
(
  while kill -0 "$PID" 2>/dev/null; do
    echo "$(date +%s) $(awk '/^VmRSS/ {print $2}' /proc/"$PID"/status)" >> "$OUT/rss.tsv"
    sleep 2
  done
) &
SAMPLER=$!

log "soak: $MINUTES min at $target req/s over $conc connections"
: > "$OUT/minutes.jsonl"
for minute in $(seq 1 "$MINUTES"); do
  start=$(date +%s)
  line=$(run_wrk "$conc" 60 "$target")
  end=$(date +%s)
  echo "$line" | python3 -c '
import json, sys
row = json.loads(sys.stdin.read()); row.update(minute=int(sys.argv[1]), start=int(sys.argv[2]), end=int(sys.argv[3]))
print(json.dumps(row))' "$minute" "$start" "$end" >> "$OUT/minutes.jsonl"
  log "  minute $minute: $(field "$line" req_per_s) req/s, errors $(field "$line" errors)"
  kill -0 "$PID" 2>/dev/null || die "kvmesh up died during minute $minute; see $OUT/kvmesh.log"
done

python3 - "$OUT" "$max_rps" "$max_c" "$target" "$conc" "$MAX_RSS_GROWTH_PCT" <<'PY'
import json, sys
out, max_rps, max_c, target, conc, limit = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{out}/minutes.jsonl")]
rss = [tuple(map(int, l.split())) for l in open(f"{out}/rss.tsv") if len(l.split()) == 2]
def mean_rss(row):
    values = [kb for t, kb in rss if row["start"] <= t <= row["end"]]
    return sum(values) / len(values) / 1024 if values else float("nan")
first, last = mean_rss(rows[0]), mean_rss(rows[-1])
growth = 100 * (last - first) / first
requests = sum(r["requests"] for r in rows)
errors = sum(sum(r["errors"].values()) for r in rows)
rate = requests / sum(r["duration_s"] for r in rows)
summary = dict(minutes=len(rows), max_rps=float(max_rps), max_concurrency=int(max_c),
               target_rps=float(target), concurrency=int(conc), achieved_rps=round(rate, 1),
               achieved_fraction=round(rate / float(max_rps), 3), requests=requests, errors=errors,
               p99_ms_worst=max(r["lat_ms_p99"] for r in rows),
               rss_first_min_mib=round(first, 1), rss_last_min_mib=round(last, 1),
               rss_growth_pct=round(growth, 2), rss_peak_mib=round(max(kb for _, kb in rss) / 1024, 1),
               rss_by_minute_mib=[round(mean_rss(r), 1) for r in rows],
               rps_by_minute=[round(r["req_per_s"]) for r in rows])
print(json.dumps(summary))
ok = errors == 0 and growth <= float(limit)
print(f"[soak] {'PASS' if ok else 'FAIL'}: {errors} errors, RSS {first:.1f} -> {last:.1f} MiB "
      f"({growth:+.2f} %), {rate:.0f} req/s = {100 * rate / float(max_rps):.0f} % of {max_rps}",
      file=sys.stderr)
sys.exit(0 if ok else 1)
PY
