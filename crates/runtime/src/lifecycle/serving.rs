//! What a service's health probes report: where its lifecycle stands (starting, ready, draining),
//! whether its work gate is open, and how its discovery registration and event plane stand. The
//! metrics server's `/health` and the standard gRPC health service (`grpc.health.v1`) of every
//! gRPC server the lifecycle runs read the same [`ServiceHealth`], so a container's probe, a
//! Kubernetes probe and an operator's `curl` agree.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::WorkGate;
use crate::discovery::RegistrationStatus;
use crate::event_plane::EventPlane;

/// Where a service's lifecycle stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServingState {
    /// Binding, loading or catching up; not registered in discovery yet.
    Starting,
    /// Registered and serving ([`super::ServiceLifecycle::run`] has begun).
    Ready,
    /// Shutting down: unregistered, finishing in-flight work, taking none.
    Draining,
}

/// How healthy a service is at one moment, as its probes say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// `starting`, `healthy`, `degraded`, `unhealthy` or `draining`.
    pub status: &'static str,
    /// Whether probes pass: ready and taking work (a `degraded` service still serves).
    pub is_serving: bool,
    /// One line per thing short of normal.
    pub reasons: Vec<String>,
}

/// A live view of one service's health, cloned into its probes.
#[derive(Clone)]
pub struct ServiceHealth {
    state: watch::Receiver<ServingState>,
    gate: WorkGate,
    registrations: Arc<Mutex<Vec<watch::Receiver<RegistrationStatus>>>>,
    events: Option<Arc<dyn EventPlane>>,
}

impl std::fmt::Debug for ServiceHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHealth")
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl ServiceHealth {
    pub(super) fn new(
        state: watch::Receiver<ServingState>,
        gate: WorkGate,
        registrations: Arc<Mutex<Vec<watch::Receiver<RegistrationStatus>>>>,
    ) -> Self {
        Self {
            state,
            gate,
            registrations,
            events: None,
        }
    }

    /// Also reports on `events` (a disconnected event plane makes the service `degraded`).
    pub fn with_events(mut self, events: Arc<dyn EventPlane>) -> Self {
        self.events = Some(events);
        self
    }

    /// Where the lifecycle stands now.
    pub fn state(&self) -> ServingState {
        *self.state.borrow()
    }

    /// How the service stands now.
    pub fn report(&self) -> HealthReport {
        let mut reasons: Vec<String> = self
            .registrations
            .lock()
            .map(|registrations| {
                registrations
                    .iter()
                    .filter_map(|receiver| crate::health::registration_reason(&receiver.borrow()))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(events) = &self.events
            && !events.is_connected()
        {
            reasons.push(crate::health::EVENTS_DOWN.to_owned());
        }
        let (status, is_serving) = match self.state() {
            ServingState::Starting => ("starting", false),
            ServingState::Draining => ("draining", false),
            ServingState::Ready if !self.gate.is_open() => ("unhealthy", false),
            ServingState::Ready if !reasons.is_empty() => ("degraded", true),
            ServingState::Ready => ("healthy", true),
        };
        HealthReport {
            status,
            is_serving,
            reasons,
        }
    }

    /// Keeps `reporter`'s overall status (the empty service name) SERVING exactly while the
    /// service serves, until `stop`; `set_tx` fires once the first status is set. Never fails:
    /// it is a lifecycle task.
    pub(super) async fn follow(
        mut self,
        reporter: HealthReporter,
        set_tx: tokio::sync::oneshot::Sender<()>,
        stop: CancellationToken,
    ) -> Result<(), std::convert::Infallible> {
        let mut set_tx = Some(set_tx);
        // The gate changes without a notification: look again every second.
        const RECHECK: Duration = Duration::from_secs(1);
        let mut last = None;
        loop {
            let status = if self.report().is_serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if last != Some(status) {
                reporter.set_service_status("", status).await;
                last = Some(status);
            }
            if let Some(set_tx) = set_tx.take() {
                let _ = set_tx.send(());
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                changed = self.state.changed() => {
                    if changed.is_err() {
                        // The lifecycle is gone: its servers stop with it.
                        stop.cancelled().await;
                        return Ok(());
                    }
                }
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

/// `GET /health` of a service's metrics server: 200 with its status while it serves (`healthy`,
/// or `degraded` with reasons), 503 otherwise (`starting`, `draining`, `unhealthy`).
pub async fn health_response(health: ServiceHealth) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let report = health.report();
    let mut body = serde_json::json!({"status": report.status});
    if !report.reasons.is_empty() {
        body["degraded"] = serde_json::json!(report.reasons);
    }
    let code = if report.is_serving {
        http::StatusCode::OK
    } else {
        http::StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::super::{Drain, ServiceLifecycle};
    use super::*;
    use crate::shutdown::Inflight;

    async fn grpc_status(address: std::net::SocketAddr) -> i32 {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .unwrap()
            .into_inner()
            .status
    }

    async fn grpc_becomes(address: std::net::SocketAddr, status: ServingStatus) -> bool {
        for _ in 0..100 {
            if grpc_status(address).await == status as i32 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Both probes say not serving before `run` (not registered yet), serving once it runs, and
    /// not serving while it drains in-flight work.
    #[tokio::test]
    async fn probes_follow_starting_ready_and_draining() {
        let mut lifecycle = ServiceLifecycle::new("test");
        let health = lifecycle.health();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        lifecycle.serve_grpc(
            listener,
            tonic::service::Routes::default(),
            &Default::default(),
        );
        assert_eq!(health.report().status, "starting");
        assert!(grpc_becomes(address, ServingStatus::NotServing).await);
        let response = health_response(health.clone()).await;
        assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);

        let inflight = Inflight::new();
        let request = inflight.enter();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            let inflight = inflight.clone();
            async move {
                let drain = Drain {
                    limit: Duration::from_secs(10),
                    inflight: std::slice::from_ref(&inflight),
                };
                lifecycle.run(&shutdown, drain, || {}).await
            }
        });
        assert!(grpc_becomes(address, ServingStatus::Serving).await);
        assert_eq!(health.report().status, "healthy");
        let response = health_response(health.clone()).await;
        assert_eq!(response.status(), http::StatusCode::OK);

        shutdown.cancel();
        assert!(grpc_becomes(address, ServingStatus::NotServing).await);
        assert_eq!(health.report().status, "draining");
        let response = health_response(health.clone()).await;
        assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        drop(request);
        assert!(running.await.unwrap().is_ok());
    }
}
