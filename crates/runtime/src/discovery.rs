//! Service discovery: where processes register what they serve and watch what others serve.
//!
//! [`Discovery`] is a key-value store whose keys are bound to the registering process's lease:
//! when the process dies its keys disappear. Three backends implement it side by side: etcd
//! (many hosts), files (one host, many processes) and memory (one process). The typed layer in
//! [`registry`] stores instance and model records on top of any of them.

pub mod conformance;
pub mod etcd;
pub mod file;
pub mod instances;
pub mod mem;
mod namespace_filter;
pub mod registry;

use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use tokio_util::sync::CancellationToken;

use crate::Result;

/// A change seen by a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or its value changed.
    Put {
        /// Full key.
        key: String,
        /// The new value.
        value: Bytes,
    },
    /// A key was deleted or expired.
    Delete {
        /// Full key.
        key: String,
    },
}

impl WatchEvent {
    /// The key the event is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Put { key, .. } | Self::Delete { key } => key,
        }
    }
}

/// A stream of watch events: first a `Put` for every existing key, then changes in order.
pub type WatchStream = Pin<Box<dyn Stream<Item = WatchEvent> + Send>>;

/// A key and its value, as returned by [`Discovery::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// Full key.
    pub key: String,
    /// Value bytes.
    pub value: Bytes,
}

/// A discovery backend. Keys put through it live as long as this process's lease.
#[async_trait]
pub trait Discovery: Send + Sync + 'static {
    /// This process's instance id: the etcd lease id, or a random never-reused u64.
    fn instance_id(&self) -> u64;

    /// Stores `value` at `key`, bound to this process's lease (replacing any previous value).
    async fn put(&self, key: &str, value: Bytes) -> Result<()>;

    /// Deletes `key` if this process owns it; deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<()>;

    /// Every live key under `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<KeyValue>>;

    /// Watches `prefix`: a `Put` for every live key, then every change in order. The stream
    /// survives backend reconnects without missing or duplicating events.
    async fn watch(&self, prefix: &str) -> Result<WatchStream>;

    /// Deletes every key this process put and ends its lease (graceful shutdown).
    async fn revoke(&self) -> Result<()>;

    /// Cancelled when the lease is lost for good; the process must then stop serving.
    fn lease_lost(&self) -> CancellationToken;
}
