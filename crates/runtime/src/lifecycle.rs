//! The one service lifecycle every kvmesh process runs: bind → serve → register only once ready →
//! wait for shutdown, a lost discovery lease or any task's death → revoke → drain in-flight work
//! within the configured limit → stop the tasks and join them.
//!
//! What a lost lease does is decided here alone: today the service stops (and the process exits
//! with an error), because a process that discovery no longer lists must not keep taking work.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::discovery::Discovery;
use crate::shutdown::Inflight;

/// How long stopped tasks get to finish before the service gives up on them.
pub const JOIN_LIMIT: Duration = Duration::from_secs(3);

/// Most concurrent streams per connection of a server whose settings leave it unset.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 4096;

/// HTTP/2 and TLS settings of a gRPC server; unset fields keep the defaults (1 MiB windows,
/// [`DEFAULT_MAX_CONCURRENT_STREAMS`], plaintext).
#[derive(Debug, Clone, Default)]
pub struct GrpcServerSettings {
    /// Most concurrent streams one connection may open (`--tcp-max-concurrent-streams`).
    pub max_concurrent_streams: Option<u32>,
    /// Initial connection-level flow-control window, in bytes.
    pub initial_connection_window_size: Option<u32>,
    /// Initial per-stream flow-control window, in bytes.
    pub initial_stream_window_size: Option<u32>,
    /// Serve over TLS with the edge's current certificate.
    pub tls: Option<Arc<crate::tls::EdgeTls>>,
}

/// The TLS configuration a server's next connection gets.
type ServerTls = Arc<dyn Fn() -> Option<Arc<rustls::ServerConfig>> + Send + Sync>;

/// A task's outcome: an early end of any kind stops the service.
pub type TaskResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// What draining waits for, and for how long at most.
pub struct Drain<'a> {
    /// Longest wait for in-flight work (the graceful-shutdown timeout).
    pub limit: Duration,
    /// Work that must end before the tasks stop (requests, generations).
    pub inflight: &'a [Inflight],
}

impl Drain<'_> {
    /// Nothing to wait for.
    pub const NONE: Drain<'static> = Drain {
        limit: Duration::ZERO,
        inflight: &[],
    };
}

/// One service's tasks and registrations, run to the end by [`ServiceLifecycle::run`].
pub struct ServiceLifecycle {
    name: &'static str,
    tasks: JoinSet<TaskResult>,
    stop: CancellationToken,
    registrations: Vec<Arc<dyn Discovery>>,
}

impl ServiceLifecycle {
    /// An empty lifecycle of the service called `name` (for logs and errors).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            tasks: JoinSet::new(),
            stop: CancellationToken::new(),
            registrations: Vec::new(),
        }
    }

    /// The token the service's tasks stop on. It fires only after the service unregistered and
    /// drained, so tasks outlive the shutdown signal while in-flight work still needs them.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `task` for the service's life; its end before shutdown stops the service.
    pub fn spawn<F, E>(&mut self, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        self.tasks
            .spawn(async move { task.await.map_err(Into::into) });
    }

    /// Serves `routes` as a server of the mesh on `listener` until the stop token fires, with the
    /// HTTP/2 settings of `settings` (stream limit per connection, windows) and over TLS
    /// (demanding a client certificate from the mesh CA) when `--tcp-tls-*` say so
    /// ([`crate::tls::mesh`]). Every mesh server runs this way: TCP_NODELAY on every accepted
    /// socket, a pause after a failed accept instead of a retry loop, and HTTP/2 keepalive PINGs
    /// that close connections to clients that stopped answering.
    pub fn serve_grpc(
        &mut self,
        listener: tokio::net::TcpListener,
        routes: tonic::service::Routes,
        settings: &GrpcServerSettings,
    ) {
        let mesh = crate::tls::mesh::current().filter(|tls| tls.server_config().is_some());
        let tls = mesh.map(|tls| -> ServerTls { Arc::new(move || tls.server_config()) });
        self.serve(listener, routes, settings, tls);
    }

    /// Serves `routes` as a server for clients outside the mesh (the KServe edge), with the
    /// HTTP/2 and TLS settings of `settings`; the mesh's TLS does not apply.
    pub fn serve_grpc_with(
        &mut self,
        listener: tokio::net::TcpListener,
        routes: tonic::service::Routes,
        settings: &GrpcServerSettings,
    ) {
        let tls = settings.tls.clone().map(|tls| -> ServerTls {
            Arc::new(move || Some(tls.config(crate::tls::EdgeProtocol::Grpc)))
        });
        self.serve(listener, routes, settings, tls);
    }

    fn serve(
        &mut self,
        listener: tokio::net::TcpListener,
        routes: tonic::service::Routes,
        settings: &GrpcServerSettings,
        tls: Option<ServerTls>,
    ) {
        let stop = self.stop.clone();
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_connection_window_size(settings.initial_connection_window_size)
            .initial_stream_window_size(settings.initial_stream_window_size)
            .max_concurrent_streams(
                settings
                    .max_concurrent_streams
                    .unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS),
            )
            .http2_keepalive_interval(Some(crate::net::KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(crate::net::KEEPALIVE_TIMEOUT))
            .add_routes(routes);
        match tls {
            None => self.spawn(router.serve_with_incoming_shutdown(
                crate::net::nodelay_incoming(listener),
                stop.cancelled_owned(),
            )),
            Some(tls) => {
                let conns = crate::tls::incoming_with(listener, move || tls());
                let conns =
                    tokio_stream::wrappers::ReceiverStream::new(conns).map(Ok::<_, std::io::Error>);
                self.spawn(router.serve_with_incoming_shutdown(conns, stop.cancelled_owned()));
            }
        }
    }

    /// Waits until `is_ready` holds (checked every 50 ms). `Ok(false)` when shutdown came
    /// first; an error when a task ended meanwhile.
    pub async fn wait_ready(
        &mut self,
        shutdown: &CancellationToken,
        is_ready: impl Fn() -> bool,
    ) -> Result<bool, LifecycleError> {
        while !is_ready() {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(false),
                Some(result) = self.tasks.join_next() => {
                    return Err(self.task_failure(result));
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        Ok(true)
    }

    /// Takes charge of `discovery`'s registration: the service stops when its lease is lost,
    /// and revokes it before draining.
    pub fn registered(&mut self, discovery: Arc<dyn Discovery>) {
        self.registrations.push(discovery);
    }

    /// Serves until `shutdown`, a lost lease or the end of any task; then calls `stopping`,
    /// revokes every registration, waits for `drain` within its limit, stops the tasks and joins
    /// them within [`JOIN_LIMIT`]. Returns why it stopped when that was not `shutdown`.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        drain: Drain<'_>,
        stopping: impl FnOnce(),
    ) -> Result<(), LifecycleError> {
        let leases: Vec<CancellationToken> = self
            .registrations
            .iter()
            .map(|discovery| discovery.lease_lost())
            .collect();
        let lease_lost = async {
            if leases.is_empty() {
                return std::future::pending().await;
            }
            futures::future::select_all(leases.iter().map(|token| Box::pin(token.cancelled())))
                .await;
        };
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => Ok(()),
            _ = lease_lost => {
                tracing::error!(service = self.name, "discovery lease lost, stopping");
                Err(LifecycleError::LeaseLost)
            }
            Some(result) = self.tasks.join_next() => {
                if shutdown.is_cancelled() {
                    Ok(())
                } else {
                    Err(self.task_failure(result))
                }
            }
        };
        stopping();
        for discovery in &self.registrations {
            if let Err(error) = discovery.revoke().await {
                tracing::warn!(service = self.name, %error, "unregister failed");
            }
        }
        for inflight in drain.inflight {
            if !inflight.drain(drain.limit).await {
                tracing::warn!(
                    service = self.name,
                    remaining = inflight.count(),
                    "drain limit reached"
                );
            }
        }
        self.stop.cancel();
        let joined = tokio::time::timeout(JOIN_LIMIT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            tracing::warn!(
                service = self.name,
                "tasks still running after the join limit"
            );
        }
        result
    }

    fn task_failure(&self, result: Result<TaskResult, tokio::task::JoinError>) -> LifecycleError {
        let reason = match result {
            Ok(Ok(())) => "stopped".to_string(),
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        LifecycleError::TaskEnded {
            service: self.name,
            reason,
        }
    }
}

/// Why a service stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// Discovery no longer holds this process's registration.
    #[error("discovery lease lost")]
    LeaseLost,
    /// One of the service's tasks ended.
    #[error("{service}: a task ended: {reason}")]
    TaskEnded {
        /// The service.
        service: &'static str,
        /// Its outcome.
        reason: String,
    },
}
