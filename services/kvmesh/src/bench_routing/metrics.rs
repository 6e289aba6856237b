//! Figures of one simulated run, computed from the engines' per-request records.

use kvmesh_mocker::engine::FinishKind;
use kvmesh_mocker::engine::sim::RequestRecord;
use serde::Serialize;

use super::goodput::{self, Slo};
use super::workload::WorkItem;
use super::{ModeArg, Report, Settings};

/// The figures of one routing mode on one workload. Times are virtual: the same inputs give the
/// same figures on any machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeReport {
    /// Requests replayed.
    pub requests: u64,
    /// Requests the engine refused (e.g. a prompt larger than a worker's KV cache).
    pub errors: u64,
    /// Block-weighted prefix hit rate: cached prompt tokens / prompt tokens of the requests that
    /// ran (the engine's `cached_tokens` at admission).
    pub hit_rate: f64,
    /// Prompt tokens of the requests that ran.
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache at admission.
    pub cached_tokens: u64,
    /// Prompt tokens prefilled: prompt − cached.
    pub prefill_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Time to first token, mean, ms.
    pub ttft_mean_ms: f64,
    /// Time to first token, median, ms.
    pub ttft_p50_ms: f64,
    /// Time to first token, 99th percentile, ms.
    pub ttft_p99_ms: f64,
    /// Arrival to last token, mean, ms.
    pub e2e_mean_ms: f64,
    /// Arrival to last token, median, ms.
    pub e2e_p50_ms: f64,
    /// Arrival to last token, 99th percentile, ms.
    pub e2e_p99_ms: f64,
    /// Mean inter-token latency of a request (finished, two tokens or more), median, ms.
    pub itl_p50_ms: f64,
    /// The same, 99th percentile, ms.
    pub itl_p99_ms: f64,
    /// Requests per second of virtual time (first arrival to last finish) that met the SLO.
    pub goodput_rps: f64,
    /// Share of the requests that met the SLO.
    pub slo_attainment: f64,
    /// Share of decode steps (tokens after each request's first) whose pass also prefilled a
    /// prompt. Each such step is lengthened by that prefill; under load this share, not the
    /// mean TTFT, is what decides how many requests meet the ITL half of the SLO.
    pub decode_steps_beside_prefill: f64,
    /// Output tokens per second of virtual time, first arrival to last finish.
    pub throughput_tok_s: f64,
    /// First arrival to last finish, s.
    pub makespan_s: f64,
    /// Most requests on one worker / mean requests per worker.
    pub req_imbalance: f64,
    /// Most work on one worker / mean, work being prefilled plus generated tokens.
    pub work_imbalance: f64,
    /// Requests each worker received, by worker index.
    pub requests_per_worker: Vec<u64>,
    /// Decisions the router refused or parked (0 with the benchmark's options).
    pub route_errors: u64,
    /// Modes reading the event index (`kv`, load-capped greedy): share of decisions that chose a
    /// worker caching a shorter prefix than the best worker did at that moment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shorter_prefix_share: Option<f64>,
    /// Same modes: prompt tokens the best worker cached beyond the chosen one / prompt tokens,
    /// the hit rate the decisions left on the table (before any later eviction).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forgone_hit_rate: Option<f64>,
    /// Load-capped greedy only: the largest chosen worker's assigned work / mean at a decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greedy_cap_ratio: Option<f64>,
    /// `--router-kv-weights auto` only: the weights in force at the end of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned_weights: Option<LearnedWeightsReport>,
}

/// The learned weights at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LearnedWeightsReport {
    /// Credit per cached block.
    pub overlap_score_credit: f64,
    /// Weight of prefill blocks against decode blocks.
    pub prefill_load_scale: f64,
    /// Weight of the decode-stall term (pending prefill × running requests).
    pub decode_stall_weight: f64,
    /// First tokens the fit saw.
    pub num_observations: u64,
}

/// Computes the figures of a run over `items` (record keys are item positions) on
/// `num_workers` workers.
pub fn summarize(
    records: &[RequestRecord],
    items: &[WorkItem],
    num_workers: usize,
    slo: &Slo,
) -> ModeReport {
    let num_workers = num_workers.max(1);
    let mut requests_per_worker = vec![0u64; num_workers];
    let mut work_per_worker = vec![0u64; num_workers];
    let (mut prompt_tokens, mut cached_tokens, mut output_tokens, mut errors) = (0, 0, 0, 0);
    let (mut decode_steps, mut steps_beside_prefill) = (0u64, 0u64);
    let mut ttft_us = Vec::with_capacity(records.len());
    let mut e2e_us = Vec::with_capacity(records.len());
    let mut first_arrival = u64::MAX;
    let mut last_finish = 0u64;
    for record in records {
        let worker = record.worker.min(num_workers - 1);
        requests_per_worker[worker] += 1;
        first_arrival = first_arrival.min(record.arrival_us);
        if let Some(finish) = record.finish_us {
            last_finish = last_finish.max(finish);
        }
        let output = u64::from(record.num_output_tokens);
        output_tokens += output;
        if matches!(record.finish, Some(FinishKind::Error(_))) {
            errors += 1;
            continue;
        }
        decode_steps += output.saturating_sub(1);
        steps_beside_prefill += u64::from(record.num_steps_beside_prefill);
        let prompt = usize::try_from(record.key)
            .ok()
            .and_then(|key| items.get(key))
            .map_or(0, |item| u64::from(item.input_length));
        let cached = u64::from(record.cached_tokens).min(prompt);
        prompt_tokens += prompt;
        cached_tokens += cached;
        work_per_worker[worker] += prompt - cached + output;
        if let Some(first) = record.first_token_us {
            ttft_us.push(first.saturating_sub(record.arrival_us));
        }
        if let Some(finish) = record.finish_us {
            e2e_us.push(finish.saturating_sub(record.arrival_us));
        }
    }
    let makespan_us = last_finish.saturating_sub(first_arrival.min(last_finish));
    let makespan_s = makespan_us as f64 / 1e6;
    let mut itl_us: Vec<u64> = records
        .iter()
        .filter_map(goodput::itl_us)
        .map(|itl| itl.round() as u64)
        .collect();
    let num_good = records.iter().filter(|r| goodput::meets(r, slo)).count();
    ModeReport {
        requests: records.len() as u64,
        errors,
        hit_rate: ratio(cached_tokens as f64, prompt_tokens as f64),
        prompt_tokens,
        cached_tokens,
        prefill_tokens: prompt_tokens - cached_tokens,
        output_tokens,
        ttft_mean_ms: mean_ms(&ttft_us),
        ttft_p50_ms: percentile_ms(&mut ttft_us, 0.50),
        ttft_p99_ms: percentile_ms(&mut ttft_us, 0.99),
        e2e_mean_ms: mean_ms(&e2e_us),
        e2e_p50_ms: percentile_ms(&mut e2e_us, 0.50),
        e2e_p99_ms: percentile_ms(&mut e2e_us, 0.99),
        itl_p50_ms: percentile_ms(&mut itl_us, 0.50),
        itl_p99_ms: percentile_ms(&mut itl_us, 0.99),
        goodput_rps: ratio(num_good as f64, makespan_s),
        slo_attainment: ratio(num_good as f64, records.len() as f64),
        decode_steps_beside_prefill: ratio(steps_beside_prefill as f64, decode_steps as f64),
        throughput_tok_s: ratio(output_tokens as f64, makespan_s),
        makespan_s,
        req_imbalance: imbalance(&requests_per_worker),
        work_imbalance: imbalance(&work_per_worker),
        requests_per_worker,
        route_errors: 0,
        shorter_prefix_share: None,
        forgone_hit_rate: None,
        greedy_cap_ratio: None,
        learned_weights: None,
    }
}

/// `a / b`, 0 when `b` is 0.
pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Max / mean; 0 when everything is 0.
fn imbalance(values: &[u64]) -> f64 {
    let total: u64 = values.iter().sum();
    let max = values.iter().copied().max().unwrap_or(0);
    ratio(max as f64 * values.len() as f64, total as f64)
}

fn mean_ms(samples_us: &[u64]) -> f64 {
    let total: u64 = samples_us.iter().sum();
    ratio(total as f64, samples_us.len() as f64) / 1000.0
}

/// Nearest-rank percentile in ms; sorts in place; 0 without samples.
fn percentile_ms(samples_us: &mut [u64], q: f64) -> f64 {
    if samples_us.is_empty() {
        return 0.0;
    }
    samples_us.sort_unstable();
    let rank = (samples_us.len() as f64 * q).ceil() as usize;
    samples_us[rank.clamp(1, samples_us.len()) - 1] as f64 / 1000.0
}

/// Prints the report as the human table (modes in run order).
pub(super) fn print_table(report: &Report, settings: &Settings, modes: &[ModeArg]) {
    let w = &report.workload;
    println!(
        "workload  {}: {} requests, {:.1} M prompt tokens, {:.2} M output tokens, arrivals over {:.1} s (speed {})",
        w.source,
        w.requests,
        w.prompt_tokens as f64 / 1e6,
        w.output_tokens as f64 / 1e6,
        w.arrival_span_s,
        report.speed
    );
    println!(
        "fleet     {} workers × {} KV blocks of {} tokens ({} tokens each), max_num_seqs {}, \
         max_num_batched_tokens {}, seed {}",
        report.workers,
        report.cache_blocks,
        report.block_size,
        report.cache_blocks * report.block_size,
        settings.engine.max_num_seqs,
        settings.engine.max_num_batched_tokens,
        report.seed
    );
    println!(
        "slo       TTFT ≤ {:.0} ms, ITL ≤ {:.2} ms ({})",
        report.slo.ttft_ms,
        report.slo.itl_ms,
        if report.slo.calibrated {
            "2× / 1.25× round-robin's medians at a quarter of the load"
        } else {
            "from the flags"
        }
    );
    println!();
    println!(
        "{:<22} {:>8} {:>8} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7}",
        "mode",
        "goodput",
        "hit rate",
        "prefill tok",
        "TTFT mean",
        "TTFT p50",
        "TTFT p99",
        "e2e mean",
        "e2e p99",
        "out tok/s",
        "req imb",
        "work imb"
    );
    for mode in modes {
        let Some(m) = report.modes.get(mode.name()) else {
            continue;
        };
        println!(
            "{:<22} {:>8.3} {:>8.3} {:>12} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>7.3} {:>7.3}",
            mode.name(),
            m.goodput_rps,
            m.hit_rate,
            m.prefill_tokens,
            m.ttft_mean_ms,
            m.ttft_p50_ms,
            m.ttft_p99_ms,
            m.e2e_mean_ms,
            m.e2e_p99_ms,
            m.throughput_tok_s,
            m.req_imbalance,
            m.work_imbalance
        );
        if m.errors > 0 || m.route_errors > 0 {
            println!(
                "{:<22} {} requests refused by the engine, {} routing errors",
                "", m.errors, m.route_errors
            );
        }
    }
    for mode in modes {
        let Some(m) = report.modes.get(mode.name()) else {
            continue;
        };
        if let (Some(share), Some(forgone)) = (m.shorter_prefix_share, m.forgone_hit_rate) {
            println!(
                "{}: {:.1}% of decisions passed over a worker caching a longer prefix \
                 (hit rate forgone at decision time {:.3})",
                mode.name(),
                share * 100.0,
                forgone
            );
        }
    }
    for mode in modes {
        if let Some(m) = report.modes.get(mode.name()) {
            println!(
                "{}: {:.1}% of decode steps shared a pass with prefill, {:.1}% of requests met the SLO",
                mode.name(),
                m.decode_steps_beside_prefill * 100.0,
                m.slo_attainment * 100.0
            );
        }
    }
    for mode in modes {
        if let Some(w) = report
            .modes
            .get(mode.name())
            .and_then(|m| m.learned_weights)
        {
            println!(
                "{}: learned overlap credit {}, prefill load scale {} ({} first tokens observed)",
                mode.name(),
                w.overlap_score_credit,
                w.prefill_load_scale,
                w.num_observations
            );
        }
    }
    println!("(goodput in requests/s; times in ms of virtual time; identical on every machine)");
}
