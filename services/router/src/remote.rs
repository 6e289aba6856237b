//! The client of remote router replicas (`kvmesh-router`), for a frontend that routes through
//! them: replicas found in discovery, `Route` with failover to another replica, and the
//! request's life reported back through a [`RemoteLease`] that, like a local guard, releases
//! the request on every terminal path, drop included.
//!
//! A replica that dies after deciding does not fail the request: the caller talks to the worker
//! itself, and its reports go to another replica, which frees the copy replica sync gave it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kvmesh_proto::v1 as pb;
use kvmesh_proto::v1::router_client::RouterClient;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::instances::InstanceList;
use kvmesh_runtime::{names, net};
use tokio_util::sync::CancellationToken;

mod route_stream;

use self::route_stream::RouteChannel;
use crate::wire;
use crate::wire::RouteErrorStatus as _;
use kvmesh_routing::config::BusyThresholds;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::{Decision, RouteRequest, TerminalPath};

/// Discovery component of router replicas.
pub const ROUTER_COMPONENT: &str = "router";
/// Discovery endpoint of router replicas.
pub const ROUTER_ENDPOINT: &str = "route";

#[derive(Clone)]
struct Replica {
    instance_id: u64,
    client: RouterClient<tonic::transport::Channel>,
    stream: RouteChannel,
}

struct Inner {
    replicas: InstanceList<Replica>,
    next: AtomicUsize,
    timeout: Duration,
    /// This process's discovery instance id (0 without discovery): replicas release what they
    /// routed for it once it leaves discovery.
    caller_instance_id: u64,
}

/// The router replicas of one namespace, kept current from discovery. Cloning is cheap.
#[derive(Clone)]
pub struct RemoteRouters {
    inner: Arc<Inner>,
}

impl RemoteRouters {
    /// Watches `namespace`'s router replicas until `shutdown`. `timeout` bounds one `Report`
    /// and the connection to a replica; `Route` may wait longer when the request queues.
    pub async fn connect(
        discovery: Arc<dyn Discovery>,
        namespace: &str,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let prefix = format!(
            "{}{ROUTER_COMPONENT}/{ROUTER_ENDPOINT}/",
            names::instances_prefix(Some(namespace))
        );
        let replicas = InstanceList::watch(
            discovery.as_ref(),
            &prefix,
            "router",
            move |record| replica_of(record, timeout),
            shutdown,
        )
        .await?;
        let inner = Arc::new(Inner {
            replicas,
            next: AtomicUsize::new(0),
            timeout,
            caller_instance_id: discovery.instance_id(),
        });
        Ok(Self { inner })
    }

    /// The replicas at fixed `addresses` (`host:port`), for deployments that configure router
    /// addresses instead of discovering them. Must run inside a Tokio runtime (each replica gets
    /// its stream task). Fails on an address that is not a valid endpoint.
    pub fn with_addresses(addresses: &[String], timeout: Duration) -> anyhow::Result<Self> {
        let mut replicas = Vec::with_capacity(addresses.len());
        for (index, address) in addresses.iter().enumerate() {
            let record = pb::InstanceRecord {
                instance_id: index as u64 + 1,
                address: address.clone(),
                ..Default::default()
            };
            let replica = replica_of(&record, timeout).ok_or_else(|| {
                anyhow::anyhow!("router address {address:?} is not a valid endpoint")
            })?;
            replicas.push(replica);
        }
        let inner = Arc::new(Inner {
            replicas: InstanceList::fixed(replicas),
            next: AtomicUsize::new(0),
            timeout,
            caller_instance_id: 0,
        });
        Ok(Self { inner })
    }

    /// Replicas currently known.
    pub fn num_replicas(&self) -> usize {
        self.inner.replicas.len()
    }

    /// Routes `request` through one replica, trying the others when a replica fails (not when it
    /// answers with a routing error such as overloaded, which every replica would repeat).
    pub async fn route(
        &self,
        model: &str,
        request: &RouteRequest<'_>,
        trace: &kvmesh_runtime::otel::Trace,
    ) -> Result<RemoteLease, RouteError> {
        let replicas = self.inner.replicas.load();
        if replicas.is_empty() {
            return Err(RouteError::Unreachable(
                "no router replica registered".into(),
            ));
        }
        let (traceparent, tracestate) = trace.to_fields();
        let wire_request = pb::RouteRequest {
            model: model.to_string(),
            request_id: request.request_id.clone(),
            token_ids: request.token_ids.to_vec(),
            lora_name: request.lora_name.unwrap_or_default().to_string(),
            cache_salt: request.cache_salt.unwrap_or_default().to_string(),
            hints: Some(wire::hints_to_proto(&request.hints)),
            allowed_worker_ids: request.hints.allowed_worker_ids.clone().unwrap_or_default(),
            session_bind_ttl_secs: request
                .hints
                .session_bind_ttl
                .map_or(0, |ttl| u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX)),
            config_override: request
                .hints
                .config_override
                .as_ref()
                .map(wire::override_to_proto),
            caller_instance_id: self.inner.caller_instance_id,
            prefix_cuts: kvmesh_runtime::prefix_cuts::cuts_to_proto(request.prefix_cuts),
            traceparent,
            tracestate,
        };
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let mut last_failure = String::new();
        for attempt in 0..replicas.len() {
            let replica = &replicas[(start + attempt) % replicas.len()];
            match replica.stream.route(wire_request.clone()).await {
                Ok(response) => {
                    return Ok(RemoteLease {
                        routers: self.clone(),
                        model: model.to_string(),
                        decision: wire::decision_from_proto(&request.request_id, &response),
                        router_id: response.router_id,
                        replica: replica.instance_id,
                        tracks_output_tokens: response.tracks_output_tokens,
                        pending_tokens: AtomicU64::new(0),
                        report_every: DEFAULT_REPORT_EVERY,
                        is_armed: true,
                    });
                }
                Err(status) => match RouteError::from_status(&status, model) {
                    Some(error) => return Err(error),
                    None => {
                        tracing::warn!(replica = %format!("{:x}", replica.instance_id), %status, "router replica failed, trying another");
                        last_failure = status.message().to_string();
                    }
                },
            }
        }
        Err(RouteError::Unreachable(last_failure))
    }

    /// A model's busy thresholds as the first answering replica holds them.
    pub async fn busy_thresholds(&self, model: &str) -> Option<BusyThresholds> {
        let replicas = self.inner.replicas.load();
        for replica in replicas.iter() {
            let mut client = replica.client.clone();
            let mut call = tonic::Request::new(pb::GetBusyThresholdsRequest {
                model: model.to_string(),
            });
            call.set_timeout(self.inner.timeout);
            if let Ok(response) = client.get_busy_thresholds(call).await
                && let Some(found) = response.into_inner().thresholds.first()
            {
                return Some(wire::thresholds_from_proto(found));
            }
        }
        None
    }

    /// Replaces a model's busy thresholds on every replica; returns how many took them.
    pub async fn set_busy_thresholds(&self, model: &str, thresholds: &BusyThresholds) -> usize {
        let replicas = self.inner.replicas.load();
        let calls = replicas.iter().map(|replica| {
            let mut client = replica.client.clone();
            let mut call = tonic::Request::new(pb::SetBusyThresholdsRequest {
                thresholds: Some(wire::thresholds_to_proto(model, thresholds)),
            });
            call.set_timeout(self.inner.timeout);
            async move { client.set_busy_thresholds(call).await.is_ok() }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Sends a report to the replica that decided: over its stream when that is up, else as a
    /// unary call, then to the others until one takes it.
    async fn report(&self, decided_by: u64, report: pb::ReportRequest) {
        let replicas = self.inner.replicas.load();
        let report = match replicas.iter().find(|r| r.instance_id == decided_by) {
            Some(owner) => match owner.stream.try_report(report) {
                Ok(()) => return,
                Err(report) => report,
            },
            None => report,
        };
        let ordered = replicas
            .iter()
            .filter(|r| r.instance_id == decided_by)
            .chain(replicas.iter().filter(|r| r.instance_id != decided_by));
        for replica in ordered {
            let mut client = replica.client.clone();
            let mut call = tonic::Request::new(report.clone());
            call.set_timeout(self.inner.timeout);
            match tokio::time::timeout(self.inner.timeout, client.report(call)).await {
                Ok(Ok(_)) => return,
                Ok(Err(status)) => {
                    tracing::debug!(replica = %format!("{:x}", replica.instance_id), %status, "router report failed")
                }
                Err(_) => {
                    tracing::debug!(replica = %format!("{:x}", replica.instance_id), "router report timed out")
                }
            }
        }
    }
}

fn replica_of(record: &pb::InstanceRecord, timeout: Duration) -> Option<Replica> {
    let channel = net::mesh_endpoint(&record.address, timeout)
        .ok()?
        .connect_lazy();
    let client = RouterClient::new(channel);
    Some(Replica {
        instance_id: record.instance_id,
        stream: RouteChannel::spawn(client.clone()),
        client,
    })
}

/// A request routed by a remote replica: the decision, and the duty to report the request's
/// life. Reports are sent in the background; a lease dropped without [`Self::finish`] reports
/// the request as disconnected.
pub struct RemoteLease {
    routers: RemoteRouters,
    model: String,
    decision: Decision,
    router_id: String,
    replica: u64,
    tracks_output_tokens: bool,
    /// Generated tokens not reported yet.
    pending_tokens: AtomicU64,
    /// Tokens per output report (a KV block: the tracker grows by whole blocks).
    report_every: u64,
    is_armed: bool,
}

/// Tokens per output report unless the caller knows the model's block size.
const DEFAULT_REPORT_EVERY: u64 = 16;

impl std::fmt::Debug for RemoteLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLease")
            .field("decision", &self.decision)
            .field("router_id", &self.router_id)
            .finish()
    }
}

impl RemoteLease {
    /// Where the request goes.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The replica that decided.
    pub fn router_id(&self) -> &str {
        &self.router_id
    }

    /// Whether the replica wants generated tokens reported as they come (it tracks output
    /// blocks); otherwise only the first token and the end matter.
    pub fn tracks_output_tokens(&self) -> bool {
        self.tracks_output_tokens
    }

    /// The first token arrived.
    pub fn first_token(&self) {
        self.send(true, 0, None);
    }

    /// Reports generated tokens every `tokens` (the model's KV block size) rather than every
    /// [`DEFAULT_REPORT_EVERY`].
    pub fn set_report_every(&mut self, tokens: u32) {
        self.report_every = u64::from(tokens.max(1));
    }

    /// More tokens were generated. Reports go out at the first token and then once a block's
    /// worth has accumulated, so a stream costs the replica one call per block, not per token.
    pub fn add_output_tokens(&self, num_tokens: u64, is_first: bool) {
        if let Some(tokens) = batch_tokens(
            &self.pending_tokens,
            num_tokens,
            is_first,
            self.report_every,
        ) {
            self.send(is_first, u32::try_from(tokens).unwrap_or(u32::MAX), None);
        }
    }

    /// Ends the request by `path`.
    pub fn finish(mut self, path: TerminalPath) {
        self.is_armed = false;
        self.send(false, 0, Some(path));
    }

    fn send(&self, first_token: bool, output_tokens: u32, terminal: Option<TerminalPath>) {
        let report = pb::ReportRequest {
            model: self.model.clone(),
            request_id: self.decision.request_id.clone(),
            router_id: self.router_id.clone(),
            first_token,
            output_tokens,
            terminal: terminal.map_or(pb::TerminalPath::Unspecified, wire::terminal_to_proto)
                as i32,
        };
        let routers = self.routers.clone();
        let replica = self.replica;
        // Outside a runtime (process teardown) the report is lost and expiry frees the request.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { routers.report(replica, report).await });
        }
    }
}

/// Adds `num_tokens` to `pending`; returns the tokens to report now (all pending ones) at the
/// first token or once `every` have accumulated.
fn batch_tokens(pending: &AtomicU64, num_tokens: u64, is_first: bool, every: u64) -> Option<u64> {
    let total = pending.fetch_add(num_tokens, Ordering::Relaxed) + num_tokens;
    (is_first || total >= every).then(|| pending.swap(0, Ordering::Relaxed))
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        if self.is_armed {
            self.is_armed = false;
            self.send(false, 0, Some(TerminalPath::Disconnected));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_reports_come_at_the_first_token_then_per_block() {
        let pending = AtomicU64::new(0);
        assert_eq!(batch_tokens(&pending, 1, true, 16), Some(1));
        let reports: Vec<Option<u64>> = (0..40)
            .map(|_| batch_tokens(&pending, 1, false, 16))
            .collect();
        let sent: Vec<u64> = reports.iter().flatten().copied().collect();
        assert_eq!(sent, vec![16, 16]);
        assert_eq!(pending.load(Ordering::Relaxed), 8);
        assert_eq!(batch_tokens(&pending, 20, false, 16), Some(28));
    }
}
