//! Adaptive KV cost weights (`--router-kv-weights auto`, a kvmesh addition; docs/routing.md,
//! "Adaptive weights").
//!
//! The cost model weighs a cached block against queued prefill (`overlap_score_credit`) and
//! prefill against decode load (`prefill_load_scale`). The right values depend on the workload
//! and the load, so in `auto` mode the router learns them from what it observes: for every
//! request whose first token it sees, the time from routing to that first token against the
//! chosen rank's queued prefill blocks `q`, the request's own uncached blocks `u` and the rank's
//! active decode blocks `d` at routing time. An exponentially forgetting least-squares fit of
//! `ttft ≈ c + a·q + b·u + δ·d` gives the exchange rates in time units: a cached block saves
//! its own request `b`, a queued prefill block costs `a`, a decode block `δ`.
//! A block that must be prefilled also delays every request that queues behind it on that
//! worker: by Little's law about as many as are queued ahead of a request on average, which is
//! `ρ = E[q] / E[u]` requests (queued blocks over a request's own uncached blocks, from the same
//! forgetting sums). Counting that delay, a cached block is worth `credit = (b / a)·(1 + ρ)`
//! queued blocks: near `b / a` when queues are short, several times it under load, which is
//! where keeping a conversation on the worker that holds it pays most.
//!
//! A prefill also stalls the decode of every request running on its worker (their steps share
//! its passes), which the first-token fit cannot see. A second fit of each completed request's
//! decode time (first token to end) on the same features gives `α'`, the decode seconds a
//! queued prefill block adds to a request decoding beside it. Decode seconds count at
//! `w = E[ttft] / E[decode]` first-token seconds, so that a phase's relative slowdown weighs the
//! same in either. A queued block then costs `A = a + w·α'`, and a cached block saves
//! `b·(1 + ρ) + n·w·α'`, `n` the mean number of requests already on the chosen rank at routing:
//! `credit = (b·(1 + ρ) + n·w·α') / A` and `scale = A / δ`.
//!
//! A cached block also saves cache space. Sent away from its cached prefix, a request stores
//! that prefix a second time, and in a full cache every block stored evicts one a later request
//! may need. The router reads how full the chosen rank's cache is (blocks the event-fed index
//! holds over the rank's KV blocks) and multiplies the credit by `1 + 2·p`, `p` the share of
//! recent routings that went to a full cache: the traces whose caches churn want 2–3× the
//! fitted credit, loads that never fill the caches want it as it is. Because the credit is then
//! often well above 1, the adjusted prefill is not floored at zero in this mode
//! (`CostWeights::floor_adjusted_prefill`): floored, every worker holding a shared system
//! prompt would cost the same and a session's own worker would not stand out.
//!
//! The fixed flags are the starting point; the learned values are clamped to the range the
//! benchmark sweeps and moved in quarter-octave steps with hysteresis, so the weights change
//! (and are logged) only when the evidence moves them.
//!
//! Replicas converge without exchanging weights: replica sync carries every request's routing
//! (with its uncached tokens), first token and end (with how it ended), and a replica reads `q`,
//! `d` and `n` from its own mirror of the load, so all replicas fit the same observations; like
//! the router that served it, a replica drops the decode time of a request that did not
//! complete.
//!
//! Cache affinity can concentrate requests on a few workers; in `auto` mode a rank that has
//! received more than [`MAX_REQUEST_SHARE`] × the mean of the recent requests (own and synced,
//! exponentially decayed) is passed over while any other candidate remains.

use std::collections::HashMap;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use crate::tracker::ReqKey;

/// How the KV cost model's credit and scale are set (`--router-kv-weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvWeightsMode {
    /// The flags' values, as Dynamo uses them.
    #[default]
    Fixed,
    /// Learned online from observed time to first token, starting at the flags' values.
    Auto,
}

/// Smallest learned overlap credit.
pub const MIN_CREDIT: f64 = 0.5;
/// Largest learned overlap credit.
pub const MAX_CREDIT: f64 = 16.0;
/// Smallest learned prefill load scale.
pub const MIN_SCALE: f64 = 1.0;
/// Largest learned prefill load scale.
pub const MAX_SCALE: f64 = 256.0;
/// A rank whose decayed share of recent requests exceeds this × the mean is passed over (the
/// imbalance the adaptive mode allows: issue 17 bounds request imbalance at 1.25).
pub const MAX_REQUEST_SHARE: f64 = 1.25;
/// How much more a cached block is worth when the workers' caches are full: `credit` is
/// multiplied by `1 + FULL_CACHE_CREDIT · p`, `p` the share of recent routings that went to a
/// rank whose cache was full. A request sent away from its cached prefix stores that prefix a
/// second time; in a full cache each block stored evicts one that a later request may need,
/// in a cache with room it costs nothing later. Measured (docs/benchmarks.md, issue 17): the
/// best fixed credit is 2–3× the fitted one on the conversation traces, whose caches churn,
/// and equal to it on loads that never fill them.
pub const FULL_CACHE_CREDIT: f64 = 2.0;
/// A rank's cache counts as full from this share of its KV blocks held (engines keep freed
/// blocks cached until they need the room, so a churning cache sits just under its size).
pub const FULL_CACHE_AT: f64 = 0.95;

/// Observations before the fit replaces the starting weights.
const MIN_OBSERVATIONS: u64 = 128;
/// Forgetting per observation: the fit remembers about the last 2048 first tokens.
const FORGET: f64 = 1.0 - 1.0 / 2048.0;
/// Decay of the request counts per routed request (about the last 64 requests per rank).
const COUNT_WINDOW_PER_RANK: f64 = 64.0;
/// Requests a rank may be ahead of the mean before the share cap applies at all.
const COUNT_SLACK: f64 = 2.0;
/// Standard errors taken off the decode fit's slope: a decode stall counts only as far as the
/// observations show it beyond their noise (decode times vary with output lengths the router
/// does not know).
const EVIDENCE_SDS: f64 = 2.0;
/// Weights move in steps of 2^(1/4).
const STEPS_PER_OCTAVE: f64 = 4.0;
/// A weight moves once its fitted value is this many steps away from the current one: 0.1 step
/// past the rounding midpoint, so a fit wavering around a midpoint does not flap.
const HYSTERESIS_STEPS: f64 = 0.6;

/// The weights in force and how much evidence they rest on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedWeights {
    /// Credit per device-cached block.
    pub overlap_score_credit: f64,
    /// Weight of the adjusted prefill blocks.
    pub prefill_load_scale: f64,
    /// First tokens observed so far.
    pub num_observations: u64,
    /// Completed requests whose decode time was observed so far.
    pub num_decodes: u64,
}

/// What was known about a request when it was routed.
#[derive(Debug, Clone, Copy)]
struct Pending {
    routed_at: Duration,
    features: [f64; 4],
    /// Requests already on the rank.
    running: f64,
}

/// A request between its first token and its end.
#[derive(Debug, Clone, Copy)]
struct Decoding {
    first_token_at: Duration,
    features: [f64; 4],
}

/// An exponentially forgetting least-squares fit of one time against the routing features.
#[derive(Debug, Default)]
struct Fit {
    /// Σ w·x·xᵀ, Σ w·x·y and Σ w·y², w decaying by [`FORGET`].
    xx: [[f64; 4]; 4],
    xy: [f64; 4],
    yy: f64,
}

impl Fit {
    fn add(&mut self, x: &[f64; 4], y: f64) {
        for (i, row) in self.xx.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = *cell * FORGET + x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * FORGET + x[i] * y;
        }
        self.yy = self.yy * FORGET + y * y;
    }

    /// Coefficient `i` less [`EVIDENCE_SDS`] standard errors, at least zero: the part of a
    /// slope the observations show beyond their noise.
    fn evident_slope(&self, i: usize) -> Option<f64> {
        let beta = self.solve()?;
        let count = self.xx[0][0];
        if count <= 8.0 {
            return None;
        }
        let explained: f64 = beta.iter().zip(&self.xy).map(|(b, xy)| b * xy).sum();
        let variance = ((self.yy - explained) / (count - 4.0)).max(0.0);
        let mut unit = [0.0; 4];
        unit[i] = 1.0;
        let spread = solve(&self.xx, &unit)?[i].max(0.0);
        Some((beta[i] - EVIDENCE_SDS * (variance * spread).sqrt()).max(0.0))
    }

    /// The forgetting mean of the fitted time (the first feature is the constant 1).
    fn mean(&self) -> f64 {
        if self.xx[0][0] > 0.0 {
            self.xy[0] / self.xx[0][0]
        } else {
            0.0
        }
    }

    fn solve(&self) -> Option<[f64; 4]> {
        solve(&self.xx, &self.xy)
    }
}

/// The learner of one router (see the module docs).
#[derive(Debug)]
pub(crate) struct Adaptive {
    weights: LearnedWeights,
    learns_credit: bool,
    /// Time to first token against the features.
    ttft: Fit,
    /// Time from first token to the end against the same features.
    decode: Fit,
    /// Forgetting sum of the requests already on the chosen rank, over the first tokens.
    running_sum: f64,
    /// Forgetting sums of the routings to a rank whose cache was full, and of all routings
    /// that knew.
    full_sum: f64,
    full_count: f64,
    pending: HashMap<ReqKey, Pending>,
    decoding: HashMap<ReqKey, Decoding>,
    /// Recent requests per rank, in units of `growth` (lazy exponential decay).
    counts: HashMap<WorkerKey, f64>,
    growth: f64,
}

impl Adaptive {
    /// A learner starting at the configured weights; a zero starting credit (load-only routing)
    /// stays zero and only the scale is learned.
    pub fn new(credit: f64, scale: f64) -> Self {
        Self {
            weights: LearnedWeights {
                overlap_score_credit: credit,
                prefill_load_scale: scale,
                num_observations: 0,
                num_decodes: 0,
            },
            learns_credit: credit > 0.0,
            ttft: Fit::default(),
            decode: Fit::default(),
            running_sum: 0.0,
            full_sum: 0.0,
            full_count: 0.0,
            pending: HashMap::new(),
            decoding: HashMap::new(),
            counts: HashMap::new(),
            growth: 1.0,
        }
    }

    /// The weights in force.
    pub fn weights(&self) -> LearnedWeights {
        self.weights
    }

    /// A request was routed to `worker` (by this router or a replica): `queued_tokens` of
    /// prefill were already waiting there, it brings `uncached_tokens` of its own, the rank
    /// held `decode_blocks` and `running` requests, and its cache was `fullness` full (0–1,
    /// when the index and the rank's size are known).
    pub fn on_routed(
        &mut self,
        key: ReqKey,
        worker: WorkerKey,
        now: Duration,
        block_size: u32,
        (queued_tokens, uncached_tokens, decode_blocks, running): (u64, u64, u64, u32),
        fullness: Option<f64>,
    ) {
        if let Some(fullness) = fullness {
            let full = if fullness >= FULL_CACHE_AT { 1.0 } else { 0.0 };
            self.full_sum = self.full_sum * FORGET + full;
            self.full_count = self.full_count * FORGET + 1.0;
        }
        let block = f64::from(block_size.max(1));
        let features = [
            1.0,
            queued_tokens as f64 / block,
            uncached_tokens as f64 / block,
            decode_blocks as f64,
        ];
        self.pending.insert(
            key,
            Pending {
                routed_at: now,
                features,
                running: f64::from(running),
            },
        );
        self.count(worker);
    }

    /// The request's first token arrived: one observation. Returns the new weights when they
    /// moved.
    pub fn on_first_token(&mut self, key: &ReqKey, now: Duration) -> Option<LearnedWeights> {
        let pending = self.pending.remove(key)?;
        let ttft = now.saturating_sub(pending.routed_at).as_secs_f64();
        self.ttft.add(&pending.features, ttft);
        self.running_sum = self.running_sum * FORGET + pending.running;
        self.decoding.insert(
            key.clone(),
            Decoding {
                first_token_at: now,
                features: pending.features,
            },
        );
        self.weights.num_observations += 1;
        if self.weights.num_observations < MIN_OBSERVATIONS {
            return None;
        }
        self.refit()
    }

    /// The request completed: its decode time is one observation of the decode fit.
    pub fn on_completed(&mut self, key: &ReqKey, now: Duration) {
        self.pending.remove(key);
        if let Some(decoding) = self.decoding.remove(key) {
            let decode = now.saturating_sub(decoding.first_token_at).as_secs_f64();
            self.decode.add(&decoding.features, decode);
            self.weights.num_decodes += 1;
        }
    }

    /// The request ended without completing, or was replaced.
    pub fn forget(&mut self, key: &ReqKey) {
        self.pending.remove(key);
        self.decoding.remove(key);
    }

    /// Drops requests routed before `cutoff` whose first token never came, and those decoding
    /// since before it whose end never came.
    pub fn expire(&mut self, cutoff: Duration) {
        self.pending.retain(|_, p| p.routed_at > cutoff);
        self.decoding.retain(|_, d| d.first_token_at > cutoff);
    }

    /// Which candidates are within the request-share cap (all of them when none would be).
    pub fn under_share_cap(&self, keys: &[WorkerKey]) -> Vec<bool> {
        if keys.len() < 2 {
            return vec![true; keys.len()];
        }
        let shares: Vec<f64> = keys
            .iter()
            .map(|k| self.counts.get(k).copied().unwrap_or(0.0) / self.growth)
            .collect();
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        let limit = (mean * MAX_REQUEST_SHARE).max(mean + COUNT_SLACK);
        if shares.iter().all(|&s| s > limit) {
            return vec![true; keys.len()];
        }
        shares.into_iter().map(|s| s <= limit).collect()
    }

    fn count(&mut self, worker: WorkerKey) {
        let window = COUNT_WINDOW_PER_RANK * self.counts.len().max(1) as f64;
        self.growth /= 1.0 - 1.0 / window;
        *self.counts.entry(worker).or_insert(0.0) += self.growth;
        if self.growth > 1e100 {
            for count in self.counts.values_mut() {
                *count /= self.growth;
            }
            self.growth = 1.0;
        }
    }

    /// Solves the fits and moves the weights when the fitted values left the hysteresis band.
    fn refit(&mut self) -> Option<LearnedWeights> {
        let [_, a, b, delta] = self.ttft.solve()?;
        let costs = self.decode_costs();
        // In time-to-first-token seconds, a queued block costs this request `a` and, through
        // the prefill passes its decode shares, `w·α'`.
        let queued = a + costs.weight * costs.queued;
        let mut moved = false;
        if self.learns_credit && a > 0.0 && b > 0.0 {
            // Σw·q and Σw·u: the first row of the weighted Gram matrix.
            let queued_behind = if self.ttft.xx[0][2] > 0.0 {
                self.ttft.xx[0][1] / self.ttft.xx[0][2]
            } else {
                0.0
            };
            let running = if self.ttft.xx[0][0] > 0.0 {
                self.running_sum / self.ttft.xx[0][0]
            } else {
                0.0
            };
            // A cached block saves its request `b`, the requests queued behind it `ρ·b`, and
            // each request decoding on the rank the prefill pass it would have shared.
            let saved = b * (1.0 + queued_behind) + running * costs.weight * costs.queued;
            let credit = (saved / queued * (1.0 + FULL_CACHE_CREDIT * self.full_share()))
                .clamp(MIN_CREDIT, MAX_CREDIT);
            moved |= step(&mut self.weights.overlap_score_credit, credit);
        }
        if a > 0.0 {
            // A decode block costs `δ`. Its decode-fit term is left out: counted, it lowered the
            // scale on every workload and cost goodput (docs/benchmarks.md, issue 17 figures).
            let scale = if delta > 0.0 {
                queued / delta
            } else {
                MAX_SCALE
            };
            moved |= step(
                &mut self.weights.prefill_load_scale,
                scale.clamp(MIN_SCALE, MAX_SCALE),
            );
        }
        moved.then_some(self.weights)
    }

    /// The share of recent routings that went to a rank whose cache was full (0 when unknown).
    fn full_share(&self) -> f64 {
        if self.full_count > 0.0 {
            self.full_sum / self.full_count
        } else {
            0.0
        }
    }

    /// What the decode fit says, once it rests on enough completions (zeros before).
    fn decode_costs(&self) -> DecodeCosts {
        let none = DecodeCosts::default();
        if self.decode.xx[0][0] < MIN_OBSERVATIONS as f64 {
            return none;
        }
        let Some(queued) = self.decode.evident_slope(1) else {
            return none;
        };
        let mean_decode = self.decode.mean();
        if mean_decode <= 0.0 {
            return none;
        }
        DecodeCosts {
            weight: self.ttft.mean() / mean_decode,
            queued,
        }
    }
}

/// How routing features lengthen a request's decode, and what decode time is worth.
#[derive(Debug, Default, Clone, Copy)]
struct DecodeCosts {
    /// A second of decode in seconds of time to first token: mean TTFT over mean decode time,
    /// so that each phase's relative slowdown counts alike.
    weight: f64,
    /// Decode seconds per queued prefill block at routing (`α'`).
    queued: f64,
}

/// Moves `current` to `target` rounded to the step grid when `target` is more than the
/// hysteresis away. Returns whether it moved.
fn step(current: &mut f64, target: f64) -> bool {
    let to_steps = |v: f64| v.max(f64::MIN_POSITIVE).log2() * STEPS_PER_OCTAVE;
    if (to_steps(target) - to_steps(*current)).abs() <= HYSTERESIS_STEPS {
        return false;
    }
    let snapped = (to_steps(target).round() / STEPS_PER_OCTAVE).exp2();
    let moved = snapped != *current;
    *current = snapped;
    moved
}

/// Solves `(xx + λI) β = xy` for the 4 coefficients by Gaussian elimination with partial
/// pivoting; a small ridge `λ` keeps an unobserved direction (no queued prefill yet) at zero.
fn solve(xx: &[[f64; 4]; 4], xy: &[f64; 4]) -> Option<[f64; 4]> {
    let trace: f64 = (0..4).map(|i| xx[i][i]).sum();
    if !(trace.is_finite() && trace > 0.0) {
        return None;
    }
    // Not on the intercept: a ridge there would shift the mean time onto the slopes.
    let ridge = trace * 1e-12;
    let mut m = [[0.0; 5]; 4];
    for i in 0..4 {
        m[i][..4].copy_from_slice(&xx[i]);
        if i > 0 {
            m[i][i] += ridge;
        }
        m[i][4] = xy[i];
    }
    for col in 0..4 {
        let pivot = (col..4).max_by(|&r, &s| m[r][col].abs().total_cmp(&m[s][col].abs()))?;
        if m[pivot][col].abs() < f64::MIN_POSITIVE {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..4 {
            if row != col {
                let pivot_row = m[col];
                let factor = m[row][col] / pivot_row[col];
                for (cell, p) in m[row][col..].iter_mut().zip(&pivot_row[col..]) {
                    *cell -= factor * p;
                }
            }
        }
    }
    let beta = [
        m[0][4] / m[0][0],
        m[1][4] / m[1][1],
        m[2][4] / m[2][2],
        m[3][4] / m[3][3],
    ];
    beta.iter().all(|b| b.is_finite()).then_some(beta)
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
