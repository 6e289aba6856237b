//! `kvmesh bench routing`: a deterministic routing-quality simulation.
//!
//! K mock engine cores ([`kvmesh_mocker::engine::DpEngine`]) run on one virtual clock
//! ([`Simulation`]); each arriving request is placed by the real routing core
//! ([`kvmesh_routing::RouterCore`]) in one of the product modes, or by the load-capped greedy
//! reference policy. The router sees what it would see in production: the engines' KV events
//! through the in-process event index, their published load, first tokens and finishes, all at
//! the virtual time they happen. The workload is a Mooncake-format trace replayed at its
//! timestamps divided by `--speed`, or the seeded synthetic generator.
//!
//! Engines and router use the same block size (`--block-size`, tokens); `--cache-blocks` is each
//! worker's KV capacity in those engine blocks. Trace prompts are built from 512-token hash-id
//! blocks whatever the engine block size (see [`workload`]).
//!
//! Nothing reads the wall clock, no decision depends on hash-map iteration order, and every
//! random choice comes from a seeded generator, so the same inputs print bit-identical figures on
//! any machine.

mod goodput;
mod handler;
mod metrics;
mod modes;
mod sweep;
mod synthetic;
#[cfg(test)]
mod tests;
mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kvmesh_mocker::engine::EngineConfig;
use kvmesh_mocker::engine::sim::{RequestRecord, SimConfig, Simulation};
use kvmesh_routing::KvRouterConfig;
use kvmesh_routing::args::AdaptiveArgs;
use serde::Serialize;

pub use self::goodput::Slo;
use self::handler::{BenchHandler, Fleet};
pub use self::metrics::ModeReport;
pub use self::modes::ModeArg;
use self::synthetic::{SyntheticArgs, positive_f64};
use self::workload::{WorkItem, scaled_arrival};

/// Options of `kvmesh bench routing`.
#[derive(Debug, Args)]
pub struct RoutingBench {
    /// Mooncake-format trace (JSON lines: `timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids` of 512-token blocks), e.g.
    /// ../shared/traces/mooncake_fast25_conversation_trace.jsonl.
    #[arg(
        long,
        required_unless_present_any = ["synthetic", "tool_agent"],
        conflicts_with_all = ["synthetic", "tool_agent"]
    )]
    pub trace: Option<PathBuf>,
    /// Replay the seeded synthetic workload (shared system prompts, multi-turn sessions).
    #[arg(long)]
    pub synthetic: bool,
    /// Replay the seeded tool-agent workload: the synthetic generator with long shared tool
    /// prefixes and many short turns (its shape replaces the synthetic workload options; only
    /// `--seed`, `--speed` and `--max-requests` apply).
    #[arg(long, conflicts_with = "synthetic")]
    pub tool_agent: bool,
    /// Synthetic workload shape.
    #[command(flatten)]
    pub synthetic_args: SyntheticArgs,
    /// Replay only the first N requests (by arrival).
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Simulated workers (one dp rank each).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub workers: u32,
    /// KV capacity of each worker, in engine blocks of `--block-size` tokens.
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..))]
    pub cache_blocks: u32,
    /// Tokens per KV block, for the engines and the router alike.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_size: u32,
    /// Most sequences an engine runs at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_seqs: u32,
    /// Token budget of one engine scheduler pass.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_batched_tokens: u32,
    /// Arrival-rate factor: request i arrives at its timestamp / speed (> 1 = faster).
    #[arg(long, default_value_t = 1.0, value_parser = positive_f64)]
    pub speed: f64,
    /// Routing modes to compare, comma-separated, or `all`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub mode: Vec<ModeArg>,
    /// Seeds the router's random choices, the engines' tokens and the synthetic workload.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Sweep the fixed weights (overlap credit × prefill load scale) and compare the best grid
    /// point with `kv-auto`, Dynamo's defaults, `lmetric` and round-robin (`--mode` is ignored).
    #[arg(long)]
    pub sweep: bool,
    /// Goodput's TTFT objective in ms, with `--slo-itl-ms` (default: calibrated per workload,
    /// see the report).
    #[arg(long, value_parser = positive_f64, requires = "slo_itl_ms")]
    pub slo_ttft_ms: Option<f64>,
    /// Goodput's inter-token-latency objective in ms, with `--slo-ttft-ms`.
    #[arg(long, value_parser = positive_f64, requires = "slo_ttft_ms")]
    pub slo_itl_ms: Option<f64>,
    /// Cost-model options of the `kv` modes.
    #[command(flatten)]
    pub router: RouterKnobs,
    /// Load-capped greedy: eligible workers have assigned work at most this × the mean.
    #[arg(long, default_value_t = 1.25, value_parser = at_least_one)]
    pub greedy_cap: f64,
}

/// The `kv` cost-model options the simulation supports, named as the frontend's flags (no
/// environment variables: a benchmark's figures must not depend on the shell).
#[derive(Debug, Clone, Args)]
pub struct RouterKnobs {
    /// Credit per device-cached block against prefill.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub router_kv_overlap_score_credit: f64,
    /// Decay of the credit on workers with excess active prefill.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub router_kv_overlap_score_credit_decay: f64,
    /// Weight of the adjusted prefill blocks in the cost.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub router_prefill_load_scale: f64,
    /// Softmax temperature of the selection (0 = lowest cost).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub router_temperature: f64,
    /// Cost per request already active on a worker.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub router_decode_active_request_weight: f64,
    /// TTL of the approximate index (`kv-approx`), in virtual seconds.
    #[arg(long, default_value_t = 120.0, value_parser = positive_f64)]
    pub router_ttl_secs: f64,
    /// TTL of the predicted side index (`kv` only), in virtual seconds; unset = none.
    #[arg(long, value_parser = positive_f64)]
    pub router_predicted_ttl_secs: Option<f64>,
    /// Grow tracked blocks as output is generated.
    #[arg(long)]
    pub router_track_output_blocks: bool,
    /// Fixed or learned credit and scale (the router's own flag).
    #[command(flatten)]
    pub adaptive: AdaptiveArgs,
}

impl RouterKnobs {
    /// The `kv` options these knobs give (the router's defaults otherwise; one event apply lane,
    /// which changes no answer since the index is flushed before each decision).
    pub fn kv_config(&self) -> anyhow::Result<KvRouterConfig> {
        let secs = |flag: &str, value: f64| {
            Duration::try_from_secs_f64(value).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
        };
        let predicted_ttl = self
            .router_predicted_ttl_secs
            .map(|v| secs("--router-predicted-ttl-secs", v))
            .transpose()?;
        Ok(KvRouterConfig {
            overlap_score_credit: self.router_kv_overlap_score_credit,
            overlap_score_credit_decay: self.router_kv_overlap_score_credit_decay,
            prefill_load_scale: self.router_prefill_load_scale,
            temperature: self.router_temperature,
            decode_active_request_weight: self.router_decode_active_request_weight,
            ttl: secs("--router-ttl-secs", self.router_ttl_secs)?,
            predicted_ttl,
            track_output_blocks: self.router_track_output_blocks,
            weights: self.adaptive.router_kv_weights,
            event_threads: 1,
            ..KvRouterConfig::default()
        })
    }
}

/// Everything a run needs besides the workload.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Workers.
    pub workers: usize,
    /// Each worker's engine.
    pub engine: EngineConfig,
    /// Arrival-rate factor.
    pub speed: f64,
    /// Router seed.
    pub seed: u64,
    /// `kv` options of the router modes.
    pub kv: KvRouterConfig,
    /// Load-capped greedy's cap.
    pub greedy_cap: f64,
    /// Goodput's objective when given by flags (both set); calibrated per workload otherwise.
    pub slo: Option<Slo>,
}

impl Settings {
    /// The settings the command line asks for.
    pub fn from_args(args: &RoutingBench) -> anyhow::Result<Self> {
        Ok(Self {
            workers: args.workers as usize,
            engine: EngineConfig {
                num_gpu_blocks: args.cache_blocks as usize,
                block_size: args.block_size as usize,
                max_num_seqs: args.max_num_seqs as usize,
                max_num_batched_tokens: args.max_num_batched_tokens as usize,
                seed: args.seed,
                ..EngineConfig::default()
            },
            speed: args.speed,
            seed: args.seed,
            kv: args.router.kv_config()?,
            greedy_cap: args.greedy_cap,
            slo: match (args.slo_ttft_ms, args.slo_itl_ms) {
                (Some(ttft_ms), Some(itl_ms)) => Some(Slo {
                    ttft_ms,
                    itl_ms,
                    calibrated: false,
                }),
                _ => None,
            },
        })
    }
}

/// What was replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSummary {
    /// `trace <file name>` or `synthetic`.
    pub source: String,
    /// Requests.
    pub requests: u64,
    /// Prompt tokens of all requests.
    pub prompt_tokens: u64,
    /// Output tokens asked for.
    pub output_tokens: u64,
    /// Last arrival at the chosen speed, s.
    pub arrival_span_s: f64,
}

/// The whole report: the run's parameters and one [`ModeReport`] per mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The workload.
    pub workload: WorkloadSummary,
    /// Workers.
    pub workers: usize,
    /// KV blocks per worker (engine blocks).
    pub cache_blocks: usize,
    /// Tokens per engine and router block.
    pub block_size: usize,
    /// Arrival-rate factor.
    pub speed: f64,
    /// Seed.
    pub seed: u64,
    /// The objective goodput counts against.
    pub slo: Slo,
    /// Figures by mode name.
    pub modes: BTreeMap<&'static str, ModeReport>,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: RoutingBench) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let (source, items) = load_workload(&args)?;
        let settings = Settings::from_args(&args)?;
        if args.sweep {
            let report = sweep::run(source, &items, &settings)?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                sweep::print(&report);
            }
            return Ok(());
        }
        let modes = ModeArg::expand(&args.mode);
        let report = run_modes(source, &items, &settings, &modes)?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            metrics::print_table(&report, &settings, &modes);
        }
        Ok(())
    })
    .await?
}

/// Reads the trace or generates the synthetic workload; returns its description too.
pub fn load_workload(args: &RoutingBench) -> anyhow::Result<(String, Vec<WorkItem>)> {
    match &args.trace {
        Some(path) if !args.synthetic => {
            let items = workload::load_trace(path, args.max_requests)?;
            let name = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            );
            Ok((format!("trace {name}"), items))
        }
        _ => {
            let (name, shape) = if args.tool_agent {
                ("tool-agent", SyntheticArgs::tool_agent())
            } else {
                ("synthetic", args.synthetic_args.clone())
            };
            let mut items = synthetic::generate(&shape, args.seed);
            if let Some(max) = args.max_requests {
                items.truncate(max);
            }
            Ok((name.to_string(), items))
        }
    }
}

/// Simulates each mode over `items` and gathers the report.
pub fn run_modes(
    source: String,
    items: &[WorkItem],
    settings: &Settings,
    modes: &[ModeArg],
) -> anyhow::Result<Report> {
    let slo = match settings.slo {
        Some(slo) => slo,
        None => goodput::calibrate(items, settings)?,
    };
    let mut reports = BTreeMap::new();
    for &mode in modes {
        reports.insert(mode.name(), run_mode(items, settings, mode, &slo)?);
    }
    let last_arrival = items.iter().map(|i| i.arrival_us).max().unwrap_or(0);
    Ok(Report {
        workload: WorkloadSummary {
            source,
            requests: items.len() as u64,
            prompt_tokens: items.iter().map(|i| u64::from(i.input_length)).sum(),
            output_tokens: items.iter().map(|i| u64::from(i.output_length)).sum(),
            arrival_span_s: scaled_arrival(last_arrival, settings.speed) as f64 / 1e6,
        },
        workers: settings.workers,
        cache_blocks: settings.engine.num_gpu_blocks,
        block_size: settings.engine.block_size,
        speed: settings.speed,
        seed: settings.seed,
        slo,
        modes: reports,
    })
}

/// Simulates one mode over `items` and computes its figures against `slo`.
pub fn run_mode(
    items: &[WorkItem],
    settings: &Settings,
    mode: ModeArg,
    slo: &Slo,
) -> anyhow::Result<ModeReport> {
    let (records, handler) = simulate(items, settings, mode)?;
    let mut report = metrics::summarize(&records, items, settings.workers.max(1), slo);
    report.route_errors = handler.num_route_errors();
    report.greedy_cap_ratio = handler.greedy_worst_ratio();
    report.learned_weights = handler.learned_weights();
    if let Some(prefix) = handler.prefix_choices() {
        let all_prompt_tokens: u64 = items.iter().map(|i| u64::from(i.input_length)).sum();
        report.shorter_prefix_share = Some(metrics::ratio(
            prefix.num_shorter as f64,
            prefix.num_decisions as f64,
        ));
        report.forgone_hit_rate = Some(metrics::ratio(
            prefix.forgone_tokens as f64,
            all_prompt_tokens as f64,
        ));
    }
    Ok(report)
}

/// Replays `items` under one mode; returns the engines' per-request records and the handler.
fn simulate(
    items: &[WorkItem],
    settings: &Settings,
    mode: ModeArg,
) -> anyhow::Result<(Vec<RequestRecord>, BenchHandler)> {
    settings
        .engine
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid engine configuration: {e}"))?;
    let fleet = Fleet {
        num_workers: settings.workers.max(1),
        block_size: settings.engine.block_size as u32,
        total_kv_blocks: settings.engine.num_gpu_blocks as u64,
        max_num_batched_tokens: settings.engine.max_num_batched_tokens as u64,
        seed: settings.seed,
    };
    let mut handler = BenchHandler::new(mode.policy(settings), &fleet)
        .map_err(|e| anyhow::anyhow!("mode {}: {e}", mode.name()))?;
    let mut sim = Simulation::new(
        settings.engine.clone(),
        fleet.num_workers,
        SimConfig::default(),
    );
    let speed = settings.speed;
    let arrivals = items.iter().enumerate().map(|(key, item)| {
        (
            scaled_arrival(item.arrival_us, speed),
            item.engine_request(key as u64),
        )
    });
    sim.run_with(arrivals, &mut handler);
    if let Some(failure) = handler.failure() {
        anyhow::bail!("mode {}: the event index failed: {failure}", mode.name());
    }
    Ok((sim.records().to_vec(), handler))
}

fn at_least_one(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("must be a number >= 1, got {value}")),
    }
}
