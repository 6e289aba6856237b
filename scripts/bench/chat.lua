-- wrk script: closed-loop POST /v1/chat/completions, one JSON line on completion.
-- Used by scripts/bench/http_side_by_side.sh; usable alone:
--   BENCH_STREAM=1 wrk -t2 -c64 -d10s -s scripts/bench/chat.lua http://127.0.0.1:8000/v1/chat/completions
-- Env: BENCH_MODEL (tiny), BENCH_MAX_TOKENS (16), BENCH_STREAM (0|1), BENCH_CLOSE (0|1: new
-- connection per request), BENCH_BODIES (256 distinct prompts per thread, pre-formatted in init so
-- the per-request client cost is a table lookup), BENCH_RATE (0: closed loop; else the total
-- requests per second over BENCH_THREADS threads, paced by a monotonic clock: each request takes
-- the next slot of its thread's schedule and waits for it, so the rate holds whatever the latency
-- while the connections keep up; scripts/bench/soak.sh uses it).
-- Prompts mirror ../shared/bench/dynamo-reference/loadgen.py's "short" workload: "Request i: " plus
-- 8 random words (31 prompt tokens with the tiny model's chat template), ignore_eos so every
-- response has exactly max_tokens tokens.

local model = os.getenv("BENCH_MODEL") or "tiny"
local max_tokens = tonumber(os.getenv("BENCH_MAX_TOKENS") or "16")
local stream = os.getenv("BENCH_STREAM") == "1"
local close = os.getenv("BENCH_CLOSE") == "1"
local nbodies = tonumber(os.getenv("BENCH_BODIES") or "256")
local rate = tonumber(os.getenv("BENCH_RATE") or "0")
local nthreads = tonumber(os.getenv("BENCH_THREADS") or "1")

local WORDS = {}
for w in ([[alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain cloud
forest ocean stone light shadow winter summer engine router cache token block prefix
worker server client stream signal value index table record object method string]]):gmatch("%S+") do
  WORDS[#WORDS + 1] = w
end

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

local reqs = {}
local n = 0

function init(args)
  local tid = tid or 1
  math.randomseed(1000 + tid)
  local headers = { ["Content-Type"] = "application/json" }
  if close then headers["Connection"] = "close" end
  local tail = '],"max_tokens":' .. max_tokens .. ',"ignore_eos":true'
  if stream then tail = tail .. ',"stream":true,"stream_options":{"include_usage":true}' end
  tail = tail .. '}'
  for i = 1, nbodies do
    local ws = {}
    for k = 1, 8 do ws[k] = WORDS[math.random(#WORDS)] end
    local content = "Request " .. (tid * 100000 + i) .. ": " .. table.concat(ws, " ")
    local body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"' .. content .. '"}' .. tail
    reqs[i] = wrk.format("POST", nil, headers, body)
  end
end

if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef [[
    typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
    int clock_gettime(int clock_id, bench_timespec *tp);
  ]]
  local now_ts = ffi.new("bench_timespec")
  local function now_ms()
    ffi.C.clock_gettime(1, now_ts) -- CLOCK_MONOTONIC
    return tonumber(now_ts.tv_sec) * 1000 + tonumber(now_ts.tv_nsec) / 1e6
  end
  local interval_ms = 1000 * nthreads / rate
  local next_slot = nil

  function delay()
    local now = now_ms()
    if next_slot == nil then next_slot = now end
    -- A schedule that fell behind by more than a second restarts from now instead of bursting.
    if next_slot < now - 1000 then next_slot = now end
    local wait = next_slot - now
    next_slot = next_slot + interval_ms
    if wait < 0 then return 0 end
    return wait
  end
end

function request()
  n = n % nbodies + 1
  return reqs[n]
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    '{"requests":%d,"duration_s":%.3f,"req_per_s":%.1f,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"lat_ms_mean":%.2f,"lat_ms_p50":%.2f,"lat_ms_p90":%.2f,"lat_ms_p99":%.2f,"lat_ms_max":%.2f}\n',
    summary.requests, secs, summary.requests / secs, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean / 1000, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
