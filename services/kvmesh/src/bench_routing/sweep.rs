//! `kvmesh bench routing --sweep`: the fixed weights over a grid, and the adaptive mode against
//! the best grid point.
//!
//! The grid is overlap credit × prefill load scale; the best fixed setting of a workload is the
//! point with the highest goodput, ties to the lower mean TTFT. The report then holds `kv-auto`
//! (no weight flags), `kv` at the flags' weights (Dynamo's defaults unless given), `lmetric`
//! and round-robin, and checks the adaptive mode's targets against them.

use std::collections::BTreeMap;

use kvmesh_routing::KvWeightsMode;
use serde::Serialize;

use super::workload::WorkItem;
use super::{ModeArg, ModeReport, Report, Settings, Slo, WorkloadSummary, run_mode, run_modes};

/// Overlap credits swept.
pub const CREDITS: [f64; 6] = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0];
/// Prefill load scales swept.
pub const SCALES: [f64; 5] = [1.0, 4.0, 16.0, 64.0, 256.0];

/// The modes compared with the best grid point.
const COMPARED: [ModeArg; 4] = [
    ModeArg::RoundRobin,
    ModeArg::Kv,
    ModeArg::KvAuto,
    ModeArg::Lmetric,
];

/// One fixed setting's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridPoint {
    /// `--router-kv-overlap-score-credit`.
    pub credit: f64,
    /// `--router-prefill-load-scale`.
    pub scale: f64,
    /// Requests per second within the SLO.
    pub goodput_rps: f64,
    /// Prefix hit rate.
    pub hit_rate: f64,
    /// Mean TTFT, ms.
    pub ttft_mean_ms: f64,
    /// p99 TTFT, ms.
    pub ttft_p99_ms: f64,
    /// Most requests on one worker / mean.
    pub req_imbalance: f64,
    /// Share of decode steps whose pass also prefilled ([`ModeReport`]'s field of that name).
    pub decode_steps_beside_prefill: f64,
}

/// One target of the adaptive mode and whether it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// What is compared.
    pub name: &'static str,
    /// The adaptive mode's value (a ratio where the target is one).
    pub value: f64,
    /// The bound.
    pub target: f64,
    /// Whether the target is met.
    pub met: bool,
}

/// The sweep's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    /// The workload.
    pub workload: WorkloadSummary,
    /// Workers.
    pub workers: usize,
    /// KV blocks per worker.
    pub cache_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Arrival-rate factor.
    pub speed: f64,
    /// The objective goodput counts against.
    pub slo: Slo,
    /// Every grid point, credit-major.
    pub grid: Vec<GridPoint>,
    /// The best fixed setting.
    pub best: GridPoint,
    /// The compared modes.
    pub modes: BTreeMap<&'static str, ModeReport>,
    /// The adaptive mode's targets.
    pub checks: Vec<Check>,
}

/// Runs the grid and the compared modes over `items`.
pub fn run(source: String, items: &[WorkItem], settings: &Settings) -> anyhow::Result<SweepReport> {
    let fixed = Settings {
        kv: kvmesh_routing::KvRouterConfig {
            weights: KvWeightsMode::Fixed,
            ..settings.kv.clone()
        },
        ..settings.clone()
    };
    let Report {
        workload,
        workers,
        cache_blocks,
        block_size,
        speed,
        slo,
        modes,
        ..
    } = run_modes(source, items, &fixed, &COMPARED)?;
    let mut grid = Vec::with_capacity(CREDITS.len() * SCALES.len());
    for credit in CREDITS {
        for scale in SCALES {
            let mut point = fixed.clone();
            point.kv.overlap_score_credit = credit;
            point.kv.prefill_load_scale = scale;
            let m = run_mode(items, &point, ModeArg::Kv, &slo)?;
            grid.push(GridPoint {
                credit,
                scale,
                goodput_rps: m.goodput_rps,
                hit_rate: m.hit_rate,
                ttft_mean_ms: m.ttft_mean_ms,
                ttft_p99_ms: m.ttft_p99_ms,
                req_imbalance: m.req_imbalance,
                decode_steps_beside_prefill: m.decode_steps_beside_prefill,
            });
        }
    }
    let best = grid
        .iter()
        .cloned()
        .reduce(|best, p| {
            let better = p.goodput_rps > best.goodput_rps
                || (p.goodput_rps == best.goodput_rps && p.ttft_mean_ms < best.ttft_mean_ms);
            if better { p } else { best }
        })
        .ok_or_else(|| anyhow::anyhow!("empty grid"))?;
    let checks = checks(&modes, &best);
    Ok(SweepReport {
        workload,
        workers,
        cache_blocks,
        block_size,
        speed,
        slo,
        grid,
        best,
        modes,
        checks,
    })
}

/// The targets of the adaptive mode (docs/benchmarks.md, "Adaptive weights").
fn checks(modes: &BTreeMap<&'static str, ModeReport>, best: &GridPoint) -> Vec<Check> {
    let (Some(auto), Some(rr), Some(kv), Some(lmetric)) = (
        modes.get("kv-auto"),
        modes.get("round-robin"),
        modes.get("kv"),
        modes.get("lmetric"),
    ) else {
        return Vec::new();
    };
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let at_least = |name, value: f64, target: f64| Check {
        name,
        value,
        target,
        met: value >= target,
    };
    let at_most = |name, value: f64, target: f64| Check {
        name,
        value,
        target,
        met: value <= target,
    };
    vec![
        at_least(
            "goodput / best fixed",
            ratio(auto.goodput_rps, best.goodput_rps),
            0.97,
        ),
        at_least(
            "hit rate / best fixed",
            ratio(auto.hit_rate, best.hit_rate),
            0.97,
        ),
        at_most(
            "mean TTFT / best fixed",
            ratio(auto.ttft_mean_ms, best.ttft_mean_ms),
            1.05,
        ),
        at_most(
            "p99 TTFT / round-robin",
            ratio(auto.ttft_p99_ms, rr.ttft_p99_ms),
            1.0,
        ),
        at_most("request imbalance", auto.req_imbalance, 1.25),
        Check {
            name: "goodput / Dynamo defaults (> 1)",
            value: ratio(auto.goodput_rps, kv.goodput_rps),
            target: 1.0,
            met: auto.goodput_rps > kv.goodput_rps,
        },
        Check {
            name: "goodput / lmetric (> 1)",
            value: ratio(auto.goodput_rps, lmetric.goodput_rps),
            target: 1.0,
            met: auto.goodput_rps > lmetric.goodput_rps,
        },
    ]
}

/// Prints the sweep as tables.
pub fn print(report: &SweepReport) {
    let w = &report.workload;
    println!(
        "workload  {}: {} requests, {} workers × {} blocks of {} tokens, speed {}",
        w.source, w.requests, report.workers, report.cache_blocks, report.block_size, report.speed
    );
    println!(
        "slo       TTFT ≤ {:.0} ms, ITL ≤ {:.2} ms",
        report.slo.ttft_ms, report.slo.itl_ms
    );
    println!();
    println!(
        "{:>6} {:>6} {:>8} {:>8} {:>10} {:>10} {:>7}",
        "credit", "scale", "goodput", "hit rate", "TTFT mean", "TTFT p99", "req imb"
    );
    let row = |label: String, p: &GridPoint| {
        println!(
            "{label:>13} {:>8.3} {:>8.3} {:>10.0} {:>10.0} {:>7.3}",
            p.goodput_rps, p.hit_rate, p.ttft_mean_ms, p.ttft_p99_ms, p.req_imbalance
        );
    };
    for p in &report.grid {
        row(format!("{:>6} {:>6}", p.credit, p.scale), p);
    }
    println!();
    row(
        format!("best {}/{}", report.best.credit, report.best.scale),
        &report.best,
    );
    for mode in COMPARED {
        if let Some(m) = report.modes.get(mode.name()) {
            let p = GridPoint {
                credit: 0.0,
                scale: 0.0,
                goodput_rps: m.goodput_rps,
                hit_rate: m.hit_rate,
                ttft_mean_ms: m.ttft_mean_ms,
                ttft_p99_ms: m.ttft_p99_ms,
                req_imbalance: m.req_imbalance,
                decode_steps_beside_prefill: m.decode_steps_beside_prefill,
            };
            row(mode.name().to_string(), &p);
        }
    }
    if let Some(weights) = report.modes.get("kv-auto").and_then(|m| m.learned_weights) {
        println!(
            "kv-auto ended at credit {} / scale {} / decode stall {} after {} first tokens",
            weights.overlap_score_credit,
            weights.prefill_load_scale,
            weights.decode_stall_weight,
            weights.num_observations
        );
    }
    println!();
    for check in &report.checks {
        println!(
            "{:<34} {:>8.3}  target {:>5}  {}",
            check.name,
            check.value,
            check.target,
            if check.met { "met" } else { "NOT MET" }
        );
    }
}
