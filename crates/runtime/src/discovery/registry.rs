//! Typed records on top of any [`Discovery`] backend.
//!
//! Processes register `InstanceRecord`s and `ModelRecord`s (protobuf JSON; docs/discovery.md,
//! "Keys and records") and watch them as typed added/removed events, filtered by namespace
//! (docs/discovery.md, "Watching"). Values that do not decode are logged and skipped: a bad record
//! from one process must not take down the processes watching it.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use kvmesh_proto::v1::{InstanceRecord, ModelCard, ModelRecord};
use serde::de::DeserializeOwned;

use super::{Discovery, WatchEvent};
use crate::names::{self, InstanceKey, ModelKey};
use crate::{Error, Result};

pub use super::namespace_filter::NamespaceFilter;

/// A change to one record: added (or replaced) with its new value, or removed.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordEvent<R, K> {
    /// The record was registered or re-registered.
    Added(R),
    /// The record's key was deleted or expired. The record may never have been seen as added
    /// (it did not decode), so consumers treat an unknown key as a no-op.
    Removed(K),
}

/// Instance record changes.
pub type InstanceEvent = RecordEvent<InstanceRecord, InstanceKey>;

/// Model record changes.
pub type ModelEvent = RecordEvent<ModelRecord, ModelKey>;

/// A change to an instance or a model record, as one watch of both delivers them in order.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordChange {
    /// An instance record changed.
    Instance(Box<InstanceEvent>),
    /// A model record changed.
    Model(Box<ModelEvent>),
}

impl RecordChange {
    /// The instance id of a removed instance record, if this change is one.
    pub fn removed_instance(&self) -> Option<u64> {
        match self {
            Self::Instance(event) => match event.as_ref() {
                RecordEvent::Removed(key) => Some(key.instance_id),
                RecordEvent::Added(_) => None,
            },
            Self::Model(_) => None,
        }
    }

    /// The typed form of a raw watch event on the key root: `None` for keys that are neither
    /// kind, records of namespaces `filter` rejects, and values that do not decode (logged).
    pub fn from_watch(event: WatchEvent, filter: &NamespaceFilter) -> Option<Self> {
        if names::parse_instance_key(event.key()).is_some() {
            typed_event(
                event,
                filter,
                names::parse_instance_key,
                |k| &k.namespace,
                decode_instance,
            )
            .map(|event| Self::Instance(Box::new(event)))
        } else {
            typed_event(
                event,
                filter,
                names::parse_model_key,
                |k| &k.namespace,
                decode_model,
            )
            .map(|event| Self::Model(Box::new(event)))
        }
    }
}

/// Stream of instance and model record changes: existing records first, then changes in order.
pub type RecordWatch = Pin<Box<dyn Stream<Item = RecordChange> + Send>>;

/// Stream of instance record changes: existing records first, then changes in order.
pub type InstanceWatch = Pin<Box<dyn Stream<Item = InstanceEvent> + Send>>;

/// Stream of model record changes: existing records first, then changes in order.
pub type ModelWatch = Pin<Box<dyn Stream<Item = ModelEvent> + Send>>;

/// Checksum of a model card: lowercase hex (16 digits) of xxh3_64 over its canonical JSON
/// (protobuf JSON with object keys sorted), so equal cards always agree.
pub fn card_checksum(card: &ModelCard) -> String {
    let canonical = serde_json::to_value(card)
        .map(sort_keys)
        .and_then(|value| serde_json::to_vec(&value));
    let bytes = canonical.unwrap_or_else(|error| {
        tracing::warn!(error = %error, "model card not serializable, checksumming its debug form");
        format!("{card:?}").into_bytes()
    });
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// Rebuilds every object with its keys in sorted order (maps in cards are hash maps).
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, sort_keys(value)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

/// Rejects names that cannot be one key segment.
fn check_segment(what: &str, value: &str) -> Result<()> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
        return Err(Error::Discovery(format!("invalid {what} {value:?}")));
    }
    Ok(())
}

fn decode<T: DeserializeOwned>(what: &'static str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|error| Error::Decode {
        what,
        message: error.to_string(),
    })
}

fn decode_instance(key: &InstanceKey, value: &[u8]) -> Result<InstanceRecord> {
    let record: InstanceRecord = decode("instance record", value)?;
    let is_consistent = record.namespace == key.namespace
        && record.component == key.component
        && record.endpoint == key.endpoint
        && record.instance_id == key.instance_id;
    if !is_consistent {
        return Err(Error::Decode {
            what: "instance record",
            message: "fields disagree with its key".into(),
        });
    }
    Ok(record)
}

fn decode_model(key: &ModelKey, value: &[u8]) -> Result<ModelRecord> {
    let record: ModelRecord = decode("model record", value)?;
    let is_consistent = record.namespace == key.namespace
        && record.model == key.model
        && record.instance_id == key.instance_id;
    if !is_consistent {
        return Err(Error::Decode {
            what: "model record",
            message: "fields disagree with its key".into(),
        });
    }
    Ok(record)
}

/// Turns a raw watch event into a typed one; `None` for other keys and undecodable values.
fn typed_event<R, K>(
    event: WatchEvent,
    filter: &NamespaceFilter,
    parse: fn(&str) -> Option<K>,
    namespace: fn(&K) -> &str,
    decode: fn(&K, &[u8]) -> Result<R>,
) -> Option<RecordEvent<R, K>> {
    let parts = parse(event.key())?;
    if !filter.matches(namespace(&parts)) {
        return None;
    }
    match event {
        WatchEvent::Delete { .. } => Some(RecordEvent::Removed(parts)),
        WatchEvent::Put { key, value } => match decode(&parts, &value) {
            Ok(record) => Some(RecordEvent::Added(record)),
            Err(error) => {
                tracing::warn!(key = %key, error = %error, "skipping undecodable discovery record");
                None
            }
        },
    }
}

/// The instance record of one endpoint of this process, as every kvmesh service registers it:
/// its address and transport, CPU as the device, this build's version and the start time. The
/// instance id is left 0 for [`Registry::register_instance`] to fill in; callers add metadata.
pub fn instance_record(
    namespace: &str,
    component: &str,
    endpoint: &str,
    address: &str,
    transport: &str,
) -> InstanceRecord {
    InstanceRecord {
        namespace: namespace.to_string(),
        component: component.to_string(),
        endpoint: endpoint.to_string(),
        instance_id: 0,
        address: address.to_string(),
        transport: transport.to_string(),
        device_type: "cpu".to_string(),
        metadata: Default::default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    }
}

/// Typed access to discovery records for one process.
#[derive(Clone)]
pub struct Registry {
    discovery: Arc<dyn Discovery>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field(
                "instance_id",
                &format_args!("{:x}", self.discovery.instance_id()),
            )
            .finish()
    }
}

impl Registry {
    /// Wraps a backend.
    pub fn new(discovery: Arc<dyn Discovery>) -> Self {
        Self { discovery }
    }

    /// The backend, for raw access and for its lease.
    pub fn discovery(&self) -> &Arc<dyn Discovery> {
        &self.discovery
    }

    /// This process's instance id.
    pub fn instance_id(&self) -> u64 {
        self.discovery.instance_id()
    }

    /// Resolves a record's instance id: 0 means "this process"; another process's id is an error.
    fn own_id(&self, instance_id: u64) -> Result<u64> {
        let own = self.discovery.instance_id();
        match instance_id {
            0 => Ok(own),
            id if id == own => Ok(own),
            id => Err(Error::Discovery(format!(
                "record instance id {id:x} is not this process's id {own:x}"
            ))),
        }
    }

    /// Stores this process's instance record (an `instance_id` of 0 is filled in) and returns
    /// its key.
    pub async fn register_instance(&self, record: &InstanceRecord) -> Result<InstanceKey> {
        check_segment("namespace", &record.namespace)?;
        check_segment("component", &record.component)?;
        check_segment("endpoint", &record.endpoint)?;
        let mut record = record.clone();
        record.instance_id = self.own_id(record.instance_id)?;
        let key = InstanceKey {
            namespace: record.namespace.clone(),
            component: record.component.clone(),
            endpoint: record.endpoint.clone(),
            instance_id: record.instance_id,
        };
        let value = serde_json::to_vec(&record)
            .map_err(|error| Error::Discovery(format!("encode instance record: {error}")))?;
        self.discovery.put(&key.key(), Bytes::from(value)).await?;
        Ok(key)
    }

    /// Stores this process's model record and returns its key. The `instance_id` is filled in
    /// when 0, and `card_checksum` is always recomputed from the card.
    pub async fn register_model(&self, record: &ModelRecord) -> Result<ModelKey> {
        check_segment("namespace", &record.namespace)?;
        if record.model.is_empty() {
            return Err(Error::Discovery("empty model name".into()));
        }
        let mut record = record.clone();
        record.instance_id = self.own_id(record.instance_id)?;
        record.card_checksum = record.card.as_ref().map(card_checksum).unwrap_or_default();
        let key = ModelKey {
            namespace: record.namespace.clone(),
            model: record.model.clone(),
            instance_id: record.instance_id,
        };
        let value = serde_json::to_vec(&record)
            .map_err(|error| Error::Discovery(format!("encode model record: {error}")))?;
        self.discovery.put(&key.key(), Bytes::from(value)).await?;
        Ok(key)
    }

    /// Deletes an instance record this process registered.
    pub async fn unregister_instance(&self, key: &InstanceKey) -> Result<()> {
        self.discovery.delete(&key.key()).await
    }

    /// Deletes a model record this process registered.
    pub async fn unregister_model(&self, key: &ModelKey) -> Result<()> {
        self.discovery.delete(&key.key()).await
    }

    /// Every live instance record passing `filter`, in key order; undecodable ones are skipped.
    pub async fn list_instances(&self, filter: &NamespaceFilter) -> Result<Vec<InstanceRecord>> {
        let entries = self.discovery.list(&filter.key_prefix("instances")).await?;
        Ok(entries
            .into_iter()
            .filter_map(|kv| {
                let event = WatchEvent::Put {
                    key: kv.key,
                    value: kv.value,
                };
                match typed_event(
                    event,
                    filter,
                    names::parse_instance_key,
                    |k| &k.namespace,
                    decode_instance,
                ) {
                    Some(RecordEvent::Added(record)) => Some(record),
                    _ => None,
                }
            })
            .collect())
    }

    /// Every live model record passing `filter`, in key order; undecodable ones are skipped.
    pub async fn list_models(&self, filter: &NamespaceFilter) -> Result<Vec<ModelRecord>> {
        let entries = self.discovery.list(&filter.key_prefix("models")).await?;
        Ok(entries
            .into_iter()
            .filter_map(|kv| {
                let event = WatchEvent::Put {
                    key: kv.key,
                    value: kv.value,
                };
                match typed_event(
                    event,
                    filter,
                    names::parse_model_key,
                    |k| &k.namespace,
                    decode_model,
                ) {
                    Some(RecordEvent::Added(record)) => Some(record),
                    _ => None,
                }
            })
            .collect())
    }

    /// Watches instance records passing `filter`.
    pub async fn watch_instances(&self, filter: NamespaceFilter) -> Result<InstanceWatch> {
        let raw = self
            .discovery
            .watch(&filter.key_prefix("instances"))
            .await?;
        Ok(Box::pin(raw.filter_map(move |event| {
            futures::future::ready(typed_event(
                event,
                &filter,
                names::parse_instance_key,
                |k| &k.namespace,
                decode_instance,
            ))
        })))
    }

    /// Watches instance and model records passing `filter` in one stream, so a watcher that
    /// joins them (a worker serves a model once both exist) sees their changes in order.
    pub async fn watch_records(&self, filter: NamespaceFilter) -> Result<RecordWatch> {
        let raw = self.discovery.watch(&filter.root_prefix()).await?;
        Ok(Box::pin(raw.filter_map(move |event| {
            futures::future::ready(RecordChange::from_watch(event, &filter))
        })))
    }

    /// Watches model records passing `filter`.
    pub async fn watch_models(&self, filter: NamespaceFilter) -> Result<ModelWatch> {
        let raw = self.discovery.watch(&filter.key_prefix("models")).await?;
        Ok(Box::pin(raw.filter_map(move |event| {
            futures::future::ready(typed_event(
                event,
                &filter,
                names::parse_model_key,
                |k| &k.namespace,
                decode_model,
            ))
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_filter_follows_the_flags() {
        let prefix = NamespaceFilter::from_flags(Some("x"), Some("ns"));
        assert_eq!(prefix, NamespaceFilter::Prefix("ns".into()));
        assert!(prefix.matches("ns") && prefix.matches("ns-abc123") && !prefix.matches("n"));
        let exact = NamespaceFilter::from_flags(Some("ns"), None);
        assert!(exact.matches("ns") && !exact.matches("ns-abc123"));
        assert_eq!(
            NamespaceFilter::from_flags(None, None),
            NamespaceFilter::All
        );
        assert_eq!(exact.key_prefix("models"), "/kvmesh/ns/models/");
        assert_eq!(prefix.key_prefix("models"), "/kvmesh/ns");
        assert_eq!(NamespaceFilter::All.key_prefix("instances"), "/kvmesh/");
    }

    #[test]
    fn card_checksum_ignores_map_order_and_sees_every_field() {
        let mut card = ModelCard {
            display_name: "m".into(),
            kv_cache_block_size: 16,
            ..Default::default()
        };
        let base = card_checksum(&card);
        assert_eq!(base.len(), 16);
        assert!(
            base.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(card_checksum(&card.clone()), base);
        card.kv_cache_block_size = 32;
        assert_ne!(card_checksum(&card), base);

        let json = |pairs: &[(&str, &str)]| {
            let mut text = String::from("{\"display_name\":\"m\",\"user_data\":{");
            let fields: Vec<String> = pairs
                .iter()
                .map(|(k, v)| format!("\"{k}\":\"{v}\""))
                .collect();
            text.push_str(&fields.join(","));
            text.push_str("}}");
            serde_json::from_str::<ModelCard>(&text).unwrap()
        };
        let forward = json(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]);
        let backward = json(&[("d", "4"), ("c", "3"), ("b", "2"), ("a", "1")]);
        assert_eq!(card_checksum(&forward), card_checksum(&backward));
        assert_ne!(card_checksum(&forward), card_checksum(&json(&[("a", "1")])));
    }

    #[test]
    fn records_that_disagree_with_their_key_are_rejected() {
        let key = ModelKey {
            namespace: "ns".into(),
            model: "m".into(),
            instance_id: 5,
        };
        let good = br#"{"namespace":"ns","model":"m","instance_id":"5"}"#;
        assert!(decode_model(&key, good).is_ok());
        let other_id = br#"{"namespace":"ns","model":"m","instance_id":"6"}"#;
        assert!(matches!(
            decode_model(&key, other_id),
            Err(Error::Decode { .. })
        ));
        assert!(matches!(
            decode_model(&key, b"not json"),
            Err(Error::Decode { .. })
        ));
        assert!(matches!(
            decode_model(&key, b"[1,2]"),
            Err(Error::Decode { .. })
        ));
    }
}
