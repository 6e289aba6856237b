//! Entry point of the discovery record fuzz target in `fuzz/` and of its corpus replay
//! (docs/security.md, "Fuzzing"): keys and values as anyone who can write to the discovery store
//! can put them there.

use bytes::Bytes;
use kvmesh_proto::v1::ModelRecord;

use crate::discovery::WatchEvent;
use crate::discovery::registry::{NamespaceFilter, RecordChange, RecordEvent, card_checksum};
use crate::names::{self, InstanceKey, ModelKey};

/// One discovery entry: the key up to the first newline, the value after it. Read as a put and
/// as a delete of that key, as every watcher reads them. A record that decodes must agree with
/// its key, read back the same after encoding, and a model name must survive the key and
/// subject encodings.
pub fn discovery_record(entry: &[u8]) {
    let (key, value) = match entry.iter().position(|&byte| byte == b'\n') {
        Some(at) => (&entry[..at], &entry[at + 1..]),
        None => (entry, &[][..]),
    };
    let key = String::from_utf8_lossy(key).into_owned();
    let filter = NamespaceFilter::from_flags(None, None);
    let put = WatchEvent::Put {
        key: key.clone(),
        value: Bytes::copy_from_slice(value),
    };
    if let Some(change) = RecordChange::from_watch(put, &filter) {
        check_added(&key, change, &filter);
    }
    let delete = WatchEvent::Delete { key: key.clone() };
    match RecordChange::from_watch(delete, &filter) {
        None => {}
        Some(RecordChange::Instance(event)) => match *event {
            RecordEvent::Removed(parts) => assert_eq!(parts.key(), key),
            RecordEvent::Added(_) => panic!("a delete of {key:?} read as an addition"),
        },
        Some(RecordChange::Model(event)) => match *event {
            RecordEvent::Removed(parts) => check_model_name(&parts.model),
            RecordEvent::Added(_) => panic!("a delete of {key:?} read as an addition"),
        },
    }
}

fn check_added(key: &str, change: RecordChange, filter: &NamespaceFilter) {
    let (again, value) = match change {
        RecordChange::Instance(event) => {
            let RecordEvent::Added(record) = *event else {
                panic!("a put of {key:?} read as a removal");
            };
            assert_eq!(InstanceKey::of(&record).key(), key);
            let value = serde_json::to_vec(&record).unwrap_or_default();
            let again = RecordChange::Instance(Box::new(RecordEvent::Added(record)));
            (again, value)
        }
        RecordChange::Model(event) => {
            let RecordEvent::Added(record) = *event else {
                panic!("a put of {key:?} read as a removal");
            };
            let parts = ModelKey::of(&record);
            assert_eq!(names::parse_model_key(&parts.key()), Some(parts));
            check_model_name(&record.model);
            let value = serde_json::to_vec(&record).unwrap_or_default();
            // Cards hold hash maps: the checksum must not depend on their order in memory.
            if let Ok(reread) = serde_json::from_slice::<ModelRecord>(&value) {
                let checksum = |r: &ModelRecord| r.card.as_ref().map(card_checksum);
                assert_eq!(checksum(&reread), checksum(&record));
            }
            let again = RecordChange::Model(Box::new(RecordEvent::Added(record)));
            (again, value)
        }
    };
    let put = WatchEvent::Put {
        key: key.to_owned(),
        value: Bytes::from(value),
    };
    assert_eq!(RecordChange::from_watch(put, filter), Some(again));
}

/// Model names travel in keys and in NATS subjects, each with its own escaping.
fn check_model_name(model: &str) {
    let segment = names::encode_model_segment(model);
    assert_eq!(
        names::decode_model_segment(&segment).as_deref(),
        Some(model)
    );
    let token = names::subject_token(model);
    assert!(!token.contains(['.', '*', '>', ' ']), "{token:?}");
    assert_eq!(names::decode_subject_token(&token).as_deref(), Some(model));
}
