//! The shared long-lived stream client against an in-memory peer: answers matched by order and
//! by key, failed calls and the reopen after a failure, the stall limit, the in-flight limit,
//! and calls abandoned before they were sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::GrpcErrorCode as _;
use kvmesh_runtime::stream_client::{
    Answers, CallResult, Incoming, StreamClient, StreamProtocol, StreamSettings,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the in-memory peer does with each message it receives.
#[derive(Clone, Copy)]
enum Peer {
    /// Answers every message at once, echoing it.
    Echo,
    /// Answers in reverse order once `n` messages arrived (held, so keys must match them).
    ReverseAfter(usize),
    /// Fails the stream when a message equals this value; echoes others.
    FailOn(u64),
    /// Echoes every message after this many milliseconds.
    EchoAfter(u64),
    /// Never answers.
    Silent,
}

/// A message `(key, value)`; a key of 0 means "answered in order".
struct Test {
    peer: Peer,
    keyed: bool,
    opened: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<u64>>>,
    failed_keys: Arc<Mutex<Vec<u64>>>,
    /// Most unanswered messages the peer held at once.
    peak_unanswered: Arc<AtomicUsize>,
}

impl Test {
    fn new(peer: Peer, keyed: bool) -> Self {
        Self {
            peer,
            keyed,
            opened: Arc::default(),
            seen: Arc::default(),
            failed_keys: Arc::default(),
            peak_unanswered: Arc::default(),
        }
    }

    fn handles(&self) -> Handles {
        Handles {
            opened: self.opened.clone(),
            seen: self.seen.clone(),
            failed_keys: self.failed_keys.clone(),
            peak_unanswered: self.peak_unanswered.clone(),
        }
    }
}

struct Handles {
    opened: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<u64>>>,
    failed_keys: Arc<Mutex<Vec<u64>>>,
    peak_unanswered: Arc<AtomicUsize>,
}

impl StreamProtocol for Test {
    type Outgoing = u64;
    type Incoming = u64;
    type Answer = u64;
    type Key = u64;

    async fn open(&mut self, mut outgoing: ReceiverStream<u64>) -> CallResult<Incoming<u64>> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        let peer = self.peer;
        let seen = self.seen.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(message) = outgoing.next().await {
                lock(&seen).push(message);
                match peer {
                    Peer::Echo => {
                        let _ = tx.send(Ok(message));
                    }
                    Peer::ReverseAfter(n) => {
                        held.push(message);
                        if held.len() == n {
                            for message in held.drain(..).rev() {
                                let _ = tx.send(Ok(message));
                            }
                        }
                    }
                    Peer::FailOn(bad) if message == bad => {
                        let _ = tx.send(Err(ErrorCode::Unavailable.to_status("peer failed")));
                        return;
                    }
                    Peer::FailOn(_) => {
                        let _ = tx.send(Ok(message));
                    }
                    Peer::EchoAfter(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        let _ = tx.send(Ok(message));
                    }
                    Peer::Silent => held.push(message),
                }
            }
        });
        let peak = self.peak_unanswered.clone();
        let seen = self.seen.clone();
        let answered = Arc::new(AtomicUsize::new(0));
        Ok(UnboundedReceiverStream::new(rx)
            .inspect(move |_| {
                let unanswered = lock(&seen).len() - answered.fetch_add(1, Ordering::SeqCst);
                peak.fetch_max(unanswered, Ordering::SeqCst);
            })
            .boxed())
    }

    fn key(&self, message: &u64) -> Option<u64> {
        self.keyed.then_some(*message)
    }

    fn answer(&self, incoming: u64) -> (Answers<u64>, CallResult<u64>) {
        let answers = if self.keyed {
            Answers::Key(incoming)
        } else {
            Answers::Oldest
        };
        (answers, Ok(incoming * 10))
    }

    fn failed(&mut self, unanswered: Vec<u64>) {
        lock(&self.failed_keys).extend(unanswered);
    }
}

fn settings() -> StreamSettings {
    StreamSettings {
        name: "test stream",
        queue: 64,
        max_in_flight: None,
        stalled_after: None,
    }
}

#[tokio::test]
async fn keyed_answers_reach_their_callers_out_of_order() {
    let test = Test::new(Peer::ReverseAfter(4), true);
    let client = StreamClient::spawn(test, settings());
    let calls = (1..=4u64).map(|n| {
        let client = client.clone();
        async move { client.call(n).await }
    });
    let answers = futures::future::join_all(calls).await;
    let answers: Vec<u64> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, vec![10, 20, 30, 40]);
}

#[tokio::test]
async fn ordered_answers_go_to_the_oldest_caller() {
    let test = Test::new(Peer::Echo, false);
    let client = StreamClient::spawn(test, settings());
    for n in 1..=20u64 {
        assert_eq!(client.call(n).await.unwrap(), n * 10);
    }
}

#[tokio::test]
async fn a_failed_stream_fails_its_calls_and_the_next_call_reopens_it() {
    let test = Test::new(Peer::FailOn(7), true);
    let handles = test.handles();
    let client = StreamClient::spawn(test, settings());
    assert_eq!(client.call(1).await.unwrap(), 10);
    assert!(client.is_up());
    let status = client.call(7).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(*lock(&handles.failed_keys), vec![7]);
    assert_eq!(client.call(2).await.unwrap(), 20);
    assert_eq!(handles.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_stalled_peer_fails_the_calls_after_the_limit() {
    let test = Test::new(Peer::Silent, false);
    let handles = test.handles();
    let stalled = StreamSettings {
        stalled_after: Some(Duration::from_millis(200)),
        ..settings()
    };
    let client = StreamClient::spawn(test, stalled);
    let call = tokio::time::timeout(Duration::from_secs(5), client.call(1)).await;
    let status = call.expect("the stall limit ends the call").unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("stopped answering"), "{status:?}");
    assert!(!client.is_up());
    let _ = tokio::time::timeout(Duration::from_secs(5), client.call(2)).await;
    assert_eq!(handles.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn no_more_than_max_in_flight_calls_are_unanswered() {
    let test = Test::new(Peer::Echo, false);
    let handles = test.handles();
    let limited = StreamSettings {
        max_in_flight: Some(3),
        ..settings()
    };
    let client = StreamClient::spawn(test, limited);
    let calls = (1..=50u64).map(|n| {
        let client = client.clone();
        async move { client.call(n).await.unwrap() }
    });
    let answers = futures::future::join_all(calls).await;
    assert_eq!(answers.len(), 50);
    assert!(handles.peak_unanswered.load(Ordering::SeqCst) <= 3);
}

#[tokio::test]
async fn a_call_abandoned_before_it_was_sent_never_reaches_the_peer() {
    let test = Test::new(Peer::EchoAfter(200), true);
    let handles = test.handles();
    let one_at_a_time = StreamSettings {
        max_in_flight: Some(1),
        ..settings()
    };
    let client = StreamClient::spawn(test, one_at_a_time);
    // The first call holds the only slot for 200 ms; the next waits in the queue meanwhile.
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.call(1).await }
    });
    while lock(&handles.seen).is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let abandoned = tokio::time::timeout(Duration::from_millis(10), client.call(99)).await;
    assert!(abandoned.is_err(), "the peer cannot have answered yet");
    assert_eq!(client.call(2).await.unwrap(), 20);
    assert_eq!(first.await.unwrap().unwrap(), 10);
    assert_eq!(*lock(&handles.seen), vec![1, 2]);
}

#[tokio::test]
async fn casts_need_no_answer() {
    let test = Test::new(Peer::Silent, true);
    let handles = test.handles();
    let client = StreamClient::spawn(test, settings());
    assert!(client.try_cast(5).is_ok());
    assert!(client.try_cast(6).is_ok());
    while lock(&handles.seen).len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(*lock(&handles.seen), vec![5, 6]);
}
