//! Goodput: requests per second that meet a time-to-first-token and an inter-token-latency SLO.
//!
//! Dynamo's A/B comparisons use TTFT ≤ 2 s and ITL ≤ 25 ms on GPUs; the simulated engines are
//! not those GPUs, so the SLO is calibrated per workload instead: 2× round-robin's median TTFT
//! and 1.25× its median ITL when the same workload arrives four times slower. That SLO is
//! reachable (an unloaded fleet meets it easily) and separates policies by how they hold up
//! under the real load.

use kvmesh_mocker::engine::FinishKind;
use kvmesh_mocker::engine::sim::RequestRecord;
use serde::Serialize;

use super::workload::WorkItem;
use super::{ModeArg, Settings};

/// Slow-down of the arrivals for the calibration run.
pub const CALIBRATION_SLOWDOWN: f64 = 4.0;
/// SLO TTFT = this × round-robin's median TTFT at a quarter of the load.
pub const TTFT_FACTOR: f64 = 2.0;
/// SLO ITL = this × round-robin's median ITL at a quarter of the load.
pub const ITL_FACTOR: f64 = 1.25;

/// The latency objective a request must meet to count towards goodput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    /// Largest time to first token, ms.
    pub ttft_ms: f64,
    /// Largest mean inter-token latency of a request, ms.
    pub itl_ms: f64,
    /// Whether the values come from the calibration run (or from `--slo-*` flags).
    pub calibrated: bool,
}

/// The SLO of `items` under `settings`: round-robin at a quarter of the load.
pub fn calibrate(items: &[WorkItem], settings: &Settings) -> anyhow::Result<Slo> {
    let slow = Settings {
        speed: settings.speed / CALIBRATION_SLOWDOWN,
        ..settings.clone()
    };
    let records = super::simulate(items, &slow, ModeArg::RoundRobin)?.0;
    let mut ttft: Vec<u64> = records.iter().filter_map(ttft_us).collect();
    let mut itl: Vec<f64> = records.iter().filter_map(itl_us).collect();
    ttft.sort_unstable();
    itl.sort_unstable_by(f64::total_cmp);
    let median_ttft_ms = ttft.get(ttft.len() / 2).copied().unwrap_or(0) as f64 / 1000.0;
    let median_itl_ms = itl.get(itl.len() / 2).copied().unwrap_or(0.0) / 1000.0;
    Ok(Slo {
        ttft_ms: TTFT_FACTOR * median_ttft_ms,
        itl_ms: ITL_FACTOR * median_itl_ms,
        calibrated: true,
    })
}

/// Time to first token of a request that ran, µs.
pub fn ttft_us(record: &RequestRecord) -> Option<u64> {
    if matches!(record.finish, Some(FinishKind::Error(_))) {
        return None;
    }
    record
        .first_token_us
        .map(|first| first.saturating_sub(record.arrival_us))
}

/// Mean inter-token latency of a finished request with at least two tokens, µs.
pub fn itl_us(record: &RequestRecord) -> Option<f64> {
    let (first, finish) = (record.first_token_us?, record.finish_us?);
    if record.num_output_tokens < 2 || matches!(record.finish, Some(FinishKind::Error(_))) {
        return None;
    }
    Some(finish.saturating_sub(first) as f64 / f64::from(record.num_output_tokens - 1))
}

/// Whether a request finished within the SLO (a single-token request has no ITL to miss).
pub fn meets(record: &RequestRecord, slo: &Slo) -> bool {
    let Some(ttft) = ttft_us(record) else {
        return false;
    };
    if record.finish_us.is_none() {
        return false;
    }
    let itl_ok = itl_us(record).is_none_or(|itl| itl <= slo.itl_ms * 1000.0);
    ttft as f64 <= slo.ttft_ms * 1000.0 && itl_ok
}
