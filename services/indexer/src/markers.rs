//! Worker-removed markers (docs/kv-events.md, "Worker removal"): when a worker leaves discovery,
//! replicas that own its partition publish a marker into the stream, so every replica drops the
//! worker at the same stream position. A periodic sweep covers removals that happened while no
//! replica ran.

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
    let mut suspects = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = sweep.tick() => {
                if state.state() == IndexerState::Serving
                    && let Err(error) = sweep_once(&state, discovery.as_ref(), events.as_ref(), &namespace, &mut suspects).await
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

/// Removes workers the index holds but discovery does not list, once they were missing from two
/// sweeps in a row: a worker's first events can reach the index before its registration reaches
/// discovery, and worker ids are never reused, so a wrong removal would be for good.
async fn sweep_once(
    state: &ShardState,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
    namespace: &str,
    suspects: &mut HashSet<u64>,
) -> anyhow::Result<()> {
    // Indexed first, listed second: a worker indexed by now registered before the listing.
    let mut indexed: HashSet<u64> = HashSet::new();
    for (_, index) in state.models() {
        indexed.extend(index.workers().iter().map(|worker| worker.worker_id));
    }
    let listed: HashSet<u64> = discovery
        .list(&names::instances_prefix(Some(namespace)))
        .await?
        .iter()
        .filter_map(|entry| names::parse_instance_key(&entry.key))
        .filter(|key| WORKER_COMPONENTS.contains(&key.component.as_str()))
        .map(|key| key.instance_id)
        .collect();
    let missing: HashSet<u64> = indexed.difference(&listed).copied().collect();
    for worker_id in missing.intersection(suspects) {
        publish_marker(state, events, namespace, *worker_id).await;
    }
    *suspects = missing;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ShardLayout;
    use kvmesh_kv::{KvEvent, KvEventKind, KvStored, KvStoredBlock, Tier};
    use kvmesh_runtime::discovery::mem::MemStore;
    use kvmesh_runtime::event_plane::StreamConfig;
    use kvmesh_runtime::event_plane::mem::MemEventPlane;

    const NS: &str = "sweep";

    fn indexed_state(worker_ids: &[u64]) -> ShardState {
        let state = ShardState::new(ShardLayout::striped(0, 1, 4), 1);
        let Some(index) = state.model_or_insert("m") else {
            panic!("first model");
        };
        for &worker_id in worker_ids {
            let batch = kvmesh_kv::KvEventBatch {
                worker_id,
                events: vec![KvEvent {
                    event_id: 0,
                    tier: Tier::Device,
                    kind: KvEventKind::Stored(KvStored {
                        parent_hash: None,
                        blocks: vec![KvStoredBlock::new(worker_id, 1)],
                        start_position: None,
                    }),
                }],
                ..kvmesh_kv::KvEventBatch::default()
            };
            index.apply(batch).map_err(|e| e.to_string()).unwrap();
        }
        index.flush().map_err(|e| e.to_string()).unwrap();
        state
    }

    #[tokio::test]
    async fn a_worker_is_swept_only_when_missing_from_two_sweeps_in_a_row() {
        let state = indexed_state(&[1, 2]);
        let discovery = MemStore::new().handle();
        discovery
            .put(
                &names::instance_key(NS, "backend", "generate", 1),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
        let events = MemEventPlane::new();
        let stream = names::kv_stream_name(NS);
        events
            .ensure_stream(&StreamConfig {
                name: stream.clone(),
                subjects: names::kv_stream_subjects(NS),
                max_age: Duration::from_secs(60),
                duplicate_window: Duration::from_secs(60),
            })
            .await
            .unwrap();
        let mut suspects = HashSet::new();
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        assert_eq!(events.last_sequence(&stream).await.unwrap(), 0);
        assert_eq!(suspects, HashSet::from([2]));
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        assert_eq!(
            events.last_sequence(&stream).await.unwrap(),
            1,
            "one marker, for 2"
        );

        // A worker that registers between two sweeps is not removed.
        let state = indexed_state(&[3]);
        let mut suspects = HashSet::new();
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        discovery
            .put(
                &names::instance_key(NS, "backend", "generate", 3),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        assert_eq!(events.last_sequence(&stream).await.unwrap(), 1);
        assert!(suspects.is_empty());
    }
}
