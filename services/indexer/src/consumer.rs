//! The shard's single ordered reader of the KV event stream: applies every message of the
//! shard's partitions in stream order, and takes consistent cuts (flush all lanes between two
//! messages) for snapshots and status.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kvmesh_kv::{EventCounters, IndexDump, KvEventBatch};
use kvmesh_proto::v1::{self as pb, IndexerState};
use kvmesh_runtime::event_plane::{EventPlane, StreamMessage};
use kvmesh_runtime::names;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::convert::batch_from_proto;
use crate::metrics::IndexerMetrics;
use crate::shard::ShardState;

/// How long the stream must stay quiet after start before a replica with nothing left to read
/// counts as caught up.
const IDLE_CATCH_UP: Duration = Duration::from_millis(300);

/// One model's part of a consistent cut.
#[derive(Debug, Clone)]
pub struct ModelCut {
    /// Served model name.
    pub model: String,
    /// Order-independent digest.
    pub digest: u64,
    /// Distinct workers indexed.
    pub num_workers: u64,
    /// (block, member) entries.
    pub num_blocks: u64,
    /// Event outcome counters.
    pub counters: EventCounters,
    /// The full state as events, for snapshots.
    pub dump: Option<IndexDump>,
}

/// The shard's state between two stream messages.
#[derive(Debug, Clone)]
pub struct Cut {
    /// Every message up to this sequence is applied, none after.
    pub applied_seq: u64,
    /// Per model, sorted by name.
    pub models: Vec<ModelCut>,
}

/// Requests served by the consumer between two messages.
pub enum Control {
    /// A cut with dumps (snapshot).
    Snapshot(oneshot::Sender<Result<Cut, String>>),
    /// A cut without dumps (status).
    Status(oneshot::Sender<Result<Cut, String>>),
}

/// Where the consumer reads.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Namespace of the stream.
    pub namespace: String,
    /// Subject filters, one per owned partition.
    pub filters: Vec<String>,
    /// Where to reload the state after a retention gap (`None`: read on, the gap counted).
    pub resync: Option<Resync>,
}

/// Longest wait between attempts to resume a failed event stream.
const MAX_RESUME_BACKOFF: Duration = Duration::from_secs(5);

/// How often, at most, a jump in stream sequences makes the consumer ask for the stream's first
/// sequence (docs/indexer.md, "Retention gaps").
const GAP_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where a replica that fell behind the stream's retention reloads its state: a serving peer of
/// the same partitions, found in discovery.
#[derive(Clone)]
pub struct Resync {
    /// Discovery of the namespace (this replica's own record is skipped).
    pub discovery: Arc<dyn kvmesh_runtime::discovery::Discovery>,
    /// The namespace.
    pub namespace: String,
}

impl std::fmt::Debug for Resync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resync")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Messages the shard expected were deleted by retention before it read them: from `expected`
/// on, the stream now starts at `first`.
#[derive(Debug, thiserror::Error)]
#[error(
    "kv event stream retention passed this replica: expected sequence {expected}, the stream starts at {first}"
)]
struct RetentionGap {
    expected: u64,
    first: u64,
}

/// Consumes the shard's events from `start_seq` until `shutdown` (or until every control sender
/// is gone), resuming after the last applied sequence whenever the stream fails; fails only when
/// the shard can no longer index ([`LaneStopped`]). When retention deleted messages the replica
/// had not read, it reloads a peer's snapshot through `config.resync` (docs/indexer.md,
/// "Retention gaps"); without a peer it counts the gap and goes on from the first retained
/// message. The state stays intact across a failure (a NATS restart, a lost consumer), so resuming converges where exiting
/// would not: every replica of a shard sees the same failure, and a replica that restarts finds
/// no serving peer to load a snapshot from.
pub async fn consume_forever(
    state: Arc<ShardState>,
    events: Arc<dyn EventPlane>,
    config: ConsumerConfig,
    start_seq: u64,
    mut control: mpsc::Receiver<Control>,
    metrics: Arc<IndexerMetrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut start_seq = start_seq;
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = run_consumer(
            &state,
            events.as_ref(),
            &config,
            start_seq,
            &mut control,
            &metrics,
            &shutdown,
        );
        let error = match attempt.await {
            Ok(()) => return Ok(()),
            Err(error) if error.is::<LaneStopped>() => return Err(error),
            Err(error) => match error.downcast::<RetentionGap>() {
                Ok(gap) => {
                    start_seq = recover_gap(&state, config.resync.as_ref(), &gap, &metrics).await?;
                    continue;
                }
                Err(error) => error,
            },
        };
        metrics.stream_failures.inc();
        tracing::warn!(
            namespace = %config.namespace,
            %error,
            resume_after = state.applied_seq(),
            "lost the kv event stream; resuming"
        );
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_RESUME_BACKOFF);
        start_seq = state.applied_seq().saturating_add(1).max(start_seq);
    }
}

/// Reads the stream from `start_seq` until `shutdown`, applying this shard's events; an error
/// means the stream failed and may be resumed.
async fn run_consumer(
    state: &Arc<ShardState>,
    events: &dyn EventPlane,
    config: &ConsumerConfig,
    start_seq: u64,
    control: &mut mpsc::Receiver<Control>,
    metrics: &IndexerMetrics,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let stream_name = names::kv_stream_name(&config.namespace);
    // Without the tail a replica cannot tell when it caught up: fail and let the caller retry.
    let tail_at_start = events.last_sequence(&stream_name).await?;
    check_retention(events, &stream_name, state, start_seq).await?;
    let mut last_gap_check = tokio::time::Instant::now();
    let mut stream = events
        .consume(&stream_name, &config.filters, start_seq.max(1))
        .await?;
    if state.applied_seq() >= tail_at_start {
        state.set_state(IndexerState::Serving);
    }
    let idle = tokio::time::sleep(IDLE_CATCH_UP);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            // A message ready now is applied before the idle timer may call the replica caught up.
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            request = control.recv() => match request {
                Some(Control::Snapshot(reply)) => { let _ = reply.send(cut(state, true).await); }
                Some(Control::Status(reply)) => { let _ = reply.send(cut(state, false).await); }
                None => return Ok(()),
            },
            message = stream.next() => match message {
                Some(Ok(message)) => {
                    // A jump past the next sequence is normal (other partitions' messages), but
                    // it is also what a consumer that silently skipped deleted messages shows.
                    let expected = state.applied_seq() + 1;
                    if state.applied_seq() > 0
                        && message.sequence > expected
                        && last_gap_check.elapsed() >= GAP_CHECK_INTERVAL
                    {
                        last_gap_check = tokio::time::Instant::now();
                        check_retention(events, &stream_name, state, expected).await?;
                    }
                    apply(state, message, metrics)?;
                    if state.state() == IndexerState::Loading {
                        if state.applied_seq() >= tail_at_start {
                            tracing::info!(applied_seq = state.applied_seq(), "caught up with the stream, serving");
                            state.set_state(IndexerState::Serving);
                        } else {
                            idle.as_mut().reset(tokio::time::Instant::now() + IDLE_CATCH_UP);
                        }
                    }
                }
                Some(Err(error)) => return Err(anyhow::anyhow!("kv event stream failed: {error}")),
                None => return Err(anyhow::anyhow!("kv event stream ended")),
            },
            _ = &mut idle, if state.state() == IndexerState::Loading => {
                tracing::info!(applied_seq = state.applied_seq(), "caught up with the stream, serving");
                state.set_state(IndexerState::Serving);
            }
        }
    }
}

/// Fails with [`RetentionGap`] when this replica holds state (it applied something) and the
/// stream no longer holds `expected`, the next sequence it needs.
async fn check_retention(
    events: &dyn EventPlane,
    stream_name: &str,
    state: &ShardState,
    expected: u64,
) -> anyhow::Result<()> {
    if state.applied_seq() == 0 {
        return Ok(());
    }
    let first = events.first_sequence(stream_name).await?;
    if first > expected {
        return Err(RetentionGap { expected, first }.into());
    }
    Ok(())
}

/// Reloads the state from a peer after `gap` and returns the sequence to read from: the peer's
/// snapshot sequence + 1, or the gap's first retained sequence when there is no peer or the peer
/// is no further along (its partitions were quiet too): either way this replica then holds
/// everything that can still be had.
async fn recover_gap(
    state: &Arc<ShardState>,
    resync: Option<&Resync>,
    gap: &RetentionGap,
    metrics: &IndexerMetrics,
) -> anyhow::Result<u64> {
    metrics.retention_gaps.inc();
    tracing::warn!(
        expected = gap.expected,
        first = gap.first,
        "kv event stream retention passed this replica; resyncing"
    );
    if let Some(resync) = resync {
        let previous = state.state();
        state.set_state(IndexerState::Loading);
        let snapshot =
            crate::bootstrap::load_from_peer(resync.discovery.as_ref(), &resync.namespace, state)
                .await?;
        state.set_state(previous);
        if let Some(seq) = snapshot {
            tracing::info!(stream_seq = seq, "resynced from a peer's snapshot");
            if seq + 1 >= gap.first {
                return Ok(seq + 1);
            }
        }
    }
    tracing::warn!(
        first = gap.first,
        "no peer further along: the messages before the stream's first retained one are lost"
    );
    state.set_applied_seq(state.applied_seq().max(gap.first - 1));
    Ok(gap.first)
}

/// The model a KV subject `kvmesh.{ns}.kv.{model}.{partition}` carries.
pub fn model_of_subject(subject: &str) -> Option<String> {
    let mut tokens = subject.split('.');
    let (_, _, kind, model) = (
        tokens.next()?,
        tokens.next()?,
        tokens.next()?,
        tokens.next()?,
    );
    (kind == "kv").then(|| names::decode_subject_token(model))?
}

/// An apply lane stopped: the shard can no longer index, and skipping events would leave its state
/// behind its applied sequence for good.
#[derive(Debug, thiserror::Error)]
#[error("kv index lane stopped: {0}")]
pub struct LaneStopped(String);

fn apply(
    state: &ShardState,
    message: StreamMessage,
    metrics: &IndexerMetrics,
) -> Result<(), LaneStopped> {
    let seq = message.sequence;
    let Some(model) = model_of_subject(&message.subject) else {
        metrics.malformed.inc();
        tracing::warn!(subject = %message.subject, "kv event on an unexpected subject, skipped");
        state.set_applied_seq(seq);
        return Ok(());
    };
    let batch = match pb::KvEventBatch::decode(message.payload.as_ref()) {
        Ok(batch) => batch_from_proto(batch),
        Err(error) => {
            metrics.malformed.inc();
            tracing::warn!(%error, seq, "undecodable kv event batch, skipped");
            state.set_applied_seq(seq);
            return Ok(());
        }
    };
    if !state.layout.owns_worker(batch.worker_id) {
        state.set_applied_seq(seq);
        return Ok(());
    }
    let Some(index) = state.model_or_insert(&model) else {
        metrics.malformed.inc();
        tracing::warn!(%model, seq, "kv events of one model too many for this shard, skipped");
        state.set_applied_seq(seq);
        return Ok(());
    };
    if batch.is_marker() {
        // A marker is about the worker, not one model: it leaves (or rejoins) every model of
        // this shard.
        for (_, other) in state.models() {
            if !Arc::ptr_eq(&other, &index) {
                let marker = if batch.worker_removed {
                    KvEventBatch::worker_removed(batch.worker_id)
                } else {
                    KvEventBatch::worker_readmitted(batch.worker_id)
                };
                apply_batch(&other, marker)?;
            }
        }
    }
    apply_batch(&index, batch)?;
    state.set_applied_seq(seq);
    Ok(())
}

/// Queues a batch on its lane. `apply` blocks while the lane's queue is full (back-pressure on the
/// stream), so on a multi-threaded runtime the wait is moved off the async worker.
fn apply_batch(index: &kvmesh_kv::ConcurrentIndex, batch: KvEventBatch) -> Result<(), LaneStopped> {
    let stopped = |error: kvmesh_kv::LaneClosed| LaneStopped(error.to_string());
    // Queued at once while the lane keeps up. Only a full lane waits, and then off the async
    // worker (`block_in_place` hands the worker's other tasks to another thread, which costs a
    // thread wake-up every call: too much for every batch).
    let Some(batch) = index.try_apply(batch).map_err(stopped)? else {
        return Ok(());
    };
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    let result = if multi_thread {
        tokio::task::block_in_place(|| index.apply(batch))
    } else {
        index.apply(batch)
    };
    result.map_err(stopped)
}

async fn cut(state: &Arc<ShardState>, with_dump: bool) -> Result<Cut, String> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let applied_seq = state.applied_seq();
        let mut models = Vec::new();
        for (model, index) in state.models() {
            index.flush().map_err(|e| e.to_string())?;
            let dump = if with_dump {
                Some(index.dump().map_err(|e| e.to_string())?)
            } else {
                None
            };
            models.push(ModelCut {
                model,
                digest: index.digest(),
                num_workers: index.num_workers() as u64,
                num_blocks: index.num_blocks(),
                counters: index.counters(),
                dump,
            });
        }
        Ok(Cut {
            applied_seq,
            models,
        })
    })
    .await
    .map_err(|e| format!("cut task failed: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_name_their_model() {
        let subject = names::kv_subject("ns", "Qwen/Qwen3-0.6B", 3);
        assert_eq!(
            model_of_subject(&subject).as_deref(),
            Some("Qwen/Qwen3-0.6B")
        );
        assert_eq!(model_of_subject("kvmesh.ns.load.m"), None);
        assert_eq!(model_of_subject("short"), None);
    }

    /// A replica that resumes after retention deleted messages it had not read notices the gap
    /// (first retained sequence past the one it expects), counts it, and without a peer goes on
    /// from the first retained message.
    #[tokio::test]
    async fn a_retention_gap_is_detected_and_counted() {
        use kvmesh_runtime::event_plane::StreamConfig;
        use kvmesh_runtime::event_plane::mem::MemEventPlane;
        let events = Arc::new(MemEventPlane::new());
        let stream = names::kv_stream_name("ns");
        events
            .ensure_stream(&StreamConfig {
                name: stream.clone(),
                subjects: names::kv_stream_subjects("ns"),
                max_age: Duration::from_millis(200),
                duplicate_window: Duration::from_millis(200),
            })
            .await
            .unwrap();
        let subject = names::kv_subject("ns", "m", 0);
        for id in 0..3 {
            events
                .publish_durable(
                    &subject,
                    &format!("old{id}"),
                    bytes::Bytes::from_static(b"x"),
                )
                .await
                .unwrap();
        }
        // The replica applied sequence 1, then fell behind while 2 and 3 aged out.
        let state = Arc::new(ShardState::new(
            crate::shard::ShardLayout::striped(0, 1, 1),
            1,
        ));
        state.set_applied_seq(1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        events
            .publish_durable(&subject, "new", bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(events.first_sequence(&stream).await.unwrap(), 4);
        let metrics = Arc::new(IndexerMetrics::new().unwrap());
        let (_control_tx, control_rx) = mpsc::channel(1);
        let shutdown = CancellationToken::new();
        let consumer = tokio::spawn(consume_forever(
            state.clone(),
            events.clone(),
            ConsumerConfig {
                namespace: "ns".into(),
                filters: vec![names::kv_partition_filter("ns", 0)],
                resync: None,
            },
            2,
            control_rx,
            metrics.clone(),
            shutdown.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while state.applied_seq() < 4 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(state.applied_seq(), 4);
        assert_eq!(metrics.retention_gaps.get(), 1);
        shutdown.cancel();
        consumer.await.unwrap().unwrap();
    }
}
