//! The one service lifecycle every kvmesh process runs: bind → serve → register only once ready →
//! wait for shutdown or any task's death → revoke → drain in-flight work within the configured
//! limit → stop the tasks and join them.
//!
//! What a lost lease does is decided here alone: the service keeps serving with what it knows
//! while its discovery backend puts the registration back (same instance id, same records), and
//! its [`WorkGate`] closes only when a registration stays lost for longer than the registration
//! grace (`--registration-grace-secs`). A worker refuses new work while its gate is closed; an
//! unreachable etcd alone never closes it, since nobody's view of the mesh changes meanwhile.

mod serving;
mod small_frames;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::discovery::{Discovery, RegistrationState, RegistrationStatus};
use crate::shutdown::Inflight;

pub use serving::{HealthReport, ServiceHealth, ServingState, health_response};

/// How long stopped tasks get to finish before the service gives up on them.
pub const JOIN_LIMIT: Duration = Duration::from_secs(3);

/// Most concurrent streams per connection of a server whose settings leave it unset.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 4096;

/// How long a registration may stay lost before the service stops taking new work
/// (`--registration-grace-secs`).
pub const DEFAULT_REGISTRATION_GRACE: Duration = Duration::from_secs(30);

/// Whether the service takes new work: closed while a registration stayed lost for longer than
/// the registration grace, open again once it is back.
#[derive(Debug, Clone)]
pub struct WorkGate(Arc<AtomicBool>);

impl WorkGate {
    /// A gate that is open.
    pub fn open() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Whether new work may start.
    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, is_open: bool) -> bool {
        self.0.swap(is_open, Ordering::AcqRel) != is_open
    }
}

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
    registration_grace: Duration,
    gate: WorkGate,
    state: watch::Sender<ServingState>,
    registration_states: Arc<Mutex<Vec<watch::Receiver<RegistrationStatus>>>>,
}

impl ServiceLifecycle {
    /// An empty lifecycle of the service called `name` (for logs and errors).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            tasks: JoinSet::new(),
            stop: CancellationToken::new(),
            registrations: Vec::new(),
            registration_grace: DEFAULT_REGISTRATION_GRACE,
            gate: WorkGate::open(),
            state: watch::Sender::new(ServingState::Starting),
            registration_states: Arc::default(),
        }
    }

    /// What the service's probes report: `starting` until [`Self::run`] begins (services
    /// register just before), then ready, degraded or unhealthy by the registration and the work
    /// gate, and `draining` from the shutdown signal on.
    pub fn health(&self) -> ServiceHealth {
        ServiceHealth::new(
            self.state.subscribe(),
            self.gate.clone(),
            self.registration_states.clone(),
        )
    }

    /// Sets how long a registration may stay lost before the work gate closes.
    pub fn with_registration_grace(mut self, grace: Duration) -> Self {
        self.registration_grace = grace;
        self
    }

    /// The gate a service that takes routed work (a worker) checks before starting any.
    pub fn work_gate(&self) -> WorkGate {
        self.gate.clone()
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

    /// Serves `routes` and the standard gRPC health service (`grpc.health.v1`: SERVING only
    /// while [`Self::health`] says the service serves) as a server of the mesh on `listener`
    /// until the stop token fires, with the
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

    /// Serves `routes` and the gRPC health service as a server for clients outside the mesh (the
    /// KServe edge), with the
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
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let routes = routes.add_service(health_service);
        // The reporter starts out SERVING: the server accepts its first connection only once
        // the reporter says what the service's health says.
        let (set_tx, set_rx) = tokio::sync::oneshot::channel();
        let initial = async move {
            let _ = set_rx.await;
        };
        self.spawn(self.health().follow(reporter, set_tx, stop.clone()));
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
            .layer(small_frames::layer())
            .add_routes(routes);
        match tls {
            None => self.spawn(async move {
                initial.await;
                router
                    .serve_with_incoming_shutdown(
                        crate::net::nodelay_incoming(listener),
                        stop.cancelled_owned(),
                    )
                    .await
            }),
            Some(tls) => {
                let conns = crate::tls::incoming_with(listener, move || tls());
                let conns =
                    tokio_stream::wrappers::ReceiverStream::new(conns).map(Ok::<_, std::io::Error>);
                self.spawn(async move {
                    initial.await;
                    router
                        .serve_with_incoming_shutdown(conns, stop.cancelled_owned())
                        .await
                });
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

    /// Takes charge of `discovery`'s registration: its losses are logged and close the work gate
    /// after the registration grace, and it is revoked before draining.
    pub fn registered(&mut self, discovery: Arc<dyn Discovery>) {
        if let Ok(mut states) = self.registration_states.lock() {
            states.push(discovery.registration());
        }
        self.registrations.push(discovery);
    }

    /// Serves until `shutdown` or the end of any task; then calls `stopping`,
    /// revokes every registration, waits for `drain` within its limit, stops the tasks and joins
    /// them within [`JOIN_LIMIT`]. Returns why it stopped when that was not `shutdown`.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        drain: Drain<'_>,
        stopping: impl FnOnce(),
    ) -> Result<(), LifecycleError> {
        let registrations = watch_registrations(
            self.name,
            &self.registrations,
            self.registration_grace,
            &self.gate,
        );
        self.state.send_replace(ServingState::Ready);
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => Ok(()),
            () = registrations => Ok(()),
            Some(result) = self.tasks.join_next() => {
                if shutdown.is_cancelled() {
                    Ok(())
                } else {
                    Err(self.task_failure(result))
                }
            }
        };
        self.state.send_replace(ServingState::Draining);
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

/// Follows every registration's state for the service's life: logs each change, closes `gate`
/// once one stayed lost for longer than `grace` and opens it when none is lost. Never ends.
async fn watch_registrations(
    service: &'static str,
    registrations: &[Arc<dyn Discovery>],
    grace: Duration,
    gate: &WorkGate,
) {
    let mut receivers: Vec<_> = registrations
        .iter()
        .map(|discovery| discovery.registration())
        .collect();
    let mut last: Vec<RegistrationState> = receivers
        .iter()
        .map(|receiver| receiver.borrow().state)
        .collect();
    loop {
        let statuses: Vec<RegistrationStatus> = receivers
            .iter_mut()
            .map(|receiver| *receiver.borrow_and_update())
            .collect();
        for (status, last) in statuses.iter().zip(last.iter_mut()) {
            if status.state != *last {
                match status.state {
                    RegistrationState::Held => {
                        tracing::info!(service, was = ?*last, "discovery registration held again")
                    }
                    RegistrationState::Unreachable => tracing::warn!(
                        service,
                        "discovery unreachable; serving with the last known mesh"
                    ),
                    RegistrationState::Lost => tracing::error!(
                        service,
                        num_losses = status.num_losses,
                        "discovery lease lost; serving on and re-registering"
                    ),
                }
                *last = status.state;
            }
        }
        let lost_since = statuses
            .iter()
            .filter(|status| status.state == RegistrationState::Lost)
            .map(|status| status.since)
            .min();
        let close_at = match lost_since {
            None => {
                if gate.set(true) {
                    tracing::info!(service, "registered again; taking new work");
                }
                None
            }
            Some(since) if since.elapsed() >= grace => {
                if gate.set(false) {
                    tracing::error!(
                        service,
                        grace_s = grace.as_secs(),
                        "registration lost for longer than the grace; refusing new work"
                    );
                }
                None
            }
            Some(since) => Some(since + grace),
        };
        let changed = async {
            if receivers.is_empty() {
                return std::future::pending().await;
            }
            let changes = receivers
                .iter_mut()
                .map(|receiver| Box::pin(receiver.changed()));
            let _ = futures::future::select_all(changes).await;
        };
        tokio::select! {
            () = changed => {}
            () = sleep_until_some(close_at) => {}
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a service stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// One of the service's tasks ended.
    #[error("{service}: a task ended: {reason}")]
    TaskEnded {
        /// The service.
        service: &'static str,
        /// Its outcome.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::mem::{MemDiscovery, MemStore};

    async fn gate_becomes(gate: &WorkGate, is_open: bool) -> bool {
        for _ in 0..100 {
            if gate.is_open() == is_open {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// A lost registration closes the gate only after the grace and never stops the service;
    /// an unreachable backend never closes it; the gate opens once the registration is back.
    #[tokio::test]
    async fn a_lost_registration_closes_the_gate_after_the_grace_and_serves_on() {
        let discovery = Arc::new(MemDiscovery::new(&MemStore::new()));
        let mut lifecycle =
            ServiceLifecycle::new("test").with_registration_grace(Duration::from_millis(300));
        lifecycle.registered(discovery.clone());
        let gate = lifecycle.work_gate();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { lifecycle.run(&shutdown, Drain::NONE, || {}).await }
        });
        discovery.simulate_registration(RegistrationState::Unreachable);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(gate.is_open(), "unreachable alone closed the gate");
        discovery.simulate_registration(RegistrationState::Lost);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(gate.is_open(), "closed before the grace");
        assert!(
            gate_becomes(&gate, false).await,
            "not closed after the grace"
        );
        assert!(!running.is_finished(), "a lost lease stopped the service");
        discovery.simulate_registration(RegistrationState::Held);
        assert!(
            gate_becomes(&gate, true).await,
            "not opened once held again"
        );
        shutdown.cancel();
        assert!(running.await.unwrap().is_ok());
    }
}
