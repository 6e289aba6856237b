//! The `kvmesh-router` service and every process's way to route through the mesh, built on the
//! pure routing core of `kvmesh-routing`.
//!
//! * [`generation`] — the one seam from a preprocessed request to a worker's token stream
//!   ([`ModelRouter`]): decide, call the worker, retry, report, migrate. Every edge uses it.
//! * [`decider`] — who decides: this process's router ([`LocalDecider`]) or `kvmesh-router`
//!   replicas ([`ReplicaDecider`]), behind [`RouteDecider`].
//! * [`fleet`] — workers, load and indexer clients from discovery, for every process that routes.
//! * [`replica_sync`] — tracker changes shared between replicas over the event plane.
//! * [`routed_models`], [`service`] / [`server`] — the `kvmesh-router` replica: the models it
//!   routes, kept current from discovery, and its `kvmesh.v1.Router` service;
//!   [`remote`] is the client of those replicas; [`wire`] converts between the core's types and
//!   the protobuf contract.

pub mod decider;
pub mod fleet;
pub mod fuzzing;
pub mod generation;
pub mod metrics;
pub mod remote;
pub mod replica_sync;
pub mod routed_models;
pub mod routing;
pub mod server;
pub mod service;
pub mod wire;

pub use decider::{LocalDecider, RemoteRouterMode, ReplicaDecider, RouteDecider, RouteLease};
pub use generation::{
    FirstResponseWait, GenerateOptions, Generation, GenerationObserver, MigrationPolicy,
    ModelRouter, NoObserver, StartTimings, WorkerRef,
};
pub use remote::{RemoteLease, RemoteRouters};
pub use routing::route_with_index;
pub use wire::RouteErrorStatus;
