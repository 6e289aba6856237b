//! Replicas running in this process, by discovery instance id, so a router in the same process
//! (`kvmesh up`, a frontend with `--serve-indexer`) calls them directly instead of over gRPC on
//! loopback. Instance ids are unique in a discovery backend, so an id found here is the replica
//! the caller discovered.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};

use crate::service::IndexerService;

fn table() -> &'static RwLock<HashMap<u64, IndexerService>> {
    static TABLE: OnceLock<RwLock<HashMap<u64, IndexerService>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Keeps a replica reachable in-process until dropped.
#[must_use = "the replica leaves the table when this is dropped"]
pub struct LocalReplica {
    instance_id: u64,
}

impl Drop for LocalReplica {
    fn drop(&mut self) {
        table()
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.instance_id);
    }
}

/// Makes `service`, registered in discovery as `instance_id`, reachable in-process.
pub fn register(instance_id: u64, service: IndexerService) -> LocalReplica {
    table()
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(instance_id, service);
    LocalReplica { instance_id }
}

/// The replica of `instance_id` if it runs in this process.
pub fn lookup(instance_id: u64) -> Option<IndexerService> {
    table()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&instance_id)
        .cloned()
}
