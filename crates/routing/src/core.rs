//! The routing core of one model: a deterministic state machine with time passed in.
//!
//! [`RouterCore`] owns everything a decision reads or changes — the worker set, published load,
//! busy latches, the active-load tracker, session bindings, the queue, the approximate and
//! predicted indexes, the seeded generator — and nothing else: no clock, no threads, no I/O.
//! Every method that depends on time takes `now` (a [`Duration`] since any fixed origin, never
//! decreasing), so the routing-quality simulator drives it on a virtual clock and gets identical
//! results on every run; [`crate::SharedRouter`] wraps it for concurrent callers with a real
//! clock and release guards.
//!
//! Outputs that happen as side effects are collected in outboxes the caller drains: parked
//! requests that left the queue ([`RouterCore::take_dispatched`]) and, with replica sync, the
//! tracker changes to publish ([`RouterCore::take_sync_events`]).

mod decide;
mod lifecycle;
mod pick;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::{ApproxConfig, ApproxIndex, ApproxPolicy, BlockHasher, WorkerKey};

use crate::adaptive::{Adaptive, CacheShares, KvWeightsMode, LearnedWeights};
use crate::busy::{self, BusyInputs};
use crate::config::{ApproxCachePolicy, BusyThresholds, ConfigError, RouterConfig, RouterMode};
use crate::health::WorkerHealth;
use crate::overlap::OverlapSource;
use crate::queue::Queue;
use crate::request::{Dispatched, RouteRequest, RoutingHints, TerminalPath};
use crate::rng::Rng;
use crate::session::Sessions;
use crate::sync::{SyncEvent, SyncKind};
use crate::tracker::{RankLoadSnapshot, ReqKey, Tracker};
use crate::worker::{WorkerInfo, WorkerLoad};
use kvmesh_kv::BlockHashCache;

/// How often stale tracked requests are looked for.
pub const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// A request hashed and ready for a decision (hashing is the expensive part and needs no lock).
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedRequest {
    /// The request id.
    pub request_id: String,
    /// Prompt tokens.
    pub isl: u64,
    /// Local block hashes of the full prompt blocks (empty outside `kv` mode).
    pub local_hashes: Vec<u64>,
    /// Sequence hashes of the same blocks.
    pub seq_hashes: Vec<u64>,
    /// Pins, priorities, session.
    pub hints: RoutingHints,
    /// LoRA adapter (carried into sync events).
    pub lora_name: Option<String>,
}

impl PreparedRequest {
    /// Hashes the prompt into local and sequence hashes (docs/kv-events.md, "Hashing") when
    /// `hash` is set.
    pub fn new(request: &RouteRequest<'_>, block_size: u32, hash: bool) -> Self {
        Self::hashed_with(request, block_size, hash, None)
    }

    /// [`Self::new`], reusing the hashes of a prefix `cache` holds (and caching this prompt's).
    pub fn hashed_with(
        request: &RouteRequest<'_>,
        block_size: u32,
        hash: bool,
        cache: Option<&BlockHashCache>,
    ) -> Self {
        let seed = kvmesh_kv::seed_for(request.lora_name, request.cache_salt);
        let (local_hashes, seq_hashes) = match cache {
            _ if !hash => (Vec::new(), Vec::new()),
            Some(cache) => cache.hash(request.token_ids, request.prefix_cuts, block_size, seed),
            None => {
                let mut local = Vec::new();
                BlockHasher::new(block_size as usize, seed)
                    .hash_blocks_into(request.token_ids, &mut local);
                let seq = kvmesh_kv::compute_seq_hashes(&local);
                (local, seq)
            }
        };
        Self {
            request_id: request.request_id.clone(),
            isl: request.token_ids.len() as u64,
            local_hashes,
            seq_hashes,
            hints: request.hints.clone(),
            lora_name: request.lora_name.map(str::to_string),
        }
    }
}

/// How long a rank's published load counts for busy detection without a newer one.
pub const PUBLISHED_LOAD_TTL: Duration = Duration::from_secs(5);

/// The routing core of one model (see the module docs).
pub struct RouterCore {
    config: RouterConfig,
    model: String,
    router_id: Arc<str>,
    block_size: u32,
    rng: Rng,
    workers: BTreeMap<u64, WorkerInfo>,
    /// Each rank's last published load and when it arrived.
    loads: HashMap<WorkerKey, (WorkerLoad, Duration)>,
    latches: HashMap<WorkerKey, bool>,
    /// The latest time the router was told (routing, ticks, published load).
    clock: Duration,
    busy: BusyThresholds,
    tracker: Tracker,
    health: WorkerHealth,
    sessions: Sessions,
    queue: Queue,
    primary: Option<Arc<dyn OverlapSource>>,
    approx: Option<ApproxIndex>,
    side: Option<ApproxIndex>,
    rr_counter: u64,
    is_ready: bool,
    next_sweep: Duration,
    next_ticket: u64,
    dispatched: Vec<Dispatched>,
    sync_out: Vec<SyncEvent>,
    /// The weight learner (`kv` mode with `--router-kv-weights auto`).
    adaptive: Option<Adaptive>,
}

impl std::fmt::Debug for RouterCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterCore")
            .field("model", &self.model)
            .field("mode", &self.config.mode)
            .field("workers", &self.workers.len())
            .field("tracked", &self.tracker.len())
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl RouterCore {
    /// A router for `model` with blocks of `block_size` tokens; `seed` fixes every random choice.
    /// The config is resolved (implied options applied) and validated.
    pub fn new(
        config: RouterConfig,
        model: impl Into<String>,
        block_size: u32,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let config = config.resolved();
        config.validate()?;
        let kv = &config.kv;
        let approx = (config.mode == RouterMode::Kv && !kv.use_kv_events).then(|| {
            ApproxIndex::new(ApproxConfig {
                policy: match kv.approx_cache_policy {
                    ApproxCachePolicy::Ttl => ApproxPolicy::Ttl(kv.ttl),
                    ApproxCachePolicy::Lru => ApproxPolicy::Lru,
                },
                max_tree_size: kv.max_tree_size,
                prune_target_ratio: kv.prune_target_ratio,
            })
        });
        let side = kv
            .predicted_ttl
            .filter(|_| config.mode == RouterMode::Kv && kv.use_kv_events)
            .map(|ttl| ApproxIndex::new(ApproxConfig::predicted(ttl)));
        let ejection = config.ejection;
        let adaptive = (config.mode == RouterMode::Kv && kv.weights == KvWeightsMode::Auto)
            .then(|| Adaptive::new(kv.overlap_score_credit, kv.prefill_load_scale));
        Ok(Self {
            busy: config.busy,
            is_ready: config.min_initial_workers == 0,
            config,
            model: model.into(),
            router_id: Arc::from(format!("router-{seed:016x}")),
            block_size: block_size.max(1),
            rng: Rng::new(seed),
            workers: BTreeMap::new(),
            loads: HashMap::new(),
            clock: Duration::ZERO,
            latches: HashMap::new(),
            tracker: Tracker::default(),
            health: WorkerHealth::new(ejection),
            sessions: Sessions::default(),
            queue: Queue::default(),
            primary: None,
            approx,
            side,
            rr_counter: 0,
            next_sweep: EXPIRY_SWEEP_INTERVAL,
            next_ticket: 0,
            dispatched: Vec::new(),
            sync_out: Vec::new(),
            adaptive,
        })
    }

    /// Attaches the event-fed index (in-process, or a client of remote shards).
    pub fn with_overlap_source(mut self, source: Arc<dyn OverlapSource>) -> Self {
        self.primary = Some(source);
        self
    }

    /// Sets the id this router signs its sync events with (unique per replica).
    pub fn with_router_id(mut self, router_id: impl AsRef<str>) -> Self {
        self.router_id = Arc::from(router_id.as_ref());
        self
    }

    /// The resolved configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The model this router serves.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The id of this router in sync events.
    pub fn router_id(&self) -> &str {
        &self.router_id
    }

    /// The attached event-fed index, for callers that query it outside a lock.
    pub fn overlap_source(&self) -> Option<&Arc<dyn OverlapSource>> {
        self.primary.as_ref()
    }

    /// Hashes a request as this router's mode needs (only `kv` mode hashes).
    pub fn prepare(&self, request: &RouteRequest<'_>) -> PreparedRequest {
        PreparedRequest::new(request, self.block_size, self.config.mode == RouterMode::Kv)
    }

    /// Adds or replaces a discovered worker (its runtime config may have changed).
    pub fn upsert_worker(&mut self, info: WorkerInfo, now: Duration) {
        if !self.workers.contains_key(&info.worker_id) {
            // A worker that left and registered again under the same id (its lease came back)
            // is routed to, and recorded in the decision-fed indexes, again.
            if let Some(approx) = self.approx.as_mut() {
                approx.readmit_worker(info.worker_id);
            }
            if let Some(side) = self.side.as_mut() {
                side.readmit_worker(info.worker_id);
            }
        }
        if let (Some(approx), Some(runtime)) = (self.approx.as_mut(), info.runtime)
            && let Some(total) = runtime.total_kv_blocks
        {
            for rank in runtime.ranks() {
                approx.set_capacity(WorkerKey::new(info.worker_id, rank), total);
            }
        }
        self.workers.insert(info.worker_id, info);
        let with_config = self
            .workers
            .values()
            .filter(|w| w.runtime.is_some())
            .count();
        if with_config >= self.config.min_initial_workers as usize {
            self.is_ready = true;
        }
        self.drain_queue(now);
    }

    /// Forgets a worker that left discovery: its tracked requests, bindings, load and index
    /// entries go with it.
    pub fn remove_worker(&mut self, worker_id: u64, now: Duration) {
        if self.workers.remove(&worker_id).is_none() {
            return;
        }
        self.loads.retain(|key, _| key.worker_id != worker_id);
        self.latches.retain(|key, _| key.worker_id != worker_id);
        for (key, request) in self.tracker.remove_worker(worker_id) {
            // The session may have moved to another worker meanwhile: its in-flight count must
            // still drop, or it never goes idle and never expires. Bindings to the removed
            // worker go below.
            if let Some(session) = &request.session {
                self.sessions.release(session, now, false);
            }
            let path = TerminalPath::WorkerFailed;
            self.emit(&key, request.worker, SyncKind::Free { path });
        }
        self.sessions.remove_worker(worker_id);
        self.health.remove(worker_id);
        if let Some(approx) = self.approx.as_mut() {
            approx.remove_worker(worker_id);
        }
        if let Some(side) = self.side.as_mut() {
            side.remove_worker(worker_id);
        }
        self.drain_queue(now);
    }

    /// Records load a rank published and re-evaluates its busy state.
    pub fn update_load(&mut self, load: WorkerLoad, now: Duration) {
        let Some(info) = self.workers.get(&load.worker.worker_id) else {
            return;
        };
        if !info.ranks().contains(&load.worker.dp_rank) {
            return;
        }
        self.clock = self.clock.max(now);
        self.loads.insert(load.worker, (load, now));
        self.is_rank_busy(load.worker);
        self.drain_queue(now);
    }

    /// Whether `--router-min-initial-workers` workers with runtime config have been seen (once
    /// reached, the router stays ready).
    pub fn is_ready(&self) -> bool {
        self.is_ready
    }

    /// Known workers, ids ascending.
    pub fn workers(&self) -> impl Iterator<Item = &WorkerInfo> {
        self.workers.values()
    }

    /// The busy thresholds in force.
    pub fn busy_thresholds(&self) -> BusyThresholds {
        self.busy
    }

    /// Replaces the busy thresholds (`POST /busy_threshold`); they apply from the next
    /// evaluation.
    pub fn set_busy_thresholds(&mut self, thresholds: BusyThresholds) {
        self.busy = thresholds;
    }

    /// Whether every known rank of a worker is busy.
    pub fn is_worker_busy(&mut self, worker_id: u64) -> bool {
        let Some(info) = self.workers.get(&worker_id) else {
            return false;
        };
        let ranks = info.ranks();
        ranks
            .into_iter()
            .all(|rank| self.is_rank_busy(WorkerKey::new(worker_id, rank)))
    }

    /// The tracked load of one rank.
    pub fn load(&self, worker: WorkerKey) -> RankLoadSnapshot {
        self.tracker.snapshot(worker)
    }

    /// Ranks the tracker has held load for.
    pub fn tracked_ranks(&self) -> Vec<WorkerKey> {
        self.tracker.ranks()
    }

    /// Requests in flight on a worker (all ranks, all routers).
    pub fn inflight(&self, worker_id: u64) -> u32 {
        self.tracker.inflight(worker_id)
    }

    /// Requests tracked (ours and replicas').
    pub fn num_tracked(&self) -> usize {
        self.tracker.len()
    }

    /// Whether one of our requests is still tracked.
    pub fn is_tracked(&self, request_id: &str) -> bool {
        self.tracker.get(&self.key(request_id)).is_some()
    }

    /// Where a request routed by `router_id` (this router or a replica) is tracked, if it is.
    pub fn tracked_worker_of(&self, router_id: &str, request_id: &str) -> Option<WorkerKey> {
        let key: crate::tracker::ReqKey = (Arc::from(router_id), request_id.to_string());
        self.tracker.get(&key).map(|request| request.worker)
    }

    /// Workers ejected for failing (or probing after their back-off; docs/routing.md,
    /// "Ejection of failing workers").
    pub fn num_ejected_workers(&self) -> usize {
        self.health.num_ejected()
    }

    /// Whether a worker is ejected (or probing).
    pub fn is_worker_ejected(&self, worker_id: u64) -> bool {
        self.health.is_ejected(worker_id)
    }

    /// Ejections so far (a failed probe counts again) and readmissions so far.
    pub fn ejection_counts(&self) -> (u64, u64) {
        (self.health.ejections(), self.health.readmissions())
    }

    /// Parked requests (`dynamo_frontend_router_queue_pending_requests`).
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Session bindings held.
    pub fn num_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The learned cost weights (`--router-kv-weights auto` in `kv` mode; `None` otherwise).
    pub fn learned_weights(&self) -> Option<LearnedWeights> {
        self.adaptive.as_ref().map(Adaptive::weights)
    }

    /// Blocks in the approximate index (approximate mode) — for metrics and tests.
    pub fn approx_blocks(&self) -> Option<u64> {
        self.approx.as_ref().map(ApproxIndex::num_blocks)
    }

    /// Blocks in the predicted side index, when there is one.
    pub fn predicted_blocks(&self) -> Option<u64> {
        self.side.as_ref().map(ApproxIndex::num_blocks)
    }

    /// How full a rank's cache is, for the adaptive weights: its KV blocks when the worker
    /// published them, and the share of them the event-fed index holds when it can tell. Without
    /// a learner nothing is read (the index's size is not free to ask for).
    pub(crate) fn cache_shares(&self, worker: WorkerKey) -> CacheShares {
        if self.adaptive.is_none() {
            return CacheShares::default();
        }
        let total_blocks = self
            .workers
            .get(&worker.worker_id)
            .and_then(|w| w.runtime)
            .and_then(|runtime| runtime.total_kv_blocks)
            .filter(|&total| total > 0);
        let held = total_blocks.and_then(|total| {
            let held = self.primary.as_ref()?.blocks_held(worker)?;
            Some(held as f64 / total as f64)
        });
        CacheShares { held, total_blocks }
    }

    pub(crate) fn key(&self, request_id: &str) -> ReqKey {
        (Arc::clone(&self.router_id), request_id.to_string())
    }

    /// Evaluates (and latches) the busy state of one rank.
    pub(crate) fn is_rank_busy(&mut self, worker: WorkerKey) -> bool {
        if !self.busy.is_any_set() {
            return false;
        }
        let runtime = self
            .workers
            .get(&worker.worker_id)
            .and_then(|w| w.runtime)
            .unwrap_or_default();
        // Engines publish on every pass while they work: an old figure is an idle engine's last
        // word (possibly from before its last requests ended), not its load now.
        let published = self
            .loads
            .get(&worker)
            .filter(|(_, at)| self.clock.saturating_sub(*at) <= PUBLISHED_LOAD_TTL)
            .map(|(load, _)| load);
        let input = BusyInputs {
            prefill_tokens: self
                .tracker
                .prefill_tokens(worker)
                .max(published.map_or(0, |l| l.waiting_prefill_tokens)),
            max_num_batched_tokens: runtime.max_num_batched_tokens,
            kv_used_blocks: published.map(|l| l.kv_used_blocks),
            active_decode_blocks: self.tracker.active_blocks(worker),
            total_kv_blocks: runtime
                .total_kv_blocks
                .or_else(|| published.map(|l| l.kv_total_blocks).filter(|&t| t > 0)),
        };
        let latch = self.latches.entry(worker).or_insert(false);
        busy::evaluate(&self.busy, &input, latch)
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
