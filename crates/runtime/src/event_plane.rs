//! The event plane: fire-and-forget subjects (load, router sync) and durable, ordered streams
//! (KV events), with a NATS/JetStream backend and an in-process twin.

pub mod conformance;
pub mod mem;
pub mod nats;
mod nats_security;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use tokio_util::sync::CancellationToken;

use crate::Result;

/// A message received from a plain subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The concrete subject it was published on.
    pub subject: String,
    /// Payload bytes (protobuf).
    pub payload: Bytes,
}

/// A message read from a durable stream, with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMessage {
    /// Stream sequence number, from 1, strictly increasing.
    pub sequence: u64,
    /// The concrete subject it was published on.
    pub subject: String,
    /// Payload bytes (protobuf).
    pub payload: Bytes,
}

/// Stream of plain messages.
pub type Subscription = Pin<Box<dyn Stream<Item = Message> + Send>>;

/// Stream of durable messages in stream order.
pub type StreamSubscription = Pin<Box<dyn Stream<Item = Result<StreamMessage>> + Send>>;

/// A durable stream's settings (one stream per namespace for KV events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// Stream name, e.g. `KVMESH_KV_dynamo`.
    pub name: String,
    /// Subjects it captures, with wildcards, e.g. `kvmesh.dynamo.kv.>`.
    pub subjects: Vec<String>,
    /// Messages older than this are dropped.
    pub max_age: Duration,
    /// A second publish with the same message id inside this window is dropped.
    pub duplicate_window: Duration,
}

/// Publish/subscribe plus durable streams. Subjects are dot-separated tokens; patterns may use
/// `*` (one token) and `>` (one or more trailing tokens), as in NATS.
#[async_trait]
pub trait EventPlane: Send + Sync + 'static {
    /// Publishes on a plain subject: delivered to current subscribers, not stored.
    async fn publish(&self, subject: &str, payload: Bytes) -> Result<()>;

    /// Subscribes to a subject pattern.
    async fn subscribe(&self, pattern: &str) -> Result<Subscription>;

    /// Creates the durable stream if missing (or updates its subjects); idempotent.
    async fn ensure_stream(&self, config: &StreamConfig) -> Result<()>;

    /// Publishes into the durable stream capturing `subject` and waits for it to be stored.
    /// A repeat of `msg_id` within the duplicate window is acknowledged but not stored again.
    /// Returns the stream sequence of the stored (or original) message.
    async fn publish_durable(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<u64>;

    /// Reads `stream` in order from sequence `start_sequence` (1 = the beginning; sequences
    /// already aged out are skipped), keeping only subjects matching one of `filters`, and keeps
    /// following new messages.
    async fn consume(
        &self,
        stream: &str,
        filters: &[String],
        start_sequence: u64,
    ) -> Result<StreamSubscription>;

    /// The last sequence stored in `stream` (0 when empty).
    async fn last_sequence(&self, stream: &str) -> Result<u64>;

    /// The first sequence still stored in `stream`: a reader that expects an earlier one lost
    /// the messages in between to retention (0 or `last + 1` when nothing is stored).
    async fn first_sequence(&self, stream: &str) -> Result<u64>;

    /// Whether the plane is connected now. A plane that is not keeps connecting in the
    /// background: subscriptions made meanwhile start delivering once it is, plain publishes fail
    /// fast, and stream calls fail until then.
    fn is_connected(&self) -> bool {
        true
    }
}

/// How often [`ensure_stream_eventually`] tries while the plane is down.
const ENSURE_RETRY: Duration = Duration::from_secs(1);

/// Creates `config`'s stream now when the plane is connected (an error then is the caller's);
/// otherwise in the background as soon as it is, retrying until `stop`, so a process started
/// while NATS is down comes up and uses the stream once NATS does.
pub async fn ensure_stream_eventually(
    events: &Arc<dyn EventPlane>,
    config: &StreamConfig,
    stop: CancellationToken,
) -> Result<()> {
    if events.is_connected() {
        return events.ensure_stream(config).await;
    }
    tracing::warn!(stream = %config.name, "event plane not connected; creating the stream once it is");
    let (events, config) = (events.clone(), config.clone());
    tokio::spawn(async move {
        loop {
            if events.is_connected() {
                match events.ensure_stream(&config).await {
                    Ok(()) => {
                        tracing::info!(stream = %config.name, "event plane connected; stream ready");
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(stream = %config.name, %error, "creating the stream failed; retrying")
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ENSURE_RETRY) => {}
            }
        }
    });
    Ok(())
}
