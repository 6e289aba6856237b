//! Entry point of the ZMQ frame fuzz target in `fuzz/` and of its corpus replay
//! (docs/security.md, "Fuzzing"): multipart messages as anything that reaches the bridge's SUB
//! socket can send them.

use std::sync::LazyLock;

use bytes::Bytes;
use kvmesh_proto::v1::KvEvent;
use prost::Message;

use crate::convert::Converter;
use crate::metrics::BridgeMetrics;
use crate::source::BatchProcessor;
use crate::wire;

/// The block size of the converter (vLLM's default); a stored event of another size is skipped.
const BLOCK_SIZE: usize = 16;

static METRICS: LazyLock<Option<BridgeMetrics>> = LazyLock::new(|| BridgeMetrics::new().ok());

/// One multipart message, its frames written as a 2-byte big-endian length and the bytes (the last
/// frame may run short): split into topic, sequence and msgpack payload, decoded and converted
/// as the source task does. Every converted event must survive protobuf encoding unchanged.
pub fn zmq_message(mut message: &[u8]) {
    let mut frames = Vec::new();
    while let [high, low, rest @ ..] = message {
        let len = usize::from(u16::from_be_bytes([*high, *low])).min(rest.len());
        frames.push(Bytes::copy_from_slice(&rest[..len]));
        message = &rest[len..];
    }
    let Ok(frames) = wire::split_frames(frames) else {
        return;
    };
    let Some(metrics) = METRICS.clone() else {
        return;
    };
    let processor = BatchProcessor::new(Converter::new(BLOCK_SIZE), 0, metrics);
    let Some(converted) = processor.process(&frames.payload) else {
        return;
    };
    assert!(!converted.events.is_empty());
    for event in converted.events {
        assert_eq!(
            KvEvent::decode(event.encode_to_vec().as_slice()).ok(),
            Some(event)
        );
    }
}
