//! The frontend's configuration: every option has a Dynamo-compatible flag and environment name.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};
use kvmesh_routing::{RouterArgs, RouterConfig};
use kvmesh_runtime::config::RuntimeOpts;

pub use kvmesh_router::decider::RemoteRouterMode;

mod chat;

pub use self::chat::{ChatOpts, ReasoningField};

/// Options of `kvmesh-frontend`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvmesh-frontend",
    version,
    about = "OpenAI-compatible HTTP edge of kvmesh"
)]
pub struct FrontendOpts {
    /// Shared runtime options (discovery, planes, logging).
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Frontend options.
    #[command(flatten)]
    pub frontend: FrontendArgs,
}

/// The frontend's own options, shared with `kvmesh up`.
#[derive(Debug, Clone, Args)]
pub struct FrontendArgs {
    /// HTTP options.
    #[command(flatten)]
    pub http: HttpOpts,

    /// KServe gRPC options.
    #[command(flatten)]
    pub kserve: KserveOpts,

    /// Chat API surfaces, processors, reasoning and tool presentation, the REPL.
    #[command(flatten)]
    pub chat: ChatOpts,

    /// Serve only workers of this namespace (unset: every namespace).
    #[arg(long, env = "DYN_NAMESPACE")]
    pub namespace: Option<String>,

    /// Serve only namespaces starting with this prefix; wins over --namespace.
    #[arg(long, env = "DYN_NAMESPACE_PREFIX")]
    pub namespace_prefix: Option<String>,

    /// Served name of the model read from --model-path.
    #[arg(long, env = "DYN_MODEL_NAME", value_parser = non_empty)]
    pub model_name: Option<String>,

    /// Local model directory whose tokenizer and chat template are used instead of the card's.
    #[arg(long, env = "DYN_MODEL_PATH", value_parser = existing_dir)]
    pub model_path: Option<PathBuf>,

    /// Prompt encoder: `default` (Hugging Face tokenizers) or `fastokens` (checked against the
    /// default on the model's own template output at load, else the default with a warning);
    /// `basetenkenizer` is taken as `fastokens`.
    #[arg(long, env = "DYN_TOKENIZER", value_enum, default_value_t = TokenizerChoice::Default)]
    pub tokenizer: TokenizerChoice,

    /// With `false`, a model `--tokenizer fastokens` cannot serve stops the frontend instead of
    /// falling back to the default tokenizer.
    #[arg(long, env = "DYN_TOKENIZER_FALLBACK", default_value = "true", value_parser = kvmesh_core::flags::parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub tokenizer_fallback: bool,
    /// Turn --tokenizer-fallback off.
    #[arg(long, overrides_with = "tokenizer_fallback")]
    pub no_tokenizer_fallback: bool,

    /// Bytes the process-wide prompt prefix cache may hold, in MiB (0 = off).
    #[arg(long, env = "KVMESH_TOKENIZER_CACHE_MB", default_value_t = 256)]
    pub tokenizer_cache_mb: u64,

    /// Threads that tokenize large prompts off the I/O threads (0 = one per CPU).
    #[arg(long, env = "DYN_PREPROCESS_WORKERS", default_value_t = 0)]
    pub dyn_preprocess_workers: u32,

    /// Log every request's stage timings (template, tokenize, route, first token).
    #[arg(long, env = "DYN_DEBUG_PERF", default_value = "false", value_parser = kvmesh_core::flags::parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub dyn_debug_perf: bool,
    /// Turn --dyn-debug-perf off.
    #[arg(long, overrides_with = "dyn_debug_perf")]
    pub no_dyn_debug_perf: bool,

    /// Tokens per KV block for hashing (default: the worker's card).
    #[arg(long, env = "DYN_KV_CACHE_BLOCK_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_cache_block_size: Option<u32>,

    /// Router options (`--router-mode` and the KV router's flags).
    #[command(flatten)]
    pub router: RouterArgs,

    /// Times one request may move to another worker when its worker fails mid-stream (0 = off,
    /// then the worker card's limit applies).
    #[arg(long, env = "DYN_MIGRATION_LIMIT", default_value_t = 0)]
    pub migration_limit: u32,

    /// Prompt plus generated tokens beyond which a request is no longer migratable.
    #[arg(long, env = "DYN_MIGRATION_MAX_SEQ_LEN", value_parser = clap::value_parser!(u32).range(1..))]
    pub migration_max_seq_len: Option<u32>,

    /// Route through `kvmesh-router` replicas: `auto` when some are registered in the model's
    /// namespace, `on` always (503 while none answers), `off` never (in-process router).
    #[arg(long, env = "KVMESH_USE_REMOTE_ROUTER", value_enum, default_value_t = RemoteRouterMode::Auto)]
    pub use_remote_router: RemoteRouterMode,

    /// Router replicas by address (`host:port`, comma-separated) instead of discovery; with
    /// them `--use-remote-router auto` routes remotely.
    #[arg(
        long = "router-address",
        env = "KVMESH_ROUTER_ADDRESSES",
        value_delimiter = ','
    )]
    pub router_addresses: Vec<String>,

    /// Milliseconds one overlap query to the indexer shards may take before it is answered
    /// without them (kv mode).
    #[arg(long, env = "KVMESH_INDEXER_QUERY_TIMEOUT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub indexer_query_timeout_ms: u64,

    /// Prometheus metric name prefix.
    #[arg(long, env = "DYN_METRICS_PREFIX", default_value = "dynamo_frontend", value_parser = metric_prefix)]
    pub metrics_prefix: String,
}

/// HTTP server options, including Dynamo's env-only variables (exposed as flags too).
#[derive(Debug, Clone, Args)]
pub struct HttpOpts {
    /// Address the HTTP server binds.
    #[arg(long, env = "DYN_HTTP_HOST", default_value = "0.0.0.0")]
    pub http_host: String,

    /// Port of the HTTP server.
    #[arg(long, env = "DYN_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,

    /// Largest request body in MiB; larger bodies get 413.
    #[arg(long, env = "DYN_HTTP_BODY_LIMIT_MB", default_value_t = 45, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_limit_mb: u64,

    /// MiB of request bodies held at once, being read or parsed; a body that does not fit
    /// waits, then gets the overload status (kvmesh addition).
    #[arg(long, env = "KVMESH_HTTP_BODY_BUDGET_MB", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_budget_mb: u64,

    /// Milliseconds a body waits for room in the body budget before it is refused (kvmesh
    /// addition).
    #[arg(long, env = "KVMESH_HTTP_BODY_BUDGET_WAIT_MS", default_value_t = 2000)]
    pub http_body_budget_wait_ms: u64,

    /// Seconds a client has to send a complete request head (HTTP/1.1 headers, or the first
    /// request of any connection); a slower client is disconnected (kvmesh addition).
    #[arg(long, env = "KVMESH_HTTP_HEADER_READ_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_read_timeout_secs: u64,

    /// Seconds a connection stays open with no request in flight (kvmesh addition).
    #[arg(long, env = "KVMESH_HTTP_IDLE_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_secs: u64,

    /// Most client connections served at once on each HTTP listener; more wait in the listen
    /// backlog until one closes (kvmesh addition).
    #[arg(long, env = "KVMESH_HTTP_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: u64,

    /// Seconds to drain in-flight requests on SIGTERM.
    #[arg(
        long,
        env = "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS",
        default_value_t = 5
    )]
    pub http_graceful_shutdown_timeout_secs: u64,

    /// Status used when every worker is busy (200-999; anything else falls back to 529).
    #[arg(long, env = "DYN_HTTP_OVERLOAD_STATUS_CODE", default_value = "529", value_parser = overload_status)]
    pub http_overload_status_code: u16,

    /// Interval of SSE keep-alive comments while a stream is idle (unset: none).
    #[arg(long, env = "DYN_HTTP_SSE_KEEP_ALIVE_INTERVAL_MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_sse_keep_alive_interval_ms: Option<u64>,

    /// Fail a request whose worker stays silent this long, before the first response or between
    /// two (migrated instead when `--migration-limit` allows).
    #[arg(long, env = "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_backend_stream_timeout_secs: Option<u64>,

    /// Milliseconds a stream waits for the worker's first response before committing its 200, so
    /// that an error arriving first gets its own status; unset or 0: the stream commits once the
    /// worker accepted the request (Dynamo sets this only by environment; the flag is kvmesh's).
    #[arg(long, env = "DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS", hide = true)]
    pub http_pre_commit_error_peek_ms: Option<u64>,

    /// Most inference requests in flight at once; past it a request gets the overload status.
    #[arg(long, env = "DYN_REJECTION_FRONTEND_REQUEST_CONCURRENCY_LIMIT", value_parser = clap::value_parser!(u64).range(1..))]
    pub rejection_frontend_request_concurrency_limit: Option<u64>,

    /// Dynamo's cap on runtime tasks; in kvmesh each request in flight is one task, so it caps
    /// requests in flight like --rejection-frontend-request-concurrency-limit.
    #[arg(long, env = "DYN_REJECTION_FRONTEND_RUNTIME_TASK_LIMIT", value_parser = clap::value_parser!(u64).range(1..))]
    pub rejection_frontend_runtime_task_limit: Option<u64>,

    /// Dynamo's cap on request-plane connections; in kvmesh each request in flight holds one
    /// worker stream, so it caps requests in flight too.
    #[arg(long, env = "DYN_REJECTION_FRONTEND_REQUEST_PLANE_CONNECTION_LIMIT", value_parser = clap::value_parser!(u64).range(1..))]
    pub rejection_frontend_request_plane_connection_limit: Option<u64>,

    /// File of API keys, one a line (blank lines and `#` comments skipped): the inference routes
    /// and KServe inference then need `Authorization: Bearer <key>` (kvmesh addition; the file is
    /// re-read when it changes).
    #[arg(long, env = "DYN_HTTP_API_KEYS_FILE", value_parser = existing_file)]
    pub http_api_keys_file: Option<PathBuf>,

    /// File of admin keys, in the same format: `/busy_threshold` then needs one (kvmesh
    /// addition).
    #[arg(long, env = "DYN_HTTP_ADMIN_KEYS_FILE", value_parser = existing_file)]
    pub http_admin_keys_file: Option<PathBuf>,
}

impl HttpOpts {
    /// The connection limits of the HTTP listeners.
    pub(crate) fn conn_limits(&self) -> crate::edge::ConnLimits {
        crate::edge::ConnLimits {
            header_read_timeout: Duration::from_secs(self.http_header_read_timeout_secs),
            idle_timeout: Duration::from_secs(self.http_idle_timeout_secs),
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
        }
    }

    /// The budget of request body bytes held at once.
    pub(crate) fn body_budget(&self) -> crate::http::BodyBudget {
        crate::http::BodyBudget::new(
            self.http_body_budget_mb,
            Duration::from_millis(self.http_body_budget_wait_ms),
        )
    }

    /// The most inference requests in flight: the smallest of the three rejection limits.
    pub fn inflight_limit(&self) -> Option<u64> {
        [
            self.rejection_frontend_request_concurrency_limit,
            self.rejection_frontend_runtime_task_limit,
            self.rejection_frontend_request_plane_connection_limit,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The KServe v2 gRPC edge (docs/kserve.md): instead of the OpenAI edge, or beside it.
#[derive(Debug, Clone, Args)]
pub struct KserveOpts {
    /// Serve KServe gRPC on `--http-host:--http-port` instead of the OpenAI HTTP edge; a side
    /// HTTP server on `--grpc-metrics-port` keeps `/metrics`, `/health`, `/live` and `/v1/models`.
    #[arg(long, env = "DYN_KSERVE_GRPC_SERVER", default_value = "false", value_parser = kvmesh_core::flags::parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub kserve_grpc_server: bool,
    /// Turn --kserve-grpc-server off.
    #[arg(long, overrides_with = "kserve_grpc_server")]
    pub no_kserve_grpc_server: bool,

    /// Port of the side HTTP server in `--kserve-grpc-server` mode.
    #[arg(long, env = "DYN_GRPC_METRICS_PORT", default_value_t = 8788)]
    pub grpc_metrics_port: u16,

    /// Serve KServe gRPC on this port of `--http-host` as well as the full HTTP edge (kvmesh
    /// addition; 0 = any free port).
    #[arg(long, env = "KVMESH_KSERVE_GRPC_PORT")]
    pub kserve_grpc_port: Option<u16>,

    /// Requests of one `ModelStreamInfer` stream run at once; the stream is read no further
    /// while that many are running (kvmesh addition).
    #[arg(long, env = "KVMESH_KSERVE_STREAM_CONCURRENCY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub kserve_stream_concurrency: u32,

    /// HTTP/2 connection flow-control window of the KServe gRPC server, in bytes (unset: the
    /// server default, 1 MiB).
    #[arg(long, env = "DYN_GRPC_INITIAL_CONNECTION_WINDOW_SIZE", hide = true, value_parser = clap::value_parser!(u32).range(65_535..=2_147_483_647))]
    pub grpc_initial_connection_window_size: Option<u32>,

    /// HTTP/2 per-stream flow-control window of the KServe gRPC server, in bytes (unset: the
    /// server default, 1 MiB).
    #[arg(long, env = "DYN_GRPC_INITIAL_STREAM_WINDOW_SIZE", hide = true, value_parser = clap::value_parser!(u32).range(65_535..=2_147_483_647))]
    pub grpc_initial_stream_window_size: Option<u32>,
}

impl KserveOpts {
    /// Whether KServe gRPC replaces the OpenAI edge (`--kserve-grpc-server`).
    pub fn grpc_server(&self) -> bool {
        kvmesh_core::flags::negatable(self.kserve_grpc_server, self.no_kserve_grpc_server)
    }
}

impl FrontendArgs {
    /// Whether a model `--tokenizer fastokens` cannot serve falls back to the default engine.
    pub fn tokenizer_fallback(&self) -> bool {
        kvmesh_core::flags::negatable(self.tokenizer_fallback, self.no_tokenizer_fallback)
    }

    /// Whether every request's stage timings are logged (`--dyn-debug-perf`).
    pub fn debug_perf(&self) -> bool {
        kvmesh_core::flags::negatable(self.dyn_debug_perf, self.no_dyn_debug_perf)
    }
}

/// `--tokenizer` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenizerChoice {
    /// Hugging Face `tokenizers`.
    Default,
    /// The `fastokens` engine.
    Fastokens,
    /// Another engine's name for `fastokens`'s role; served by `fastokens`.
    Basetenkenizer,
}

impl TokenizerChoice {
    /// The engine that serves this choice.
    pub fn engine(self) -> kvmesh_llm::TokenizerEngine {
        match self {
            TokenizerChoice::Default => kvmesh_llm::TokenizerEngine::Default,
            TokenizerChoice::Fastokens | TokenizerChoice::Basetenkenizer => {
                kvmesh_llm::TokenizerEngine::Fastokens
            }
        }
    }
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(value.to_string())
    }
}

fn existing_dir(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_dir() {
        Ok(path)
    } else {
        Err(format!("directory {value:?} does not exist"))
    }
}

fn existing_file(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("file {value:?} does not exist"))
    }
}

fn metric_prefix(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    if valid {
        Ok(value.to_string())
    } else {
        Err(format!("{value:?} is not a valid Prometheus metric name"))
    }
}

fn overload_status(value: &str) -> Result<u16, String> {
    Ok(value
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|status| (200..=999).contains(status))
        .unwrap_or(529))
}

impl FrontendArgs {
    /// Checks the options that clap cannot (the key files' contents, the router's cross-field
    /// rules); the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        for (flag, path) in [
            (
                "--http-api-keys-file (DYN_HTTP_API_KEYS_FILE)",
                &self.http.http_api_keys_file,
            ),
            (
                "--http-admin-keys-file (DYN_HTTP_ADMIN_KEYS_FILE)",
                &self.http.http_admin_keys_file,
            ),
        ] {
            if let Some(path) = path {
                let text = std::fs::read(path).map_err(|e| format!("{flag}: {e}"))?;
                crate::auth::KeySet::parse(&text)
                    .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
            }
        }
        if self.kserve.grpc_server() && self.kserve.kserve_grpc_port.is_some() {
            return Err("--kserve-grpc-port: with --kserve-grpc-server, KServe gRPC is served on --http-port; give one of the two".into());
        }
        crate::metrics::HistogramBuckets::from_process_env()?;
        self.router_config().map(|_| ())
    }

    /// Every WARN line start-up logs for these options: deprecated spellings and options, and
    /// each accepted option kvmesh does not act on yet with what it does instead.
    pub fn startup_warnings<I, S>(&self, argv: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut warnings = self.router.startup_warnings(argv);
        warnings.extend(self.chat.notices());
        let embedding_buckets = ["MIN", "MAX", "COUNT"].iter().any(|suffix| {
            std::env::var_os(format!("DYN_METRICS_EMBEDDING_LATENCY_{suffix}")).is_some()
        });
        if embedding_buckets {
            warnings.push("DYN_METRICS_EMBEDDING_LATENCY_* is not implemented yet; kvmesh has no embedding latency histogram and counts embedding requests in request_duration_seconds".into());
        }
        warnings
    }

    /// Logs [`Self::startup_warnings`] for the process arguments, one WARN each.
    pub fn log_startup_warnings(&self) {
        for warning in self.startup_warnings(std::env::args_os()) {
            tracing::warn!("{warning}");
        }
    }

    /// The routing configuration (deprecated aliases applied, validated).
    pub fn router_config(&self) -> Result<RouterConfig, String> {
        self.router.to_config().map_err(|error| error.to_string())
    }
}

#[cfg(test)]
mod tests;
