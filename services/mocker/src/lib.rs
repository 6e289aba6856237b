//! The kvmesh mock engine: a worker that behaves like a vLLM engine without a GPU.
//!
//! [`engine`] is the synchronous core (block manager, scheduler, timing, deterministic tokens) that
//! both the real-time server here and the virtual-time simulator drive. [`run`] starts
//! `--num-workers` workers, each with its own instance id, `Worker` gRPC server (or in-process
//! endpoint in embedded mode), KV event publisher and discovery registration.

pub mod driver;
pub mod embed;
pub mod engine;
pub mod fault;
mod guided;
pub mod opts;
mod tool_calls;
mod trace;
pub mod words;
pub mod worker;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvmesh_proto::v1::worker_server::WorkerServer;
use kvmesh_proto::v1::{ModelCard, ModelRecord, ModelRuntimeConfig};
use kvmesh_runtime::connect::{self, Embedded};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::registry::{Registry, instance_record};
use kvmesh_runtime::event_plane::{StreamConfig, ensure_stream_eventually};
use kvmesh_runtime::lifecycle::{Drain, ServiceLifecycle};
use kvmesh_runtime::names;
use kvmesh_runtime::worker_client::{INPROC_TRANSPORT, register_inproc, unregister_inproc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use opts::MockerOpts;

use crate::driver::Pace;
use crate::engine::EngineConfig;
use crate::worker::{MockWorker, PublishTarget};

/// Model-card flags: Chat | Completions.
const MODEL_TYPE_CHAT_COMPLETIONS: u32 = 1 | 2;

/// Runs the mocker's workers until `shutdown`, then unregisters them and stops.
///
/// With `embedded` (from `kvmesh up`) workers are reached in-process instead of over gRPC.
pub async fn run(
    mut opts: MockerOpts,
    embedded: Option<Embedded>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    opts.engine
        .apply_extra_engine_args()
        .map_err(|e| anyhow::anyhow!(e))?;
    let model = kvmesh_llm::ModelDir::load(&opts.model_path)
        .with_context(|| format!("--model-path {}", opts.model_path.display()))?;
    let tokenizer = model.tokenizer();
    let mut special: Vec<u32> = tokenizer.added_token_ids().to_vec();
    special.extend_from_slice(tokenizer.special_token_ids());
    let mut config = opts.engine.engine_config(
        tokenizer.vocab_size() as u32,
        special,
        model.context_length().map(|n| n as usize),
    );
    config.word_token_ids = words::whole_word_ids(tokenizer);
    if config.reasoning.is_none()
        && let Some(format) = opts.engine.reasoning_parser
    {
        config.reasoning = Some(reasoning_markers(format, tokenizer)?);
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid engine configuration: {e}"))?;
    let model_name = opts
        .model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&opts.model_path));
    let card = model_card(&opts, &model_name, &config);

    if let Some(seconds) = opts.engine.startup_time {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {}
        }
    }

    let events = connect::event_plane(&opts.runtime, embedded.as_ref()).await?;
    let namespace = opts.endpoint.namespace.clone();
    let mut lifecycle =
        ServiceLifecycle::new("mocker").with_registration_grace(opts.runtime.registration_grace());
    // With NATS down the worker serves and its KV events wait for the stream (publishes retry).
    ensure_stream_eventually(
        &events,
        &StreamConfig {
            name: names::kv_stream_name(&namespace),
            subjects: names::kv_stream_subjects(&namespace),
            max_age: Duration::from_secs(opts.runtime.nats_stream_max_age),
            duplicate_window: Duration::from_secs(120),
        },
        lifecycle.stop_token(),
    )
    .await?;
    let mut addresses = Vec::new();
    let mut inflight = Vec::new();
    // Worker tasks outlive the shutdown signal: they stop only after in-flight work drained.
    let workers_shutdown = lifecycle.stop_token();
    let stagger = opts.engine.stagger();
    for index in 0..opts.engine.num_workers {
        if index > 0 && !stagger.is_zero() {
            tokio::time::sleep(stagger).await;
        }
        if shutdown.is_cancelled() {
            break;
        }
        let discovery = connect::discovery(&opts.runtime, embedded.as_ref()).await?;
        let worker_id = discovery.instance_id();

        let (output_tx, output_rx) = mpsc::unbounded_channel();
        let mut ranks = Vec::new();
        for dp_rank in 0..opts.engine.data_parallel_size {
            let (tx, rx) = mpsc::unbounded_channel();
            ranks.push(tx);
            lifecycle.spawn(ends_well(driver::run_rank(
                worker_id,
                dp_rank,
                config.clone(),
                Pace {
                    speedup_ratio: opts.engine.speedup_ratio,
                    decode_speedup_ratio: opts.engine.decode_speedup_ratio,
                },
                rx,
                output_tx.clone(),
                workers_shutdown.clone(),
            )));
        }
        drop(output_tx);
        let target = PublishTarget {
            events: events.clone(),
            kv_subject: names::kv_subject(
                &namespace,
                &model_name,
                kvmesh_kv::kv_partition(worker_id, opts.runtime.kv_partitions),
            ),
            load_subject: names::load_subject(&namespace, &model_name),
            worker_id,
            publish_kv_events: config.enable_prefix_caching,
        };
        lifecycle.spawn(ends_well(worker::run_publisher(
            target,
            opts.engine.data_parallel_size as usize,
            output_rx,
            workers_shutdown.clone(),
        )));

        let mut service = MockWorker::new(
            ranks,
            tokenizer.clone(),
            opts.engine.tool_call_parser,
            config.seed,
        );
        if config.enable_prefix_caching {
            service =
                service.with_block_hash_cache(config.block_size, worker::BLOCK_HASH_CACHE_BYTES);
        }
        let service = service
            .with_fault_file(opts.fault_file.clone().map(fault::FaultFile))
            .with_work_gate(lifecycle.work_gate());
        inflight.push(service.inflight().clone());
        let is_inproc = embedded.as_ref().is_some_and(|e| !e.grpc_workers);
        let (address, transport) = if is_inproc {
            let address =
                register_inproc(&format!("mocker-{worker_id:x}"), Arc::new(service.clone()));
            (address, INPROC_TRANSPORT)
        } else {
            let port = if opts.runtime.tcp_rpc_port == 0 {
                0
            } else {
                opts.runtime.tcp_rpc_port.saturating_add(index as u16)
            };
            let bind: SocketAddr = format!("{}:{port}", opts.runtime.tcp_rpc_host)
                .parse()
                .with_context(|| format!("--tcp-rpc-host {}", opts.runtime.tcp_rpc_host))?;
            let listener = tokio::net::TcpListener::bind(bind)
                .await
                .with_context(|| format!("bind worker gRPC server on {bind}"))?;
            let local = listener.local_addr()?;
            lifecycle.serve_grpc(
                listener,
                tonic::service::Routes::new(
                    WorkerServer::new(service)
                        .max_decoding_message_size(opts.runtime.max_message_size())
                        .max_encoding_message_size(opts.runtime.max_message_size()),
                ),
                &opts.runtime.grpc_server_settings(),
            );
            (local.to_string(), "grpc")
        };

        register(&discovery, &opts, &model_name, &card, &address, transport).await?;
        tracing::info!(worker_id = %format!("{worker_id:x}"), %address, model = %model_name, "mock worker registered");
        lifecycle.registered(discovery);
        addresses.push(address);
    }

    let limit = Duration::from_secs(
        kvmesh_runtime::config::env_number::<u64>("DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS")
            .ok()
            .flatten()
            .unwrap_or(5),
    );
    let drain = Drain {
        limit,
        inflight: &inflight,
    };
    let result = lifecycle.run(&shutdown, drain, || {}).await;
    // Embedded workers leave the in-process table once they drained.
    for address in &addresses {
        unregister_inproc(address);
    }
    Ok(result?)
}

/// A task that ends without an outcome of its own, as a lifecycle task.
async fn ends_well(
    task: impl std::future::Future<Output = ()>,
) -> Result<(), std::convert::Infallible> {
    task.await;
    Ok(())
}

async fn register(
    discovery: &Arc<dyn Discovery>,
    opts: &MockerOpts,
    model_name: &str,
    card: &ModelCard,
    address: &str,
    transport: &str,
) -> anyhow::Result<()> {
    let endpoint = &opts.endpoint;
    let registry = Registry::new(discovery.clone());
    let record = ModelRecord {
        namespace: endpoint.namespace.clone(),
        model: model_name.to_string(),
        component: endpoint.component.clone(),
        endpoint: endpoint.endpoint.clone(),
        card: Some(card.clone()),
        ..Default::default()
    };
    registry.register_model(&record).await?;
    let instance = instance_record(
        &endpoint.namespace,
        &endpoint.component,
        &endpoint.endpoint,
        address,
        transport,
    );
    registry.register_instance(&instance).await?;
    Ok(())
}

fn model_card(opts: &MockerOpts, model_name: &str, config: &EngineConfig) -> ModelCard {
    let source =
        std::fs::canonicalize(&opts.model_path).unwrap_or_else(|_| opts.model_path.clone());
    ModelCard {
        display_name: model_name.to_string(),
        source_path: source.to_string_lossy().into_owned(),
        context_length: config.max_model_len.unwrap_or(0).min(u32::MAX as usize) as u32,
        kv_cache_block_size: config.block_size as u32,
        model_type: MODEL_TYPE_CHAT_COMPLETIONS,
        model_input: "Tokens".into(),
        runtime_config: Some(ModelRuntimeConfig {
            total_kv_blocks: Some(config.num_gpu_blocks as u64),
            max_num_seqs: Some(config.max_num_seqs as u64),
            max_num_batched_tokens: Some(config.max_num_batched_tokens as u64),
            prefill_tokens_per_second: prefill_speed(
                config.max_num_batched_tokens,
                opts.engine.speedup_ratio,
            ),
            data_parallel_start_rank: 0,
            data_parallel_size: opts.engine.data_parallel_size,
            tool_call_parser: opts
                .engine
                .tool_call_parser
                .map(|format| format.name().to_owned()),
            reasoning_parser: opts
                .engine
                .reasoning_parser
                .map(|format| format.name().to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Prompt tokens per second the engine prefills, published on the card so that routers give a
/// worker time for a long prefill: one full scheduler pass of prefill, at the timing model's
/// speed. `None` when the engine does not sleep (`--speedup-ratio 0`).
fn prefill_speed(max_num_batched_tokens: usize, speedup_ratio: f64) -> Option<u64> {
    let pass_ms = engine::timing::prefill_ms(max_num_batched_tokens) / speedup_ratio;
    (speedup_ratio > 0.0 && pass_ms > 0.0)
        .then(|| (max_num_batched_tokens as f64 * 1000.0 / pass_ms) as u64)
}

/// Thinking between `format`'s markers, tokenized with the model's tokenizer, for half of each
/// output.
fn reasoning_markers(
    format: kvmesh_llm::reasoning::ReasoningFormat,
    tokenizer: &kvmesh_llm::Tokenizer,
) -> anyhow::Result<engine::ReasoningConfig> {
    let (start, end) = format.markers();
    let encode = |text: &str| {
        tokenizer
            .encode(text, false)
            .with_context(|| format!("tokenize the {} marker {text:?}", format.name()))
    };
    Ok(engine::ReasoningConfig {
        start_thinking: encode(start)?.into(),
        end_thinking: encode(end)?.into(),
        thinking_ratio: 0.5,
    })
}

fn default_model_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string_lossy().into_owned())
}
