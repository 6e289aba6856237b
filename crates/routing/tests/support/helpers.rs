//! Shared helpers of the router's integration tests: routers built from real flags, an index
//! that counts its queries, stored events.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use clap::Parser;
use kvmesh_kv::{
    KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, OverlapScores, RadixIndex, Tier,
};
use kvmesh_routing::{
    Decision, OverlapSource, RouteError, RouteOutcome, RouteRequest, RouterArgs, RouterConfig,
    RouterCore, RuntimeConfig, WorkerInfo,
};

/// Tokens per block in these tests.
pub const B: u32 = 4;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    router: RouterArgs,
}

/// The configuration the given flags produce.
pub fn config(args: &[&str]) -> RouterConfig {
    let cli = Cli::try_parse_from(std::iter::once("router").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    cli.router
        .to_config_with_env(|_| None)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Seconds.
pub fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// A worker with one rank and the given capacity.
pub fn worker(id: u64, mnbt: Option<u64>, total_kv_blocks: Option<u64>) -> WorkerInfo {
    WorkerInfo::new(id).with_runtime(RuntimeConfig {
        max_num_batched_tokens: mnbt,
        total_kv_blocks,
        ..RuntimeConfig::default()
    })
}

/// A router from flags with plain workers `ids`.
pub fn core(args: &[&str], ids: &[u64]) -> RouterCore {
    core_seeded(args, ids, 1)
}

/// [`core`] with a seed.
pub fn core_seeded(args: &[&str], ids: &[u64], seed: u64) -> RouterCore {
    let mut core = RouterCore::new(config(args), "m", B, seed).unwrap_or_else(|e| panic!("{e}"));
    for &id in ids {
        core.upsert_worker(worker(id, None, None), Duration::ZERO);
    }
    core
}

/// An in-process index that counts `find_matches` calls.
#[derive(Debug, Default)]
pub struct Counting {
    pub index: RwLock<RadixIndex>,
    pub queries: AtomicUsize,
}

impl Counting {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn store(&self, worker_id: u64, tier: Tier, tokens: &[u32]) {
        let mut index = self.index.write().unwrap_or_else(PoisonError::into_inner);
        let event_id = index
            .last_event_id(kvmesh_kv::WorkerKey::new(worker_id, 0))
            .map_or(0, |id| id + 1);
        index.apply(&stored(worker_id, tier, tokens, event_id));
    }

    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

impl OverlapSource for Counting {
    fn find_matches(&self, _model: &str, local_hashes: &[u64]) -> OverlapScores {
        self.queries.fetch_add(1, Ordering::SeqCst);
        self.index
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .find_matches(local_hashes)
    }
}

/// A router from flags with workers `ids` and `index` attached.
pub fn core_with_index(args: &[&str], ids: &[u64], index: &Arc<Counting>) -> RouterCore {
    core(args, ids).with_overlap_source(index.clone())
}

/// A stored event for the full blocks of `tokens` on (worker, rank 0).
pub fn stored(worker_id: u64, tier: Tier, tokens: &[u32], event_id: u64) -> KvEventBatch {
    let local =
        kvmesh_kv::compute_block_hashes(tokens, B as usize, kvmesh_kv::seed_for(None, None));
    let seq = kvmesh_kv::compute_seq_hashes(&local);
    KvEventBatch {
        worker_id,
        dp_rank: 0,
        events: vec![KvEvent {
            event_id,
            tier,
            kind: KvEventKind::Stored(KvStored {
                parent_hash: None,
                blocks: seq
                    .iter()
                    .zip(&local)
                    .map(|(&s, &l)| KvStoredBlock::new(s, l))
                    .collect(),
                start_position: None,
            }),
        }],
        ..KvEventBatch::default()
    }
}

/// `len` distinct tokens starting at `base`.
pub fn prompt(base: u32, len: usize) -> Vec<u32> {
    (base..base + len as u32).collect()
}

/// The decision of a routed outcome.
pub fn routed(outcome: Result<RouteOutcome, RouteError>) -> Decision {
    match outcome {
        Ok(RouteOutcome::Routed(decision)) => decision,
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// Routes and expects a decision.
pub fn route(core: &mut RouterCore, id: &str, tokens: &[u32], now: Duration) -> Decision {
    routed(core.route(&RouteRequest::new(id, tokens), now))
}

/// Routes a request pinned to a worker.
pub fn route_pinned(core: &mut RouterCore, id: &str, tokens: &[u32], worker_id: u64) -> Decision {
    let mut request = RouteRequest::new(id, tokens);
    request.hints.backend_instance_id = Some(worker_id);
    routed(core.route(&request, Duration::ZERO))
}
