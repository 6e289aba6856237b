//! The KV cost function (docs/routing.md, "Cost function"), as a pure function of one
//! candidate's facts.
//!
//! Kept apart from the router so each term can be tested on its own, the worked example of
//! docs/routing.md ("Worked example") reproduced exactly, and the simulator can print a
//! decision's costs.

use crate::config::{KvRouterConfig, apply_legacy_overlap_weight};
use crate::request::RouterConfigOverride;

/// The formula a candidate is scored with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CostPolicy {
    /// docs/routing.md, "Cost function".
    #[default]
    Default,
    /// `adjusted_prefill · (decode_blocks + 1)`: new prefill times batch size, no weights to
    /// tune (a `later` policy of the spec; the routing benchmark compares against it).
    Lmetric,
}

/// The cost model's weights for one decision: the router's config with the request's override.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostWeights {
    /// Credit per device-cached block.
    pub overlap_score_credit: f64,
    /// Decay rate of device credit with excess active prefill.
    pub overlap_score_credit_decay: f64,
    /// Weight of the adjusted prefill blocks.
    pub prefill_load_scale: f64,
    /// Credit per block matched in host memory.
    pub host_cache_hit_weight: f64,
    /// Credit per block matched on disk.
    pub disk_cache_hit_weight: f64,
    /// Cost per active request.
    pub decode_active_request_weight: f64,
    /// Whether prefill load enters the cost at all.
    pub track_prefill_tokens: bool,
    /// Whether the adjusted prefill stops at zero, as in Dynamo's formula. The adaptive mode
    /// lets it go below: its learned credit is often above 1, and at zero every worker whose
    /// credit covers its whole prefill (all those holding a shared system prompt) would cost the
    /// same, so a session's own worker would no longer stand out.
    pub floor_adjusted_prefill: bool,
    /// Weight of the decode-stall term, `max(adjusted_prefill, 0) × active_requests` in units of
    /// the prefill load scale: learned in the adaptive mode (its module docs), 0 otherwise.
    pub decode_stall_weight: f64,
}

/// Everything a decision takes from the config after the per-request override.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EffectiveKv {
    /// Cost weights.
    pub weights: CostWeights,
    /// Selection temperature.
    pub temperature: f64,
    /// Whether tracked blocks dedup by sequence hash.
    pub assume_kv_reuse: bool,
}

impl EffectiveKv {
    /// Merges `config` with a request's `override` (unset fields keep the config's values; the
    /// legacy `overlap_score_weight` is mapped last and wins).
    pub fn new(config: &KvRouterConfig, over: Option<&RouterConfigOverride>) -> Self {
        Self::with_learned(config, None, over)
    }

    /// [`Self::new`] with the adaptive mode's learned credit and scale in place of the
    /// config's (a request's override still wins).
    pub fn with_learned(
        config: &KvRouterConfig,
        learned: Option<&crate::adaptive::LearnedWeights>,
        over: Option<&RouterConfigOverride>,
    ) -> Self {
        let mut weights = CostWeights {
            overlap_score_credit: config.overlap_score_credit,
            overlap_score_credit_decay: config.overlap_score_credit_decay,
            prefill_load_scale: config.prefill_load_scale,
            host_cache_hit_weight: config.host_cache_hit_weight,
            disk_cache_hit_weight: config.disk_cache_hit_weight,
            decode_active_request_weight: config.decode_active_request_weight,
            track_prefill_tokens: config.track_prefill_tokens,
            floor_adjusted_prefill: learned.is_none(),
            decode_stall_weight: 0.0,
        };
        if let Some(learned) = learned {
            weights.overlap_score_credit = learned.overlap_score_credit;
            weights.prefill_load_scale = learned.prefill_load_scale;
            weights.decode_stall_weight = learned.decode_stall_weight;
        }
        let mut temperature = config.temperature;
        let mut assume_kv_reuse = config.assume_kv_reuse;
        if let Some(over) = over {
            let finite = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
            if let Some(credit) = finite(over.overlap_score_credit) {
                weights.overlap_score_credit = credit;
            }
            if let Some(scale) = finite(over.prefill_load_scale) {
                weights.prefill_load_scale = scale;
            }
            if let Some(t) = finite(over.router_temperature) {
                temperature = t;
            }
            if let Some(reuse) = over.assume_kv_reuse {
                assume_kv_reuse = reuse;
            }
            if let Some(track) = over.track_prefill_tokens {
                weights.track_prefill_tokens = track;
            }
            if let Some(weight) = finite(over.overlap_score_weight) {
                apply_legacy_overlap_weight(
                    weight,
                    &mut weights.overlap_score_credit,
                    &mut weights.prefill_load_scale,
                );
            }
        }
        Self {
            weights,
            temperature,
            assume_kv_reuse,
        }
    }

    /// Whether the index is consulted at all (credit 0 ⇒ no query; step 2 of docs/routing.md,
    /// "KV routing flow").
    pub fn queries_index(&self) -> bool {
        self.weights.overlap_score_credit > 0.0
    }
}

/// The request side of the cost: prompt length and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Prompt tokens (ISL).
    pub isl: u64,
    /// Tokens per block (B).
    pub block_size: u32,
    /// Least active prefill tokens over the eligible candidates (the decay's baseline).
    pub min_active_prefill_tokens: u64,
}

impl RequestShape {
    /// `ceil(ISL / B)`.
    pub fn request_blocks(&self) -> u64 {
        self.isl.div_ceil(u64::from(self.block_size.max(1)))
    }
}

/// What the cost reads about one candidate (worker, dp_rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CandidateLoad {
    /// Leading prompt blocks cached on the device.
    pub device_overlap: u32,
    /// Further blocks matched in host memory.
    pub host_overlap: u32,
    /// Further blocks matched on disk.
    pub disk_overlap: u32,
    /// Prefill tokens of requests routed here that have not produced a first token.
    pub active_prefill_tokens: u64,
    /// Whether the tracker has ever held load for this candidate.
    pub has_load_entry: bool,
    /// Decode blocks if the request lands here: active blocks plus this request's new ones.
    pub decode_blocks: u64,
    /// Requests active here.
    pub active_requests: u32,
}

/// The terms of one candidate's cost, for tests, logs and the simulator's traces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostBreakdown {
    /// Prefill blocks before credit.
    pub raw_prefill: f64,
    /// Device-credit decay factor in (0, 1].
    pub decay: f64,
    /// Blocks of credit.
    pub credit: f64,
    /// `raw_prefill − credit`, at least 0 unless the weights allow below.
    pub adjusted_prefill: f64,
    /// Decode steps the pending prefill would share a pass with: `max(adjusted_prefill, 0) ×
    /// active_requests`, weighted by the decode-stall weight and the prefill load scale.
    pub decode_stall: f64,
    /// The total.
    pub cost: f64,
}

/// The cost of sending `request` to `candidate` (docs/routing.md, "Cost function").
pub fn kv_cost(weights: &CostWeights, request: &RequestShape, candidate: &CandidateLoad) -> f64 {
    kv_cost_breakdown(weights, request, candidate).cost
}

/// The lmetric score of sending `request` to `candidate` ([`CostPolicy::Lmetric`]).
pub fn lmetric_cost(
    weights: &CostWeights,
    request: &RequestShape,
    candidate: &CandidateLoad,
) -> f64 {
    let terms = kv_cost_breakdown(weights, request, candidate);
    // A product ranks by sign: new prefill below zero would make a fuller batch cheaper.
    terms.adjusted_prefill.max(0.0) * (candidate.decode_blocks as f64 + 1.0)
}

/// [`kv_cost`] with its terms.
pub fn kv_cost_breakdown(
    weights: &CostWeights,
    request: &RequestShape,
    candidate: &CandidateLoad,
) -> CostBreakdown {
    let block = f64::from(request.block_size.max(1));
    let isl = request.isl as f64;
    let cached = f64::from(candidate.device_overlap) * block;
    let raw_prefill = if !weights.track_prefill_tokens {
        0.0
    } else if !candidate.has_load_entry {
        isl / block
    } else {
        (candidate.active_prefill_tokens as f64 + isl.max(cached)) / block
    };
    let decay = if weights.overlap_score_credit_decay == 0.0 || !weights.track_prefill_tokens {
        1.0
    } else {
        let excess = candidate
            .active_prefill_tokens
            .saturating_sub(request.min_active_prefill_tokens) as f64
            / block;
        let request_blocks = request.request_blocks().max(1) as f64;
        1.0 / (1.0 + weights.overlap_score_credit_decay * excess / request_blocks)
    };
    let credit = weights.overlap_score_credit * decay * f64::from(candidate.device_overlap)
        + weights.host_cache_hit_weight * f64::from(candidate.host_overlap)
        + weights.disk_cache_hit_weight * f64::from(candidate.disk_overlap);
    let adjusted_prefill = if weights.floor_adjusted_prefill {
        (raw_prefill - credit).max(0.0)
    } else {
        raw_prefill - credit
    };
    let decode_stall = weights.prefill_load_scale
        * weights.decode_stall_weight
        * adjusted_prefill.max(0.0)
        * f64::from(candidate.active_requests);
    let cost = weights.prefill_load_scale * adjusted_prefill
        + decode_stall
        + candidate.decode_blocks as f64
        + weights.decode_active_request_weight * f64::from(candidate.active_requests);
    CostBreakdown {
        raw_prefill,
        decay,
        credit,
        adjusted_prefill,
        decode_stall,
        cost,
    }
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
