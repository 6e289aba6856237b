//! The kvmesh routing core: which worker serves each request, and what every routed request
//! still costs until it ends (docs/routing.md). Pure logic with time passed in: no gRPC, HTTP or
//! NATS, so the routing-quality simulator, the `kvmesh-router` service and every process that
//! routes in-process share it unchanged.
//!
//! * [`RouterCore`] — one model's router as a deterministic state machine with time passed in:
//!   every routing mode, the KV cost model, active-load tracking, busy detection, the queue,
//!   session affinity, readiness, the approximate and predicted indexes. The routing-quality
//!   simulator drives it directly on a virtual clock.
//! * [`SharedRouter`] — the same core behind a lock for concurrent callers (frontend, gRPC
//!   service), with a [`Clock`], async waiting for queued requests, and a [`RouteGuard`] that
//!   releases a request's load on every terminal path, drop included.
//! * [`OverlapSource`] — the trait between the router and an in-process KV index.
//! * [`RouterConfig`] / [`RouterArgs`] — the typed configuration and its clap flags, named as in
//!   docs/flags.md.
//! * [`SyncEvent`] — tracker changes as events, for replica sync (the `kvmesh-router` crate
//!   publishes and applies them over the event plane).
//! * [`KvWeightsMode`] — fixed cost weights, or weights learned online (`auto`).
//! * [`RouteError`] — why a request could not be routed, with its [`kvmesh_core::ErrorCode`].

pub mod adaptive;
pub mod args;
mod busy;
pub mod clock;
pub mod config;
pub mod core;
pub mod cost;
pub mod error;
pub mod health;
mod modes;
pub mod overlap;
mod queue;
pub mod request;
pub mod rng;
pub mod select;
mod session;
pub mod shared;
pub mod sync;
mod tracker;
pub mod worker;

pub use adaptive::{DECODE_STALL_WEIGHT, KvWeightsMode, LearnedWeights};
pub use args::RouterArgs;
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{
    ApproxCachePolicy, BusyThresholds, ConfigError, KvRouterConfig, QueuePolicy, RouterConfig,
    RouterMode, SessionAffinityMode,
};
pub use core::{PreparedRequest, RouterCore};
pub use cost::{
    CandidateLoad, CostBreakdown, CostPolicy, CostWeights, EffectiveKv, RequestShape, kv_cost,
};
pub use error::{DEFAULT_OVERLOAD_STATUS, OVERLOADED_MESSAGE, RouteError};
pub use health::{EjectionConfig, HealthChange};
pub use overlap::{NoIndex, OverlapSource, build_event_index};
pub use request::{
    Decision, Dispatched, RouteOutcome, RouteRequest, RouterConfigOverride, RoutingHints,
    TerminalPath, Ticket, unique_route_id,
};
pub use rng::Rng;
pub use select::{select_index, softmax_probabilities};
pub use shared::{Admission, QueuedRoute, RouteGuard, SharedRouter};
pub use sync::{SyncEvent, SyncKind};
pub use tracker::RankLoadSnapshot;
pub use worker::{RuntimeConfig, WorkerInfo, WorkerLoad};
