//! The simulation's router: the real [`RouterCore`] in a product mode, or the load-capped greedy
//! reference policy, fed with the engines' tokens, KV events and load in simulation order.
//!
//! Worker `i` of the simulation is router worker id `i + 1`. KV events go into an in-process
//! event index built as the router service builds it ([`build_event_index`]); it is flushed
//! before each decision that reads it, so a decision sees exactly the events reported up to its
//! arrival time, whatever the apply threads were doing.

use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::{
    ConcurrentIndex, KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier,
    WorkerKey,
};
use kvmesh_mocker::engine::sim::{SimEvent, SimHandler, SimView};
use kvmesh_mocker::engine::{EngineRequest, FinishKind, KvCacheEvent, LoadSnapshot};
use kvmesh_routing::{
    KvRouterConfig, RouteOutcome, RouteRequest, RouterConfig, RouterCore, RuntimeConfig,
    TerminalPath, WorkerInfo, WorkerLoad, build_event_index,
};

use super::workload::request_id;

/// How requests are placed.
pub(super) enum Policy {
    /// The product router in the given configuration.
    Router(Box<RouterConfig>),
    /// Longest cached prefix among workers whose assigned work is at most `cap` × the mean.
    LoadCappedGreedy {
        /// The cap, relative to the mean assigned work (at least 1).
        cap: f64,
    },
}

/// What the engines look like to the router.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fleet {
    /// Workers (one dp rank each).
    pub num_workers: usize,
    /// Tokens per KV block, for the engines and the router alike.
    pub block_size: u32,
    /// KV blocks per worker.
    pub total_kv_blocks: u64,
    /// Token budget of one scheduler pass.
    pub max_num_batched_tokens: u64,
    /// Seeds the router's random choices.
    pub seed: u64,
}

enum Placer {
    Router(Box<RouterCore>),
    Greedy(Greedy),
}

/// The load-capped greedy reference (not a product mode).
struct Greedy {
    cap: f64,
    /// Tokens assigned to each worker so far: uncached prompt plus output.
    work: Vec<u64>,
    /// Largest `work[chosen] / mean` seen at a decision (0 before any).
    worst_ratio: f64,
}

/// Drives one policy through a [`kvmesh_mocker::engine::sim::Simulation`].
pub(super) struct BenchHandler {
    placer: Placer,
    index: Option<Arc<ConcurrentIndex>>,
    is_index_stale: bool,
    next_event_id: Vec<u64>,
    block_size: u32,
    track_output_blocks: bool,
    num_route_errors: u64,
    prefix: PrefixChoices,
    failure: Option<String>,
}

/// How often decisions passed over the worker caching the longest prefix (modes with the event
/// index only).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PrefixChoices {
    /// Decisions scored against the index.
    pub num_decisions: u64,
    /// Decisions whose worker cached a shorter prefix than the best worker did.
    pub num_shorter: u64,
    /// Prompt tokens the best worker cached beyond the chosen one, summed.
    pub forgone_tokens: u64,
}

/// Router worker id of simulation worker `index`.
fn worker_id(index: usize) -> u64 {
    index as u64 + 1
}

impl BenchHandler {
    /// A handler for `policy` over `fleet`, with its workers registered.
    pub(super) fn new(policy: Policy, fleet: &Fleet) -> anyhow::Result<Self> {
        let num_workers = fleet.num_workers.max(1);
        let (placer, index, track_output_blocks) = match policy {
            Policy::Router(config) => {
                let needs_index = config.kv.use_kv_events
                    && config.mode == kvmesh_routing::RouterMode::Kv
                    && config.kv.overlap_score_credit > 0.0;
                let index = needs_index.then(|| Arc::new(build_event_index(&config.kv)));
                let track_output_blocks = config.kv.track_output_blocks;
                let mut core = RouterCore::new(*config, "bench", fleet.block_size, fleet.seed)?;
                if let Some(index) = &index {
                    core = core.with_overlap_source(index.clone());
                }
                let runtime = RuntimeConfig {
                    total_kv_blocks: Some(fleet.total_kv_blocks),
                    max_num_batched_tokens: Some(fleet.max_num_batched_tokens),
                    data_parallel_start_rank: 0,
                    data_parallel_size: 1,
                };
                for worker in 0..num_workers {
                    core.upsert_worker(
                        WorkerInfo::new(worker_id(worker)).with_runtime(runtime),
                        Duration::ZERO,
                    );
                }
                (Placer::Router(Box::new(core)), index, track_output_blocks)
            }
            Policy::LoadCappedGreedy { cap } => {
                let kv = KvRouterConfig {
                    event_threads: 1,
                    ..KvRouterConfig::default()
                };
                let greedy = Greedy {
                    cap,
                    work: vec![0; num_workers],
                    worst_ratio: 0.0,
                };
                (
                    Placer::Greedy(greedy),
                    Some(Arc::new(build_event_index(&kv))),
                    false,
                )
            }
        };
        Ok(Self {
            placer,
            index,
            is_index_stale: false,
            next_event_id: vec![0; num_workers],
            block_size: fleet.block_size.max(1),
            track_output_blocks,
            num_route_errors: 0,
            prefix: PrefixChoices::default(),
            failure: None,
        })
    }

    /// Decisions the router refused or parked (each was sent to worker 0 untracked); 0 with the
    /// options the benchmark exposes.
    pub(super) fn num_route_errors(&self) -> u64 {
        self.num_route_errors
    }

    /// Decisions against the longest cached prefix, when the policy reads the event index.
    pub(super) fn prefix_choices(&self) -> Option<PrefixChoices> {
        self.index.as_ref().map(|_| self.prefix)
    }

    /// For load-capped greedy, the largest ratio of the chosen worker's assigned work to the mean
    /// at any decision (at most the cap).
    pub(super) fn greedy_worst_ratio(&self) -> Option<f64> {
        match &self.placer {
            Placer::Greedy(greedy) => Some(greedy.worst_ratio),
            Placer::Router(_) => None,
        }
    }

    /// The weights the router learned, in `--router-kv-weights auto` mode.
    pub(super) fn learned_weights(&self) -> Option<super::metrics::LearnedWeightsReport> {
        let Placer::Router(core) = &self.placer else {
            return None;
        };
        core.learned_weights()
            .map(|w| super::metrics::LearnedWeightsReport {
                overlap_score_credit: w.overlap_score_credit,
                prefill_load_scale: w.prefill_load_scale,
                decode_stall_weight: w.decode_stall_weight,
                num_observations: w.num_observations,
            })
    }

    /// Why the event index stopped working, if it did (the run's figures are then invalid).
    pub(super) fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Cached prefix blocks of `request` on each worker, per the event index (when there is one).
    fn overlaps(&self, request: &EngineRequest) -> Option<Vec<u32>> {
        let index = self.index.as_ref()?;
        let local = kvmesh_kv::compute_block_hashes(
            &request.prompt,
            self.block_size as usize,
            kvmesh_kv::seed_for(request.lora_name.as_deref(), None),
        );
        let scores = index.find_matches(&local);
        Some(
            (0..self.next_event_id.len())
                .map(|w| scores.device(WorkerKey::new(worker_id(w), 0)))
                .collect(),
        )
    }

    fn refresh_index(&mut self) {
        if !self.is_index_stale {
            return;
        }
        self.is_index_stale = false;
        if let Some(index) = &self.index
            && let Err(error) = index.flush()
        {
            self.failure.get_or_insert_with(|| error.to_string());
        }
    }

    fn apply_events(&mut self, worker: usize, events: Vec<KvCacheEvent>) {
        let Some(index) = &self.index else {
            return;
        };
        let Some(next_id) = self.next_event_id.get_mut(worker) else {
            return;
        };
        let events = events
            .into_iter()
            .map(|event| {
                let event_id = *next_id;
                *next_id += 1;
                to_index_event(event, event_id)
            })
            .collect();
        let batch = KvEventBatch {
            worker_id: worker_id(worker),
            dp_rank: 0,
            events,
            ..KvEventBatch::default()
        };
        if let Err(error) = index.apply(batch) {
            self.failure.get_or_insert_with(|| error.to_string());
        }
        self.is_index_stale = true;
    }
}

impl SimHandler for BenchHandler {
    fn route(&mut self, view: &SimView<'_>, request: &EngineRequest) -> usize {
        self.refresh_index();
        let now = Duration::from_micros(view.now_us());
        let overlaps = self.overlaps(request);
        let chosen = match &mut self.placer {
            Placer::Router(core) => {
                let route = RouteRequest::new(request.request_id.clone(), &request.prompt);
                match core.route(&route, now) {
                    Ok(RouteOutcome::Routed(decision)) => {
                        decision.worker_id.saturating_sub(1) as usize
                    }
                    Ok(RouteOutcome::Queued(_)) | Err(_) => {
                        self.num_route_errors += 1;
                        0
                    }
                }
            }
            Placer::Greedy(greedy) => {
                let overlaps = overlaps.as_deref().unwrap_or_default();
                let chosen = greedy_pick(overlaps, &greedy.work, greedy.cap);
                let mean = greedy.work.iter().sum::<u64>() as f64 / greedy.work.len() as f64;
                if mean > 0.0 {
                    let ratio = greedy.work[chosen] as f64 / mean;
                    greedy.worst_ratio = greedy.worst_ratio.max(ratio);
                }
                let cached = u64::from(overlaps.get(chosen).copied().unwrap_or(0))
                    * u64::from(self.block_size);
                let prompt = request.prompt.len() as u64;
                greedy.work[chosen] += prompt.saturating_sub(cached)
                    + u64::from(request.max_tokens.unwrap_or_default());
                chosen
            }
        };
        if let Some(overlaps) = &overlaps {
            let best = overlaps.iter().copied().max().unwrap_or(0);
            let got = overlaps.get(chosen).copied().unwrap_or(0);
            self.prefix.num_decisions += 1;
            if got < best {
                self.prefix.num_shorter += 1;
                self.prefix.forgone_tokens += u64::from(best - got) * u64::from(self.block_size);
            }
        }
        chosen
    }

    fn on_event(&mut self, event: SimEvent) {
        match event {
            SimEvent::Token { at_us, output, .. } => {
                let Placer::Router(core) = &mut self.placer else {
                    return;
                };
                let now = Duration::from_micros(at_us);
                if let Some(finish) = &output.finish {
                    let path = match finish {
                        FinishKind::Error(_) => TerminalPath::Error,
                        FinishKind::Length | FinishKind::Stop | FinishKind::Eos => {
                            TerminalPath::Completed
                        }
                    };
                    core.free(&request_id(output.key), path, now);
                } else if self.track_output_blocks {
                    core.add_output_tokens(&request_id(output.key), 1, now);
                } else if output.is_first {
                    core.mark_prefill_done(&request_id(output.key), now);
                }
            }
            SimEvent::KvEvents { worker, events, .. } => self.apply_events(worker, events),
            SimEvent::Load {
                at_us,
                worker,
                snapshot,
            } => {
                if let Placer::Router(core) = &mut self.placer {
                    let load = worker_load(worker, &snapshot);
                    core.update_load(load, Duration::from_micros(at_us));
                }
            }
        }
    }
}

/// Load-capped greedy: among workers whose assigned `work` is at most `cap` × the mean, the one
/// with the longest cached prefix (`overlaps`), ties to the least work, then the lowest index.
/// With `cap` ≥ 1 the least-loaded worker is always eligible.
pub(super) fn greedy_pick(overlaps: &[u32], work: &[u64], cap: f64) -> usize {
    if work.is_empty() {
        return 0;
    }
    let mean = work.iter().sum::<u64>() as f64 / work.len() as f64;
    let limit = cap * mean;
    let better = |a: usize, b: usize| {
        let overlap = |w: usize| overlaps.get(w).copied().unwrap_or(0);
        overlap(a) > overlap(b) || (overlap(a) == overlap(b) && work[a] < work[b])
    };
    let mut best: Option<usize> = None;
    for (w, &load) in work.iter().enumerate() {
        if load as f64 > limit {
            continue;
        }
        if best.is_none_or(|b| better(w, b)) {
            best = Some(w);
        }
    }
    best.unwrap_or_else(|| {
        (0..work.len())
            .min_by_key(|&w| (work[w], w))
            .unwrap_or_default()
    })
}

fn worker_load(worker: usize, snapshot: &LoadSnapshot) -> WorkerLoad {
    WorkerLoad {
        worker: WorkerKey::new(worker_id(worker), 0),
        kv_used_blocks: snapshot.kv_used_blocks as u64,
        kv_total_blocks: snapshot.kv_total_blocks as u64,
        num_running: snapshot.num_running as u32,
        num_waiting: snapshot.num_waiting as u32,
        waiting_prefill_tokens: snapshot.waiting_prefill_tokens as u64,
    }
}

/// An engine event as the index receives it (device tier; the mocker's engine hash is the
/// block's sequence hash).
fn to_index_event(event: KvCacheEvent, event_id: u64) -> KvEvent {
    let kind = match event {
        KvCacheEvent::Stored {
            parent_hash,
            blocks,
        } => KvEventKind::Stored(KvStored {
            parent_hash,
            blocks: blocks
                .iter()
                .map(|b| KvStoredBlock::new(b.block_hash, b.tokens_hash))
                .collect(),
            start_position: None,
        }),
        KvCacheEvent::Removed { block_hashes } => KvEventKind::Removed(KvRemoved { block_hashes }),
        KvCacheEvent::Cleared => KvEventKind::Cleared,
    };
    KvEvent {
        event_id,
        tier: Tier::Device,
        kind,
    }
}
