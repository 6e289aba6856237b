//! Entry point of the KV event fuzz target in `fuzz/` and of its corpus replay (docs/security.md,
//! "Fuzzing"): KV event batches as anyone who can publish on the KV subjects can send them.

use kvmesh_kv::RadixIndex;
use kvmesh_proto::v1 as pb;
use prost::Message;

use crate::convert::{batch_from_proto, batch_to_proto};

/// A sequence of length-delimited `kvmesh.v1.KvEventBatch` messages, each decoded and applied as
/// the consumer applies one message of the KV stream. After each batch the index must pass its
/// full consistency check, after all of them it must rebuild from its own dump with the same
/// digest, and a converted batch must convert back to itself.
pub fn kv_event_batches(mut messages: &[u8]) {
    let mut index = RadixIndex::new();
    let mut probes: Vec<u64> = Vec::new();
    while !messages.is_empty() {
        let Ok(message) = pb::KvEventBatch::decode_length_delimited(&mut messages) else {
            break;
        };
        let batch = batch_from_proto(message);
        assert_eq!(batch_from_proto(batch_to_proto(&batch)), batch);
        for event in &batch.events {
            if let kvmesh_kv::KvEventKind::Stored(stored) = &event.kind {
                probes.extend(stored.blocks.iter().map(|block| block.tokens_hash));
            }
        }
        index.apply(&batch);
        if let Err(broken) = index.validate() {
            panic!("index inconsistent after {batch:?}: {broken}");
        }
    }
    let scores = index.find_matches(&probes);
    assert!(scores.frequencies.len() <= probes.len());
    assert!(scores.frequencies.windows(2).all(|pair| pair[0] >= pair[1]));
    let rebuilt = RadixIndex::from_dump(&index.dump());
    assert_eq!(rebuilt.digest(), index.digest());
    assert_eq!(rebuilt.num_blocks(), index.num_blocks());
}
