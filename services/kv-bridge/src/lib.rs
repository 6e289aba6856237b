//! The engine KV event bridge: reads a vLLM or SGLang engine's KV events from its ZMQ publisher
//! (docs/kv-events.md, "Engine wire format") and republishes them as kvmesh `KvEventBatch`es for
//! one worker ("Transport"), so indexers see a real engine exactly as they see the mocker.
//!
//! * [`wire`]: the engine's multipart frames and msgpack batches, decoded leniently.
//! * [`convert`]: engine events to kvmesh events, with kvmesh's `tokens_hash`.
//! * [`source`]: one SUB socket per dp rank, sequence gaps and replay.
//! * [`publish`]: gap-free event ids per dp rank and durable, ordered publishing.
//! * [`metrics`]: counters of what was skipped, and `/metrics`.
//!
//! Nothing an engine sends stops the bridge: malformed frames, payloads and events are counted
//! and skipped.

pub mod convert;
pub mod fuzzing;
pub mod guard;
pub mod metrics;
pub mod opts;
pub mod publish;
pub mod source;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvmesh_runtime::config::DiscoveryBackend;
use kvmesh_runtime::connect;
use kvmesh_runtime::event_plane::{EventPlane, StreamConfig};
use kvmesh_runtime::names;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use metrics::BridgeMetrics;
pub use opts::BridgeOpts;

use crate::convert::Converter;
use crate::publish::PublishTarget;
use crate::source::{BatchProcessor, SourceConfig};

/// How long shutdown waits for queued events to be published.
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// Converted engine batches that may wait for the publisher before the readers stop reading.
const PUBLISH_QUEUE: usize = 4096;

/// How long a restarted bridge may spend finding the event ids it already published.
const RESUME_LIMIT: Duration = Duration::from_secs(30);

/// Connects the event plane from the runtime options and runs the bridge until `shutdown`.
pub async fn run(opts: BridgeOpts, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Some(parent) = opts.parent_pid {
        exit_with_parent(parent)?;
    }
    if opts.runtime.discovery_backend == DiscoveryBackend::Mem {
        // With mem discovery the event plane is in-process: nobody else would see the events.
        anyhow::bail!(
            "--discovery-backend (DYN_DISCOVERY_BACKEND): mem has no event plane outside this \
             process; the bridge needs NATS (etcd or file discovery)"
        );
    }
    let events = connect::event_plane(&opts.runtime, None).await?;
    let metrics = BridgeMetrics::new()?;
    run_with(opts, events, metrics, shutdown).await
}

/// Has the kernel send SIGKILL to this process when its parent dies, and checks that the parent
/// is still `expected` (it may have died before the request was made; the bridge was then handed
/// to another parent and would never get the signal). The signal follows the parent *thread* that
/// started the bridge, so a parent must start it from a thread that lives as long as it does.
fn exit_with_parent(expected: i32) -> anyhow::Result<()> {
    use rustix::process::{Signal, getppid, set_parent_process_death_signal};
    set_parent_process_death_signal(Some(Signal::KILL))
        .context("--parent-pid: ask the kernel for a signal at the parent's death")?;
    let parent = getppid().map(|pid| pid.as_raw_nonzero().get());
    if parent != Some(expected) {
        anyhow::bail!(
            "--parent-pid {expected}: the bridge's parent is {parent:?}; the process that started it is gone"
        );
    }
    Ok(())
}

/// The socket settings of every dp rank, checked before anything starts.
pub fn source_configs(opts: &BridgeOpts) -> anyhow::Result<Vec<SourceConfig>> {
    let bind = opts.zmq_bind || opts::is_bind_endpoint(&opts.zmq_endpoint);
    (0..opts.data_parallel_size)
        .map(|dp_rank| {
            let endpoint = opts::rank_endpoint(&opts.zmq_endpoint, dp_rank)
                .map_err(|e| anyhow::anyhow!("--zmq-endpoint: {e}"))?;
            let replay_endpoint = opts
                .zmq_replay_endpoint
                .as_deref()
                .map(|replay| opts::rank_endpoint(replay, dp_rank))
                .transpose()
                .map_err(|e| anyhow::anyhow!("--zmq-replay-endpoint: {e}"))?;
            Ok(SourceConfig {
                endpoint,
                bind,
                topic: opts.zmq_topic.clone(),
                dp_rank,
                replay_endpoint,
            })
        })
        .collect()
}

/// Runs the bridge on a given event plane (tests and embedding use an in-process one).
pub async fn run_with(
    opts: BridgeOpts,
    events: Arc<dyn EventPlane>,
    metrics: BridgeMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let configs = source_configs(&opts)?;
    let namespace = &opts.namespace;
    let stream = names::kv_stream_name(namespace);
    events
        .ensure_stream(&StreamConfig {
            name: stream.clone(),
            subjects: names::kv_stream_subjects(namespace),
            max_age: Duration::from_secs(opts.runtime.nats_stream_max_age),
            duplicate_window: Duration::from_secs(120),
        })
        .await
        .with_context(|| format!("create stream {stream}"))?;
    let partition = kvmesh_kv::kv_partition(opts.worker_id, opts.runtime.kv_partitions);
    let subject = names::kv_subject(namespace, &opts.model_name, partition);

    let next_event_id = if opts.resume_event_ids {
        match publish::resume_event_ids(
            events.as_ref(),
            &stream,
            &subject,
            opts.worker_id,
            RESUME_LIMIT,
        )
        .await
        {
            Ok(next) => next,
            Err(error) => {
                tracing::warn!(%error, "cannot read earlier event ids, starting above them by the clock");
                HashMap::new()
            }
        }
    } else {
        HashMap::new()
    };
    if !next_event_id.is_empty() {
        tracing::info!(?next_event_id, "continuing earlier event ids");
    }

    if let Some(port) = opts.metrics_port {
        let addr: SocketAddr = format!("{}:{port}", opts.runtime.tcp_rpc_host)
            .parse()
            .with_context(|| format!("--tcp-rpc-host {}", opts.runtime.tcp_rpc_host))?;
        let bound = metrics::serve(metrics.clone(), addr, shutdown.clone()).await?;
        tracing::info!(address = %bound, "metrics served");
    }

    // Open (and bind) every socket before starting, so a taken port fails the start.
    let guarding = guard::Guarding {
        limit: opts.zmq_max_message_bytes,
        bind_host: opts.zmq_bind_host.clone(),
        metrics: metrics.clone(),
        stop: shutdown.child_token(),
    };
    let mut configs = configs;
    let mut sockets = Vec::with_capacity(configs.len());
    for config in &mut configs {
        sockets.push(source::open_sub(config, &guarding).await?);
    }

    // Bounded: while the event plane is down, the readers stop reading, the engines' sockets
    // fill and drop at their high-water mark, and the gaps are replayed or counted on resume,
    // instead of the bridge buffering without limit.
    let (events_tx, events_rx) = mpsc::channel(PUBLISH_QUEUE);
    let abort = CancellationToken::new();
    let mut publisher = tokio::spawn(publish::run_publisher(
        PublishTarget {
            events,
            subject: subject.clone(),
            worker_id: opts.worker_id,
        },
        next_event_id,
        events_rx,
        metrics.clone(),
        abort.clone(),
    ));
    let sources_stop = CancellationToken::new();
    let mut sources = tokio::task::JoinSet::new();
    let converter = Converter::new(opts.block_size as usize);
    for (config, socket) in configs.into_iter().zip(sockets) {
        let processor = BatchProcessor::new(converter.clone(), config.dp_rank, metrics.clone());
        sources.spawn(source::run_source(
            config,
            socket,
            processor,
            events_tx.clone(),
            sources_stop.clone(),
        ));
    }
    drop(events_tx);
    tracing::info!(
        worker_id = opts.worker_id,
        %subject,
        endpoint = %opts.zmq_endpoint,
        data_parallel_size = opts.data_parallel_size,
        "kv bridge running"
    );

    let mut publisher_done = false;
    let failure = tokio::select! {
        _ = shutdown.cancelled() => None,
        _ = &mut publisher => {
            publisher_done = true;
            Some("kv event publisher stopped")
        }
        Some(_) = sources.join_next() => Some("kv event socket stopped"),
    };
    if let Some(failure) = failure {
        tracing::error!("{failure}, shutting down");
    }
    sources_stop.cancel();
    while sources.join_next().await.is_some() {}
    guarding.stop.cancel();
    if !publisher_done
        && tokio::time::timeout(FLUSH_LIMIT, &mut publisher)
            .await
            .is_err()
    {
        abort.cancel();
        let _ = publisher.await;
    }
    if let Some(failure) = failure {
        anyhow::bail!(failure);
    }
    Ok(())
}
