//! Worker-removed markers (kv-events.md section 4): when a worker leaves discovery, replicas that
//! own its partition publish a marker into the stream, so every replica drops the worker at the
//! same stream position. A periodic sweep covers removals that happened while no replica ran.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kvmesh_proto::v1::{IndexerState, KvEventBatch};
use kvmesh_runtime::discovery::{Discovery, WatchEvent};
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::names;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::shard::ShardState;

/// Components whose instances are workers with KV caches.
const WORKER_COMPONENTS: [&str; 2] = ["backend", "prefill"];

/// Publishes markers for removed workers until `shutdown`.
pub async fn run_markers(
    state: Arc<ShardState>,
    discovery: Arc<dyn Discovery>,
    events: Arc<dyn EventPlane>,
    namespace: String,
    sweep_every: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let prefix = names::instances_prefix(Some(&namespace));
    let mut watch = discovery.watch(&prefix).await?;
    let mut sweep = tokio::time::interval(sweep_every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = sweep.tick() => {
                if state.state() == IndexerState::Serving
                    && let Err(error) = sweep_once(&state, discovery.as_ref(), events.as_ref(), &namespace).await
                {
                    tracing::warn!(%error, "worker sweep failed");
                }
            }
            event = watch.next() => match event {
                Some(WatchEvent::Delete { key }) => {
                    if let Some(parsed) = names::parse_instance_key(&key)
                        && WORKER_COMPONENTS.contains(&parsed.component.as_str())
                    {
                        publish_marker(&state, events.as_ref(), &namespace, parsed.instance_id).await;
                    }
                }
                Some(WatchEvent::Put { .. }) => {}
                None => anyhow::bail!("discovery watch ended"),
            },
        }
    }
}

async fn sweep_once(
    state: &ShardState,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
    namespace: &str,
) -> anyhow::Result<()> {
    let listed: HashSet<u64> = discovery
        .list(&names::instances_prefix(Some(namespace)))
        .await?
        .iter()
        .filter_map(|entry| names::parse_instance_key(&entry.key))
        .filter(|key| WORKER_COMPONENTS.contains(&key.component.as_str()))
        .map(|key| key.instance_id)
        .collect();
    let mut indexed: HashSet<u64> = HashSet::new();
    for (_, index) in state.models() {
        indexed.extend(index.workers().iter().map(|worker| worker.worker_id));
    }
    for worker_id in indexed.difference(&listed) {
        publish_marker(state, events, namespace, *worker_id).await;
    }
    Ok(())
}

/// Publishes the removal marker of `worker_id` on the subject of every model that indexes it.
pub async fn publish_marker(
    state: &ShardState,
    events: &dyn EventPlane,
    namespace: &str,
    worker_id: u64,
) {
    if !state.layout.owns_worker(worker_id) {
        return;
    }
    let partition = kvmesh_kv::kv_partition(worker_id, state.layout.num_partitions);
    let payload = Bytes::from(
        KvEventBatch {
            worker_id,
            worker_removed: true,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let msg_id = format!("rm-{worker_id:016x}");
    for (model, index) in state.models() {
        if !index.workers().iter().any(|w| w.worker_id == worker_id) {
            continue;
        }
        let subject = names::kv_subject(namespace, &model, partition);
        match events
            .publish_durable(&subject, &msg_id, payload.clone())
            .await
        {
            Ok(_) => {
                tracing::info!(worker_id = %format!("{worker_id:x}"), %model, "worker removed from the index")
            }
            Err(error) => {
                tracing::warn!(%error, worker_id = %format!("{worker_id:x}"), "marker publish failed")
            }
        }
    }
}
