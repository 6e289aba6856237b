//! The seam against workers that misbehave: a stalled worker is given up at its own
//! first-response deadline (no override), the request moves, and the worker's failure is counted.
//! A decision for a worker newer than the table version goes to a listed worker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use kvmesh_proto::v1::{FinishReason, GenerateRequest, GenerateResponse};
use kvmesh_routing::shared::SharedRouter;
use kvmesh_routing::{EjectionConfig, RouterConfig, RouterCore, RouterMode, WorkerInfo};
use kvmesh_runtime::worker_client::{ResponseStream, WorkerEndpoint};

use super::*;
use crate::decider::LocalDecider;

/// Accepts every request and never answers.
struct Stalled;

#[async_trait]
impl WorkerEndpoint for Stalled {
    async fn generate(&self, _request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        Ok(futures::stream::pending().boxed())
    }
}

/// Answers every request with one final token.
struct Answers;

#[async_trait]
impl WorkerEndpoint for Answers {
    async fn generate(&self, _request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        let response = GenerateResponse {
            token_ids: vec![7],
            finish_reason: FinishReason::Length as i32,
            ..Default::default()
        };
        Ok(futures::stream::iter([Ok(response)]).boxed())
    }
}

/// A round-robin seam whose decider knows workers 1 and 2 (worker 1 is decided first), over
/// the table version `workers`.
fn seam(
    config: RouterConfig,
    workers: Vec<WorkerRef>,
    migration_limit: u32,
) -> (ModelRouter, SharedRouter) {
    let mut core = RouterCore::new(config, "m", 16, 1).unwrap();
    core.upsert_worker(WorkerInfo::new(1), Duration::ZERO);
    core.upsert_worker(WorkerInfo::new(2), Duration::ZERO);
    let router = SharedRouter::new(core, Arc::new(kvmesh_routing::MonotonicClock::new()));
    let decider = Arc::new(LocalDecider {
        router: router.clone(),
        indexer: None,
    });
    let policy = MigrationPolicy {
        limit: migration_limit,
        max_seq_len: None,
    };
    let model = ModelRouter::new("m", decider, workers, policy, Arc::new(NoObserver));
    (model, router)
}

fn model(migration_limit: u32) -> (ModelRouter, SharedRouter) {
    let mut config = RouterConfig::with_mode(RouterMode::RoundRobin);
    config.ejection = EjectionConfig {
        consecutive_failures: 1,
        ..EjectionConfig::default()
    };
    // Round robin tries worker 1 (stalled) first; its card says it answers within 200 ms.
    let workers = vec![
        WorkerRef {
            first_response_timeout: Duration::from_millis(200),
            ..WorkerRef::new(1, Arc::new(Stalled))
        },
        WorkerRef::new(2, Arc::new(Answers)),
    ];
    seam(config, workers, migration_limit)
}

fn options(wait: FirstResponseWait) -> GenerateOptions {
    GenerateOptions {
        hints: RoutingHints::default(),
        prefix_cuts: Arc::from(Vec::new()),
        response_timeout: None,
        wait,
        trace: kvmesh_runtime::otel::Trace::off(),
    }
}

fn request() -> GenerateRequest {
    GenerateRequest {
        request_id: "r".into(),
        token_ids: vec![1, 2, 3],
        ..Default::default()
    }
}

/// Runs one non-streaming request to its answer (checked) and gives the worker that answered.
async fn answering_worker(model: &ModelRouter) -> u64 {
    let mut generation = model
        .generate(request(), options(FirstResponseWait::Full))
        .await
        .unwrap();
    let worker_id = generation.worker_id();
    assert_eq!(generation.next().await.unwrap().unwrap().token_ids, vec![7]);
    worker_id
}

#[tokio::test]
async fn a_stalled_stream_moves_at_the_workers_first_response_deadline() {
    let (model, router) = model(3);
    let began = Instant::now();
    let mut generation = model
        .generate(request(), options(FirstResponseWait::None))
        .await
        .unwrap();
    assert_eq!(generation.worker_id(), 1);
    let response = generation.next().await.unwrap().unwrap();
    assert_eq!(response.token_ids, vec![7]);
    assert_eq!(
        generation.worker_id(),
        2,
        "moved to the worker that answers"
    );
    let waited = began.elapsed();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(
        router.with_core(|core, _| core.is_worker_ejected(1)),
        "the stalled worker counted as failing"
    );
}

#[tokio::test]
async fn a_stalled_start_moves_within_the_migration_budget() {
    let (model, _router) = model(1);
    // A non-streaming start waits for the first response itself.
    assert_eq!(answering_worker(&model).await, 2);
}

#[tokio::test]
async fn without_migration_the_deadline_is_a_timeout_error() {
    let (model, router) = model(0);
    let error = match model
        .generate(request(), options(FirstResponseWait::Full))
        .await
    {
        Err(error) => error,
        Ok(_) => panic!("a stalled worker answered"),
    };
    assert_eq!(error.code(), ErrorCode::Timeout);
    assert!(router.with_core(|core, _| core.is_worker_ejected(1)));
    assert_eq!(router.with_core(|core, _| core.num_tracked()), 0);
}

#[tokio::test]
async fn a_decision_for_a_worker_newer_than_the_table_goes_to_a_listed_one() {
    // This table version was taken before worker 1 joined and lists worker 2 alone.
    let (model, router) = seam(
        RouterConfig::with_mode(RouterMode::RoundRobin),
        vec![WorkerRef::new(2, Arc::new(Answers))],
        0,
    );
    for _ in 0..4 {
        assert_eq!(answering_worker(&model).await, 2);
    }
    assert_eq!(router.with_core(|core, _| core.num_tracked()), 0);
}

/// Answers like [`Answers`] and keeps the cut points of every request it receives.
#[derive(Default)]
struct KeepsCuts(std::sync::Mutex<Vec<Vec<kvmesh_proto::v1::PrefixCut>>>);

#[async_trait]
impl WorkerEndpoint for KeepsCuts {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        self.0.lock().unwrap().push(request.prefix_cuts.clone());
        Answers.generate(request).await
    }
}

#[tokio::test]
async fn the_worker_request_carries_the_prompts_cut_points_unless_it_has_its_own() {
    let worker = Arc::new(KeepsCuts::default());
    let (model, _router) = seam(
        RouterConfig::with_mode(RouterMode::RoundRobin),
        vec![WorkerRef::new(2, worker.clone())],
        0,
    );
    let cuts = vec![
        kvmesh_core::prefix::PrefixCut {
            key: 5 << 64 | 9,
            tokens: 2,
        },
        kvmesh_core::prefix::PrefixCut { key: 11, tokens: 3 },
    ];
    let with_cuts = GenerateOptions {
        prefix_cuts: Arc::from(cuts.clone()),
        ..options(FirstResponseWait::Full)
    };
    let own = kvmesh_runtime::prefix_cuts::cuts_to_proto(&cuts[..1]);
    for request in [
        request(),
        GenerateRequest {
            prefix_cuts: own.clone(),
            ..request()
        },
    ] {
        let mut generation = model.generate(request, with_cuts.clone()).await.unwrap();
        assert_eq!(generation.next().await.unwrap().unwrap().token_ids, vec![7]);
    }
    let received = worker.0.lock().unwrap().clone();
    assert_eq!(
        received,
        vec![kvmesh_runtime::prefix_cuts::cuts_to_proto(&cuts), own]
    );
}
