//! The one long-lived bidirectional-stream client: many concurrent callers share one gRPC stream
//! to a peer instead of paying an HTTP/2 stream setup per call. Calls wait for their answer,
//! matched to them by the order answers come back in or by a key the answer carries; casts go
//! without an answer. A failed stream fails the calls in flight and is reopened by the next
//! message. What differs between protocols (how a stream opens, how an answer is matched, what
//! to resend after a failure) is a [`StreamProtocol`].
//!
//! The router's overlap queries to indexer replicas (answers in order) and the frontend's routes
//! and load reports to router replicas (answers by request id) both use it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{ErrorCode, GrpcErrorCode as _};

/// An answer to one call, or the status it failed with.
pub type CallResult<A> = Result<A, tonic::Status>;

/// What a peer sends back on one stream (a `tonic::Streaming`, boxed).
pub type Incoming<T> = BoxStream<'static, CallResult<T>>;

/// Which waiting call an incoming message answers.
pub enum Answers<K> {
    /// The oldest call still waiting: the peer answers in the order it was asked.
    Oldest,
    /// The call that was sent with this key.
    Key(K),
}

/// What one kind of stream does differently; the client does the rest.
pub trait StreamProtocol: Send + 'static {
    /// A message to the peer.
    type Outgoing: Send + 'static;
    /// A message from the peer.
    type Incoming: Send + 'static;
    /// What a call's caller gets back.
    type Answer: Send + 'static;
    /// What matches an answer to its call when answers carry one.
    type Key: Eq + Hash + Clone + Send + 'static;

    /// Opens a stream that carries `outgoing` to the peer; returns what the peer sends back.
    fn open(
        &mut self,
        outgoing: ReceiverStream<Self::Outgoing>,
    ) -> impl Future<Output = CallResult<Incoming<Self::Incoming>>> + Send;

    /// The key the answer to call `message` will carry; `None` when answers come in order.
    fn key(&self, message: &Self::Outgoing) -> Option<Self::Key>;

    /// Which call `incoming` answers, and the answer.
    fn answer(&self, incoming: Self::Incoming) -> (Answers<Self::Key>, CallResult<Self::Answer>);

    /// A new stream is about to open.
    fn opened(&mut self) {}

    /// `message` (a call or a cast) was handed to the current stream.
    fn sent(&mut self, _message: &Self::Outgoing) {}

    /// The current stream failed after it was opened; `unanswered` are the keys of the calls
    /// it failed (those with one). The protocol may resend what the peer could have lost.
    fn failed(&mut self, _unanswered: Vec<Self::Key>) {}
}

/// Limits of one stream client.
#[derive(Debug, Clone, Copy)]
pub struct StreamSettings {
    /// What the stream is, in errors ("query stream closed").
    pub name: &'static str,
    /// Messages that may wait for the stream task before senders block (casts fail instead).
    pub queue: usize,
    /// Calls one stream carries unanswered; beyond it the task reads answers before taking
    /// more, so neither HTTP/2 flow-control window can fill while the other side waits on it.
    /// `None` for peers that may hold a call a long time (a router queueing a request).
    pub max_in_flight: Option<usize>,
    /// A stream whose oldest call waited this long is torn down and reopened: a peer that
    /// stalls while its connection still answers keepalives would otherwise hold every call.
    pub stalled_after: Option<Duration>,
}

enum Envelope<P: StreamProtocol> {
    Call(P::Outgoing, oneshot::Sender<CallResult<P::Answer>>),
    Cast(P::Outgoing),
}

/// A handle on one long-lived stream; clones share it. The stream task ends when every handle
/// is dropped.
pub struct StreamClient<P: StreamProtocol> {
    tx: mpsc::Sender<Envelope<P>>,
    is_up: Arc<AtomicBool>,
    name: &'static str,
}

impl<P: StreamProtocol> Clone for StreamClient<P> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            is_up: self.is_up.clone(),
            name: self.name,
        }
    }
}

impl<P: StreamProtocol> StreamClient<P> {
    /// Starts the stream task; the first message opens the stream.
    pub fn spawn(protocol: P, settings: StreamSettings) -> Self {
        let (tx, rx) = mpsc::channel(settings.queue);
        let is_up = Arc::new(AtomicBool::new(false));
        tokio::spawn(run(protocol, settings, rx, is_up.clone()));
        Self {
            tx,
            is_up,
            name: settings.name,
        }
    }

    /// Sends `message` and waits for its answer.
    pub async fn call(&self, message: P::Outgoing) -> CallResult<P::Answer> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Envelope::Call(message, reply))
            .await
            .map_err(|_| self.closed())?;
        answer.await.unwrap_or_else(|_| Err(self.closed()))
    }

    /// Queues `message` without an answer; gives it back when the queue is full or closed.
    pub fn try_cast(&self, message: P::Outgoing) -> Result<(), P::Outgoing> {
        self.tx
            .try_send(Envelope::Cast(message))
            .map_err(|error| match error.into_inner() {
                Envelope::Cast(message) | Envelope::Call(message, _) => message,
            })
    }

    /// Whether a stream is open and has not failed.
    pub fn is_up(&self) -> bool {
        self.is_up.load(Ordering::Acquire)
    }

    fn closed(&self) -> tonic::Status {
        ErrorCode::Unavailable.to_status(format!("{} closed", self.name))
    }
}

struct Waiter<K, A> {
    key: Option<K>,
    reply: oneshot::Sender<CallResult<A>>,
    sent_at: Instant,
}

/// The calls a stream carries unanswered, oldest first, findable by key.
struct Waiting<K, A> {
    next_seq: u64,
    calls: BTreeMap<u64, Waiter<K, A>>,
    by_key: HashMap<K, u64>,
}

impl<K: Eq + Hash + Clone, A> Waiting<K, A> {
    fn new() -> Self {
        Self {
            next_seq: 0,
            calls: BTreeMap::new(),
            by_key: HashMap::new(),
        }
    }

    fn push(&mut self, key: Option<K>, reply: oneshot::Sender<CallResult<A>>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(key) = &key {
            self.by_key.insert(key.clone(), seq);
        }
        let sent_at = Instant::now();
        self.calls.insert(
            seq,
            Waiter {
                key,
                reply,
                sent_at,
            },
        );
    }

    fn take(&mut self, answers: Answers<K>) -> Option<Waiter<K, A>> {
        match answers {
            Answers::Oldest => {
                let (_, waiter) = self.calls.pop_first()?;
                if let Some(key) = &waiter.key {
                    self.by_key.remove(key);
                }
                Some(waiter)
            }
            Answers::Key(key) => {
                let seq = self.by_key.remove(&key)?;
                self.calls.remove(&seq)
            }
        }
    }

    fn oldest_sent_at(&self) -> Option<Instant> {
        self.calls.first_key_value().map(|(_, w)| w.sent_at)
    }

    /// Fails every call with `status`; returns the keys of those that had one.
    fn fail_all(&mut self, status: &tonic::Status) -> Vec<K> {
        self.by_key.clear();
        let calls = std::mem::take(&mut self.calls);
        calls
            .into_values()
            .filter_map(|waiter| {
                let _ = waiter.reply.send(Err(status.clone()));
                waiter.key
            })
            .collect()
    }
}

/// Hands `envelope` to the stream: a call starts waiting, the protocol sees what was sent.
fn take_message<P: StreamProtocol>(
    protocol: &mut P,
    waiting: &mut Waiting<P::Key, P::Answer>,
    envelope: Envelope<P>,
) -> P::Outgoing {
    let message = match envelope {
        Envelope::Call(message, reply) => {
            waiting.push(protocol.key(&message), reply);
            message
        }
        Envelope::Cast(message) => message,
    };
    protocol.sent(&message);
    message
}

/// Whether nobody waits for this envelope any more (a call whose caller gave up): the peer is
/// spared the work.
fn is_abandoned<P: StreamProtocol>(envelope: &Envelope<P>) -> bool {
    matches!(envelope, Envelope::Call(_, reply) if reply.is_closed())
}

async fn run<P: StreamProtocol>(
    mut protocol: P,
    settings: StreamSettings,
    mut rx: mpsc::Receiver<Envelope<P>>,
    is_up: Arc<AtomicBool>,
) {
    let unavailable =
        |what: &str| ErrorCode::Unavailable.to_status(format!("{} {what}", settings.name));
    let max_in_flight = settings.max_in_flight.unwrap_or(usize::MAX);
    let out_capacity = settings.max_in_flight.unwrap_or(settings.queue).max(1);
    let mut waiting = Waiting::new();
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        if is_abandoned(&first) {
            continue;
        }
        protocol.opened();
        let (out_tx, out_rx) = mpsc::channel(out_capacity);
        // A fresh channel has room for one message.
        let _ = out_tx.try_send(take_message(&mut protocol, &mut waiting, first));
        let mut incoming = match protocol.open(ReceiverStream::new(out_rx)).await {
            Ok(incoming) => incoming,
            Err(status) => {
                // Nothing reached the peer: no stream was opened.
                waiting.fail_all(&status);
                continue;
            }
        };
        is_up.store(true, Ordering::Release);
        let failure = loop {
            let stall_at = settings
                .stalled_after
                .zip(waiting.oldest_sent_at())
                .map(|(after, sent_at)| sent_at + after);
            tokio::select! {
                envelope = rx.recv(), if waiting.calls.len() < max_in_flight => {
                    let Some(envelope) = envelope else { return };
                    if is_abandoned(&envelope) {
                        continue;
                    }
                    let message = take_message(&mut protocol, &mut waiting, envelope);
                    if out_tx.send(message).await.is_err() {
                        break unavailable("closed");
                    }
                }
                message = incoming.next() => match message {
                    Some(Ok(message)) => {
                        let (answers, result) = protocol.answer(message);
                        if let Some(waiter) = waiting.take(answers) {
                            let _ = waiter.reply.send(result);
                        }
                    }
                    Some(Err(status)) => break status,
                    None => break unavailable("ended"),
                },
                _ = tokio::time::sleep_until(stall_at.unwrap_or_else(Instant::now)), if stall_at.is_some() => {
                    break unavailable("stopped answering");
                }
            }
        };
        is_up.store(false, Ordering::Release);
        let unanswered = waiting.fail_all(&failure);
        protocol.failed(unanswered);
    }
}
