//! Bootstrap of a new or restarted replica: load a snapshot from a serving peer of the same
//! shard, so that replaying the stream from the snapshot's sequence converges to the peers' state.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kvmesh_kv::{IndexDump, WorkerCursor, WorkerKey};
use kvmesh_proto::v1::indexer_client::IndexerClient as GrpcIndexerClient;
use kvmesh_proto::v1::{
    IndexerState, InstanceRecord, SnapshotRequest, StatusRequest, snapshot_chunk,
};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::names;

use crate::convert::batch_from_proto;
use crate::shard::{ShardLayout, ShardState};

/// Component and endpoint under which indexer replicas register.
pub const INDEXER_COMPONENT: &str = "indexer";
/// Endpoint name of indexer replicas.
pub const INDEXER_ENDPOINT: &str = "query";

/// Serving replicas of `namespace` registered in discovery, with their shard layout.
pub async fn list_replicas(
    discovery: &dyn Discovery,
    namespace: &str,
) -> anyhow::Result<Vec<(InstanceRecord, ShardLayout)>> {
    let prefix = format!(
        "{}{INDEXER_COMPONENT}/{INDEXER_ENDPOINT}/",
        names::instances_prefix(Some(namespace))
    );
    let mut replicas = Vec::new();
    for entry in discovery.list(&prefix).await? {
        match serde_json::from_slice::<InstanceRecord>(&entry.value) {
            Ok(record) => {
                if let Some(layout) = layout_of(&record) {
                    replicas.push((record, layout));
                }
            }
            Err(error) => tracing::warn!(key = %entry.key, %error, "undecodable indexer record"),
        }
    }
    Ok(replicas)
}

/// The metadata through which a replica advertises its shard layout ([`layout_of`] reads it).
pub fn layout_metadata(layout: &ShardLayout) -> HashMap<String, String> {
    let partitions: Vec<String> = layout.partitions.iter().map(u32::to_string).collect();
    HashMap::from([
        ("shard".to_string(), layout.shard.to_string()),
        ("shards".to_string(), layout.shards.to_string()),
        (
            "kv_partitions".to_string(),
            layout.num_partitions.to_string(),
        ),
        ("partitions".to_string(), partitions.join(",")),
    ])
}

/// The shard layout an indexer replica advertises in its metadata.
pub fn layout_of(record: &InstanceRecord) -> Option<ShardLayout> {
    let shard = record.metadata.get("shard")?.parse().ok()?;
    let shards = record.metadata.get("shards")?.parse().ok()?;
    let num_partitions = record.metadata.get("kv_partitions")?.parse().ok()?;
    let partitions = record
        .metadata
        .get("partitions")?
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<u32>, _>>()
        .ok()?;
    Some(ShardLayout {
        shard,
        shards,
        partitions,
        num_partitions,
    })
}

/// How long a replica keeps asking its shard's registered peers for a snapshot when all of them
/// fail: longer than a discovery lease, so peers that died unannounced expire meanwhile.
const BOOTSTRAP_PATIENCE: Duration = Duration::from_secs(30);

/// Loads the state of a serving peer with the same partitions into `state`. Returns the stream
/// sequence the state reflects, or `None` when the shard has no registered peer (the replica then
/// replays the stream from its start). Registered peers that all fail are asked again until
/// [`BOOTSTRAP_PATIENCE`] runs out, and then this fails: starting empty beside live peers would
/// leave the replica short of every block older than the stream's retention, for good.
pub async fn load_from_peer(
    discovery: &dyn Discovery,
    namespace: &str,
    state: &Arc<ShardState>,
) -> anyhow::Result<Option<u64>> {
    let deadline = tokio::time::Instant::now() + BOOTSTRAP_PATIENCE;
    let mut backoff = Duration::from_millis(250);
    loop {
        let peers: Vec<InstanceRecord> = list_replicas(discovery, namespace)
            .await?
            .into_iter()
            .filter(|(record, layout)| {
                // A replica resyncing while registered must not ask itself.
                record.instance_id != discovery.instance_id()
                    && layout.partitions == state.layout.partitions
                    && layout.num_partitions == state.layout.num_partitions
            })
            .map(|(record, _)| record)
            .collect();
        if peers.is_empty() {
            return Ok(None);
        }
        for record in &peers {
            match load_snapshot(&record.address, state).await {
                Ok(seq) => {
                    tracing::info!(peer = %record.address, stream_seq = seq, "loaded snapshot from peer");
                    return Ok(Some(seq));
                }
                Err(error) => {
                    tracing::warn!(peer = %record.address, %error, "snapshot from peer failed, trying another");
                }
            }
        }
        if tokio::time::Instant::now() + backoff > deadline {
            anyhow::bail!(
                "{} registered peer(s) of this shard gave no snapshot within {:?}",
                peers.len(),
                BOOTSTRAP_PATIENCE
            );
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(4));
    }
}

async fn load_snapshot(address: &str, state: &Arc<ShardState>) -> anyhow::Result<u64> {
    let endpoint = kvmesh_runtime::net::mesh_endpoint(address, Duration::from_secs(3))?;
    let mut client = GrpcIndexerClient::new(endpoint.connect().await?)
        .max_decoding_message_size(64 * 1024 * 1024);
    let status = client.status(StatusRequest {}).await?.into_inner();
    if status.state != IndexerState::Serving as i32 {
        anyhow::bail!("peer is not serving");
    }
    let mut stream = client.snapshot(SnapshotRequest {}).await?.into_inner();
    let mut stream_seq = None;
    let mut dumps: HashMap<String, IndexDump> = HashMap::new();
    while let Some(chunk) = stream.next().await {
        match chunk?.kind {
            Some(snapshot_chunk::Kind::Header(header)) => {
                stream_seq = Some(header.stream_seq);
                for model in header.models {
                    let dump = dumps.entry(model.model).or_default();
                    dump.cursors = model
                        .cursors
                        .iter()
                        .map(|cursor| WorkerCursor {
                            worker: WorkerKey::new(cursor.worker_id, cursor.dp_rank),
                            last_event_id: cursor.last_event_id,
                        })
                        .collect();
                }
            }
            Some(snapshot_chunk::Kind::Events(events)) => {
                let dump = dumps.entry(events.model).or_default();
                dump.batches
                    .extend(events.batches.into_iter().map(batch_from_proto));
            }
            None => {}
        }
    }
    let stream_seq = stream_seq.ok_or_else(|| anyhow::anyhow!("snapshot without a header"))?;
    // The snapshot replaces whatever the replica held (a resync after a retention gap).
    state.clear();
    for (model, dump) in dumps {
        let index = state
            .model_or_insert(&model)
            .ok_or_else(|| anyhow::anyhow!("snapshot holds more models than a shard indexes"))?;
        tokio::task::spawn_blocking(move || index.load_dump(&dump))
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    state.set_applied_seq(stream_seq);
    Ok(stream_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_layouts_read_back() {
        let layout = ShardLayout::striped(1, 3, 16);
        let record = InstanceRecord {
            metadata: layout_metadata(&layout),
            ..Default::default()
        };
        assert_eq!(layout_of(&record), Some(layout));
    }
}
