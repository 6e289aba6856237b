//! The bridge end to end in one process: a ZMQ PUB socket writing vLLM's frames, the bridge on
//! an in-process event plane, and the republished batches read back from the stream.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use kvmesh_kv::compute_block_hashes;
use kvmesh_kv_bridge::{BridgeMetrics, BridgeOpts};
use kvmesh_proto::v1::{KvEvent, KvEventBatch, kv_event};
use kvmesh_runtime::event_plane::mem::MemEventPlane;
use kvmesh_runtime::event_plane::{EventPlane, StreamSubscription};
use kvmesh_runtime::names;
use prost::Message;
use rmpv::Value;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const BLOCK_SIZE: u64 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn encode(value: &Value) -> Bytes {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    Bytes::from(out)
}

/// A vLLM batch: `[ts, [events as maps], dp_rank]`.
fn batch(events: Vec<Value>) -> Bytes {
    encode(&Value::Array(vec![
        Value::F64(1.0),
        Value::Array(events),
        Value::from(0),
    ]))
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], group_idx: u64) -> Value {
    map(vec![
        ("type", Value::from("BlockStored")),
        (
            "block_hashes",
            Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
        (
            "token_ids",
            Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
        ),
        ("block_size", Value::from(BLOCK_SIZE)),
        ("medium", Value::from("GPU")),
        ("group_idx", Value::from(group_idx)),
    ])
}

fn removed(hashes: &[u64]) -> Value {
    map(vec![
        ("type", Value::from("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        ("medium", Value::from("GPU")),
    ])
}

fn frames(seq: u64, payload: Bytes) -> ZmqMessage {
    let mut message = ZmqMessage::from(Bytes::from_static(b"kv-events"));
    message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
    message.push_back(payload);
    message
}

struct Bridge {
    metrics: BridgeMetrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Bridge {
    fn start(events: Arc<MemEventPlane>, extra: &[&str]) -> Bridge {
        let mut args = vec![
            "kvmesh-kv-bridge",
            "--discovery-backend",
            "mem",
            "--worker-id",
            "42",
            "--namespace",
            "test",
            "--model-name",
            "org/model",
            "--block-size",
            "4",
        ];
        args.extend_from_slice(extra);
        let opts = BridgeOpts::try_parse_from(args).unwrap();
        let metrics = BridgeMetrics::new().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kvmesh_kv_bridge::run_with(
            opts,
            events,
            metrics.clone(),
            shutdown.clone(),
        ));
        Bridge {
            metrics,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Sends skipped (non-main group) batches until the bridge receives one: PUB drops everything
/// sent before the subscription arrives. Returns the next sequence number.
async fn handshake(publisher: &mut PubSocket, bridge: &Bridge) -> u64 {
    let mut seq = 0;
    for _ in 0..200 {
        let probe = batch(vec![stored(&[1], None, &[0, 0, 0, 0], 1)]);
        publisher.send(frames(seq, probe)).await.unwrap();
        seq += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
        if bridge.metrics.batches_received.get() > 0 {
            return seq;
        }
    }
    panic!("the bridge never received a probe");
}

async fn stream(events: &MemEventPlane) -> StreamSubscription {
    let subject = names::kv_subject("test", "org/model", kvmesh_kv::kv_partition(42, 16));
    events
        .consume(&names::kv_stream_name("test"), &[subject], 1)
        .await
        .unwrap()
}

/// Reads batches until `count` events arrived.
async fn read_events(messages: &mut StreamSubscription, count: usize) -> Vec<KvEvent> {
    let mut events = Vec::new();
    while events.len() < count {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("events in time")
            .unwrap()
            .unwrap();
        let batch = KvEventBatch::decode(message.payload.as_ref()).unwrap();
        assert_eq!((batch.worker_id, batch.dp_rank), (42, 0));
        events.extend(batch.events);
    }
    events
}

fn kind(event: &KvEvent) -> &kv_event::Kind {
    event.kind.as_ref().unwrap()
}

#[tokio::test]
async fn republishes_vllm_frames_with_gap_free_ids() {
    let port = free_port();
    let mut publisher = PubSocket::new();
    publisher
        .bind(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let events = Arc::new(MemEventPlane::new());
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let floor = kvmesh_kv_bridge::publish::restart_floor();
    let bridge = Bridge::start(events.clone(), &["--zmq-endpoint", &endpoint]);
    let seq = handshake(&mut publisher, &bridge).await;
    let mut messages = stream(&events).await;

    let tokens: Vec<u32> = (1..=12).collect();
    let mut short = ZmqMessage::from(Bytes::from_static(b"kv-events"));
    short.push_back(Bytes::from_static(b"\x00\x01"));
    let cleared = map(vec![("type", Value::from("AllBlocksCleared"))]);
    let messages_in_order = [
        frames(seq, batch(vec![stored(&[100, 101], None, &tokens[..8], 0)])),
        frames(seq + 1, Bytes::from_static(b"\xc1garbage")),
        // seq + 2 and seq + 3: two batches the engine "lost".
        frames(
            seq + 4,
            batch(vec![
                stored(&[102], Some(101), &tokens[8..], 0),
                removed(&[100]),
            ]),
        ),
        short,
        frames(seq + 5, batch(vec![cleared])),
    ];
    for message in messages_in_order {
        publisher.send(message).await.unwrap();
    }

    let got = read_events(&mut messages, 4).await;
    let ids: Vec<u64> = got.iter().map(|e| e.event_id).collect();
    // A worker without earlier ids starts at the clock's floor, then counts without gaps.
    assert!(ids[0] >= floor, "{ids:?} from {floor}");
    assert_eq!(ids, (ids[0]..ids[0] + 4).collect::<Vec<_>>());
    let hashes = compute_block_hashes(&tokens, 4, 1337);
    match kind(&got[0]) {
        kv_event::Kind::Stored(s) => {
            assert_eq!(s.parent_hash, None);
            let pairs: Vec<(u64, u64)> = s
                .blocks
                .iter()
                .map(|b| (b.block_hash, b.tokens_hash))
                .collect();
            assert_eq!(pairs, [(100, hashes[0]), (101, hashes[1])]);
        }
        other => panic!("{other:?}"),
    }
    match kind(&got[1]) {
        kv_event::Kind::Stored(s) => {
            assert_eq!(s.parent_hash, Some(101));
            assert_eq!(s.blocks[0].tokens_hash, hashes[2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(kind(&got[2]), kv_event::Kind::Removed(r) if r.block_hashes == [100]));
    assert!(matches!(kind(&got[3]), kv_event::Kind::Cleared(_)));

    let metrics = &bridge.metrics;
    assert_eq!(metrics.zmq_gaps.get(), 1);
    assert_eq!(metrics.zmq_missed_batches.get(), 2);
    assert_eq!(metrics.malformed.with_label_values(&["payload"]).get(), 1);
    assert_eq!(metrics.malformed.with_label_values(&["frame"]).get(), 1);
    assert!(metrics.skipped.with_label_values(&["non_main_group"]).get() >= 1);
    assert_eq!(metrics.events_published.get(), 4);
    bridge.stop().await;
}

/// An engine replay socket serving `buffer` (seq, payload) as vLLM does.
async fn serve_replay(mut router: RouterSocket, buffer: Vec<(u64, Bytes)>) {
    while let Ok(request) = router.recv().await {
        let frames = request.into_vec();
        let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
            continue;
        };
        let start = u64::from_be_bytes(start.as_ref().try_into().unwrap());
        let reply = |parts: [Bytes; 3]| {
            let mut message = ZmqMessage::from(identity.clone());
            message.push_back(Bytes::new());
            for part in parts {
                message.push_back(part);
            }
            message
        };
        for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
            let parts = [
                Bytes::from_static(b"kv-events"),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            router.send(reply(parts)).await.unwrap();
        }
        let end = [Bytes::new(), Bytes::from(vec![0xff; 8]), Bytes::new()];
        router.send(reply(end)).await.unwrap();
    }
}

#[tokio::test]
async fn bound_socket_with_replay_fills_gaps_and_ids_resume_after_restart() {
    let port = free_port();
    let replay_port = free_port();
    let events = Arc::new(MemEventPlane::new());
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let replay_endpoint = format!("tcp://127.0.0.1:{replay_port}");
    // The engine connects (vLLM with a tcp://HOST:PORT endpoint), so the bridge binds.
    let floor = kvmesh_kv_bridge::publish::restart_floor();
    let bridge = Bridge::start(
        events.clone(),
        &[
            "--zmq-endpoint",
            &endpoint,
            "--zmq-bind",
            "--zmq-replay-endpoint",
            &replay_endpoint,
        ],
    );
    let mut publisher = PubSocket::new();
    let connect = async {
        loop {
            if publisher.connect(&endpoint).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .unwrap();
    let seq = handshake(&mut publisher, &bridge).await;

    let tokens: Vec<u32> = (1..=12).collect();
    let lost = [
        batch(vec![stored(&[200], None, &tokens[..4], 0)]),
        batch(vec![stored(&[201], Some(200), &tokens[4..8], 0)]),
    ];
    let mut router = RouterSocket::new();
    router.bind(&replay_endpoint).await.unwrap();
    let buffer = vec![(seq, lost[0].clone()), (seq + 1, lost[1].clone())];
    let replay = tokio::spawn(serve_replay(router, buffer));
    publisher
        .send(frames(seq + 2, batch(vec![removed(&[200])])))
        .await
        .unwrap();

    let mut messages = stream(&events).await;
    let got = read_events(&mut messages, 3).await;
    let first = got[0].event_id;
    assert!(first >= floor);
    assert_eq!(
        got.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        [first, first + 1, first + 2]
    );
    assert!(matches!(kind(&got[0]), kv_event::Kind::Stored(s) if s.blocks[0].block_hash == 200));
    assert!(matches!(kind(&got[1]), kv_event::Kind::Stored(s) if s.parent_hash == Some(200)));
    assert!(matches!(kind(&got[2]), kv_event::Kind::Removed(_)));
    assert_eq!(bridge.metrics.zmq_replayed_batches.get(), 2);
    assert_eq!(bridge.metrics.zmq_gaps.get(), 0);
    replay.abort();
    bridge.stop().await;
    drop(publisher);

    // A restarted bridge for the same worker continues the ids it published before.
    let port = free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let mut publisher = PubSocket::new();
    publisher.bind(&endpoint).await.unwrap();
    let bridge = Bridge::start(events.clone(), &["--zmq-endpoint", &endpoint]);
    let seq = handshake(&mut publisher, &bridge).await;
    publisher
        .send(frames(seq, batch(vec![removed(&[201])])))
        .await
        .unwrap();
    let got = read_events(&mut messages, 1).await;
    assert_eq!(got[0].event_id, first + 3);
    bridge.stop().await;
}

/// An engine that restarts starts its sequence over: what it stored before is gone, so the
/// bridge clears the rank before the restarted engine's first events.
#[tokio::test]
async fn an_engine_restart_clears_the_rank() {
    let port = free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let mut publisher = PubSocket::new();
    publisher.bind(&endpoint).await.unwrap();
    let events = Arc::new(MemEventPlane::new());
    let bridge = Bridge::start(events.clone(), &["--zmq-endpoint", &endpoint]);
    let seq = handshake(&mut publisher, &bridge).await;
    let mut messages = stream(&events).await;
    let tokens: Vec<u32> = (1..=8).collect();
    publisher
        .send(frames(
            seq,
            batch(vec![stored(&[300], None, &tokens[..4], 0)]),
        ))
        .await
        .unwrap();
    publisher
        .send(frames(
            0,
            batch(vec![stored(&[400], None, &tokens[4..], 0)]),
        ))
        .await
        .unwrap();
    let got = read_events(&mut messages, 3).await;
    assert!(matches!(kind(&got[0]), kv_event::Kind::Stored(s) if s.blocks[0].block_hash == 300));
    assert!(matches!(kind(&got[1]), kv_event::Kind::Cleared(_)));
    assert!(matches!(kind(&got[2]), kv_event::Kind::Stored(s) if s.blocks[0].block_hash == 400));
    let first = got[0].event_id;
    assert_eq!(
        got.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        [first, first + 1, first + 2]
    );
    assert_eq!(bridge.metrics.zmq_seq_resets.get(), 1);
    bridge.stop().await;
}
