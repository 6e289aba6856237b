//! What every process that routes needs from discovery and the event plane: which workers serve
//! which model, each worker's runtime config, the load workers publish, and the indexer shards of
//! a namespace. The frontend (in-process routers) and `kvmesh-router` (remote replicas) both build
//! their per-model routers from these pieces.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use kvmesh_indexer::client::IndexerClient;
use kvmesh_indexer::shard::ShardState;
use kvmesh_proto::v1::{InstanceRecord, ModelCard, ModelRecord};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::registry::{RecordChange, RecordEvent};
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::names;
use kvmesh_runtime::names::{InstanceKey, ModelKey};
use kvmesh_runtime::worker_client::{GrpcSettings, connect_worker};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use kvmesh_routing::shared::SharedRouter;

use crate::generation::WorkerRef;
use kvmesh_routing::worker::{MAX_DATA_PARALLEL_RANKS, RuntimeConfig, WorkerInfo};

pub use kvmesh_runtime::discovery::registry::NamespaceFilter;
pub use watch::{FleetTable, WatchError, watch_fleet};

pub mod watch;

/// The instance and model records seen in discovery, as a watch delivers them.
#[derive(Debug, Default)]
pub struct DiscoveredRecords {
    instances: HashMap<InstanceKey, InstanceRecord>,
    models: HashMap<ModelKey, ModelRecord>,
}

impl DiscoveredRecords {
    /// Applies one change from [`kvmesh_runtime::discovery::registry::Registry::watch_records`].
    pub fn apply(&mut self, change: RecordChange) {
        match change {
            RecordChange::Instance(event) => match *event {
                RecordEvent::Added(record) => {
                    self.instances.insert(InstanceKey::of(&record), record);
                }
                RecordEvent::Removed(key) => {
                    self.instances.remove(&key);
                }
            },
            RecordChange::Model(event) => match *event {
                RecordEvent::Added(record) => {
                    self.models.insert(ModelKey::of(&record), record);
                }
                RecordEvent::Removed(key) => {
                    self.models.remove(&key);
                }
            },
        }
    }

    /// Whether any instance record of discovery instance `instance_id` is present.
    pub fn has_instance(&self, instance_id: u64) -> bool {
        self.instances
            .keys()
            .any(|key| key.instance_id == instance_id)
    }

    /// Every model with the workers serving it: a worker serves a model once both its instance
    /// record and its model record are present.
    pub fn serving(&self) -> HashMap<String, Vec<(&ModelRecord, &InstanceRecord)>> {
        let instances: HashMap<(&str, u64), &InstanceRecord> = self
            .instances
            .values()
            .map(|record| ((record.namespace.as_str(), record.instance_id), record))
            .collect();
        let mut serving: HashMap<String, Vec<(&ModelRecord, &InstanceRecord)>> = HashMap::new();
        for record in self.models.values() {
            if let Some(instance) = instances.get(&(record.namespace.as_str(), record.instance_id))
            {
                serving
                    .entry(record.model.clone())
                    .or_default()
                    .push((record, instance));
            }
        }
        for workers in serving.values_mut() {
            workers.sort_by_key(|(_, instance)| instance.instance_id);
        }
        serving
    }
}

/// The router's view of a discovered worker: its device and the runtime config of its card.
pub fn worker_info(instance: &InstanceRecord, card: Option<&ModelCard>) -> WorkerInfo {
    let runtime = card
        .and_then(|card| card.runtime_config.as_ref())
        .map(|rc| RuntimeConfig {
            total_kv_blocks: rc.total_kv_blocks,
            max_num_batched_tokens: rc.max_num_batched_tokens,
            data_parallel_start_rank: rc.data_parallel_start_rank,
            data_parallel_size: rc.data_parallel_size,
        });
    if let Some(rc) = &runtime
        && rc.data_parallel_size > MAX_DATA_PARALLEL_RANKS
    {
        tracing::warn!(
            worker_id = %format!("{:x}", instance.instance_id),
            data_parallel_size = rc.data_parallel_size,
            "worker card advertises more data-parallel ranks than the router serves; using {MAX_DATA_PARALLEL_RANKS}"
        );
    }
    WorkerInfo {
        worker_id: instance.instance_id,
        device_type: if instance.device_type.is_empty() {
            "cuda".to_string()
        } else {
            instance.device_type.clone()
        },
        runtime,
    }
}

/// Feeds the load workers publish for `model` into its router until aborted.
pub fn spawn_load_feed(
    events: Arc<dyn EventPlane>,
    namespace: String,
    model: String,
    router: SharedRouter,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let subject = names::load_subject(&namespace, &model);
        let mut subscription = match events.subscribe(&subject).await {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::warn!(%subject, %error, "cannot subscribe to worker load");
                return;
            }
        };
        while let Some(message) = subscription.next().await {
            match kvmesh_proto::v1::WorkerLoad::decode(message.payload) {
                Ok(load) => router.update_load(crate::wire::load_from_proto(&load)),
                Err(error) => tracing::debug!(%subject, %error, "undecodable worker load"),
            }
        }
    })
}

/// Where a model's router reads KV overlap.
#[derive(Clone)]
pub enum ModelIndex {
    /// `kvmesh-indexer` shards of the namespace, over gRPC (`--use-remote-indexer`).
    Remote(IndexerClient),
    /// An index this process keeps from the namespace's event stream.
    Local(Arc<ShardState>),
}

/// Settings of the indexes a routing process reads.
#[derive(Clone)]
pub struct IndexSettings {
    /// Query shards over gRPC instead of keeping an index in-process.
    pub use_remote_indexer: bool,
    /// `--kv-partitions` of the namespace.
    pub kv_partitions: u32,
    /// Deadline of one remote shard query.
    pub remote_timeout: Duration,
    /// Retention of the KV event stream (when this process creates it).
    pub stream_max_age: Duration,
    /// Apply threads per model of an in-process index.
    pub lanes: usize,
}

/// The index of each namespace, connected or started on first use and kept for the owner's life.
pub struct IndexSources {
    discovery: Arc<dyn Discovery>,
    events: Arc<dyn EventPlane>,
    settings: IndexSettings,
    indexes: HashMap<String, ModelIndex>,
}

impl IndexSources {
    /// Indexes found through `discovery` (remote) or fed from `events` (in-process).
    pub fn new(
        discovery: Arc<dyn Discovery>,
        events: Arc<dyn EventPlane>,
        settings: IndexSettings,
    ) -> Self {
        Self {
            discovery,
            events,
            settings,
            indexes: HashMap::new(),
        }
    }

    /// The index of `namespace`; `None` (routing without overlap) when it cannot be had.
    pub async fn get(
        &mut self,
        namespace: &str,
        shutdown: &CancellationToken,
    ) -> Option<ModelIndex> {
        if let Some(index) = self.indexes.get(namespace) {
            return Some(index.clone());
        }
        let settings = &self.settings;
        let index = if settings.use_remote_indexer {
            IndexerClient::connect(
                self.discovery.clone(),
                namespace,
                settings.kv_partitions,
                settings.remote_timeout,
                shutdown.child_token(),
            )
            .await
            .map(ModelIndex::Remote)
        } else {
            kvmesh_indexer::embedded::start(
                self.events.clone(),
                self.discovery.clone(),
                namespace,
                settings.kv_partitions,
                settings.stream_max_age,
                settings.lanes,
                shutdown.child_token(),
            )
            .await
            .map(ModelIndex::Local)
        };
        match index {
            Ok(index) => {
                self.indexes.insert(namespace.to_string(), index.clone());
                Some(index)
            }
            Err(error) => {
                tracing::warn!(%namespace, %error, "no KV index; routing without overlap");
                None
            }
        }
    }
}

/// Attaches `index` to a new router core: an in-process index becomes the core's overlap
/// source; a remote one is returned for the caller to query before each decision.
pub fn attach_index(
    core: kvmesh_routing::RouterCore,
    index: Option<ModelIndex>,
) -> (kvmesh_routing::RouterCore, Option<IndexerClient>) {
    match index {
        Some(ModelIndex::Local(state)) => (core.with_overlap_source(state), None),
        Some(ModelIndex::Remote(client)) => (core, Some(client)),
        None => (core, None),
    }
}

/// One model's routing state in a routing process: the router, its remote index (if any), and
/// the tasks that feed it (published worker load, replica sync). The tasks stop when it drops.
pub struct ModelRouting {
    /// The model's router.
    pub router: SharedRouter,
    /// Tokens per block the router hashes prompts with.
    pub block_size: u32,
    /// The namespace's indexer shards, when overlap is read remotely.
    pub indexer: Option<IndexerClient>,
    load_task: tokio::task::JoinHandle<()>,
    sync_stop: CancellationToken,
}

impl Drop for ModelRouting {
    fn drop(&mut self) {
        self.load_task.abort();
        self.sync_stop.cancel();
    }
}

/// What building a model's router needs besides the model itself.
pub struct RouterSetup<'a> {
    /// Configuration of every model's router.
    pub config: &'a kvmesh_routing::RouterConfig,
    /// `--kv-cache-block-size` override.
    pub block_size_override: Option<u32>,
    /// Worker load and replica sync.
    pub events: &'a Arc<dyn EventPlane>,
    /// Prefix of the router id this process signs sync events with (`None`: a random id).
    pub router_id: Option<&'a str>,
}

impl ModelRouting {
    /// Builds the router of model `name` in `namespace` (block size from `card` unless
    /// overridden), attaches the namespace's index in kv mode, starts replica sync when
    /// configured and the load feed. `None` (logged) when the configuration is rejected.
    pub async fn build(
        name: &str,
        namespace: &str,
        card: &ModelCard,
        setup: &RouterSetup<'_>,
        indexes: &mut IndexSources,
        shutdown: &CancellationToken,
    ) -> Option<Self> {
        let config = setup.config;
        let block_size = setup
            .block_size_override
            .unwrap_or(card.kv_cache_block_size)
            .max(1);
        let core =
            match kvmesh_routing::RouterCore::new(config.clone(), name, block_size, seed_now()) {
                Ok(core) => match setup.router_id {
                    Some(prefix) => core.with_router_id(format!("{prefix}-{name}")),
                    None => core,
                },
                Err(error) => {
                    tracing::error!(model = %name, %error, "cannot build the router");
                    return None;
                }
            };
        let uses_index = config.mode == kvmesh_routing::RouterMode::Kv
            && config.kv.use_kv_events
            && config.kv.overlap_score_credit > 0.0;
        let index = if uses_index {
            indexes.get(namespace, shutdown).await
        } else {
            None
        };
        let (core, indexer) = attach_index(core, index);
        let router = SharedRouter::new(core, Arc::new(kvmesh_routing::MonotonicClock::new()));
        let sync_stop = shutdown.child_token();
        if config.replica_sync
            && let Err(error) = crate::replica_sync::start(
                setup.events.clone(),
                namespace,
                router.clone(),
                sync_stop.clone(),
            )
            .await
        {
            tracing::warn!(model = %name, %error, "replica sync unavailable");
        }
        let load_task = spawn_load_feed(
            setup.events.clone(),
            namespace.to_string(),
            name.to_string(),
            router.clone(),
        );
        tracing::info!(model = %name, block_size, "model added");
        Some(Self {
            router,
            block_size,
            indexer,
            load_task,
            sync_stop,
        })
    }
}

impl ModelRouting {
    /// Releases what this model's router tracks for departed instance `instance_id`
    /// ([`FleetTable::instance_departed`]).
    pub fn release_instance(&self, instance_id: u64) -> usize {
        self.router
            .with_core(|core, now| core.release_instance(instance_id, now))
    }

    /// Warns when a worker's card advertises a block size other than the one this model routes
    /// with: its KV events hash other blocks, so its cache never matches a prompt and kv routing
    /// treats it as cold (run every worker of a model with one block size, or set
    /// `--kv-cache-block-size` to theirs).
    pub fn check_block_size(&self, model: &str, worker_id: u64, card: Option<&ModelCard>) {
        if let Some(card) = card
            && card.kv_cache_block_size > 0
            && card.kv_cache_block_size != self.block_size
        {
            tracing::warn!(
                %model,
                worker_id = %format!("{worker_id:x}"),
                worker_block_size = card.kv_cache_block_size,
                routing_block_size = self.block_size,
                "worker's KV block size differs from the model's: its cache will not match prompts"
            );
        }
    }
}

impl ModelRouting {
    /// The model's workers after a discovery change: `current` kept for workers still listed,
    /// a connection made for each new one (logged, its block size checked unless
    /// `block_size_override`), every listed worker upserted into the router (card updates such
    /// as runtime config apply after the first sight too), and the router told of every worker
    /// that left.
    pub fn reconcile_workers(
        &self,
        model: &str,
        listed: &[(&ModelRecord, &InstanceRecord)],
        current: &BTreeMap<u64, WorkerRef>,
        grpc: &GrpcSettings,
        block_size_override: Option<u32>,
    ) -> BTreeMap<u64, WorkerRef> {
        let mut next = BTreeMap::new();
        for (record, instance) in listed {
            let id = instance.instance_id;
            let first_response_timeout = crate::generation::first_response_timeout(
                record
                    .card
                    .as_ref()
                    .and_then(|card| card.runtime_config.as_ref())
                    .and_then(|rc| rc.prefill_tokens_per_second),
            );
            let worker = match current.get(&id) {
                Some(existing) => WorkerRef {
                    first_response_timeout,
                    ..existing.clone()
                },
                None => match connect_worker(&instance.address, grpc) {
                    Ok(endpoint) => {
                        tracing::info!(model = %model, worker_id = %format!("{id:x}"), address = %instance.address, "worker added");
                        if block_size_override.is_none() {
                            self.check_block_size(model, id, record.card.as_ref());
                        }
                        WorkerRef {
                            id,
                            endpoint,
                            first_response_timeout,
                        }
                    }
                    Err(error) => {
                        tracing::warn!(worker_id = %format!("{id:x}"), %error, "cannot reach worker");
                        continue;
                    }
                },
            };
            self.router
                .upsert_worker(worker_info(instance, record.card.as_ref()));
            next.insert(id, worker);
        }
        for id in current.keys() {
            if !next.contains_key(id) {
                tracing::info!(model = %model, worker_id = %format!("{id:x}"), "worker removed");
                self.router.remove_worker(*id);
            }
        }
        next
    }
}

/// The workers a retry may go to: every listed worker not tried yet and allowed by the
/// request's own restriction, if it has one.
pub fn untried_workers(
    listed: impl IntoIterator<Item = u64>,
    tried: &[u64],
    allowed: Option<&Vec<u64>>,
) -> Vec<u64> {
    listed
        .into_iter()
        .filter(|id| !tried.contains(id) && allowed.is_none_or(|allowed| allowed.contains(id)))
        .collect()
}

/// A seed for a router's RNG that differs between processes and restarts.
pub fn seed_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests;
