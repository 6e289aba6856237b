//! In-process discovery: a shared map with watch channels.
//!
//! `kvmesh up` runs a frontend and N workers as separate "processes" inside one OS process: each
//! gets its own [`MemDiscovery`] handle (own random instance id, own keys) attached to one
//! [`MemStore`], so they see each other exactly as separate processes would through etcd.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{Discovery, KeyValue, RegistrationStatus, WatchEvent, WatchStream};
use crate::{Error, Result};

/// A random, non-zero u64 for backends that have no server to hand out instance ids.
///
/// 64 random bits make a collision between live or past instances vanishingly unlikely, which
/// is what "instance ids are never reused" (docs/discovery.md, "Instance ids and leases") needs.
pub fn random_instance_id() -> u64 {
    loop {
        let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
        // v4 fixes 4 bits of `high` and 2 of `low` at different positions: the xor is random.
        let id = high ^ low;
        if id != 0 {
            return id;
        }
    }
}

struct Entry {
    value: Bytes,
    owner: u64,
}

struct Watcher {
    prefix: String,
    events_tx: mpsc::UnboundedSender<WatchEvent>,
}

#[derive(Default)]
struct StoreState {
    entries: BTreeMap<String, Entry>,
    watchers: Vec<Watcher>,
}

impl StoreState {
    /// Sends `event` to every watcher whose prefix matches, forgetting watchers that went away.
    fn notify(&mut self, event: &WatchEvent) {
        self.watchers.retain(|watcher| {
            !event.key().starts_with(&watcher.prefix)
                || watcher.events_tx.send(event.clone()).is_ok()
        });
    }

    fn remove_owned_by(&mut self, owner: u64) {
        let keys: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.owner == owner)
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            self.entries.remove(&key);
            self.notify(&WatchEvent::Delete { key });
        }
    }
}

/// The shared map that [`MemDiscovery`] handles attach to; cheap to clone (one map, many
/// clones).
#[derive(Clone, Default)]
pub struct MemStore {
    state: Arc<Mutex<StoreState>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new handle on this store: one simulated process with its own random instance id.
    pub fn handle(&self) -> MemDiscovery {
        MemDiscovery::new(self)
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        // The state stays consistent even if a holder panicked: every mutation is one step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemStore")
            .field("num_keys", &state.entries.len())
            .field("num_watchers", &state.watchers.len())
            .finish()
    }
}

/// One process's view of a [`MemStore`]: its keys live until it deletes them or calls
/// [`Discovery::revoke`].
#[derive(Debug)]
pub struct MemDiscovery {
    store: MemStore,
    instance_id: u64,
    is_revoked: AtomicBool,
    registration: tokio::sync::watch::Sender<RegistrationStatus>,
}

impl MemDiscovery {
    /// Attaches a new handle (a new random instance id) to `store`.
    pub fn new(store: &MemStore) -> Self {
        Self {
            store: store.clone(),
            instance_id: random_instance_id(),
            is_revoked: AtomicBool::new(false),
            registration: tokio::sync::watch::Sender::new(RegistrationStatus::held()),
        }
    }

    /// The store this handle is attached to, to attach further handles.
    pub fn store(&self) -> &MemStore {
        &self.store
    }

    /// Moves this handle's registration to `state`, for tests of what processes do when a
    /// real backend loses or regains its lease.
    #[doc(hidden)]
    pub fn simulate_registration(&self, state: super::RegistrationState) {
        RegistrationStatus::enter(&self.registration, state);
    }

    /// Simulates this process crashing, for tests: its keys vanish at once, as they would when
    /// the process exits, and further puts fail.
    #[doc(hidden)]
    pub fn abort_keepalive(&self) {
        self.is_revoked.store(true, Ordering::SeqCst);
        self.store.lock().remove_owned_by(self.instance_id);
    }
}

#[async_trait]
impl Discovery for MemDiscovery {
    fn instance_id(&self) -> u64 {
        self.instance_id
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        if self.is_revoked.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost);
        }
        let mut state = self.store.lock();
        state.entries.insert(
            key.to_owned(),
            Entry {
                value: value.clone(),
                owner: self.instance_id,
            },
        );
        state.notify(&WatchEvent::Put {
            key: key.to_owned(),
            value,
        });
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let mut state = self.store.lock();
        let is_owned = state
            .entries
            .get(key)
            .is_some_and(|entry| entry.owner == self.instance_id);
        if is_owned {
            state.entries.remove(key);
            state.notify(&WatchEvent::Delete {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let state = self.store.lock();
        Ok(state
            .entries
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, entry)| KeyValue {
                key: key.clone(),
                value: entry.value.clone(),
            })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let mut state = self.store.lock();
        // Snapshot and registration happen under one lock: nothing is missed or seen twice.
        for (key, entry) in state
            .entries
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
        {
            let _ = events_tx.send(WatchEvent::Put {
                key: key.clone(),
                value: entry.value.clone(),
            });
        }
        state.watchers.push(Watcher {
            prefix: prefix.to_owned(),
            events_tx,
        });
        Ok(Box::pin(UnboundedReceiverStream::new(events_rx)))
    }

    async fn revoke(&self) -> Result<()> {
        self.is_revoked.store(true, Ordering::SeqCst);
        self.store.lock().remove_owned_by(self.instance_id);
        Ok(())
    }

    fn registration(&self) -> tokio::sync::watch::Receiver<RegistrationStatus> {
        self.registration.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[test]
    fn random_ids_differ_and_are_not_zero() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| random_instance_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&0));
    }

    #[tokio::test]
    async fn handles_share_one_store_but_own_their_keys() {
        let store = MemStore::new();
        let first = store.handle();
        let second = store.handle();
        assert_ne!(first.instance_id(), second.instance_id());
        first.put("/k/a", Bytes::from_static(b"1")).await.unwrap();
        second.delete("/k/a").await.unwrap();
        assert_eq!(second.list("/k/").await.unwrap().len(), 1);
        let mut watch = second.watch("/k/").await.unwrap();
        first.revoke().await.unwrap();
        assert!(matches!(watch.next().await, Some(WatchEvent::Put { .. })));
        assert_eq!(
            watch.next().await,
            Some(WatchEvent::Delete { key: "/k/a".into() })
        );
        assert!(matches!(
            first.put("/k/b", Bytes::new()).await,
            Err(Error::LeaseLost)
        ));
    }
}
