//! Replay benchmark of the index over a Mooncake-format trace (`kvmesh bench indexer`).
//!
//! Each trace line is `{"timestamp", "input_length", "output_length", "hash_ids": [...]}`; each
//! hash id is one block, chained, so equal prefixes have equal id prefixes. The trace can be
//! stretched (`expansion`: each id becomes that many blocks) and duplicated over disjoint id spaces
//! (`copies`), as Dynamo's `mooncake_bench` does. Requests go to `workers` synthetic engines
//! (round-robin or by first block); each engine has an LRU cache of `blocks_per_worker` blocks and
//! emits what a prefix-caching engine would: the evictions needed to make room, then one stored
//! event per run of uncached blocks, chained on the block before it. Engine hashes are the block
//! ids; tokens hashes are the ids hashed.
//!
//! The simulation runs first, untimed. The timed part replays, for each request in order:
//! `find_matches` of its blocks (timed one by one, on the calling thread), then its worker's event
//! batch handed to the index (applied by `lanes` apply threads, or inline when `lanes` is 0), and
//! ends with a flush. Block operations = blocks looked up + blocks stored + blocks removed. After
//! the replay, `static_queries` queries of `static_query_blocks` blocks (trace requests cut to that
//! length) are timed against the final state with no writes running.

mod sim;

use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use self::sim::{Step, expand, simulate, worker_id};
use crate::concurrent::{ConcurrentIndex, LaneClosed};
use crate::events::WorkerKey;
use crate::radix::RadixIndex;

/// How requests are spread over the synthetic workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// Request `i` goes to worker `i mod workers`.
    RoundRobin,
    /// By a hash of the first block (prefix affinity).
    Prefix,
}

/// Parameters of a replay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayConfig {
    /// Synthetic workers (one dp rank each).
    pub workers: usize,
    /// Blocks each worker's engine caches (LRU).
    pub blocks_per_worker: usize,
    /// Apply threads of the concurrent index; 0 applies inline on one thread with a plain
    /// [`RadixIndex`].
    pub lanes: usize,
    /// Blocks per trace hash id.
    pub expansion: usize,
    /// Copies of the trace over disjoint block ids, interleaved.
    pub copies: usize,
    /// Request-to-worker assignment.
    pub assignment: Assignment,
    /// Only the first this many requests (after copies), when set.
    pub max_requests: Option<usize>,
    /// Queries timed against the final state.
    pub static_queries: usize,
    /// Blocks per static query.
    pub static_query_blocks: usize,
}

impl Default for ReplayConfig {
    /// 16 workers × 16 384 blocks, 2 lanes, the trace as is, round-robin, 10 000 static
    /// queries of 128 blocks.
    fn default() -> Self {
        Self {
            workers: 16,
            blocks_per_worker: 16_384,
            lanes: 2,
            expansion: 1,
            copies: 1,
            assignment: Assignment::RoundRobin,
            max_requests: None,
            static_queries: 10_000,
            static_query_blocks: 128,
        }
    }
}

/// Figures of one replay (see the module docs for what is timed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The configuration that ran.
    pub config: ReplayConfig,
    /// Requests replayed.
    pub requests: u64,
    /// Blocks looked up by `find_matches`.
    pub looked_up_blocks: u64,
    /// Blocks in stored events.
    pub stored_blocks: u64,
    /// Blocks in removed events.
    pub removed_blocks: u64,
    /// looked up + stored + removed.
    pub block_ops: u64,
    /// Wall time of the timed replay.
    pub elapsed_s: f64,
    /// Block operations per second over the timed replay.
    pub block_ops_per_sec: f64,
    /// Threads doing index work: the caller plus the apply lanes.
    pub threads: usize,
    /// CPUs available to the process.
    pub cpus: usize,
    /// `block_ops_per_sec / min(threads, cpus)`.
    pub block_ops_per_sec_per_core: f64,
    /// CPU time (user + system, all threads) the process spent in the timed replay, from
    /// `/proc/self/stat` (10 ms resolution; 0 where unavailable). Unlike wall time it is not
    /// inflated by other processes competing for the cores.
    pub cpu_s: f64,
    /// `block_ops / cpu_s`: block operations per core-second actually used.
    pub block_ops_per_cpu_sec: f64,
    /// `find_matches` latency during the replay (writes running), median.
    pub find_p50_us: f64,
    /// Same, 99th percentile.
    pub find_p99_us: f64,
    /// Same, maximum.
    pub find_max_us: f64,
    /// Device blocks the assigned worker already held / blocks looked up.
    pub prefix_hit_rate: f64,
    /// (block, worker) entries at the end.
    pub entries: u64,
    /// Heap bytes of the index at the end.
    pub memory_bytes: u64,
    /// `memory_bytes / entries`.
    pub bytes_per_entry: f64,
    /// Static queries timed after the replay.
    pub static_queries: u64,
    /// Their average length in blocks.
    pub static_query_blocks: f64,
    /// Static query latency, median.
    pub static_find_p50_us: f64,
    /// Static query latency, 99th percentile.
    pub static_find_p99_us: f64,
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace could not be read.
    #[error("reading trace: {0}")]
    Io(#[from] std::io::Error),
    /// A trace line is not valid JSON of the expected shape.
    #[error("trace line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// An apply lane stopped.
    #[error(transparent)]
    Lane(#[from] LaneClosed),
}

#[derive(Deserialize)]
struct TraceLine {
    hash_ids: Vec<u64>,
}

/// One request of a Mooncake-format trace, with the fields a timed replay needs.
///
/// Exists so the routing-quality benchmark reads traces with the same parser (and the same
/// line-numbered errors) as the index replay.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRecord {
    /// Arrival time in milliseconds since the trace's start (0 when absent).
    #[serde(default)]
    pub timestamp: f64,
    /// Prompt tokens; `None` in traces that carry only block ids.
    #[serde(default)]
    pub input_length: Option<u64>,
    /// Output tokens; `None` in traces that carry only block ids.
    #[serde(default)]
    pub output_length: Option<u64>,
    /// One id per 512-token prompt block, chained: equal prefixes have equal id prefixes.
    pub hash_ids: Vec<u64>,
}

/// Reads the `hash_ids` of every line of a Mooncake-format trace.
pub fn load_trace(path: &Path) -> Result<Vec<Vec<u64>>, ReplayError> {
    Ok(read_lines::<TraceLine>(path)?
        .into_iter()
        .map(|line| line.hash_ids)
        .collect())
}

/// Reads every line of a Mooncake-format trace with its timestamp and lengths.
pub fn load_trace_records(path: &Path) -> Result<Vec<TraceRecord>, ReplayError> {
    read_lines(path)
}

/// Parses each non-blank line of a JSON-lines file; errors name the 1-based line.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, ReplayError> {
    let reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut parsed = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        parsed.push(
            serde_json::from_str(&line).map_err(|source| ReplayError::Parse {
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(parsed)
}

/// Replays the trace at `trace_path` (see the module docs).
pub fn run(trace_path: &Path, config: &ReplayConfig) -> Result<ReplayReport, ReplayError> {
    let requests = load_trace(trace_path)?;
    run_requests(requests, config)
}

/// An index in the state a replay ends in, with queries to time against it.
#[derive(Debug)]
pub struct Populated {
    /// The index (events applied, lanes flushed).
    pub index: ConcurrentIndex,
    /// `static_queries` local-hash queries of `static_query_blocks` blocks.
    pub queries: Vec<Vec<u64>>,
}

/// Builds, untimed, the state the replay of `requests` under `config` ends in: the way to get an
/// index of a given size for latency and memory measurements (640 workers × 16 384 blocks with
/// expansion 8 and 10 copies of the Mooncake trace hold about 10.5 M entries).
pub fn populate(requests: Vec<Vec<u64>>, config: &ReplayConfig) -> Result<Populated, ReplayError> {
    let mut requests = expand(requests, config.expansion, config.copies);
    if let Some(max) = config.max_requests {
        requests.truncate(max);
    }
    let queries = static_queries(&requests, config);
    let (steps, _) = simulate(&requests, config);
    drop(requests);
    let index = ConcurrentIndex::new(config.lanes.max(1));
    for batch in steps.into_iter().filter_map(|step| step.batch) {
        index.apply(batch)?;
    }
    index.flush()?;
    Ok(Populated { index, queries })
}

/// Replays already loaded requests (each a list of block ids).
pub fn run_requests(
    requests: Vec<Vec<u64>>,
    config: &ReplayConfig,
) -> Result<ReplayReport, ReplayError> {
    let mut requests = expand(requests, config.expansion, config.copies);
    if let Some(max) = config.max_requests {
        requests.truncate(max);
    }
    let static_queries = static_queries(&requests, config);
    let (steps, totals) = simulate(&requests, config);
    drop(requests);

    let mut target = Target::new(config.lanes);
    let mut latencies = Vec::with_capacity(steps.len());
    let mut hit_blocks = 0u64;
    let cpu_start = process_cpu_seconds();
    let start = Instant::now();
    for Step {
        query,
        worker,
        batch,
    } in steps
    {
        let began = Instant::now();
        let scores = target.find(&query);
        latencies.push(began.elapsed());
        hit_blocks += u64::from(scores.device(WorkerKey::new(worker_id(worker), 0)));
        if let Some(batch) = batch {
            target.apply(batch)?;
        }
    }
    target.flush()?;
    let elapsed = start.elapsed();
    let cpu_s = match (cpu_start, process_cpu_seconds()) {
        (Some(begin), Some(end)) => end - begin,
        _ => 0.0,
    };

    let mut static_latencies = Vec::with_capacity(static_queries.len());
    for query in &static_queries {
        let began = Instant::now();
        std::hint::black_box(target.find(query));
        static_latencies.push(began.elapsed());
    }

    let block_ops = totals.looked_up_blocks + totals.stored_blocks + totals.removed_blocks;
    let elapsed_s = elapsed.as_secs_f64().max(1e-9);
    let threads = config.lanes + 1;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let entries = target.num_blocks();
    let memory_bytes = target.memory_bytes() as u64;
    let (find_p50_us, find_p99_us, find_max_us) = percentiles(&mut latencies);
    let (static_find_p50_us, static_find_p99_us, _) = percentiles(&mut static_latencies);
    Ok(ReplayReport {
        config: config.clone(),
        requests: latencies.len() as u64,
        looked_up_blocks: totals.looked_up_blocks,
        stored_blocks: totals.stored_blocks,
        removed_blocks: totals.removed_blocks,
        block_ops,
        elapsed_s,
        block_ops_per_sec: block_ops as f64 / elapsed_s,
        threads,
        cpus,
        block_ops_per_sec_per_core: block_ops as f64 / elapsed_s / threads.min(cpus) as f64,
        cpu_s,
        block_ops_per_cpu_sec: if cpu_s > 0.0 {
            block_ops as f64 / cpu_s
        } else {
            0.0
        },
        find_p50_us,
        find_p99_us,
        find_max_us,
        prefix_hit_rate: hit_blocks as f64 / (totals.looked_up_blocks.max(1)) as f64,
        entries,
        memory_bytes,
        bytes_per_entry: memory_bytes as f64 / entries.max(1) as f64,
        static_queries: static_queries.len() as u64,
        static_query_blocks: static_queries.iter().map(Vec::len).sum::<usize>() as f64
            / static_queries.len().max(1) as f64,
        static_find_p50_us,
        static_find_p99_us,
    })
}

/// The index under test: a plain index applied inline, or the concurrent one.
enum Target {
    Inline(Box<RadixIndex>),
    Lanes(ConcurrentIndex),
}

impl Target {
    fn new(lanes: usize) -> Self {
        if lanes == 0 {
            Target::Inline(Box::default())
        } else {
            Target::Lanes(ConcurrentIndex::new(lanes))
        }
    }

    fn find(&self, query: &[u64]) -> crate::OverlapScores {
        match self {
            Target::Inline(index) => index.find_matches(query),
            Target::Lanes(index) => index.find_matches(query),
        }
    }

    fn apply(&mut self, batch: crate::KvEventBatch) -> Result<(), LaneClosed> {
        match self {
            Target::Inline(index) => {
                index.apply(&batch);
                Ok(())
            }
            Target::Lanes(index) => index.apply(batch),
        }
    }

    fn flush(&self) -> Result<(), LaneClosed> {
        match self {
            Target::Inline(_) => Ok(()),
            Target::Lanes(index) => index.flush(),
        }
    }

    fn num_blocks(&self) -> u64 {
        match self {
            Target::Inline(index) => index.num_blocks(),
            Target::Lanes(index) => index.num_blocks(),
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            Target::Inline(index) => index.memory_bytes(),
            Target::Lanes(index) => index.memory_bytes(),
        }
    }
}

/// Local-hash queries of exactly `static_query_blocks` blocks cut from the longest requests
/// (the latest ones first, whose blocks are most likely still cached).
fn static_queries(requests: &[Vec<u64>], config: &ReplayConfig) -> Vec<Vec<u64>> {
    let want = config.static_query_blocks.max(1);
    let mut long: Vec<&Vec<u64>> = requests.iter().rev().filter(|r| r.len() >= want).collect();
    if long.is_empty() {
        long = requests.iter().rev().filter(|r| !r.is_empty()).collect();
    }
    long.iter()
        .cycle()
        .take(if long.is_empty() {
            0
        } else {
            config.static_queries
        })
        .map(|ids| {
            ids.iter()
                .take(want)
                .map(|&id| sim::tokens_hash(id))
                .collect()
        })
        .collect()
}

/// User + system CPU seconds of this process (all threads), from `/proc/self/stat`.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    // Clock ticks are 100 Hz on every Linux configuration that matters here.
    Some((utime + stime) / 100.0)
}

/// (p50, p99, max) in microseconds; sorts in place.
fn percentiles(samples: &mut [Duration]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.50), at(0.99), at(1.0))
}
