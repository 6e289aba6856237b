//! The NATS event plane: core NATS for plain subjects, JetStream for durable streams.
//!
//! Works against nats-server 2.9, which accepts one filter subject per consumer (multiple
//! filters came in 2.10). [`NatsEventPlane::consume`] therefore asks the server for one subject
//! covering every filter (the exact filter when there is one; otherwise the filters' common
//! leading tokens followed by `>`, or the whole stream) and keeps only matching subjects on the
//! client. One consumer keeps stream order across all filters, which one consumer per filter
//! could only restore by merging.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::mem::validate_subject;
pub use super::nats_security::NatsSecurity;
use super::{EventPlane, Message, StreamConfig, StreamSubscription, Subscription};
use crate::{Error, Result};
use consumer_task::{ConsumerSource, Reading, forward};

mod consumer_task;

/// The server used when `NATS_SERVER` is not set.
pub const DEFAULT_SERVER: &str = "nats://localhost:4222";

/// Attempts of one durable publish before giving up.
const PUBLISH_ATTEMPTS: u32 = 5;

/// Tries of creating or updating a stream before giving up (see `ensure_stream`).
const ENSURE_STREAM_ATTEMPTS: u64 = 4;

/// Messages a consumer buffers ahead of its reader.
const CONSUMER_CAPACITY: usize = 1024;

/// Bound on connecting and on the subscription round trip.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn nats_error(what: &str, error: impl std::fmt::Display) -> Error {
    Error::EventPlane(format!("nats {what}: {error}"))
}

/// The one server-side filter subject that covers `filters` (`None`: no filter, whole stream).
fn covering_filter(filters: &[String]) -> Option<String> {
    let mut unique: Vec<&str> = filters.iter().map(String::as_str).collect();
    unique.sort_unstable();
    unique.dedup();
    match unique.as_slice() {
        [] => None,
        [only] => Some((*only).to_owned()),
        [first, rest @ ..] => {
            let mut common: Vec<&str> = first.split('.').collect();
            for filter in rest {
                let tokens: Vec<&str> = filter.split('.').collect();
                let shared = common
                    .iter()
                    .zip(&tokens)
                    .take_while(|(a, b)| a == b && **a != ">")
                    .count();
                // `prefix.>` needs at least one more token in every filter.
                common.truncate(shared.min(tokens.len() - 1));
            }
            let shortest = unique
                .iter()
                .map(|f| f.split('.').count())
                .min()
                .unwrap_or(0);
            common.truncate(shortest.saturating_sub(1));
            (!common.is_empty()).then(|| format!("{}.>", common.join(".")))
        }
    }
}

/// Event plane on a NATS server with JetStream.
#[derive(Clone)]
pub struct NatsEventPlane {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// Counts the client's connections to a server; a consumer opens itself again on each one
    /// (a restarted server has forgotten it, and the ordered consumer can stall silently).
    connections: watch::Receiver<u64>,
}

impl std::fmt::Debug for NatsEventPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsEventPlane")
            .field("state", &self.client.connection_state())
            .finish()
    }
}

impl NatsEventPlane {
    /// Connects to `server` (a URL, or a comma list of URLs). A server that cannot be reached
    /// yet is not an error: the client keeps connecting in the background (see
    /// [`EventPlane::is_connected`]), so a process started while NATS is down uses events as
    /// soon as NATS is up. Only a malformed address fails.
    pub async fn connect(server: &str) -> Result<Self> {
        Self::connect_secured(server, &NatsSecurity::default()).await
    }

    /// Connects to `server` with TLS and credentials. A first attempt tells a refusal from an
    /// outage: credentials the server refuses fail here (a configuration error, retrying would
    /// never help), while a server that cannot be reached (or not over TLS yet) is connected to
    /// in the background.
    pub async fn connect_secured(server: &str, security: &NatsSecurity) -> Result<Self> {
        let (connected_tx, connections) = watch::channel(0u64);
        let connected_tx = std::sync::Arc::new(connected_tx);
        let options = |retry: bool| {
            let connected_tx = connected_tx.clone();
            async move {
                let options = async_nats::ConnectOptions::new()
                    .name("kvmesh")
                    .connection_timeout(CONNECT_TIMEOUT)
                    .event_callback(move |event| {
                        if matches!(event, async_nats::Event::Connected) {
                            connected_tx.send_modify(|count| *count += 1);
                        }
                        std::future::ready(())
                    });
                let options = if retry {
                    options.retry_on_initial_connect()
                } else {
                    options
                };
                security.apply(options).await
            }
        };
        let client = match options(false).await?.connect(server).await {
            Ok(client) => client,
            Err(error)
                if matches!(
                    error.kind(),
                    async_nats::ConnectErrorKind::AuthorizationViolation
                        | async_nats::ConnectErrorKind::Authentication
                ) =>
            {
                return Err(nats_error(
                    &format!("connect {server} (credentials refused)"),
                    error,
                ));
            }
            Err(error) => {
                tracing::warn!(%server, %error, "nats not reachable yet; connecting in the background");
                options(true)
                    .await?
                    .connect(server)
                    .await
                    .map_err(|error| nats_error(&format!("connect {server}"), error))?
            }
        };
        let jetstream = jetstream::new(client.clone());
        Ok(Self {
            client,
            jetstream,
            connections,
        })
    }

    /// The underlying client, for callers that need raw NATS.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Deletes a stream and its messages (`--router-reset-states`, test cleanup); deleting a
    /// missing stream is not an error.
    pub async fn delete_stream(&self, name: &str) -> Result<()> {
        match self.jetstream.delete_stream(name).await {
            Ok(_) => Ok(()),
            Err(error) if error.to_string().contains("not found") => Ok(()),
            Err(error) => Err(nats_error("delete stream", error)),
        }
    }

    /// Returns once the server has processed everything sent before: a message to a fresh
    /// inbox comes back only after the server handled our earlier subscribe.
    async fn round_trip(&self) -> Result<()> {
        let inbox = self.client.new_inbox();
        let mut probe = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|error| nats_error("subscribe", error))?;
        self.client
            .publish(inbox, Bytes::new())
            .await
            .map_err(|error| nats_error("publish", error))?;
        match tokio::time::timeout(CONNECT_TIMEOUT, probe.next()).await {
            Ok(Some(_)) => Ok(()),
            _ => Err(Error::EventPlane("nats round trip timed out".into())),
        }
    }
}

#[async_trait]
impl EventPlane for NatsEventPlane {
    async fn publish(&self, subject: &str, payload: Bytes) -> Result<()> {
        validate_subject(subject, false)?;
        // Disconnected, the client would queue publishes until its buffer fills and then block
        // the publisher: a plain event is worth nothing late, so it is dropped instead.
        if !self.is_connected() {
            return Err(Error::EventPlane("nats publish: not connected".into()));
        }
        self.client
            .publish(subject.to_owned(), payload)
            .await
            .map_err(|error| nats_error("publish", error))
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription> {
        validate_subject(pattern, true)?;
        let subscriber = self
            .client
            .subscribe(pattern.to_owned())
            .await
            .map_err(|error| nats_error("subscribe", error))?;
        // Callers expect messages published after this returns (from any connection) to arrive.
        // Not connected, the subscription is sent once the client connects.
        if self.is_connected() {
            self.round_trip().await?;
        }
        Ok(Box::pin(subscriber.map(|message| Message {
            subject: message.subject.to_string(),
            payload: message.payload,
        })))
    }

    async fn ensure_stream(&self, config: &StreamConfig) -> Result<()> {
        let stream_config = stream::Config {
            name: config.name.clone(),
            subjects: config.subjects.clone(),
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: config.max_age,
            // JetStream refuses a duplicate window longer than the retention.
            duplicate_window: if config.max_age.is_zero() {
                config.duplicate_window
            } else {
                config.duplicate_window.min(config.max_age)
            },
            ..Default::default()
        };
        // Processes that start together race to create the stream: the loser's create can fail
        // (JetStream answers "subjects overlap with an existing stream" while the winner's is
        // being added), and its next attempt finds the stream and updates it instead.
        let mut attempt = 0;
        loop {
            match self
                .jetstream
                .create_or_update_stream(stream_config.clone())
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) if attempt + 1 < ENSURE_STREAM_ATTEMPTS => {
                    tracing::debug!(stream = %config.name, %error, "ensure stream raced; retrying");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                }
                Err(error) => {
                    return Err(nats_error(&format!("ensure stream {}", config.name), error));
                }
            }
        }
    }

    async fn publish_durable(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<u64> {
        validate_subject(subject, false)?;
        let mut last_error = String::new();
        for attempt in 0..PUBLISH_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
            }
            let mut message = jetstream::message::PublishMessage::build().payload(payload.clone());
            if !msg_id.is_empty() {
                message = message.message_id(msg_id);
            }
            let acked = match self
                .jetstream
                .send_publish(subject.to_owned(), message)
                .await
            {
                Ok(ack) => ack.await.map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match acked {
                Ok(ack) => return Ok(ack.sequence),
                Err(error) => {
                    tracing::warn!(subject = %subject, attempt, error = %error, "durable publish failed");
                    last_error = error;
                }
            }
        }
        Err(nats_error(&format!("publish to {subject}"), last_error))
    }

    async fn consume(
        &self,
        stream: &str,
        filters: &[String],
        start_sequence: u64,
    ) -> Result<StreamSubscription> {
        for filter in filters {
            validate_subject(filter, true)?;
        }
        let start_sequence = start_sequence.max(1);
        let source = ConsumerSource {
            jetstream: self.jetstream.clone(),
            stream: stream.to_owned(),
            filter_subject: covering_filter(filters).unwrap_or_default(),
        };
        let ordered = source
            .open(start_sequence)
            .await
            .map_err(|error| nats_error(&format!("consume {stream}"), error))?;
        let (messages_tx, messages_rx) = mpsc::channel(CONSUMER_CAPACITY);
        let mut connections = self.connections.clone();
        connections.mark_unchanged();
        tokio::spawn(forward(
            source,
            ordered,
            Reading {
                filters: filters.to_vec(),
                start_sequence,
                connections,
            },
            messages_tx,
        ));
        Ok(Box::pin(ReceiverStream::new(messages_rx)))
    }

    async fn last_sequence(&self, stream: &str) -> Result<u64> {
        let found = self
            .jetstream
            .get_stream(stream)
            .await
            .map_err(|error| nats_error(&format!("stream {stream}"), error))?;
        Ok(found.cached_info().state.last_sequence)
    }

    async fn first_sequence(&self, stream: &str) -> Result<u64> {
        let found = self
            .jetstream
            .get_stream(stream)
            .await
            .map_err(|error| nats_error(&format!("stream {stream}"), error))?;
        Ok(found.cached_info().state.first_sequence)
    }

    fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_plane::mem::subject_matches;

    fn filters(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn covering_filter_is_exact_or_a_common_prefix() {
        assert_eq!(covering_filter(&[]), None);
        assert_eq!(
            covering_filter(&filters(&["a.b.*.0"])).as_deref(),
            Some("a.b.*.0")
        );
        assert_eq!(
            covering_filter(&filters(&["a.b", "a.b"])).as_deref(),
            Some("a.b")
        );
        assert_eq!(
            covering_filter(&filters(&["k.ns.kv.*.0", "k.ns.kv.*.3"])).as_deref(),
            Some("k.ns.kv.*.>")
        );
        assert_eq!(
            covering_filter(&filters(&["a.b", "a.b.c"])).as_deref(),
            Some("a.>")
        );
        assert_eq!(
            covering_filter(&filters(&["a.>", "a.b"])).as_deref(),
            Some("a.>")
        );
        assert_eq!(covering_filter(&filters(&["a.b", "c.d"])), None);
        assert_eq!(covering_filter(&filters(&["a", "a.b"])), None);
        for list in [&["x.y.1", "x.z.2", "x.y.3"][..], &["p.*.q", "p.r.>"][..]] {
            let cover = covering_filter(&filters(list)).unwrap_or_else(|| ">".into());
            for subject in ["x.y.1", "x.z.2", "x.y.3", "p.a.q", "p.r.s.t"] {
                let wanted = list.iter().any(|f| subject_matches(f, subject));
                assert!(
                    !wanted || subject_matches(&cover, subject),
                    "{cover} misses {subject}"
                );
            }
        }
    }
}
