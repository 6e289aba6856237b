//! The kvmesh routing core: which worker serves each request, and what every routed request
//! still costs until it ends (docs/routing.md).
//!
//! * [`RouterCore`] — one model's router as a deterministic state machine with time passed in:
//!   every routing mode, the KV cost model, active-load tracking, busy detection, the queue,
//!   session affinity, readiness, the approximate and predicted indexes. The routing-quality
//!   simulator drives it directly on a virtual clock.
//! * [`SharedRouter`] — the same core behind a lock for concurrent callers (frontend, gRPC
//!   service), with a [`Clock`], async waiting for queued requests, and a [`RouteGuard`] that
//!   releases a request's load on every terminal path, drop included.
//! * [`OverlapSource`] — the trait between the router and a KV index (in-process here, remote
//!   shards later).
//! * [`RouterConfig`] / [`RouterArgs`] — the typed configuration and its clap flags, named as in
//!   docs/flags.md.
//! * [`SyncEvent`] — tracker changes as events, for replica sync ([`replica_sync`] publishes and
//!   applies them over the event plane).
//! * [`fleet`] — workers, load and indexer clients from discovery, for every process that routes.
//! * [`service`] / [`server`] — the `kvmesh-router` replica serving `kvmesh.v1.Router`;
//!   [`remote`] is the frontend's client of those replicas.

pub mod args;
mod busy;
pub mod config;
pub mod core;
pub mod cost;
pub mod decider;
pub mod error;
pub mod fleet;
pub mod generation;
pub mod metrics;
mod modes;
pub mod overlap;
mod queue;
pub mod remote;
pub mod replica_sync;
pub mod request;
pub mod rng;
pub mod routing;
pub mod select;
pub mod server;
pub mod service;
mod session;
pub mod shared;
pub mod sync;
mod tracker;
pub mod wire;
pub mod worker;

pub use args::RouterArgs;
pub use config::{
    ApproxCachePolicy, BusyThresholds, ConfigError, KvRouterConfig, QueuePolicy, RouterConfig,
    RouterMode, SessionAffinityMode,
};
pub use core::{PreparedRequest, RouterCore};
pub use cost::{CandidateLoad, CostBreakdown, CostWeights, EffectiveKv, RequestShape, kv_cost};
pub use decider::{LocalDecider, RemoteRouterMode, ReplicaDecider, RouteDecider, RouteLease};
pub use error::{DEFAULT_OVERLOAD_STATUS, OVERLOADED_MESSAGE, RouteError};
pub use generation::{
    FirstResponseWait, GenerateOptions, Generation, GenerationObserver, MigrationPolicy,
    ModelRouter, NoObserver, WorkerRef,
};
pub use overlap::{NoIndex, OverlapSource, build_event_index};
pub use remote::{RemoteLease, RemoteRouters};
pub use request::{
    Decision, Dispatched, RouteOutcome, RouteRequest, RouterConfigOverride, RoutingHints,
    TerminalPath, Ticket, unique_route_id,
};
pub use rng::Rng;
pub use routing::route_with_index;
pub use select::{select_index, softmax_probabilities};
pub use shared::{
    Admission, Clock, ManualClock, MonotonicClock, QueuedRoute, RouteGuard, SharedRouter,
};
pub use sync::{SyncEvent, SyncKind};
pub use tracker::RankLoadSnapshot;
pub use worker::{RuntimeConfig, WorkerInfo, WorkerLoad};
