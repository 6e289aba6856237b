//! Route extensions (`--frontend-route-extension`, docs/processors.md "Route extensions"): small
//! GET handlers written in Python that the processor hosts load and run; the frontend serves
//! their paths and forwards each call to a live host with the frontend's serving state.

use std::time::Duration;

use kvmesh_core::ErrorCode;
use kvmesh_proto::v1::{CallRouteRequest, CallRouteResponse, FrontendState, ListRoutesRequest};
use tokio_util::sync::CancellationToken;

use super::{ProcessorHosts, is_unreachable};
use crate::error::FrontendError;

/// The option route extension errors name.
const OPTION: &str = "--frontend-route-extension (DYN_FRONTEND_ROUTE_EXTENSIONS)";

/// Longer than a host's own 30 s limit on a handler, so the host's 503 is what a client sees.
const CALL_TIMEOUT: Duration = Duration::from_secs(35);

/// The extension routes this frontend serves and the hosts that answer them.
#[derive(Clone)]
pub struct RouteExtensions {
    hosts: ProcessorHosts,
    paths: Vec<String>,
}

impl RouteExtensions {
    /// Asks the hosts for their routes (retrying until one answers, at most `wait`) and checks
    /// them against the paths this frontend serves itself; a failure stops the frontend naming
    /// the option.
    pub async fn load(
        hosts: ProcessorHosts,
        anthropic_api: bool,
        wait: Duration,
        shutdown: &CancellationToken,
    ) -> Self {
        let deadline = tokio::time::Instant::now() + wait;
        let paths = loop {
            let listed = match hosts.in_turn().next() {
                Some(host) => host
                    .client
                    .clone()
                    .list_routes(ListRoutesRequest {})
                    .await
                    .map(|response| response.into_inner().paths)
                    .ok(),
                None => None,
            };
            if let Some(paths) = listed {
                break paths;
            }
            if tokio::time::Instant::now() >= deadline {
                kvmesh_runtime::config::exit_config_error(&format!(
                    "{OPTION}: no processor host listed the route extensions within {wait:?}"
                ));
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = shutdown.cancelled() => break Vec::new(),
            }
        };
        let reserved = crate::http::reserved_paths(anthropic_api);
        let mut seen = std::collections::HashSet::new();
        for path in &paths {
            if reserved.contains(path) || !seen.insert(path) {
                kvmesh_runtime::config::exit_config_error(&format!(
                    "{OPTION}: route {path:?} is a path the frontend serves itself or is listed twice"
                ));
            }
        }
        tracing::info!(routes = ?paths, "route extensions served");
        Self { hosts, paths }
    }

    /// The paths served (GET).
    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// Runs `path`'s handler on a live host (a host that cannot be reached is skipped for the
    /// next one) and returns its status and JSON body.
    pub async fn call(
        &self,
        path: &str,
        state: FrontendState,
    ) -> Result<CallRouteResponse, FrontendError> {
        let unavailable = |message: String| FrontendError::Worker {
            code: ErrorCode::Unavailable,
            message,
        };
        let mut last = None;
        for host in self.hosts.in_turn() {
            let request = CallRouteRequest {
                path: path.to_owned(),
                state: Some(state.clone()),
            };
            let mut client = host.client.clone();
            match tokio::time::timeout(CALL_TIMEOUT, client.call_route(request)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) if is_unreachable(&status) => last = Some(status),
                Ok(Err(status)) => {
                    return Err(unavailable(format!(
                        "route extension host: {}",
                        status.message()
                    )));
                }
                Err(_) => {
                    return Err(FrontendError::Worker {
                        code: ErrorCode::Timeout,
                        message: format!("route extension {path} did not answer"),
                    });
                }
            }
        }
        Err(unavailable(match last {
            Some(status) => format!("route extension host: {}", status.message()),
            None => "no live processor host serves the route extensions".into(),
        }))
    }
}
