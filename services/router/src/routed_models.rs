//! The models a `kvmesh-router` replica routes, kept current from discovery: a router per
//! discovered model (workers from discovery, load from the event plane, overlap from the indexer
//! shards, optional replica sync) and the seam its `Generate` calls run through.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use kvmesh_indexer::client::IndexerClient;
use kvmesh_routing::config::RouterConfig;
use kvmesh_routing::shared::SharedRouter;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::worker_client::GrpcSettings;
use tokio_util::sync::CancellationToken;

use crate::decider::LocalDecider;
use crate::fleet::{self, DiscoveredRecords, FleetTable, IndexSources, NamespaceFilter};
use crate::generation::{MigrationPolicy, ModelRouter, NoObserver, WorkerRef};

/// One model as this replica routes it.
pub struct RoutedModel {
    /// Served model name.
    pub name: String,
    /// Namespace its workers registered in.
    pub namespace: String,
    /// Its router.
    pub router: SharedRouter,
    /// Its namespace's indexer shards (kv mode with events).
    pub indexer: Option<IndexerClient>,
    /// The seam `Generate` runs requests through, over this table version's workers.
    pub seam: ModelRouter,
}

impl RoutedModel {
    /// Model `name` of `namespace` routed by `router` (overlap from `indexer` when remote), its
    /// `Generate` calls going to `workers` through the seam.
    pub fn new(
        name: &str,
        namespace: &str,
        router: SharedRouter,
        indexer: Option<IndexerClient>,
        workers: Vec<WorkerRef>,
    ) -> Self {
        let decider = Arc::new(LocalDecider {
            router: router.clone(),
            indexer: indexer.clone(),
        });
        Self {
            name: name.to_string(),
            namespace: namespace.to_string(),
            router,
            indexer,
            seam: ModelRouter::new(
                name,
                decider,
                workers,
                MigrationPolicy::default(),
                Arc::new(NoObserver),
            ),
        }
    }
}

/// The models this replica routes, read lock-free by every call.
pub type RoutedTable = Arc<ArcSwap<HashMap<String, Arc<RoutedModel>>>>;

/// What the model watcher needs.
pub struct FleetConfig {
    /// Namespaces served.
    pub namespaces: NamespaceFilter,
    /// Configuration of every model's router.
    pub router: RouterConfig,
    /// `--kv-cache-block-size` override.
    pub kv_cache_block_size: Option<u32>,
    /// Worker load, KV events and replica sync.
    pub events: Arc<dyn EventPlane>,
    /// Discovery (workers, indexer replicas).
    pub discovery: Arc<dyn Discovery>,
    /// The KV index of each namespace (remote shards or in-process).
    pub indexes: IndexSources,
    /// gRPC settings of worker connections.
    pub grpc: GrpcSettings,
    /// Prefix of every router id this replica signs sync events with.
    pub router_id: String,
}

struct ModelState {
    namespace: String,
    routing: fleet::ModelRouting,
    workers: BTreeMap<u64, WorkerRef>,
}

/// Watches discovery and keeps `table` current until `shutdown`: a router per model with
/// workers; a model whose last worker left is dropped (its tracked load is gone with them).
pub async fn watch_models(
    table: RoutedTable,
    config: FleetConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let discovery = config.discovery.clone();
    let namespaces = config.namespaces.clone();
    let fleet = RoutedFleet {
        table,
        config,
        models: HashMap::new(),
    };
    Ok(fleet::watch_fleet(discovery, namespaces, fleet, shutdown).await?)
}

/// The replica's side of the one model-table watcher.
struct RoutedFleet {
    table: RoutedTable,
    config: FleetConfig,
    models: HashMap<String, ModelState>,
}

impl FleetTable for RoutedFleet {
    async fn reconcile(
        &mut self,
        records: &DiscoveredRecords,
        shutdown: &CancellationToken,
    ) -> Result<(), fleet::WatchError> {
        reconcile(records, &mut self.models, &mut self.config, shutdown).await;
        Ok(())
    }

    fn tick(&mut self) -> bool {
        for state in self.models.values() {
            state.routing.router.tick();
        }
        false
    }

    fn instance_departed(&mut self, instance_id: u64) {
        for state in self.models.values() {
            state.routing.release_instance(instance_id);
        }
    }

    fn publish(&self) {
        publish(&self.table, &self.models);
    }
}

async fn reconcile(
    records: &DiscoveredRecords,
    models: &mut HashMap<String, ModelState>,
    config: &mut FleetConfig,
    shutdown: &CancellationToken,
) {
    let serving = records.serving();
    models.retain(|name, _| {
        let keep = serving.contains_key(name);
        if !keep {
            tracing::info!(model = %name, "model removed: no workers");
        }
        keep
    });
    for (name, workers) in &serving {
        let Some((first, _)) = workers.first() else {
            continue;
        };
        if !models.contains_key(name) {
            let card = first.card.clone().unwrap_or_default();
            let setup = fleet::RouterSetup {
                config: &config.router,
                block_size_override: config.kv_cache_block_size,
                events: &config.events,
                router_id: Some(&config.router_id),
            };
            let Some(routing) = fleet::ModelRouting::build(
                name,
                &first.namespace,
                &card,
                &setup,
                &mut config.indexes,
                shutdown,
            )
            .await
            else {
                continue;
            };
            models.insert(
                name.clone(),
                ModelState {
                    namespace: first.namespace.clone(),
                    routing,
                    workers: BTreeMap::new(),
                },
            );
        }
        let Some(state) = models.get_mut(name) else {
            continue;
        };
        let next = state.routing.reconcile_workers(
            name,
            workers,
            &state.workers,
            &config.grpc,
            config.kv_cache_block_size,
        );
        state.workers = next;
    }
}

fn publish(table: &RoutedTable, models: &HashMap<String, ModelState>) {
    let next = models
        .iter()
        .map(|(name, state)| {
            let workers = state.workers.values().cloned().collect();
            let model = RoutedModel::new(
                name,
                &state.namespace,
                state.routing.router.clone(),
                state.routing.indexer.clone(),
                workers,
            );
            (name.clone(), Arc::new(model))
        })
        .collect();
    table.store(Arc::new(next));
}
