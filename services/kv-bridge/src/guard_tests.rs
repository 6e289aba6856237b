//! The frame guard on crafted byte streams, and the relay cutting a real connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{Socket, SocketRecv, SubSocket};

use super::*;

/// A ZMTP 3.0 greeting with the NULL mechanism.
fn greeting() -> Vec<u8> {
    let mut bytes = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    let mut mechanism = b"NULL".to_vec();
    mechanism.resize(20, 0);
    bytes.extend(mechanism);
    bytes.resize(64, 0);
    bytes
}

/// A short frame with `flags` and `body`.
fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![flags, u8::try_from(body.len()).unwrap()];
    bytes.extend_from_slice(body);
    bytes
}

/// The READY command of a PUB socket.
fn ready() -> Vec<u8> {
    let mut body = b"\x05READY\x0bSocket-Type".to_vec();
    body.extend_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(b"PUB");
    frame(0b100, &body)
}

/// A long frame header announcing `len` bytes, without the body.
fn long_header(flags: u8, len: u64) -> Vec<u8> {
    let mut bytes = vec![flags | 0b010];
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes
}

#[test]
fn messages_under_the_limit_pass_in_any_chunking() {
    let mut stream = greeting();
    stream.extend(ready());
    stream.extend(frame(0b001, b"topic"));
    stream.extend(frame(0b001, &7u64.to_be_bytes()));
    stream.extend(frame(0, &[0x90; 80]));
    stream.extend(long_header(0, 100));
    stream.extend([0u8; 100]);
    for chunk in [1, 3, 64, stream.len()] {
        let mut guard = FrameGuard::new(100);
        for piece in stream.chunks(chunk) {
            guard.feed(piece).unwrap();
        }
    }
}

#[test]
fn a_frame_announcing_more_than_the_limit_is_refused_at_its_header() {
    let mut guard = FrameGuard::new(1 << 20);
    guard.feed(&greeting()).unwrap();
    guard.feed(&ready()).unwrap();
    // 1 TiB announced: refused once the 8 length bytes are in, before any body byte.
    let error = guard.feed(&long_header(0, 1 << 40)).unwrap_err();
    assert_eq!(
        error,
        Oversized {
            announced: 1 << 40,
            limit: 1 << 20
        }
    );
    // Nothing is kept per frame: the guard's size does not depend on what it read.
    assert!(std::mem::size_of::<FrameGuard>() <= 64);
}

#[test]
fn the_limit_counts_every_frame_of_a_multipart_message() {
    let mut guard = FrameGuard::new(100);
    guard.feed(&greeting()).unwrap();
    guard.feed(&frame(0b001, &[0; 60])).unwrap();
    let error = guard.feed(&frame(0, &[0; 60])).unwrap_err();
    assert_eq!(error.announced, 120);
    // A new message starts from zero.
    let mut guard = FrameGuard::new(100);
    guard.feed(&greeting()).unwrap();
    guard.feed(&frame(0, &[0; 60])).unwrap();
    guard.feed(&frame(0, &[0; 60])).unwrap();
}

#[test]
fn a_wildcard_bind_host_means_the_configured_one() {
    let mut guarding = Guarding {
        limit: 1,
        bind_host: "127.0.0.1".into(),
        metrics: BridgeMetrics::new().unwrap(),
        stop: CancellationToken::new(),
    };
    assert_eq!(guarding.bind_address("*:5557"), "127.0.0.1:5557");
    assert_eq!(guarding.bind_address("0.0.0.0:5557"), "127.0.0.1:5557");
    assert_eq!(guarding.bind_address("[::]:5557"), "127.0.0.1:5557");
    assert_eq!(guarding.bind_address("10.1.2.3:5557"), "10.1.2.3:5557");
    guarding.bind_host = "::".into();
    assert_eq!(guarding.bind_address("*:5557"), "[::]:5557");
}

#[test]
fn a_command_over_the_limit_is_refused() {
    let mut guard = FrameGuard::new(16);
    guard.feed(&greeting()).unwrap();
    assert!(guard.feed(&long_header(0b100, 17)).is_err());
}

/// A fake engine that completes the handshake and then announces a 1 TiB frame: the relay drops
/// the connection at the header, the bridge's SUB socket receives nothing, the drop is counted.
#[tokio::test]
async fn the_relay_drops_an_engine_that_announces_an_oversized_frame() {
    let engine = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine_address = engine.local_addr().unwrap();
    let metrics = BridgeMetrics::new().unwrap();
    let stop = CancellationToken::new();
    let guarding = Guarding {
        limit: 1 << 20,
        bind_host: "127.0.0.1".into(),
        metrics: metrics.clone(),
        stop: stop.clone(),
    };
    let relay = guarding
        .relay_to(&engine_address.to_string())
        .await
        .unwrap();
    // The fake engine: handshake, then a header announcing 1 TiB; it reports when the relay
    // closed its connection.
    let engine_side = tokio::spawn(async move {
        let (mut conn, _) = engine.accept().await.unwrap();
        conn.write_all(&greeting()).await.unwrap();
        conn.write_all(&ready()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        conn.write_all(&long_header(0, 1 << 40)).await.unwrap();
        let _ = conn.write_all(&[0u8; 1024]).await;
        let mut sink = [0u8; 4096];
        loop {
            match conn.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    let mut sub = SubSocket::new();
    sub.subscribe("").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), sub.connect(&relay))
        .await
        .expect("handshake through the relay")
        .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), engine_side).await;
    assert!(closed.is_ok(), "the relay kept the connection open");
    assert_eq!(metrics.zmq_oversized.get(), 1);
    let received = tokio::time::timeout(Duration::from_millis(300), sub.recv()).await;
    assert!(received.is_err(), "nothing reaches the socket");
    stop.cancel();
}
