//! Who decides where a model's requests go: this process's router, or `kvmesh-router` replicas.
//!
//! A [`RouteDecider`] answers one question, "which worker serves this request?", and hands back a
//! [`RouteLease`] that holds the chosen worker's load until the request ends. Everything after the
//! decision (the worker call, retries, load reports, migration) is the same whoever decided, and
//! lives once in [`crate::generation`].

use std::sync::Arc;

use async_trait::async_trait;
use kvmesh_indexer::client::IndexerClient;
use kvmesh_runtime::otel::Trace;

use crate::remote::{RemoteLease, RemoteRouters};
use crate::routing::route_with_index;
use kvmesh_routing::config::BusyThresholds;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::{Decision, RouteRequest, TerminalPath};
use kvmesh_routing::shared::{RouteGuard, SharedRouter};

/// A routed request's hold on its worker's load. Every terminal path releases it once: an
/// explicit [`RouteLease::finish`], or a drop (the caller went away) as disconnected.
pub trait RouteLease: Send + Sync + std::fmt::Debug {
    /// Where the request goes.
    fn decision(&self) -> &Decision;

    /// Whether every generated token changes the decider's state (`--router-track-output-blocks`);
    /// otherwise only the first token and the end matter.
    fn tracks_output_tokens(&self) -> bool;

    /// The first token arrived: prefill is over.
    fn first_token(&self);

    /// `num_tokens` more were generated (`is_first`: they include the first token).
    fn add_output_tokens(&self, num_tokens: u64, is_first: bool);

    /// Ends the request by `path`.
    fn finish(self: Box<Self>, path: TerminalPath);

    /// Time this process spent hashing the prompt for the decision (zero when another process
    /// decided).
    fn hash_time(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl RouteLease for RouteGuard {
    fn decision(&self) -> &Decision {
        RouteGuard::decision(self)
    }

    fn tracks_output_tokens(&self) -> bool {
        RouteGuard::tracks_output_tokens(self)
    }

    fn first_token(&self) {
        RouteGuard::first_token(self);
    }

    fn add_output_tokens(&self, num_tokens: u64, _is_first: bool) {
        RouteGuard::add_output_tokens(self, num_tokens);
    }

    fn finish(self: Box<Self>, path: TerminalPath) {
        RouteGuard::finish(*self, path);
    }

    fn hash_time(&self) -> std::time::Duration {
        RouteGuard::hash_time(self)
    }
}

impl RouteLease for RemoteLease {
    fn decision(&self) -> &Decision {
        RemoteLease::decision(self)
    }

    fn tracks_output_tokens(&self) -> bool {
        RemoteLease::tracks_output_tokens(self)
    }

    fn first_token(&self) {
        RemoteLease::first_token(self);
    }

    fn add_output_tokens(&self, num_tokens: u64, is_first: bool) {
        RemoteLease::add_output_tokens(self, num_tokens, is_first);
    }

    fn finish(self: Box<Self>, path: TerminalPath) {
        RemoteLease::finish(*self, path);
    }
}

/// Decides where a model's requests go.
#[async_trait]
pub trait RouteDecider: Send + Sync {
    /// Picks a worker for `request` and holds its load until the lease ends; waits in the queue
    /// when every worker is busy (dropping the future leaves the queue). `trace` is the
    /// decision's span: a replica that decides makes its own span a child of it.
    async fn decide(
        &self,
        request: &RouteRequest<'_>,
        trace: &Trace,
    ) -> Result<Box<dyn RouteLease>, RouteError>;

    /// The busy thresholds requests are admitted under.
    async fn busy_thresholds(&self) -> BusyThresholds;

    /// Replaces the busy thresholds (already validated).
    async fn set_busy_thresholds(&self, thresholds: BusyThresholds);
}

/// Decisions by this process's router, with the overlap read from `indexer` when the namespace's
/// index is remote (an in-process index is attached to the router itself).
#[derive(Clone)]
pub struct LocalDecider {
    /// The model's router.
    pub router: SharedRouter,
    /// The namespace's indexer shards, when overlap is read over gRPC.
    pub indexer: Option<IndexerClient>,
}

#[async_trait]
impl RouteDecider for LocalDecider {
    async fn decide(
        &self,
        request: &RouteRequest<'_>,
        _trace: &Trace,
    ) -> Result<Box<dyn RouteLease>, RouteError> {
        let guard = route_with_index(&self.router, self.indexer.as_ref(), request).await?;
        Ok(Box::new(guard))
    }

    async fn busy_thresholds(&self) -> BusyThresholds {
        self.router.busy_thresholds()
    }

    async fn set_busy_thresholds(&self, thresholds: BusyThresholds) {
        self.router.set_busy_thresholds(thresholds);
    }
}

/// `--use-remote-router`: whether a process routes through `kvmesh-router` replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RemoteRouterMode {
    /// Remote replicas when registered, else the in-process router.
    Auto,
    /// Only remote replicas.
    On,
    /// Only the in-process router.
    Off,
}

/// Decisions by router replicas, chosen per request by [`RemoteRouterMode`], with this
/// process's router as the in-process side (`auto` without replicas, and `off`).
#[derive(Clone)]
pub struct ReplicaDecider {
    /// The model's name on the replicas.
    pub model: String,
    /// This process's router of the model.
    pub local: LocalDecider,
    /// The namespace's replicas; `None` when they cannot be watched.
    pub remote: Option<RemoteRouters>,
    /// `--use-remote-router`.
    pub mode: RemoteRouterMode,
    /// Tokens per report of generated tokens to a replica (the model's KV block size).
    pub report_every: u32,
}

impl ReplicaDecider {
    /// The replicas requests go to now, if any.
    fn active_remote(&self) -> Result<Option<&RemoteRouters>, RouteError> {
        match (self.mode, &self.remote) {
            (RemoteRouterMode::Off, _) => Ok(None),
            (RemoteRouterMode::On, None) => Err(RouteError::Unreachable(
                "router replicas cannot be watched".into(),
            )),
            (RemoteRouterMode::On, Some(remote)) => Ok(Some(remote)),
            (RemoteRouterMode::Auto, remote) => {
                Ok(remote.as_ref().filter(|remote| remote.num_replicas() > 0))
            }
        }
    }
}

#[async_trait]
impl RouteDecider for ReplicaDecider {
    async fn decide(
        &self,
        request: &RouteRequest<'_>,
        trace: &Trace,
    ) -> Result<Box<dyn RouteLease>, RouteError> {
        match self.active_remote()? {
            Some(remote) => {
                let mut lease = remote.route(&self.model, request, trace).await?;
                lease.set_report_every(self.report_every);
                Ok(Box::new(lease))
            }
            None => self.local.decide(request, trace).await,
        }
    }

    async fn busy_thresholds(&self) -> BusyThresholds {
        let remote = self.active_remote().ok().flatten();
        match remote {
            Some(remote) => remote.busy_thresholds(&self.model).await,
            None => None,
        }
        .unwrap_or_else(|| self.local.router.busy_thresholds())
    }

    async fn set_busy_thresholds(&self, thresholds: BusyThresholds) {
        self.local.router.set_busy_thresholds(thresholds);
        if let Ok(Some(remote)) = self.active_remote() {
            let updated = remote.set_busy_thresholds(&self.model, &thresholds).await;
            tracing::info!(model = %self.model, replicas = updated, "busy thresholds sent to router replicas");
        }
    }
}

/// A decider shared by every table version of a model.
pub type SharedDecider = Arc<dyn RouteDecider>;
