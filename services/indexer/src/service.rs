//! The `kvmesh.v1.Indexer` gRPC service over a shard replica.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use futures::StreamExt;
use kvmesh_kv::KvEventBatch;
use kvmesh_proto::v1::indexer_server::Indexer;
use kvmesh_proto::v1::{
    EventCursor, FindMatchesRequest, FindMatchesResponse, IndexerState, ModelSnapshot, ModelStatus,
    SnapshotChunk, SnapshotEvents, SnapshotHeader, SnapshotRequest, StatusRequest, StatusResponse,
    snapshot_chunk,
};
use kvmesh_runtime::event_plane::EventPlane;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use crate::consumer::{Control, Cut};
use crate::convert::{batch_to_proto, scores_to_proto};
use crate::metrics::IndexerMetrics;
use crate::shard::ShardState;
use kvmesh_runtime::GrpcErrorCode as _;

/// Encoded bytes a snapshot chunk grows to before the next batch starts a new one, keeping chunks
/// well under gRPC's 64 MiB message limit whatever the batches hold (a batch of long stored
/// chains on a host or disk tier can be megabytes).
const CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Snapshots built at once; each holds a full copy of the shard's state until it is sent.
const MAX_CONCURRENT_SNAPSHOTS: usize = 2;

/// Serves queries from the shard's state and cuts through its consumer.
#[derive(Clone)]
pub struct IndexerService {
    state: Arc<ShardState>,
    control: mpsc::Sender<Control>,
    metrics: Arc<IndexerMetrics>,
    /// Block size per model, from the model cards in discovery.
    block_sizes: Arc<ArcSwap<HashMap<String, u32>>>,
    events: Arc<dyn EventPlane>,
    stream_name: String,
    /// Bounds the snapshots held in memory at once.
    snapshots: Arc<tokio::sync::Semaphore>,
}

impl IndexerService {
    /// Wraps a shard replica.
    pub fn new(
        state: Arc<ShardState>,
        control: mpsc::Sender<Control>,
        metrics: Arc<IndexerMetrics>,
        block_sizes: Arc<ArcSwap<HashMap<String, u32>>>,
        events: Arc<dyn EventPlane>,
        stream_name: String,
    ) -> Self {
        Self {
            state,
            control,
            metrics,
            block_sizes,
            events,
            stream_name,
            snapshots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_SNAPSHOTS)),
        }
    }

    /// Takes a consistent cut through the consumer.
    pub async fn cut(&self, with_dump: bool) -> Result<Cut, tonic::Status> {
        let (tx, rx) = oneshot::channel();
        let request = if with_dump {
            Control::Snapshot(tx)
        } else {
            Control::Status(tx)
        };
        self.control
            .send(request)
            .await
            .map_err(|_| kvmesh_runtime::ErrorCode::Unavailable.to_status("indexer is stopping"))?;
        let cut = rx
            .await
            .map_err(|_| kvmesh_runtime::ErrorCode::Unavailable.to_status("indexer is stopping"))?
            .map_err(|error| kvmesh_runtime::ErrorCode::Internal.to_status(error))?;
        self.metrics.update(&cut);
        Ok(cut)
    }

    /// Answers one query for a router in this process, with no gRPC in between
    /// (the caller found this replica in the process's table of local replicas).
    pub fn answer_in_process(
        &self,
        request: FindMatchesRequest,
    ) -> Result<FindMatchesResponse, tonic::Status> {
        self.metrics.in_process_queries.inc();
        self.answer(request)
    }

    /// Answers one query (unary or on a stream).
    fn answer(&self, request: FindMatchesRequest) -> Result<FindMatchesResponse, tonic::Status> {
        if self.state.state() != IndexerState::Serving {
            return Err(kvmesh_runtime::ErrorCode::Unavailable
                .to_status("indexer replica is not serving yet"));
        }
        let started = Instant::now();
        let hashes = self.local_hashes(&request)?;
        let scores = self.state.find_matches(&request.model, &hashes);
        self.metrics.queries.inc();
        self.metrics
            .find_matches_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(FindMatchesResponse {
            scores: scores_to_proto(&scores),
            frequencies: scores.frequencies,
            applied_seq: self.state.applied_seq(),
            partitions: self.state.layout.partitions.clone(),
            missing_partitions: Vec::new(),
        })
    }

    fn local_hashes(&self, request: &FindMatchesRequest) -> Result<Vec<u64>, tonic::Status> {
        if request.token_ids.is_empty() {
            return Ok(request.local_hashes.clone());
        }
        if !request.local_hashes.is_empty() {
            return Err(kvmesh_runtime::ErrorCode::InvalidArgument
                .to_status("give either local_hashes or token_ids, not both"));
        }
        let block_size = match request.block_size {
            0 => self
                .block_sizes
                .load()
                .get(&request.model)
                .copied()
                .ok_or_else(|| {
                    kvmesh_runtime::ErrorCode::InvalidArgument.to_status(format!(
                        "block_size is required: no model card for {:?}",
                        request.model
                    ))
                })?,
            size => size,
        };
        let seed = kvmesh_kv::seed_for(Some(&request.lora_name), Some(&request.cache_salt));
        Ok(kvmesh_kv::compute_block_hashes(
            &request.token_ids,
            block_size as usize,
            seed,
        ))
    }
}

/// Splits one model's dumped batches into snapshot chunks of about `max_bytes` encoded bytes,
/// keeping their order; a batch larger than that goes alone.
fn events_chunks(model: &str, dumped: &[KvEventBatch], max_bytes: usize) -> Vec<SnapshotEvents> {
    let mut chunks = Vec::new();
    let mut batches = Vec::new();
    let mut bytes = 0;
    for batch in dumped {
        let batch = batch_to_proto(batch);
        let size = batch.encoded_len();
        if !batches.is_empty() && bytes + size > max_bytes {
            chunks.push(SnapshotEvents {
                model: model.to_string(),
                batches: std::mem::take(&mut batches),
            });
            bytes = 0;
        }
        bytes += size;
        batches.push(batch);
    }
    if !batches.is_empty() {
        chunks.push(SnapshotEvents {
            model: model.to_string(),
            batches,
        });
    }
    chunks
}

#[tonic::async_trait]
impl Indexer for IndexerService {
    async fn find_matches(
        &self,
        request: tonic::Request<FindMatchesRequest>,
    ) -> Result<tonic::Response<FindMatchesResponse>, tonic::Status> {
        self.metrics.grpc_queries.inc();
        self.answer(request.into_inner()).map(tonic::Response::new)
    }

    type FindMatchesStreamStream =
        futures::stream::BoxStream<'static, Result<FindMatchesResponse, tonic::Status>>;

    async fn find_matches_stream(
        &self,
        request: tonic::Request<tonic::Streaming<FindMatchesRequest>>,
    ) -> Result<tonic::Response<Self::FindMatchesStreamStream>, tonic::Status> {
        let service = self.clone();
        let answers = request.into_inner().map(move |query| {
            service.metrics.grpc_queries.inc();
            service.answer(query?)
        });
        Ok(tonic::Response::new(answers.boxed()))
    }

    type SnapshotStream = futures::stream::BoxStream<'static, Result<SnapshotChunk, tonic::Status>>;

    async fn snapshot(
        &self,
        _request: tonic::Request<SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, tonic::Status> {
        if self.state.state() != IndexerState::Serving {
            return Err(kvmesh_runtime::ErrorCode::Unavailable
                .to_status("indexer replica is not serving yet"));
        }
        let permit =
            self.snapshots.clone().acquire_owned().await.map_err(|_| {
                kvmesh_runtime::ErrorCode::Unavailable.to_status("indexer is stopping")
            })?;
        let cut = self.cut(true).await?;
        let layout = &self.state.layout;
        let header = SnapshotHeader {
            stream_seq: cut.applied_seq,
            shard: layout.shard,
            shards: layout.shards,
            partitions: layout.partitions.clone(),
            models: cut
                .models
                .iter()
                .map(|model| ModelSnapshot {
                    model: model.model.clone(),
                    digest: model.digest,
                    cursors: model
                        .dump
                        .as_ref()
                        .map(|dump| {
                            dump.cursors
                                .iter()
                                .map(|cursor| EventCursor {
                                    worker_id: cursor.worker.worker_id,
                                    dp_rank: cursor.worker.dp_rank,
                                    last_event_id: cursor.last_event_id,
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect(),
        };
        let mut chunks = vec![Ok(SnapshotChunk {
            kind: Some(snapshot_chunk::Kind::Header(header)),
        })];
        for model in cut.models {
            let Some(dump) = model.dump else {
                continue;
            };
            chunks.extend(
                events_chunks(&model.model, &dump.batches, CHUNK_BYTES)
                    .into_iter()
                    .map(|events| {
                        Ok(SnapshotChunk {
                            kind: Some(snapshot_chunk::Kind::Events(events)),
                        })
                    }),
            );
        }
        // The permit goes with the stream: the copy is held until the last chunk is sent.
        let chunks = futures::stream::iter(chunks).map(move |chunk| {
            let _held = &permit;
            chunk
        });
        Ok(tonic::Response::new(chunks.boxed()))
    }

    async fn status(
        &self,
        _request: tonic::Request<StatusRequest>,
    ) -> Result<tonic::Response<StatusResponse>, tonic::Status> {
        let cut = self.cut(false).await?;
        let stream_last_seq = self
            .events
            .last_sequence(&self.stream_name)
            .await
            .unwrap_or(0);
        self.metrics
            .lag
            .set(i64::try_from(stream_last_seq.saturating_sub(cut.applied_seq)).unwrap_or(0));
        let mut counters = HashMap::new();
        for model in &cut.models {
            for (event_type, status, count) in model.counters.applied() {
                *counters
                    .entry(format!("{}/{}", event_type.as_str(), status.as_str()))
                    .or_insert(0) += count;
            }
            *counters.entry("gaps".to_string()).or_insert(0) += model.counters.gaps;
            *counters.entry("duplicates".to_string()).or_insert(0) += model.counters.duplicates;
        }
        let layout = &self.state.layout;
        Ok(tonic::Response::new(StatusResponse {
            state: self.state.state() as i32,
            shard: layout.shard,
            shards: layout.shards,
            partitions: layout.partitions.clone(),
            applied_seq: cut.applied_seq,
            stream_last_seq,
            models: cut
                .models
                .iter()
                .map(|model| ModelStatus {
                    model: model.model.clone(),
                    workers: model.num_workers,
                    blocks: model.num_blocks,
                    digest: model.digest,
                })
                .collect(),
            counters,
            grpc_queries: self.metrics.grpc_queries.get(),
            in_process_queries: self.metrics.in_process_queries.get(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_kv::{KvEvent, KvEventKind, KvStored, KvStoredBlock, Tier};

    fn stored_batch(worker_id: u64, blocks: u64) -> KvEventBatch {
        KvEventBatch {
            worker_id,
            events: vec![KvEvent {
                event_id: 0,
                tier: Tier::HostPinned,
                kind: KvEventKind::Stored(KvStored {
                    parent_hash: None,
                    blocks: (0..blocks)
                        .map(|b| KvStoredBlock::new(b * 7919 + worker_id, b))
                        .collect(),
                    start_position: None,
                }),
            }],
            ..KvEventBatch::default()
        }
    }

    #[test]
    fn snapshot_chunks_are_bounded_by_bytes_and_keep_every_batch_in_order() {
        let dumped: Vec<KvEventBatch> = (1..=40).map(|w| stored_batch(w, 500 * (w % 5))).collect();
        let chunks = events_chunks("m", &dumped, 64 * 1024);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert_eq!(chunk.model, "m");
            let bytes: usize = chunk.batches.iter().map(Message::encoded_len).sum();
            assert!(
                chunk.batches.len() == 1 || bytes <= 64 * 1024,
                "{bytes} bytes"
            );
        }
        let workers: Vec<u64> = chunks
            .iter()
            .flat_map(|c| c.batches.iter().map(|b| b.worker_id))
            .collect();
        assert_eq!(workers, (1..=40).collect::<Vec<_>>());
        // One batch above the limit still goes, alone.
        let huge = events_chunks("m", &[stored_batch(1, 10_000)], 1024);
        assert_eq!(huge.len(), 1);
        assert!(events_chunks("m", &[], 1024).is_empty());
    }
}
