//! Worker-removed and worker-readmitted markers (docs/kv-events.md, "Worker removal"): when a
//! worker leaves discovery, replicas that own its partition publish a removal marker into the
//! stream, so every replica drops the worker at the same stream position; when a removed worker
//! registers again under the same id (its lease was lost and granted again), they publish a
//! readmission marker, after which its events count again. A periodic sweep covers removals and
//! returns that happened while no replica ran or watched.

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

/// Which marker to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The worker left discovery: drop its blocks, ignore its events.
    Removed,
    /// The worker registered again under the same id: apply its events again.
    Readmitted,
}

/// Publishes markers for removed and returning workers until `shutdown`.
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
    // Workers this replica published a removal for that the index may not have applied yet: a
    // return seen before then still needs its readmission.
    let mut removing = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = sweep.tick() => {
                removing.retain(|id| !is_removed(&state, *id));
                if state.state() == IndexerState::Serving
                    && let Err(error) = sweep_once(&state, discovery.as_ref(), events.as_ref(), &namespace, &mut suspects).await
                {
                    tracing::warn!(%error, "worker sweep failed");
                }
            }
            event = watch.next() => match event {
                Some(WatchEvent::Delete { key }) => {
                    if let Some(worker_id) = worker_of(&key) {
                        publish_marker(&state, events.as_ref(), &namespace, worker_id, Marker::Removed).await;
                        removing.insert(worker_id);
                    }
                }
                Some(WatchEvent::Put { key, .. }) => {
                    if let Some(worker_id) = worker_of(&key)
                        && (removing.remove(&worker_id) || is_removed(&state, worker_id))
                    {
                        publish_marker(&state, events.as_ref(), &namespace, worker_id, Marker::Readmitted).await;
                    }
                }
                None => anyhow::bail!("discovery watch ended"),
            },
        }
    }
}

/// The worker id of a worker's instance key.
fn worker_of(key: &str) -> Option<u64> {
    names::parse_instance_key(key)
        .filter(|parsed| WORKER_COMPONENTS.contains(&parsed.component.as_str()))
        .map(|parsed| parsed.instance_id)
}

/// Whether any model of the shard applied a removal of `worker_id` and no readmission since.
fn is_removed(state: &ShardState, worker_id: u64) -> bool {
    state
        .models()
        .iter()
        .any(|(_, index)| index.removal_state(worker_id).0)
}

/// Removes workers the index holds but discovery does not list, once they were missing from two
/// sweeps in a row: a worker's first events can reach the index before its registration reaches
/// discovery. Readmits removed workers that discovery lists again (a return the watch missed).
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
        .filter_map(|entry| worker_of(&entry.key))
        .collect();
    let missing: HashSet<u64> = indexed.difference(&listed).copied().collect();
    for worker_id in missing.intersection(suspects) {
        publish_marker(state, events, namespace, *worker_id, Marker::Removed).await;
    }
    *suspects = missing;
    for worker_id in &listed {
        if is_removed(state, *worker_id) {
            publish_marker(state, events, namespace, *worker_id, Marker::Readmitted).await;
        }
    }
    Ok(())
}

/// Publishes a marker of `worker_id` on the subject of a model that indexes (or removed) it. The
/// consumer applies a marker to every model of the shard, and replicas publishing the same
/// marker use one message id, so the stream keeps one copy; the id counts the worker's
/// readmissions so that a later removal or return is not taken for a duplicate.
pub async fn publish_marker(
    state: &ShardState,
    events: &dyn EventPlane,
    namespace: &str,
    worker_id: u64,
    marker: Marker,
) {
    if !state.layout.owns_worker(worker_id) {
        return;
    }
    let partition = kvmesh_kv::kv_partition(worker_id, state.layout.num_partitions);
    let batch = KvEventBatch {
        worker_id,
        worker_removed: marker == Marker::Removed,
        worker_readmitted: marker == Marker::Readmitted,
        ..Default::default()
    };
    let payload = Bytes::from(batch.encode_to_vec());
    let worker = format!("{worker_id:x}");
    for (model, index) in state.models() {
        let (is_removed, num_readmissions) = index.removal_state(worker_id);
        let is_indexed = index.workers().iter().any(|w| w.worker_id == worker_id);
        let names_worker = is_indexed || (marker == Marker::Readmitted && is_removed);
        if !names_worker {
            continue;
        }
        let msg_id = marker_msg_id(marker, worker_id, num_readmissions);
        let subject = names::kv_subject(namespace, &model, partition);
        match events
            .publish_durable(&subject, &msg_id, payload.clone())
            .await
        {
            Ok(_) => match marker {
                Marker::Removed => {
                    tracing::info!(worker_id = %worker, %model, "worker removed from the index")
                }
                Marker::Readmitted => {
                    tracing::info!(worker_id = %worker, %model, "worker readmitted to the index")
                }
            },
            Err(error) => {
                tracing::warn!(%error, worker_id = %worker, ?marker, "marker publish failed")
            }
        }
        // One stored copy reaches every model of the shard.
        return;
    }
}

/// The stream message id of a marker: `rm-` or `re-`, the worker id (16 hex digits) and how many
/// times the worker was readmitted before.
pub fn marker_msg_id(marker: Marker, worker_id: u64, num_readmissions: u32) -> String {
    let kind = match marker {
        Marker::Removed => "rm",
        Marker::Readmitted => "re",
    };
    format!("{kind}-{worker_id:016x}-{num_readmissions}")
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

    async fn marker_stream() -> (MemEventPlane, String) {
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
        (events, stream)
    }

    /// The next marker in the stream, as the consumer would apply it to every model.
    async fn next_marker(
        messages: &mut kvmesh_runtime::event_plane::StreamSubscription,
        state: &ShardState,
    ) -> KvEventBatch {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("a marker within 10 s")
            .expect("stream open")
            .unwrap();
        let batch = KvEventBatch::decode(message.payload).unwrap();
        for (_, index) in state.models() {
            index
                .apply(crate::convert::batch_from_proto(batch.clone()))
                .unwrap();
            index.flush().unwrap();
        }
        batch
    }

    #[tokio::test]
    async fn a_worker_that_leaves_and_registers_again_is_removed_then_readmitted() {
        let state = Arc::new(indexed_state(&[1]));
        let store = MemStore::new();
        let worker: Arc<dyn Discovery> = Arc::new(store.handle());
        let watcher: Arc<dyn Discovery> = Arc::new(store.handle());
        let key = names::instance_key(NS, "backend", "generate", 1);
        worker.put(&key, Bytes::from_static(b"{}")).await.unwrap();
        let (events, stream) = marker_stream().await;
        let events = Arc::new(events);
        let mut messages = events
            .consume(&stream, &names::kv_stream_subjects(NS), 1)
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_markers(
            Arc::clone(&state),
            watcher,
            Arc::clone(&events) as Arc<dyn EventPlane>,
            NS.to_owned(),
            Duration::from_secs(3600),
            shutdown.clone(),
        ));
        // The task's watch is in place before the first removal.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Twice round: the second removal and return must not be taken for duplicates.
        for round in 0..2u32 {
            worker.delete(&key).await.unwrap();
            let removed = next_marker(&mut messages, &state).await;
            assert!(
                removed.worker_removed && removed.worker_id == 1,
                "round {round}"
            );
            assert!(is_removed(&state, 1));
            worker.put(&key, Bytes::from_static(b"{}")).await.unwrap();
            let readmitted = next_marker(&mut messages, &state).await;
            assert!(readmitted.worker_readmitted && readmitted.worker_id == 1);
            assert!(!is_removed(&state, 1));
            // The worker's events count again.
            let Some(index) = state.model("m") else {
                panic!("model m");
            };
            index
                .apply(kvmesh_kv::KvEventBatch {
                    worker_id: 1,
                    events: vec![KvEvent {
                        event_id: 100 + u64::from(round),
                        tier: Tier::Device,
                        kind: KvEventKind::Stored(KvStored {
                            parent_hash: None,
                            blocks: vec![KvStoredBlock::new(7, 7)],
                            start_position: None,
                        }),
                    }],
                    ..kvmesh_kv::KvEventBatch::default()
                })
                .unwrap();
            index.flush().unwrap();
            assert_eq!(index.find_matches(&[7]).scores.len(), 1);
        }
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_sweep_readmits_a_removed_worker_that_discovery_lists() {
        let state = indexed_state(&[4]);
        let Some(index) = state.model("m") else {
            panic!("model m");
        };
        index.remove_worker(4).unwrap();
        index.flush().unwrap();
        let discovery = MemStore::new().handle();
        discovery
            .put(
                &names::instance_key(NS, "backend", "generate", 4),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
        let (events, stream) = marker_stream().await;
        let mut suspects = HashSet::new();
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        assert_eq!(events.last_sequence(&stream).await.unwrap(), 1);
        // Until the consumer applies it, another sweep's copy is the same message.
        sweep_once(&state, &discovery, &events, NS, &mut suspects)
            .await
            .unwrap();
        assert_eq!(events.last_sequence(&stream).await.unwrap(), 1);
        assert_eq!(
            marker_msg_id(Marker::Readmitted, 4, 0),
            "re-0000000000000004-0"
        );
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
        let (events, stream) = marker_stream().await;
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
