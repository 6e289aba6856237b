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
//! A prefill also stalls the requests decoding beside it, and how much that costs depends on the
//! candidate, not on the exchange rate: sending a request to a rank with pending prefill `P`
//! (its queued blocks and the request's own, less the credit) and `n` requests running puts
//! about `P·n` decode steps into passes that carry prefill. The adaptive cost adds
//! `scale · κ · max(P, 0) · n` (lmetric's product, on top of the linear cost), which spreads
//! prefill away from crowded ranks where their requests would miss their inter-token
//! latency. `κ` is [`DECODE_STALL_WEIGHT`] while running sequences hold little of the
//! caches and fades to zero as their mean share of the KV blocks reaches
//! [`MEMORY_BOUND_USAGE`]: there a decode pass is already several times its idle length, a
//! prefill's stall is a small part of each step, and spreading by running requests costs the
//! hit rate and queueing that decide time to first token (docs/benchmarks.md, issue 17).
//!
//! The fixed flags are the starting point; the learned values are clamped to the range the
//! benchmark sweeps and moved in quarter-octave steps with hysteresis, so the weights change
//! (and are logged) only when the evidence moves them.
//!
//! Replicas converge without exchanging weights: replica sync carries every request's routing
//! (with its uncached tokens), first token and end (with how it ended), and a replica reads `q`,
//! `d`, `n` and the running share of the caches from its own mirror of the load and its worker
//! table, so all replicas fit the same observations; like
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

mod fit;

use fit::{FORGET, Fit};

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

/// Weight of the decode-stall term (pending prefill blocks × requests running on the rank, in
/// units of the prefill load scale) while the caches have room. Measured (docs/benchmarks.md,
/// issue 17): with the fade to zero at 50 %, 0.05 and 0.2 left 5 and 4 of 90 checks over
/// three seeds unmet, 0.1 two.
pub const DECODE_STALL_WEIGHT: f64 = 0.1;
/// Mean share of a rank's KV blocks held by running sequences at which the decode-stall term
/// has faded to zero. By 30 % a decode pass takes about three times its idle length
/// (docs/mocker.md, "Timing"), so a prefill's stall is a small part of each step.
pub const MEMORY_BOUND_USAGE: f64 = 0.3;

/// Observations before the fit replaces the starting weights.
const MIN_OBSERVATIONS: u64 = 128;
/// Decay of the request counts per routed request (about the last 64 requests per rank).
const COUNT_WINDOW_PER_RANK: f64 = 64.0;
/// Requests a rank may be ahead of the mean before the share cap applies at all.
const COUNT_SLACK: f64 = 2.0;
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
    /// Weight of the decode-stall term (see the module docs); 0 until the fit takes over.
    pub decode_stall_weight: f64,
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
    /// Forgetting sums of the chosen rank's share of KV blocks held by running sequences, and
    /// of the routings that knew it.
    running_share_sum: f64,
    running_share_count: f64,
    /// The decode-stall weight when it last counted as moved.
    reported_stall: f64,
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
                decode_stall_weight: 0.0,
                num_observations: 0,
                num_decodes: 0,
            },
            learns_credit: credit > 0.0,
            ttft: Fit::default(),
            decode: Fit::default(),
            running_sum: 0.0,
            full_sum: 0.0,
            full_count: 0.0,
            running_share_sum: 0.0,
            running_share_count: 0.0,
            reported_stall: 0.0,
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
    /// held `decode_blocks` and `running` requests, and `cache` says how full its KV cache was.
    pub fn on_routed(
        &mut self,
        key: ReqKey,
        worker: WorkerKey,
        now: Duration,
        block_size: u32,
        (queued_tokens, uncached_tokens, decode_blocks, running): (u64, u64, u64, u32),
        cache: CacheShares,
    ) {
        if let Some(held) = cache.held {
            let full = if held >= FULL_CACHE_AT { 1.0 } else { 0.0 };
            self.full_sum = self.full_sum * FORGET + full;
            self.full_count = self.full_count * FORGET + 1.0;
        }
        if let Some(total) = cache.total_blocks.filter(|&t| t > 0) {
            let share = (decode_blocks as f64 / total as f64).min(1.0);
            self.running_share_sum = self.running_share_sum * FORGET + share;
            self.running_share_count = self.running_share_count * FORGET + 1.0;
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
        self.weights.decode_stall_weight = self.decode_stall_weight();
        // The stall weight follows the running share continuously; it counts as moved (and is
        // logged) once it is an eighth of its range away from where it last did.
        let mut moved = (self.weights.decode_stall_weight - self.reported_stall).abs()
            >= DECODE_STALL_WEIGHT / 8.0;
        if moved {
            self.reported_stall = self.weights.decode_stall_weight;
        }
        let Some([_, a, b, delta]) = self.ttft.solve() else {
            return moved.then_some(self.weights);
        };
        let costs = self.decode_costs();
        // In time-to-first-token seconds, a queued block costs this request `a` and, through
        // the prefill passes its decode shares, `w·α'`.
        let queued = a + costs.weight * costs.queued;
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

    /// [`DECODE_STALL_WEIGHT`] faded by the mean running share of the chosen ranks' caches.
    /// Without the ranks' sizes the share counts as zero.
    fn decode_stall_weight(&self) -> f64 {
        let running = if self.running_share_count > 0.0 {
            self.running_share_sum / self.running_share_count
        } else {
            0.0
        };
        let room = (1.0 - running / MEMORY_BOUND_USAGE).clamp(0.0, 1.0);
        DECODE_STALL_WEIGHT * room
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

/// How full a chosen rank's KV cache was at routing, as far as the router knows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CacheShares {
    /// Blocks the event-fed index holds for the rank over its KV blocks.
    pub held: Option<f64>,
    /// The rank's KV blocks (the share of them that running sequences hold follows from the
    /// decode blocks routed against).
    pub total_blocks: Option<u64>,
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

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
