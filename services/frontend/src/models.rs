//! The frontend's view of the mesh: which models are served and by which workers, kept up to date
//! from discovery and read lock-free by every request.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use kvmesh_proto::v1::ModelCard;
use kvmesh_router::fleet::{self, DiscoveredRecords, FleetTable, IndexSettings, IndexSources};
use kvmesh_router::{LocalDecider, MigrationPolicy, ModelRouter, RemoteRouters, ReplicaDecider};
use kvmesh_routing::{RouterConfig, SharedRouter};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::worker_client::GrpcSettings;
use tokio_util::sync::CancellationToken;

use crate::error::FrontendError;
use crate::metrics::{FrontendMetrics, ModelConfig, ModelMetrics};
use crate::opts::RemoteRouterMode;
use crate::pipeline::Pipeline;
use crate::preprocess::Preprocess;

/// How long a model stays listed (answering 503) after its last worker left.
pub const MODEL_GRACE: Duration = Duration::from_secs(30);

pub use kvmesh_router::WorkerRef;

/// Everything a request for one model needs, immutable once published.
pub struct ModelEntry {
    /// Served model name.
    pub name: String,
    /// Creation time (Unix seconds) reported by `/v1/models`.
    pub created: u64,
    /// Tokenizer, chat template and output processing.
    pub pipeline: Arc<Pipeline>,
    /// The routing seam every request of the model goes through, over this version's workers.
    pub routing: ModelRouter,
    /// The model's in-process router (shared across table versions so its state persists).
    pub router: SharedRouter,
    /// Metric handles.
    pub metrics: ModelMetrics,
    /// Maximum prompt plus output tokens (0 = unknown).
    pub context_length: u32,
    /// Tokens per KV block.
    pub kv_cache_block_size: u32,
    /// Whether the workers take token ids (`model_input` other than `Text`): only such models
    /// are preprocessed by a custom chat processor.
    pub takes_tokens: bool,
}

impl ModelEntry {
    /// Whether the model is listed and served: it has workers, and its router has the
    /// `--router-min-initial-workers` it waits for (docs/discovery.md, "Readiness").
    pub fn is_ready(&self) -> bool {
        !self.routing.workers().is_empty() && self.router.is_ready()
    }
}

/// The table every request reads.
pub type ModelTable = Arc<ArcSwap<HashMap<String, Arc<ModelEntry>>>>;

/// Creates an empty table.
pub fn empty_table() -> ModelTable {
    Arc::new(ArcSwap::from_pointee(HashMap::new()))
}

/// Looks a model up for a request: 404 when unknown, 503 when known without workers.
pub fn find_model(table: &ModelTable, name: &str) -> Result<Arc<ModelEntry>, FrontendError> {
    match table.load().get(name) {
        Some(entry) if !entry.routing.workers().is_empty() => Ok(entry.clone()),
        Some(_) => Err(FrontendError::NoWorkers(name.to_string())),
        None => Err(FrontendError::ModelNotFound(name.to_string())),
    }
}

pub use kvmesh_router::fleet::NamespaceFilter;

/// Router clients of the watcher, by namespace.
struct Clients {
    indexes: IndexSources,
    remotes: Remotes,
}

/// Settings of the model watcher.
pub struct WatcherConfig {
    /// Namespace filter.
    pub namespaces: NamespaceFilter,
    /// `--model-path`: tokenizer and template from here instead of the card's source.
    pub model_path: Option<PathBuf>,
    /// `--model-name`: restricts `--model-path` to this model.
    pub model_name: Option<String>,
    /// `--kv-cache-block-size` override.
    pub kv_cache_block_size: Option<u32>,
    /// Routing configuration of every model's router.
    pub router: RouterConfig,
    /// Event plane the workers publish their load on.
    pub events: Arc<dyn EventPlane>,
    /// Discovery handle (indexer replicas are found through it).
    pub discovery: Arc<dyn Discovery>,
    /// Where routers read KV overlap (remote shards or an in-process index).
    pub index: IndexSettings,
    /// gRPC settings for worker connections.
    pub grpc: GrpcSettings,
    /// `--use-remote-router`: whether requests route through `kvmesh-router` replicas.
    pub remote_router: RemoteRouterMode,
    /// `--router-address`: replicas by address instead of discovery.
    pub router_addresses: Vec<String>,
    /// `--migration-limit` (0 = the card's).
    pub migration_limit: u32,
    /// `--migration-max-seq-len`.
    pub migration_max_seq_len: Option<u32>,
    /// Tokenizer engine, prefix cache and preprocessing pool of every model.
    pub preprocess: Arc<Preprocess>,
}

struct ModelState {
    card: ModelCard,
    checksum: String,
    pipeline: Arc<Pipeline>,
    routing: fleet::ModelRouting,
    remote: Option<RemoteRouters>,
    metrics: ModelMetrics,
    created: u64,
    workers: BTreeMap<u64, WorkerRef>,
    empty_since: Option<Instant>,
}

/// Router replica clients by namespace, connected on first use.
struct Remotes {
    discovery: Arc<dyn Discovery>,
    /// `--router-address`: these replicas serve every namespace, nothing is discovered.
    addresses: Vec<String>,
    clients: HashMap<String, RemoteRouters>,
}

impl Remotes {
    async fn get(
        &mut self,
        namespace: &str,
        shutdown: &CancellationToken,
    ) -> Option<RemoteRouters> {
        if let Some(client) = self.clients.get(namespace) {
            return Some(client.clone());
        }
        if !self.addresses.is_empty() {
            return match RemoteRouters::with_addresses(&self.addresses, REMOTE_ROUTER_TIMEOUT) {
                Ok(client) => {
                    self.clients.insert(namespace.to_string(), client.clone());
                    Some(client)
                }
                Err(error) => {
                    tracing::error!(%error, "--router-address: routing in-process");
                    None
                }
            };
        }
        match RemoteRouters::connect(
            self.discovery.clone(),
            namespace,
            REMOTE_ROUTER_TIMEOUT,
            shutdown.child_token(),
        )
        .await
        {
            Ok(client) => {
                self.clients.insert(namespace.to_string(), client.clone());
                Some(client)
            }
            Err(error) => {
                tracing::warn!(%namespace, %error, "cannot watch router replicas; routing in-process");
                None
            }
        }
    }
}

/// Limit of one report to a router replica, and of connecting to one.
const REMOTE_ROUTER_TIMEOUT: Duration = Duration::from_secs(3);

/// Watches discovery and keeps `table` current until `shutdown`.
pub async fn watch_models(
    discovery: Arc<dyn Discovery>,
    table: ModelTable,
    metrics: FrontendMetrics,
    config: WatcherConfig,
    shutdown: CancellationToken,
) -> Result<(), fleet::WatchError> {
    let clients = Clients {
        indexes: IndexSources::new(
            config.discovery.clone(),
            config.events.clone(),
            config.index.clone(),
        ),
        remotes: Remotes {
            discovery: config.discovery.clone(),
            addresses: config.router_addresses.clone(),
            clients: HashMap::new(),
        },
    };
    let namespaces = config.namespaces.clone();
    let served = ServedModels {
        table,
        metrics,
        config,
        clients,
        models: HashMap::new(),
        pipelines: HashMap::new(),
    };
    fleet::watch_fleet(discovery, namespaces, served, shutdown).await
}

/// The frontend's side of the one model-table watcher: a pipeline and a routing seam per model.
struct ServedModels {
    table: ModelTable,
    metrics: FrontendMetrics,
    config: WatcherConfig,
    clients: Clients,
    models: HashMap<String, ModelState>,
    /// Loaded tokenizers and templates by source, shared by models of one source.
    pipelines: HashMap<PathBuf, Arc<Pipeline>>,
}

impl FleetTable for ServedModels {
    async fn reconcile(
        &mut self,
        records: &DiscoveredRecords,
        shutdown: &CancellationToken,
    ) -> Result<(), fleet::WatchError> {
        reconcile(
            records,
            &mut self.models,
            &mut self.pipelines,
            &mut self.clients,
            &self.metrics,
            &self.config,
            shutdown,
        )
        .await
    }

    /// Ages every router's load and unlists a model [`MODEL_GRACE`] after its last worker left.
    fn tick(&mut self) -> bool {
        for state in self.models.values() {
            state.routing.router.tick();
        }
        let before = self.models.len();
        self.models.retain(|name, state| {
            let expired = state
                .empty_since
                .is_some_and(|since| since.elapsed() >= MODEL_GRACE);
            if expired {
                tracing::info!(model = %name, "model unlisted: no workers");
            }
            !expired
        });
        self.models.len() != before
    }

    fn instance_departed(&mut self, instance_id: u64) {
        for state in self.models.values() {
            state.routing.release_instance(instance_id);
        }
    }

    fn publish(&self) {
        publish(&self.table, &self.models, &self.config);
    }
}

/// Rebuilds model states from the known records: a worker serves a model once both its instance
/// record and its model record are present.
async fn reconcile(
    known: &DiscoveredRecords,
    models: &mut HashMap<String, ModelState>,
    pipelines: &mut HashMap<PathBuf, Arc<Pipeline>>,
    clients: &mut Clients,
    metrics: &FrontendMetrics,
    config: &WatcherConfig,
    shutdown: &CancellationToken,
) -> Result<(), fleet::WatchError> {
    let serving = known.serving();
    for (name, records) in &serving {
        if !models.contains_key(name) {
            let Some((record, _)) = records.first() else {
                continue;
            };
            let card = record.card.clone().unwrap_or_default();
            let source = model_source(&card, name, config);
            let pipeline = match pipelines.get(&source) {
                Some(pipeline) => pipeline.clone(),
                None => match load_pipeline(&source, &card, &config.preprocess).await {
                    Ok(pipeline) => {
                        pipelines.insert(source.clone(), pipeline.clone());
                        pipeline
                    }
                    Err(error) if config.preprocess.strict_engine => {
                        return Err(fleet::WatchError::Fatal(format!(
                            "cannot load model {name} from {}: {error}",
                            source.display()
                        )));
                    }
                    Err(error) => {
                        tracing::error!(model = %name, path = %source.display(), %error, "cannot load model");
                        continue;
                    }
                },
            };
            // Signed with this process's instance id, as replicas sign theirs, so that peers
            // syncing its load release it when this frontend leaves discovery.
            let router_id = format!("{:x}", config.discovery.instance_id());
            let setup = fleet::RouterSetup {
                config: &config.router,
                block_size_override: config.kv_cache_block_size,
                events: &config.events,
                router_id: Some(&router_id),
            };
            let Some(routing) = fleet::ModelRouting::build(
                name,
                &record.namespace,
                &card,
                &setup,
                &mut clients.indexes,
                shutdown,
            )
            .await
            else {
                continue;
            };
            let remote = match config.remote_router {
                RemoteRouterMode::Off => None,
                RemoteRouterMode::Auto | RemoteRouterMode::On => {
                    clients.remotes.get(&record.namespace, shutdown).await
                }
            };
            models.insert(
                name.clone(),
                ModelState {
                    checksum: record.card_checksum.clone(),
                    card,
                    pipeline,
                    routing,
                    remote,
                    metrics: metrics.for_model(name),
                    created: SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    workers: BTreeMap::new(),
                    empty_since: None,
                },
            );
        }
        let Some(state) = models.get_mut(name) else {
            continue;
        };
        for (record, _) in records {
            if record.card_checksum != state.checksum {
                tracing::info!(model = %name, worker_id = %format!("{:x}", record.instance_id), "worker card differs, newest wins");
                if let Some(card) = &record.card {
                    state.card = card.clone();
                }
                state.checksum = record.card_checksum.clone();
            }
        }
        let workers = state.routing.reconcile_workers(
            name,
            records,
            &state.workers,
            &config.grpc,
            config.kv_cache_block_size,
        );
        state.workers = workers;
        metrics.set_model_config(name, &model_config(&state.card, config));
    }
    for (name, state) in models.iter_mut() {
        if !serving.contains_key(name) && !state.workers.is_empty() {
            for id in state.workers.keys() {
                tracing::info!(model = %name, worker_id = %format!("{id:x}"), "worker removed");
                state.routing.router.remove_worker(*id);
            }
            state.workers.clear();
        }
        match (state.workers.is_empty(), state.empty_since) {
            (true, None) => state.empty_since = Some(Instant::now()),
            (false, Some(_)) => state.empty_since = None,
            _ => {}
        }
    }
    Ok(())
}

fn model_config(card: &ModelCard, config: &WatcherConfig) -> ModelConfig {
    let runtime = card.runtime_config.clone().unwrap_or_default();
    ModelConfig {
        context_length: u64::from(card.context_length),
        kv_cache_block_size: u64::from(
            config
                .kv_cache_block_size
                .unwrap_or(card.kv_cache_block_size),
        ),
        total_kv_blocks: runtime.total_kv_blocks.unwrap_or(0),
        max_num_seqs: runtime.max_num_seqs.unwrap_or(0),
        max_num_batched_tokens: runtime.max_num_batched_tokens.unwrap_or(0),
        migration_limit: u64::from(card.migration_limit),
    }
}

fn model_source(card: &ModelCard, name: &str, config: &WatcherConfig) -> PathBuf {
    match (&config.model_path, &config.model_name) {
        (Some(path), Some(only)) if only == name => path.clone(),
        (Some(path), None) => path.clone(),
        _ => PathBuf::from(&card.source_path),
    }
}

async fn load_pipeline(
    path: &Path,
    card: &ModelCard,
    preprocess: &Arc<Preprocess>,
) -> Result<Arc<Pipeline>, String> {
    let path = path.to_path_buf();
    let card = card.clone();
    let preprocess = preprocess.clone();
    tokio::task::spawn_blocking(move || Pipeline::load(&path, &card, &preprocess).map(Arc::new))
        .await
        .map_err(|e| format!("model load task failed: {e}"))?
        .map_err(|e| e.to_string())
}

fn publish(table: &ModelTable, models: &HashMap<String, ModelState>, config: &WatcherConfig) {
    let block_size_override = config.kv_cache_block_size;
    let mut next = HashMap::with_capacity(models.len());
    for (name, state) in models {
        let workers: Vec<WorkerRef> = state.workers.values().cloned().collect();
        let kv_cache_block_size = block_size_override.unwrap_or(state.card.kv_cache_block_size);
        let decider = ReplicaDecider {
            model: name.clone(),
            local: LocalDecider {
                router: state.routing.router.clone(),
                indexer: state.routing.indexer.clone(),
            },
            remote: state.remote.clone(),
            mode: config.remote_router,
            report_every: kv_cache_block_size,
        };
        let migration = MigrationPolicy {
            limit: if config.migration_limit > 0 {
                config.migration_limit
            } else {
                state.card.migration_limit
            },
            max_seq_len: config.migration_max_seq_len,
        };
        next.insert(
            name.clone(),
            Arc::new(ModelEntry {
                name: name.clone(),
                created: state.created,
                pipeline: state.pipeline.clone(),
                routing: ModelRouter::new(
                    name.clone(),
                    Arc::new(decider),
                    workers,
                    migration,
                    Arc::new(state.metrics.clone()),
                ),
                router: state.routing.router.clone(),
                metrics: state.metrics.clone(),
                context_length: state.card.context_length,
                kv_cache_block_size,
                takes_tokens: !state.card.model_input.eq_ignore_ascii_case("text"),
            }),
        );
    }
    table.store(Arc::new(next));
}
