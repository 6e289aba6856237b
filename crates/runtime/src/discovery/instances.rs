//! A live list of the instances registered under a discovery prefix (indexer replicas, router
//! replicas), mapped to whatever the caller keeps per instance (typically a gRPC client), for
//! callers that read it on every request without locking.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::StreamExt;
use kvmesh_proto::v1::InstanceRecord;
use tokio_util::sync::CancellationToken;

use super::{Discovery, WatchEvent};

/// The instances under one prefix, kept current by a background watch. Cloning is cheap.
pub struct InstanceList<T> {
    items: Arc<ArcSwap<Vec<T>>>,
}

impl<T> Clone for InstanceList<T> {
    fn clone(&self) -> Self {
        Self {
            items: self.items.clone(),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> InstanceList<T> {
    /// Watches `prefix` until `shutdown`, keeping `map(record)` for every instance record under
    /// it, ordered by key. A record `map` rejects (`None`) or that does not decode is logged and
    /// left out, as is `what` in the log lines.
    pub async fn watch(
        discovery: &dyn Discovery,
        prefix: &str,
        what: &'static str,
        map: impl Fn(&InstanceRecord) -> Option<T> + Send + 'static,
        shutdown: CancellationToken,
    ) -> crate::Result<Self> {
        let items: Arc<ArcSwap<Vec<T>>> = Arc::new(ArcSwap::from_pointee(Vec::new()));
        let mut watch = discovery.watch(prefix).await?;
        let published = items.clone();
        tokio::spawn(async move {
            let mut known: BTreeMap<String, T> = BTreeMap::new();
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    event = watch.next() => event,
                };
                match event {
                    Some(WatchEvent::Put { key, value }) => {
                        // A key rewritten with a record that cannot be used no longer names the
                        // instance it named before: its old entry goes.
                        match serde_json::from_slice::<InstanceRecord>(&value) {
                            Ok(record) => match map(&record) {
                                Some(item) => {
                                    known.insert(key, item);
                                }
                                None => {
                                    tracing::warn!(%key, what, "unusable instance record");
                                    known.remove(&key);
                                }
                            },
                            Err(error) => {
                                tracing::warn!(%key, %error, what, "undecodable instance record");
                                known.remove(&key);
                            }
                        }
                    }
                    Some(WatchEvent::Delete { key }) => {
                        known.remove(&key);
                    }
                    None => return,
                }
                published.store(Arc::new(known.values().cloned().collect()));
            }
        });
        Ok(Self { items })
    }

    /// A list that never changes (instances given by address instead of discovered).
    pub fn fixed(items: Vec<T>) -> Self {
        Self {
            items: Arc::new(ArcSwap::from_pointee(items)),
        }
    }

    /// The instances now.
    pub fn load(&self) -> Arc<Vec<T>> {
        self.items.load_full()
    }

    /// How many instances there are now.
    pub fn len(&self) -> usize {
        self.items.load().len()
    }

    /// Whether there are none now.
    pub fn is_empty(&self) -> bool {
        self.items.load().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::discovery::mem::MemStore;

    #[tokio::test]
    async fn follows_puts_and_deletes_under_the_prefix() {
        let store = MemStore::new();
        let writer = store.handle();
        let list = InstanceList::watch(
            &store.handle(),
            "/kvmesh/ns/instances/router/route/",
            "router",
            |record| (!record.address.is_empty()).then(|| record.address.clone()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let record = |address: &str| {
            serde_json::to_vec(&InstanceRecord {
                address: address.into(),
                ..Default::default()
            })
            .unwrap()
        };
        writer
            .put("/kvmesh/ns/instances/router/route/1", record("a:1").into())
            .await
            .unwrap();
        writer
            .put("/kvmesh/ns/instances/router/route/2", record("").into())
            .await
            .unwrap();
        writer
            .put("/kvmesh/ns/instances/indexer/query/3", record("c:3").into())
            .await
            .unwrap();
        let wait = |n: usize| {
            let list = list.clone();
            async move {
                for _ in 0..100 {
                    if list.len() == n {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            }
        };
        assert!(wait(1).await);
        assert_eq!(*list.load(), vec!["a:1".to_string()]);
        // Rewritten with a record the mapping rejects, then with one that does not decode: the
        // entry the key held goes each time.
        writer
            .put("/kvmesh/ns/instances/router/route/1", record("").into())
            .await
            .unwrap();
        assert!(wait(0).await);
        writer
            .put("/kvmesh/ns/instances/router/route/1", record("a:2").into())
            .await
            .unwrap();
        assert!(wait(1).await);
        writer
            .put(
                "/kvmesh/ns/instances/router/route/1",
                b"not json".to_vec().into(),
            )
            .await
            .unwrap();
        assert!(wait(0).await);
        writer
            .put("/kvmesh/ns/instances/router/route/1", record("a:1").into())
            .await
            .unwrap();
        assert!(wait(1).await);
        writer
            .delete("/kvmesh/ns/instances/router/route/1")
            .await
            .unwrap();
        assert!(wait(0).await);
    }
}
