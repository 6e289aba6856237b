//! The one model-table watcher: a discovery record stream folded into [`DiscoveredRecords`], a
//! table rebuilt on every change, and a once-a-second tick, until shutdown. The frontend and
//! `kvmesh-router` differ only in what their table holds ([`FleetTable`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::{DiscoveredRecords, NamespaceFilter};

/// How often [`FleetTable::tick`] runs: routers age their load, tables expire what they keep
/// after a model's last worker left.
pub const TICK: Duration = Duration::from_secs(1);

/// A table of per-model routers that [`watch_fleet`] keeps current.
pub trait FleetTable: Send {
    /// Brings the models in line with `records` after discovery changed; an error stops the
    /// watcher (and so the process).
    fn reconcile(
        &mut self,
        records: &DiscoveredRecords,
        shutdown: &CancellationToken,
    ) -> impl Future<Output = Result<(), WatchError>> + Send;

    /// Periodic upkeep; returns whether the published table must change.
    fn tick(&mut self) -> bool;

    /// The process of discovery instance `instance_id` is gone (its lease expired or was
    /// revoked): every router releases what it tracks on that process's behalf — the requests
    /// a departed frontend routed through it, the load a departed replica synced to it.
    fn instance_departed(&mut self, instance_id: u64);

    /// Publishes the current models to the readers of the table.
    fn publish(&self);
}

/// Why the watcher stopped before shutdown.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The discovery watch could not start.
    #[error("discovery watch: {0}")]
    Watch(String),
    /// The discovery watch stream ended: the table can no longer be kept current.
    #[error("discovery watch ended")]
    Ended,
    /// A model could not be served as configured, and the configuration says not to go on.
    #[error("{0}")]
    Fatal(String),
}

/// Watches the records of `namespaces` and keeps `table` current until `shutdown`.
pub async fn watch_fleet<T: FleetTable>(
    discovery: Arc<dyn Discovery>,
    namespaces: NamespaceFilter,
    mut table: T,
    shutdown: CancellationToken,
) -> Result<(), WatchError> {
    let mut stream = Registry::new(discovery)
        .watch_records(namespaces)
        .await
        .map_err(|e| WatchError::Watch(e.to_string()))?;
    let mut records = DiscoveredRecords::default();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {
                if table.tick() {
                    table.publish();
                }
            }
            change = stream.next() => {
                let Some(change) = change else {
                    return Err(WatchError::Ended);
                };
                let removed = change.removed_instance();
                records.apply(change);
                table.reconcile(&records, &shutdown).await?;
                if let Some(instance_id) = removed
                    && !records.has_instance(instance_id)
                {
                    table.instance_departed(instance_id);
                }
                table.publish();
            }
        }
    }
}
