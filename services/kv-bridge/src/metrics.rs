//! The bridge's Prometheus metrics, so operators (and tests) can see what the engine sent that
//! could not be republished, and the optional `/metrics` HTTP endpoint that exposes them.

use std::net::SocketAddr;

use anyhow::Context;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

/// Counters of one bridge process.
#[derive(Clone)]
pub struct BridgeMetrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// ZMQ messages received (any shape).
    pub batches_received: IntCounter,
    /// Sequence gaps between received batches that replay could not fill.
    pub zmq_gaps: IntCounter,
    /// Batches missing in those gaps.
    pub zmq_missed_batches: IntCounter,
    /// Times the publisher's sequence went backwards (engine publisher restarted).
    pub zmq_seq_resets: IntCounter,
    /// Batches recovered through the engine's replay socket.
    pub zmq_replayed_batches: IntCounter,
    /// Engine connections dropped for a frame or message over `--zmq-max-message-bytes`.
    pub zmq_oversized: IntCounter,
    /// Messages, payloads or events that could not be decoded, by `kind`.
    pub malformed: IntCounterVec,
    /// Events not republished as sent, by `reason`.
    pub skipped: IntCounterVec,
    /// Stored blocks dropped (block-size mismatch or missing tokens).
    pub dropped_blocks: IntCounter,
    /// kvmesh events published (stored in JetStream).
    pub events_published: IntCounter,
    /// kvmesh batches published.
    pub batches_published: IntCounter,
    /// Publish attempts that failed and were retried.
    pub publish_retries: IntCounter,
}

fn counter(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let counter = IntCounter::new(name, help)?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> prometheus::Result<IntCounterVec> {
    let counter = IntCounterVec::new(Opts::new(name, help), &[label])?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

impl BridgeMetrics {
    /// Creates the counters in a fresh registry (fails only on an invalid metric definition).
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Self {
            batches_received: counter(
                &registry,
                "kvmesh_adapter_zmq_batches_total",
                "ZMQ messages received from the engine",
            )?,
            zmq_gaps: counter(
                &registry,
                "kvmesh_adapter_zmq_gaps_total",
                "ZMQ sequence gaps that replay could not fill",
            )?,
            zmq_missed_batches: counter(
                &registry,
                "kvmesh_adapter_zmq_missed_batches_total",
                "ZMQ batches lost in sequence gaps",
            )?,
            zmq_oversized: counter(
                &registry,
                "kvmesh_adapter_zmq_oversized_total",
                "Engine connections dropped for a ZMQ message over the size limit",
            )?,
            zmq_seq_resets: counter(
                &registry,
                "kvmesh_adapter_zmq_seq_resets_total",
                "Times the engine's ZMQ sequence went backwards",
            )?,
            zmq_replayed_batches: counter(
                &registry,
                "kvmesh_adapter_zmq_replayed_batches_total",
                "ZMQ batches recovered from the engine's replay socket",
            )?,
            malformed: counter_vec(
                &registry,
                "kvmesh_adapter_malformed_total",
                "Engine messages, payloads or events that could not be decoded, skipped",
                "kind",
            )?,
            skipped: counter_vec(
                &registry,
                "kvmesh_adapter_events_skipped_total",
                "Engine events not republished as sent",
                "reason",
            )?,
            dropped_blocks: counter(
                &registry,
                "kvmesh_adapter_blocks_dropped_total",
                "Stored blocks dropped for a block-size mismatch or missing tokens",
            )?,
            events_published: counter(
                &registry,
                "kvmesh_adapter_events_published_total",
                "kvmesh KV events published",
            )?,
            batches_published: counter(
                &registry,
                "kvmesh_adapter_batches_published_total",
                "kvmesh KV event batches published",
            )?,
            publish_retries: counter(
                &registry,
                "kvmesh_adapter_publish_retries_total",
                "KV event batch publishes that failed and were retried",
            )?,
            registry,
        })
    }
}

/// Binds `/metrics` on `addr` and serves it until `shutdown`; returns the bound address.
pub async fn serve(
    metrics: BridgeMetrics,
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind metrics server on {addr}"))?;
    let local = listener.local_addr()?;
    let registry = metrics.registry.clone();
    let render = move || {
        let text = kvmesh_runtime::telemetry::encode_metrics(&registry);
        async move { text }
    };
    tokio::spawn(async move {
        let served =
            kvmesh_runtime::telemetry::serve_metrics(listener, render, None, shutdown).await;
        if let Err(error) = served {
            tracing::warn!(%error, "metrics server stopped");
        }
    });
    Ok(local)
}
