//! A durable subscription's forwarding task: moves an ordered JetStream consumer's messages to
//! the subscription in stream order and opens the consumer again when it fails or the client
//! reconnects.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::nats_error;
use crate::event_plane::StreamMessage;
use crate::event_plane::mem::subject_matches;
use crate::{Error, Result};

/// Where a durable subscription reads from, to open its consumer again.
pub(super) struct ConsumerSource {
    pub(super) jetstream: jetstream::Context,
    pub(super) stream: String,
    pub(super) filter_subject: String,
}

impl ConsumerSource {
    /// An ordered consumer from `start_sequence`.
    pub(super) async fn open(
        &self,
        start_sequence: u64,
    ) -> Result<consumer::pull::Ordered, String> {
        let config = consumer::pull::OrderedConfig {
            filter_subject: self.filter_subject.clone(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence },
            ..Default::default()
        };
        self.jetstream
            .create_consumer_on_stream(config, self.stream.as_str())
            .await
            .map_err(|error| error.to_string())?
            .messages()
            .await
            .map_err(|error| error.to_string())
    }
}

/// Longest pause between two attempts to open a failed consumer again.
const MAX_REOPEN_BACKOFF: Duration = Duration::from_secs(2);

/// What a consumer's forwarding task reads and from where.
pub(super) struct Reading {
    /// Subjects passed on (empty: all).
    pub(super) filters: Vec<String>,
    /// The first stream sequence to pass on.
    pub(super) start_sequence: u64,
    /// The client's connection count (see [`NatsEventPlane`]).
    pub(super) connections: watch::Receiver<u64>,
}

/// Moves consumer messages to the subscription in stream order, dropping any the ordered
/// consumer redelivers and subjects outside `filters`. An error is passed on and the consumer is
/// opened again after the last message passed on: a restarted NATS forgets ephemeral consumers,
/// and the ordered consumer does not always recreate itself then. For the same reason the
/// consumer is opened again, after the last message passed on, whenever the client connects
/// to a server again (nothing is passed on twice or skipped: `next` decides).
pub(super) async fn forward(
    source: ConsumerSource,
    mut ordered: consumer::pull::Ordered,
    reading: Reading,
    messages_tx: mpsc::Sender<Result<StreamMessage>>,
) {
    let Reading {
        filters,
        start_sequence,
        mut connections,
    } = reading;
    let mut watching = true;
    let mut next = start_sequence;
    loop {
        let item = tokio::select! {
            () = messages_tx.closed() => return,
            changed = connections.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                tracing::info!(stream = %source.stream, next, "nats connected again; opening the stream consumer again");
                match reopen(&source, next, &messages_tx).await {
                    Some(reopened) => ordered = reopened,
                    None => return,
                }
                continue;
            }
            item = ordered.next() => item,
        };
        let outcome = match item {
            None => Err(Error::EventPlane("nats consumer ended".into())),
            Some(Err(error)) => Err(nats_error("consume", error)),
            Some(Ok(message)) => match message.info() {
                Ok(info) => Ok((info.stream_sequence, message)),
                Err(error) => Err(nats_error("message info", error)),
            },
        };
        let (sequence, message) = match outcome {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(stream = %source.stream, error = %error, "stream consumer error; opening it again");
                if messages_tx.send(Err(error)).await.is_err() {
                    return;
                }
                match reopen(&source, next, &messages_tx).await {
                    Some(reopened) => ordered = reopened,
                    None => return,
                }
                continue;
            }
        };
        if sequence < next {
            continue;
        }
        next = sequence + 1;
        let subject = message.subject.as_str();
        if !filters.is_empty()
            && !filters
                .iter()
                .any(|filter| subject_matches(filter, subject))
        {
            continue;
        }
        let stream_message = StreamMessage {
            sequence,
            subject: subject.to_owned(),
            payload: message.payload.clone(),
        };
        if messages_tx.send(Ok(stream_message)).await.is_err() {
            return;
        }
    }
}

/// Opens the consumer again from `next`, backing off while it fails; `None` once the reader is
/// gone.
async fn reopen(
    source: &ConsumerSource,
    next: u64,
    messages_tx: &mpsc::Sender<Result<StreamMessage>>,
) -> Option<consumer::pull::Ordered> {
    let mut backoff = Duration::from_millis(200);
    loop {
        tokio::select! {
            () = messages_tx.closed() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        match source.open(next).await {
            Ok(ordered) => {
                tracing::info!(stream = %source.stream, next, "stream consumer opened again");
                return Some(ordered);
            }
            Err(error) => {
                tracing::debug!(stream = %source.stream, %error, "opening the stream consumer failed");
                backoff = (backoff * 2).min(MAX_REOPEN_BACKOFF);
            }
        }
    }
}
