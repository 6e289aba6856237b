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
use tokio::sync::watch;
use tokio::time::Instant;

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

    /// Where this process's registration stands. A backend that loses its lease puts every key
    /// back under a new lease with the same id as soon as it can, and says so here.
    fn registration(&self) -> watch::Receiver<RegistrationStatus>;
}

/// Whether the keys of this process are listed for everyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationState {
    /// The lease is alive: every key this process put is listed.
    Held,
    /// The backend cannot be reached. The lease may well survive (a restarted etcd renews every
    /// lease it held); others see no change until the backend is back.
    Unreachable,
    /// The backend said the lease is gone, so its keys are gone for everyone; the backend is
    /// putting them back under a new lease with the same id.
    Lost,
}

/// A registration's state, since when, and how often it was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationStatus {
    /// The current state.
    pub state: RegistrationState,
    /// When the current state began.
    pub since: Instant,
    /// Times the lease was lost since the process started.
    pub num_losses: u64,
}

impl RegistrationStatus {
    /// A registration that holds from now on.
    pub fn held() -> Self {
        Self {
            state: RegistrationState::Held,
            since: Instant::now(),
            num_losses: 0,
        }
    }

    /// Moves `status` to `state` (a move to the same state changes nothing); a move to `Lost`
    /// counts a loss.
    pub fn enter(status: &watch::Sender<Self>, state: RegistrationState) {
        status.send_if_modified(|current| {
            if current.state == state {
                return false;
            }
            current.state = state;
            current.since = Instant::now();
            if state == RegistrationState::Lost {
                current.num_losses += 1;
            }
            true
        });
    }
}
