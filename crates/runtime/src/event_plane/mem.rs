//! The in-process event plane: NATS semantics without a server, for `kvmesh up` and tests.
//!
//! Clones of one [`MemEventPlane`] share one bus, as processes share one NATS server. Like NATS
//! with JetStream, a publish on a subject a stream captures is stored whichever method sent it,
//! and durable publishes also reach plain subscribers.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::{EventPlane, Message, StreamConfig, StreamMessage, StreamSubscription, Subscription};
use crate::{Error, Result};

/// Messages buffered per plain subscriber before further ones are dropped (a slow consumer,
/// as NATS would drop it).
const SUBSCRIBER_CAPACITY: usize = 8192;

/// Duplicate window used when a stream's is zero (the NATS default).
const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How many stored messages a consumer copies out per lock.
const CONSUME_BATCH: usize = 256;

/// Whether `subject` matches `pattern`, with NATS wildcards: `*` is one token, a final `>` is one
/// or more tokens.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (token, Some(actual)) if token == actual => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// Whether some subject matches both patterns.
fn patterns_overlap(a: &str, b: &str) -> bool {
    let (mut left, mut right) = (a.split('.'), b.split('.'));
    loop {
        match (left.next(), right.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            _ => return false,
        }
    }
}

/// Checks a subject (`allow_wildcards` false) or a pattern: non-empty tokens, no whitespace,
/// `>` only last.
pub(crate) fn validate_subject(subject: &str, allow_wildcards: bool) -> Result<()> {
    let tokens: Vec<&str> = subject.split('.').collect();
    for (index, token) in tokens.iter().enumerate() {
        let is_wildcard = *token == "*" || (*token == ">" && index + 1 == tokens.len());
        let is_bad = token.is_empty()
            || token.chars().any(char::is_whitespace)
            || ((!allow_wildcards || !is_wildcard) && (token.contains('*') || token.contains('>')));
        if is_bad {
            return Err(Error::EventPlane(format!("invalid subject {subject:?}")));
        }
    }
    Ok(())
}

fn validate_stream_name(name: &str) -> Result<()> {
    let is_bad = name.is_empty()
        || name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'));
    if is_bad {
        return Err(Error::EventPlane(format!("invalid stream name {name:?}")));
    }
    Ok(())
}

/// What one stream may hold besides its age limit, so that a busy process's memory stays
/// bounded: past either bound the oldest messages (or remembered ids) go first, and a consumer
/// that fell that far behind sees the gap as it would on a JetStream stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Bytes of stored messages (payload, subject and bookkeeping).
    pub max_bytes: usize,
    /// Message ids remembered for the duplicate window.
    pub max_ids: usize,
}

impl Default for StreamLimits {
    /// 64 MiB and a million ids: an hour of a light load, a few minutes of a very busy one.
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_ids: 1 << 20,
        }
    }
}

struct Stored {
    sequence: u64,
    subject: String,
    payload: Bytes,
    stored_at: Instant,
}

struct MemStream {
    config: StreamConfig,
    limits: StreamLimits,
    messages: VecDeque<Stored>,
    /// What `messages` holds, as [`stored_bytes`] counts it.
    num_bytes: usize,
    last_sequence: u64,
    /// msg id → (sequence, stored at), for the duplicate window.
    recent_ids: HashMap<String, (u64, Instant)>,
    /// The ids of `recent_ids` in the order they were stored, so that expiring them takes only
    /// the expired ones instead of a pass over every id in the window.
    recent_order: VecDeque<(Instant, String)>,
    last_sequence_tx: watch::Sender<u64>,
}

impl MemStream {
    fn prune(&mut self, now: Instant) {
        if !self.config.max_age.is_zero() {
            while self
                .messages
                .front()
                .is_some_and(|stored| now.duration_since(stored.stored_at) > self.config.max_age)
            {
                self.pop_oldest();
            }
        }
        while self.num_bytes > self.limits.max_bytes && self.pop_oldest() {}
        while self.recent_order.len() > self.limits.max_ids {
            if let Some((_, id)) = self.recent_order.pop_front() {
                self.recent_ids.remove(&id);
            }
        }
        let window = self.duplicate_window();
        // An id is stored only while absent, so each one is in `recent_order` once.
        while self
            .recent_order
            .front()
            .is_some_and(|(stored_at, _)| now.duration_since(*stored_at) > window)
        {
            if let Some((_, id)) = self.recent_order.pop_front() {
                self.recent_ids.remove(&id);
            }
        }
    }

    /// Drops the oldest message; false when there is none.
    fn pop_oldest(&mut self) -> bool {
        let Some(stored) = self.messages.pop_front() else {
            return false;
        };
        self.num_bytes -= stored_bytes(&stored.subject, &stored.payload);
        true
    }

    fn duplicate_window(&self) -> Duration {
        if self.config.duplicate_window.is_zero() {
            DEFAULT_DUPLICATE_WINDOW
        } else {
            self.config.duplicate_window
        }
    }

    fn captures(&self, subject: &str) -> bool {
        self.config
            .subjects
            .iter()
            .any(|pattern| subject_matches(pattern, subject))
    }

    /// Stores a message unless `msg_id` was seen within the window; returns its sequence.
    fn append(&mut self, subject: &str, msg_id: Option<&str>, payload: Bytes) -> u64 {
        let now = Instant::now();
        self.prune(now);
        if let Some(&(sequence, _)) = msg_id.and_then(|id| self.recent_ids.get(id)) {
            return sequence;
        }
        self.last_sequence += 1;
        let sequence = self.last_sequence;
        self.num_bytes += stored_bytes(subject, &payload);
        self.messages.push_back(Stored {
            sequence,
            subject: subject.to_owned(),
            payload,
            stored_at: now,
        });
        if let Some(id) = msg_id {
            self.recent_ids.insert(id.to_owned(), (sequence, now));
            self.recent_order.push_back((now, id.to_owned()));
        }
        self.prune(now);
        self.last_sequence_tx.send_replace(sequence);
        sequence
    }
}

/// What one stored message counts against [`StreamLimits::max_bytes`].
fn stored_bytes(subject: &str, payload: &Bytes) -> usize {
    std::mem::size_of::<Stored>() + subject.len() + payload.len()
}

struct Subscriber {
    pattern: String,
    messages_tx: mpsc::Sender<Message>,
}

#[derive(Default)]
struct State {
    subscribers: Vec<Subscriber>,
    streams: BTreeMap<String, MemStream>,
}

impl State {
    fn fan_out(&mut self, subject: &str, payload: &Bytes) {
        self.subscribers.retain(|subscriber| {
            if !subject_matches(&subscriber.pattern, subject) {
                return true;
            }
            let message = Message {
                subject: subject.to_owned(),
                payload: payload.clone(),
            };
            match subscriber.messages_tx.try_send(message) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(pattern = %subscriber.pattern, "slow subscriber, message dropped");
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    fn capturing_stream(&mut self, subject: &str) -> Option<&mut MemStream> {
        self.streams
            .values_mut()
            .find(|stream| stream.captures(subject))
    }
}

/// An in-process event plane; clones share one bus.
#[derive(Clone, Default)]
pub struct MemEventPlane {
    state: Arc<Mutex<State>>,
    limits: StreamLimits,
}

impl std::fmt::Debug for MemEventPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemEventPlane")
            .field("num_subscribers", &state.subscribers.len())
            .field("streams", &state.streams.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MemEventPlane {
    /// An empty bus whose streams keep [`StreamLimits::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty bus whose streams keep `limits`.
    pub fn with_limits(limits: StreamLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation is one step, so the state is consistent even after a panic elsewhere.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Copies up to a batch of stored messages from `next` on that pass `filters`, and the
    /// sequence to continue from.
    fn read_from(
        &self,
        stream: &str,
        filters: &[String],
        next: u64,
    ) -> Result<(Vec<StreamMessage>, u64)> {
        let mut state = self.lock();
        let stream_state = state
            .streams
            .get_mut(stream)
            .ok_or_else(|| Error::EventPlane(format!("stream {stream} not found")))?;
        stream_state.prune(Instant::now());
        let first_index = stream_state
            .messages
            .partition_point(|stored| stored.sequence < next);
        let mut batch = Vec::new();
        let mut resume = next;
        for stored in stream_state
            .messages
            .iter()
            .skip(first_index)
            .take(CONSUME_BATCH)
        {
            resume = stored.sequence + 1;
            let is_wanted = filters.is_empty()
                || filters
                    .iter()
                    .any(|filter| subject_matches(filter, &stored.subject));
            if is_wanted {
                batch.push(StreamMessage {
                    sequence: stored.sequence,
                    subject: stored.subject.clone(),
                    payload: stored.payload.clone(),
                });
            }
        }
        Ok((batch, resume))
    }
}

#[async_trait]
impl EventPlane for MemEventPlane {
    async fn publish(&self, subject: &str, payload: Bytes) -> Result<()> {
        validate_subject(subject, false)?;
        let mut state = self.lock();
        if let Some(stream) = state.capturing_stream(subject) {
            stream.append(subject, None, payload.clone());
        }
        state.fan_out(subject, &payload);
        Ok(())
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription> {
        validate_subject(pattern, true)?;
        let (messages_tx, messages_rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
        self.lock().subscribers.push(Subscriber {
            pattern: pattern.to_owned(),
            messages_tx,
        });
        Ok(Box::pin(ReceiverStream::new(messages_rx)))
    }

    async fn ensure_stream(&self, config: &StreamConfig) -> Result<()> {
        validate_stream_name(&config.name)?;
        if config.subjects.is_empty() {
            return Err(Error::EventPlane(format!(
                "stream {} has no subjects",
                config.name
            )));
        }
        for subject in &config.subjects {
            validate_subject(subject, true)?;
        }
        let mut state = self.lock();
        let overlapping = state.streams.values().find(|other| {
            other.config.name != config.name
                && other.config.subjects.iter().any(|theirs| {
                    config
                        .subjects
                        .iter()
                        .any(|ours| patterns_overlap(ours, theirs))
                })
        });
        if let Some(other) = overlapping {
            return Err(Error::EventPlane(format!(
                "stream {} subjects overlap stream {}",
                config.name, other.config.name
            )));
        }
        match state.streams.get_mut(&config.name) {
            Some(existing) => existing.config = config.clone(),
            None => {
                let (last_sequence_tx, _) = watch::channel(0);
                state.streams.insert(
                    config.name.clone(),
                    MemStream {
                        config: config.clone(),
                        limits: self.limits,
                        messages: VecDeque::new(),
                        num_bytes: 0,
                        last_sequence: 0,
                        recent_ids: HashMap::new(),
                        recent_order: VecDeque::new(),
                        last_sequence_tx,
                    },
                );
            }
        }
        Ok(())
    }

    async fn publish_durable(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<u64> {
        validate_subject(subject, false)?;
        let mut state = self.lock();
        let msg_id = (!msg_id.is_empty()).then_some(msg_id);
        let sequence = state
            .capturing_stream(subject)
            .ok_or_else(|| Error::EventPlane(format!("no stream captures subject {subject}")))?
            .append(subject, msg_id, payload.clone());
        state.fan_out(subject, &payload);
        Ok(sequence)
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
        let last_sequence_rx = {
            let state = self.lock();
            let stream_state = state
                .streams
                .get(stream)
                .ok_or_else(|| Error::EventPlane(format!("stream {stream} not found")))?;
            stream_state.last_sequence_tx.subscribe()
        };
        let reader = Reader {
            plane: self.clone(),
            stream: stream.to_owned(),
            filters: filters.to_vec(),
            next: start_sequence.max(1),
            buffered: VecDeque::new(),
            last_sequence_rx,
        };
        Ok(Box::pin(futures::stream::unfold(reader, Reader::next)))
    }

    async fn last_sequence(&self, stream: &str) -> Result<u64> {
        let state = self.lock();
        state
            .streams
            .get(stream)
            .map(|stream| stream.last_sequence)
            .ok_or_else(|| Error::EventPlane(format!("stream {stream} not found")))
    }

    async fn first_sequence(&self, stream: &str) -> Result<u64> {
        let mut state = self.lock();
        let found = state
            .streams
            .get_mut(stream)
            .ok_or_else(|| Error::EventPlane(format!("stream {stream} not found")))?;
        found.prune(Instant::now());
        Ok(found
            .messages
            .front()
            .map_or(found.last_sequence + 1, |stored| stored.sequence))
    }
}

/// State of one consumer: replays stored messages, then waits for new ones.
struct Reader {
    plane: MemEventPlane,
    stream: String,
    filters: Vec<String>,
    next: u64,
    buffered: VecDeque<StreamMessage>,
    last_sequence_rx: watch::Receiver<u64>,
}

impl Reader {
    async fn next(mut self) -> Option<(Result<StreamMessage>, Self)> {
        loop {
            if let Some(message) = self.buffered.pop_front() {
                return Some((Ok(message), self));
            }
            // Mark the current value seen before reading, so an append after the read wakes us.
            self.last_sequence_rx.borrow_and_update();
            match self.plane.read_from(&self.stream, &self.filters, self.next) {
                Ok((batch, resume)) => {
                    self.next = resume;
                    if batch.is_empty() {
                        self.last_sequence_rx.changed().await.ok()?;
                    }
                    self.buffered.extend(batch);
                }
                Err(error) => return Some((Err(error), self)),
            }
        }
    }
}

#[cfg(test)]
#[path = "mem_tests.rs"]
mod tests;
