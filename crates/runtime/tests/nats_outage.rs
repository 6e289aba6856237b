//! The NATS event plane through outages, on a private nats-server it starts and kills: started
//! while NATS is down, a plane connects in the background, its subscriptions and streams work
//! once NATS is up; a NATS that restarts (same store directory) keeps plain subscriptions and
//! durable consumers delivering. Skipped with `KVMESH_SKIP_EXTERNAL=1` when `NATS_SERVER` is not
//! set (scripts/test.sh sets it).
#![allow(clippy::expect_used)] // test helpers outside #[test] functions

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kvmesh_runtime::event_plane::nats::NatsEventPlane;
use kvmesh_runtime::event_plane::{
    EventPlane, StreamConfig, Subscription, ensure_stream_eventually,
};
use tokio_util::sync::CancellationToken;

/// Whether the real-server tests run.
fn has_nats() -> bool {
    match std::env::var("NATS_SERVER") {
        Ok(server) if !server.trim().is_empty() => true,
        _ if std::env::var("KVMESH_SKIP_EXTERNAL").as_deref() == Ok("1") => false,
        _ => panic!(
            "NATS_SERVER is not set: this test needs nats-server installed (or set KVMESH_SKIP_EXTERNAL=1)"
        ),
    }
}

/// A nats-server with JetStream on a free port and a store directory of its own.
struct PrivateNats {
    port: u16,
    store: tempfile::TempDir,
    process: Option<tokio::process::Child>,
}

impl PrivateNats {
    fn new() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("free port");
        Self {
            port,
            store: tempfile::tempdir().expect("temp dir"),
            process: None,
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn start(&mut self) {
        let process = tokio::process::Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server must be installed");
        self.process = Some(process);
    }

    async fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.start_kill();
            let _ = process.wait().await;
        }
    }
}

async fn until(what: &str, within: Duration, check: impl AsyncFn() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stream_config() -> StreamConfig {
    StreamConfig {
        name: "OUTAGE".into(),
        subjects: vec!["outage.kv.>".into()],
        max_age: Duration::from_secs(600),
        duplicate_window: Duration::from_secs(60),
    }
}

/// Started with NATS down: connecting succeeds, the plane says it is not connected, a plain
/// publish fails at once instead of queueing, and the subscription and stream made meanwhile work
/// as soon as NATS is up.
#[tokio::test]
async fn a_plane_started_while_nats_is_down_uses_it_once_up() {
    if !has_nats() {
        return;
    }
    let mut nats = PrivateNats::new();
    let plane: Arc<dyn EventPlane> = Arc::new(NatsEventPlane::connect(&nats.url()).await.unwrap());
    assert!(!plane.is_connected());
    let mut subscription = plane.subscribe("outage.load").await.unwrap();
    ensure_stream_eventually(&plane, &stream_config(), CancellationToken::new())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert!(plane.publish("outage.load", Bytes::new()).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(1), "publish waited");

    nats.start();
    until("connected", Duration::from_secs(15), async || {
        plane.is_connected()
    })
    .await;
    until("stream created", Duration::from_secs(15), async || {
        plane.last_sequence("OUTAGE").await.is_ok()
    })
    .await;
    let other = NatsEventPlane::connect(&nats.url()).await.unwrap();
    // The subscription is sent on connecting.
    publish_until_received(&other, &mut subscription, b"x", "the early subscription").await;
    let sequence = plane
        .publish_durable("outage.kv.a", "m1", Bytes::from_static(b"1"))
        .await
        .unwrap();
    assert_eq!(sequence, 1);
}

/// NATS killed and restarted on the same store: a plain subscription and a durable consumer made
/// before keep delivering afterwards, the consumer without losing or repeating a message.
#[tokio::test]
async fn subscriptions_and_consumers_survive_a_nats_restart() {
    if !has_nats() {
        return;
    }
    let mut nats = PrivateNats::new();
    nats.start();
    let plane: Arc<dyn EventPlane> = Arc::new(loop {
        let plane = NatsEventPlane::connect(&nats.url()).await.unwrap();
        if plane.is_connected() {
            break plane;
        }
    });
    plane.ensure_stream(&stream_config()).await.unwrap();
    plane
        .publish_durable("outage.kv.a", "m1", Bytes::from_static(b"1"))
        .await
        .unwrap();
    let mut consumer = plane
        .consume("OUTAGE", &["outage.kv.>".into()], 1)
        .await
        .unwrap();
    let first = consumer.next().await.unwrap().unwrap();
    assert_eq!((first.sequence, &first.payload[..]), (1, &b"1"[..]));
    let mut subscription = plane.subscribe("outage.load").await.unwrap();

    nats.kill().await;
    until("disconnected", Duration::from_secs(15), async || {
        !plane.is_connected()
    })
    .await;
    nats.start();
    until("reconnected", Duration::from_secs(20), async || {
        plane.is_connected()
    })
    .await;

    let publisher = NatsEventPlane::connect(&nats.url()).await.unwrap();
    publisher
        .publish_durable("outage.kv.a", "m2", Bytes::from_static(b"2"))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match consumer.next().await {
                Some(Ok(message)) => return message,
                // The restart is reported, then the consumer is opened again.
                Some(Err(_)) => continue,
                None => panic!("consumer ended"),
            }
        }
    })
    .await
    .expect("the consumer delivered nothing after the restart");
    assert_eq!((next.sequence, &next.payload[..]), (2, &b"2"[..]));
    publish_until_received(
        &publisher,
        &mut subscription,
        b"y",
        "the restarted subscription",
    )
    .await;
}

/// Publishes `payload` on `outage.load` until `subscription` delivers it (a subscription reaches
/// the server a moment after it is made or the connection comes back).
async fn publish_until_received(
    publisher: &NatsEventPlane,
    subscription: &mut Subscription,
    payload: &'static [u8],
    what: &str,
) {
    let received = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            publisher
                .publish("outage.load", Bytes::from_static(payload))
                .await
                .expect("publish");
            if let Ok(Some(message)) =
                tokio::time::timeout(Duration::from_millis(200), subscription.next()).await
            {
                return message;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("nothing delivered on {what}"));
    assert_eq!(&received.payload[..], payload);
}
