//! The event plane conformance suite, written once and run against NATS and the in-process twin.
//!
//! Each function takes a factory that opens a new handle (a new connection, as another process
//! would) and a [`Scope`] unique to the test, and panics with a message when the plane breaks
//! the [`EventPlane`] contract. Plane errors are returned.

#![doc(hidden)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::{EventPlane, Message, StreamConfig, StreamMessage, StreamSubscription, Subscription};
use crate::Result;
use crate::discovery::mem::random_instance_id;

/// How long a test waits for a message that must come.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(15);

/// Subjects and a stream name no other test or rerun uses.
#[derive(Debug, Clone)]
pub struct Scope {
    /// Every subject of the test starts with this (`conf.{label}.{random}`).
    pub subject_prefix: String,
    /// The test's stream, capturing `{subject_prefix}.kv.>`.
    pub stream: String,
}

impl Scope {
    /// A fresh scope; `label` must be a plain word (letters, digits, `_`).
    pub fn unique(label: &str) -> Self {
        let id = random_instance_id();
        Self {
            subject_prefix: format!("conf.{label}.{id:x}"),
            stream: format!("CONF_{label}_{id:x}"),
        }
    }

    /// `{subject_prefix}.{rest}`.
    pub fn subject(&self, rest: &str) -> String {
        format!("{}.{rest}", self.subject_prefix)
    }

    /// The test's stream settings.
    pub fn stream_config(&self) -> StreamConfig {
        StreamConfig {
            name: self.stream.clone(),
            subjects: vec![self.subject("kv.>")],
            max_age: Duration::from_secs(600),
            duplicate_window: Duration::from_secs(120),
        }
    }
}

/// The next plain message, or a panic naming what was awaited.
pub async fn next_message(subscription: &mut Subscription, what: &str) -> Message {
    match tokio::time::timeout(MESSAGE_DEADLINE, subscription.next()).await {
        Ok(Some(message)) => message,
        Ok(None) => panic!("subscription ended while waiting for {what}"),
        Err(_) => panic!("no message within {MESSAGE_DEADLINE:?} while waiting for {what}"),
    }
}

/// The next durable message, tolerating a few transient consumer errors.
pub async fn next_stream_message(consumer: &mut StreamSubscription, what: &str) -> StreamMessage {
    let deadline = tokio::time::Instant::now() + MESSAGE_DEADLINE;
    let mut num_errors = 0;
    loop {
        match tokio::time::timeout_at(deadline, consumer.next()).await {
            Ok(Some(Ok(message))) => return message,
            Ok(Some(Err(error))) => {
                num_errors += 1;
                assert!(
                    num_errors < 5,
                    "repeated consumer errors while waiting for {what}: {error}"
                );
            }
            Ok(None) => panic!("consumer ended while waiting for {what}"),
            Err(_) => {
                panic!("no stream message within {MESSAGE_DEADLINE:?} while waiting for {what}")
            }
        }
    }
}

/// Collects plain messages until one arrives on `last_subject`.
async fn collect_until(subscription: &mut Subscription, last_subject: &str) -> Vec<String> {
    let mut subjects = Vec::new();
    loop {
        let message = next_message(subscription, last_subject).await;
        let is_last = message.subject == last_subject;
        subjects.push(message.subject);
        if is_last {
            return subjects;
        }
    }
}

/// `*` matches one token, `>` one or more trailing tokens; invalid subjects are rejected.
pub async fn wildcard_matching<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    let s = |rest: &str| scope.subject(rest);
    let mut one_token = plane.subscribe(&s("a.*")).await?;
    let mut everything = plane
        .subscribe(&format!("{}.>", scope.subject_prefix))
        .await?;
    let mut under_a = plane.subscribe(&s("a.>")).await?;
    for subject in [s("a.b"), s("a.b.c"), s("x"), s("a"), s("a.end")] {
        plane
            .publish(&subject, Bytes::from(subject.clone()))
            .await?;
    }
    let end = s("a.end");
    assert_eq!(
        collect_until(&mut one_token, &end).await,
        vec![s("a.b"), end.clone()]
    );
    assert_eq!(
        collect_until(&mut everything, &end).await,
        vec![s("a.b"), s("a.b.c"), s("x"), s("a"), end.clone()]
    );
    assert_eq!(
        collect_until(&mut under_a, &end).await,
        vec![s("a.b"), s("a.b.c"), end]
    );
    assert!(
        plane.publish(&s("a..b"), Bytes::new()).await.is_err(),
        "empty token"
    );
    assert!(
        plane.publish(&s("a.*"), Bytes::new()).await.is_err(),
        "wildcard publish"
    );
    assert!(plane.subscribe(&s("a.>.b")).await.is_err(), "'>' not last");
    Ok(())
}

/// Every subscriber (on any connection) gets every message, in publish order.
pub async fn fan_out_to_two_subscribers<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let publisher = open().await?;
    let subject = scope.subject("load.model");
    let mut first = open().await?.subscribe(&subject).await?;
    let mut second = open().await?.subscribe(&subject).await?;
    let mut local = publisher.subscribe(&subject).await?;
    for index in 0..20u32 {
        publisher
            .publish(&subject, Bytes::from(index.to_string()))
            .await?;
    }
    for (name, subscription) in [
        ("first", &mut first),
        ("second", &mut second),
        ("local", &mut local),
    ] {
        for index in 0..20u32 {
            let message = next_message(subscription, &format!("{name} #{index}")).await;
            assert_eq!(message.subject, subject);
            assert_eq!(
                message.payload,
                Bytes::from(index.to_string()),
                "{name} order"
            );
        }
    }
    Ok(())
}

/// Durable publishes get consecutive sequences from 1 and are consumed in order; streams are
/// idempotent to ensure; durable messages also reach plain subscribers.
pub async fn durable_ordering<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    plane.ensure_stream(&scope.stream_config()).await?;
    plane.ensure_stream(&scope.stream_config()).await?;
    assert_eq!(
        plane.last_sequence(&scope.stream).await?,
        0,
        "new stream is empty"
    );
    let mut plain = plane.subscribe(&scope.subject("kv.>")).await?;
    let subjects = [scope.subject("kv.m.0"), scope.subject("kv.m.1")];
    for index in 0..20u64 {
        let subject = &subjects[(index % 2) as usize];
        let sequence = plane
            .publish_durable(
                subject,
                &format!("order-{index}"),
                Bytes::from(index.to_string()),
            )
            .await?;
        assert_eq!(sequence, index + 1, "sequences are consecutive from 1");
    }
    assert_eq!(plane.last_sequence(&scope.stream).await?, 20);
    assert_eq!(
        plane.first_sequence(&scope.stream).await?,
        1,
        "nothing aged out yet"
    );
    plane.ensure_stream(&scope.stream_config()).await?;
    assert_eq!(
        plane.last_sequence(&scope.stream).await?,
        20,
        "ensure keeps messages"
    );
    let mut consumer = open().await?.consume(&scope.stream, &[], 1).await?;
    for index in 0..20u64 {
        let message = next_stream_message(&mut consumer, &format!("message {index}")).await;
        assert_eq!(message.sequence, index + 1);
        assert_eq!(message.subject, subjects[(index % 2) as usize]);
        assert_eq!(message.payload, Bytes::from(index.to_string()));
    }
    let first_plain = next_message(&mut plain, "durable message on a plain subscription").await;
    assert_eq!(first_plain.payload, Bytes::from_static(b"0"));
    Ok(())
}

/// A repeated message id within the window is acknowledged with the original sequence and not
/// stored again.
pub async fn dedup_by_msg_id<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    plane.ensure_stream(&scope.stream_config()).await?;
    let subject = scope.subject("kv.m.3");
    let first = plane
        .publish_durable(&subject, "dup-1", Bytes::from_static(b"first"))
        .await?;
    let again = plane
        .publish_durable(&subject, "dup-1", Bytes::from_static(b"retry"))
        .await?;
    assert_eq!(again, first, "a duplicate returns the original sequence");
    let second = plane
        .publish_durable(&subject, "dup-2", Bytes::from_static(b"second"))
        .await?;
    assert_eq!(second, first + 1, "the duplicate took no sequence");
    assert_eq!(plane.last_sequence(&scope.stream).await?, second);
    let mut consumer = plane.consume(&scope.stream, &[], 1).await?;
    assert_eq!(
        next_stream_message(&mut consumer, "first").await.payload,
        Bytes::from_static(b"first")
    );
    assert_eq!(
        next_stream_message(&mut consumer, "second").await.payload,
        Bytes::from_static(b"second")
    );
    plane
        .publish_durable(&subject, "dup-3", Bytes::from_static(b"third"))
        .await?;
    let third = next_stream_message(&mut consumer, "third").await;
    assert_eq!(
        (third.sequence, third.payload),
        (second + 1, Bytes::from_static(b"third"))
    );
    Ok(())
}

/// Consuming from a middle sequence starts exactly there; from past the end waits for the next.
pub async fn consume_from_middle<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    plane.ensure_stream(&scope.stream_config()).await?;
    let subject = scope.subject("kv.m.0");
    for index in 1..=10u64 {
        plane
            .publish_durable(
                &subject,
                &format!("mid-{index}"),
                Bytes::from(index.to_string()),
            )
            .await?;
    }
    let mut middle = plane.consume(&scope.stream, &[], 6).await?;
    for sequence in 6..=10u64 {
        let message = next_stream_message(&mut middle, &format!("sequence {sequence}")).await;
        assert_eq!(
            (message.sequence, message.payload),
            (sequence, Bytes::from(sequence.to_string()))
        );
    }
    let mut past_end = plane.consume(&scope.stream, &[], 11).await?;
    plane
        .publish_durable(&subject, "mid-11", Bytes::from_static(b"11"))
        .await?;
    assert_eq!(
        next_stream_message(&mut past_end, "sequence 11")
            .await
            .sequence,
        11
    );
    assert_eq!(
        next_stream_message(&mut middle, "sequence 11 (live)")
            .await
            .sequence,
        11
    );
    Ok(())
}

/// A consumer on an empty stream receives later publishes from another connection, in order.
pub async fn consume_follows_live<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let publisher = open().await?;
    publisher.ensure_stream(&scope.stream_config()).await?;
    let mut consumer = open().await?.consume(&scope.stream, &[], 1).await?;
    let subject = scope.subject("kv.live.4");
    for round in 0..2u64 {
        for index in 0..5u64 {
            let number = round * 5 + index + 1;
            publisher
                .publish_durable(
                    &subject,
                    &format!("live-{number}"),
                    Bytes::from(number.to_string()),
                )
                .await?;
        }
        for index in 0..5u64 {
            let number = round * 5 + index + 1;
            let message = next_stream_message(&mut consumer, &format!("live {number}")).await;
            assert_eq!(
                (message.sequence, message.payload),
                (number, Bytes::from(number.to_string()))
            );
        }
    }
    Ok(())
}

/// Filters keep only matching subjects, several filters give their union in stream order, and
/// live messages are filtered too.
pub async fn filters<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    plane.ensure_stream(&scope.stream_config()).await?;
    let s = |rest: &str| scope.subject(rest);
    let order = [
        s("kv.m1.0"),
        s("kv.m1.1"),
        s("kv.m2.0"),
        s("kv.m2.1"),
        s("kv.m3.2"),
    ];
    for round in 0..2 {
        for (index, subject) in order.iter().enumerate() {
            plane
                .publish_durable(subject, &format!("f-{round}-{index}"), Bytes::new())
                .await?;
        }
    }
    // Sequences: round r, subject i -> r * 5 + i + 1.
    let partition_zero = vec![s("kv.*.0")];
    let union = vec![s("kv.*.0"), s("kv.m2.1")];
    let single = vec![s("kv.m3.2")];
    let cases: [(&Vec<String>, Vec<u64>); 3] = [
        (&partition_zero, vec![1, 3, 6, 8]),
        (&union, vec![1, 3, 4, 6, 8, 9]),
        (&single, vec![5, 10]),
    ];
    let mut consumers = Vec::new();
    for (filters, expected) in cases {
        let mut consumer = plane.consume(&scope.stream, filters, 1).await?;
        for sequence in expected {
            let message =
                next_stream_message(&mut consumer, &format!("{filters:?} seq {sequence}")).await;
            assert_eq!(message.sequence, sequence, "filters {filters:?}");
            assert!(
                filters
                    .iter()
                    .any(|f| crate::event_plane::mem::subject_matches(f, &message.subject))
            );
        }
        consumers.push(consumer);
    }
    plane
        .publish_durable(&s("kv.m3.2"), "f-live-1", Bytes::new())
        .await?; // 11
    plane
        .publish_durable(&s("kv.m1.0"), "f-live-2", Bytes::new())
        .await?; // 12
    plane
        .publish_durable(&s("kv.m2.1"), "f-live-3", Bytes::new())
        .await?; // 13
    let [partition_zero, union, single] = consumers.as_mut_slice() else {
        panic!("three consumers expected");
    };
    assert_eq!(
        next_stream_message(partition_zero, "live partition 0")
            .await
            .sequence,
        12
    );
    assert_eq!(
        next_stream_message(union, "live union 1").await.sequence,
        12
    );
    assert_eq!(
        next_stream_message(union, "live union 2").await.sequence,
        13
    );
    assert_eq!(
        next_stream_message(single, "live single").await.sequence,
        11
    );
    Ok(())
}

/// Durable operations on a stream that does not exist fail instead of hanging.
pub async fn missing_stream_is_an_error<F, Fut>(open: F, scope: &Scope) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn EventPlane>>>,
{
    let plane = open().await?;
    let outcome = tokio::time::timeout(
        MESSAGE_DEADLINE,
        plane.publish_durable(&scope.subject("kv.none.0"), "x", Bytes::new()),
    )
    .await;
    assert!(
        matches!(outcome, Ok(Err(_))),
        "publish with no stream must fail: {outcome:?}"
    );
    assert!(plane.consume(&scope.stream, &[], 1).await.is_err());
    assert!(plane.last_sequence(&scope.stream).await.is_err());
    assert!(plane.first_sequence(&scope.stream).await.is_err());
    Ok(())
}
