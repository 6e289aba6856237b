//! Rust types and gRPC stubs for kvmesh's protobuf contracts (`proto/` at the repository root).
//!
//! Nothing here is written by hand: `build.rs` compiles the `.proto` files at build time. Messages
//! stored in discovery also implement serde with the canonical protobuf JSON mapping (pbjson),
//! keeping the proto field names so that `etcdctl` output matches Dynamo's spelling.

/// kvmesh contracts, version 1.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/kvmesh.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/kvmesh.v1.serde.rs"));
}

/// The KServe v2 inference protocol as Triton clients speak it (`proto/kserve/`, package
/// `inference`), for the frontend's KServe gRPC edge.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

pub use pbjson_types;

#[cfg(test)]
mod tests {
    use super::v1::*;

    #[test]
    fn kserve_messages_keep_the_field_numbers_clients_use() {
        use prost::Message as _;
        let request = super::inference::ModelInferRequest {
            raw_input_contents: vec![b"x".to_vec()],
            ..Default::default()
        };
        // Field 7, length-delimited: tag byte (7 << 3) | 2.
        assert_eq!(request.encode_to_vec(), vec![0x3a, 1, b'x']);
        let response = super::inference::ModelStreamInferResponse {
            error_message: "e".into(),
            ..Default::default()
        };
        assert_eq!(response.encode_to_vec(), vec![0x0a, 1, b'e']);
        let config = super::inference::ModelConfig {
            backend: "b".into(),
            ..Default::default()
        };
        // Field 17 needs a two-byte tag: (17 << 3) | 2 = 138 as a varint.
        assert_eq!(config.encode_to_vec(), vec![0x8a, 0x01, 1, b'b']);
    }

    #[test]
    fn instance_record_json_uses_proto_names_and_string_u64() {
        let record = InstanceRecord {
            namespace: "dynamo".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
            instance_id: u64::MAX,
            address: "127.0.0.1:9000".into(),
            ..Default::default()
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["instance_id"], serde_json::json!(u64::MAX.to_string()));
        let back: InstanceRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
        let camel: InstanceRecord =
            serde_json::from_str(r#"{"instanceId":"7","deviceType":"cpu"}"#).unwrap();
        assert_eq!(camel.instance_id, 7);
        assert_eq!(camel.device_type, "cpu");
    }

    #[test]
    fn kv_event_batch_field_numbers_match_the_spec() {
        use prost::Message;
        let batch = KvEventBatch {
            worker_id: 1,
            dp_rank: 0,
            events: vec![KvEvent {
                event_id: 0,
                tier: StorageTier::Device as i32,
                kind: Some(kv_event::Kind::Cleared(KvCleared {})),
            }],
            published_at_ms: 0,
            worker_removed: false,
            worker_readmitted: false,
        };
        // worker_id = 1 (tag 0x08 value 1), events = 3 (tag 0x1a, length 4):
        // KvEvent { cleared = 5 (tag 0x2a, length 0) } with zero event_id and tier omitted.
        assert_eq!(
            batch.encode_to_vec(),
            vec![0x08, 0x01, 0x1a, 0x02, 0x2a, 0x00]
        );
    }
}
