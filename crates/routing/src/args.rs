//! The router's command-line flags and environment variables (docs/flags.md, "Router flags"),
//! for `#[command(flatten)]` into the frontend, the router service and `kvmesh up`.
//!
//! Names, environment variables, defaults and ranges are exactly Dynamo's. Booleans are
//! strict (`1 true yes on` / `0 false no off`) and negatable (`--x` / `--no-x`); nullable
//! thresholds accept the literal `None`. Invalid values stop start-up with a message naming the
//! flag. [`RouterArgs::to_config`] applies the deprecated-alias rules and validates.

use std::ffi::OsStr;
use std::time::Duration;

use clap::Args;
use kvmesh_core::flags::{negatable, parse_bool};

mod adaptive;
mod deprecated;
mod ejection;
mod later;
mod values;

pub use self::adaptive::AdaptiveArgs;
pub use self::deprecated::{DEPRECATED_ALIASES, LEGACY_OVERLAP_WEIGHT_ENV};
pub use self::ejection::EjectionArgs;
pub use self::later::{AisArgs, LaterRouterArgs};

use self::values::{
    finite_non_negative, nullable_fraction, nullable_non_negative, nullable_tokens, positive,
    prune_ratio, unit_interval,
};

use crate::config::{
    ApproxCachePolicy, BusyThresholds, ConfigError, KvRouterConfig, QueuePolicy, RouterConfig,
    RouterMode, SessionAffinityMode, apply_legacy_overlap_weight,
};

/// A nullable threshold: a number, or `None` (the check is off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nullable<T>(pub Option<T>);

/// Every router flag the routing core reads (see the module docs).
#[derive(Debug, Clone, Args)]
pub struct RouterArgs {
    /// How requests are spread over workers.
    #[arg(
        long,
        env = "DYN_ROUTER_MODE",
        value_enum,
        default_value = "round-robin"
    )]
    pub router_mode: RouterMode,

    /// Workers with runtime config needed before the model is ready (0 = no wait).
    #[arg(long, env = "DYN_ROUTER_MIN_INITIAL_WORKERS", default_value_t = 0)]
    pub router_min_initial_workers: u32,

    /// Session affinity idle TTL in seconds (unset = off); the key is X-Dynamo-Session-ID.
    #[arg(long, env = "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", value_parser = clap::value_parser!(u32).range(1..=31_536_000))]
    pub router_session_affinity_ttl_secs: Option<u32>,

    /// hard: the bound worker or nothing; soft: the bound worker when eligible.
    #[arg(
        long,
        env = "DYN_ROUTER_SESSION_AFFINITY_MODE",
        value_enum,
        default_value = "hard"
    )]
    pub router_session_affinity_mode: SessionAffinityMode,

    /// Load-only kv routing: credit 0, no KV events, no KV-reuse assumption, tracking on.
    #[arg(long, env = "DYN_ROUTER_LOAD_AWARE", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub load_aware: bool,
    /// Turn --load-aware off.
    #[arg(long, overrides_with = "load_aware")]
    pub no_load_aware: bool,

    /// Credit per device-cached prompt block against prefill (0 = never query the index).
    #[arg(long, env = "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", default_value_t = 1.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_kv_overlap_score_credit: f64,

    /// Decay of device credit with excess active prefill (0 = none).
    #[arg(long, env = "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", default_value_t = 0.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_kv_overlap_score_credit_decay: f64,

    /// Weight of the adjusted prefill blocks in the cost.
    #[arg(long, env = "DYN_ROUTER_PREFILL_LOAD_SCALE", default_value_t = 1.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_prefill_load_scale: f64,

    /// Credit per block matched in host memory (0–1).
    #[arg(long, env = "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", default_value_t = 0.75, value_parser = unit_interval, allow_negative_numbers = true)]
    pub router_host_cache_hit_weight: f64,

    /// Credit per block matched on disk (0–1).
    #[arg(long, env = "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT", default_value_t = 0.25, value_parser = unit_interval, allow_negative_numbers = true)]
    pub router_disk_cache_hit_weight: f64,

    /// Softmax temperature of worker selection (0 = lowest cost).
    #[arg(long, env = "DYN_ROUTER_TEMPERATURE", default_value_t = 0.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_temperature: f64,

    /// Deprecated: non-zero sets the prefill load scale; 0 turns scale and credit off.
    #[arg(long, visible_alias = "kv-overlap-score-weight", env = "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_kv_overlap_score_weight: Option<f64>,

    /// Use KV events (false = approximate mode, fed by routing decisions).
    #[arg(long, visible_alias = "kv-events", env = "DYN_ROUTER_USE_KV_EVENTS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_kv_events: bool,
    /// Approximate mode: no KV events.
    #[arg(
        long,
        visible_alias = "no-kv-events",
        overrides_with = "router_kv_events"
    )]
    pub no_router_kv_events: bool,

    /// TTL in seconds of approximate-index entries.
    #[arg(long, visible_alias = "router-ttl", env = "DYN_ROUTER_TTL_SECS", default_value_t = 120.0, value_parser = positive, allow_negative_numbers = true)]
    pub router_ttl_secs: f64,

    /// Approximate-index blocks above which it prunes.
    #[arg(long, env = "DYN_ROUTER_MAX_TREE_SIZE", default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(1..))]
    pub router_max_tree_size: u64,

    /// MiB of block hashes kept for prompt prefixes, so a conversation's next turn hashes only
    /// its new blocks (0 = off; kvmesh addition).
    #[arg(long, env = "KVMESH_ROUTER_BLOCK_HASH_CACHE_MB", default_value_t = 32)]
    pub router_block_hash_cache_mb: u64,

    /// Fraction of the max tree size a prune goes down to, in (0, 1].
    #[arg(long, env = "DYN_ROUTER_PRUNE_TARGET_RATIO", default_value_t = 0.8, value_parser = prune_ratio, allow_negative_numbers = true)]
    pub router_prune_target_ratio: f64,

    /// Approximate-index eviction: ttl, or lru bounded by each rank's total_kv_blocks.
    #[arg(
        long,
        env = "DYN_ROUTER_APPROXIMATE_CACHE_POLICY",
        value_enum,
        default_value = "ttl"
    )]
    pub router_approximate_cache_policy: ApproxCachePolicy,

    /// TTL in seconds of the predicted side index (unset = off; needs KV events).
    #[arg(long, env = "DYN_ROUTER_PREDICTED_TTL_SECS", value_parser = positive, allow_negative_numbers = true)]
    pub router_predicted_ttl_secs: Option<f64>,

    /// Hash that keys tracked requests and sync events: `public-xxh3-v1` (the block hash of
    /// docs/kv-events.md, "Hashing"); `keyed-xxh3-v1` is refused until keyed hashing exists.
    #[arg(
        long,
        env = "DYN_ROUTER_TRACKING_HASH",
        default_value = "public-xxh3-v1"
    )]
    pub router_tracking_hash: String,
    /// Key file of `keyed-xxh3-v1` (refused with it).
    #[arg(long, env = "DYN_ROUTER_TRACKING_KEY_FILE")]
    pub router_tracking_key_file: Option<std::path::PathBuf>,
    /// Key id of `keyed-xxh3-v1` (refused with it).
    #[arg(long, env = "DYN_ROUTER_TRACKING_KEY_ID")]
    pub router_tracking_key_id: Option<String>,

    /// Serve aggregated when no prefill workers exist (always the case until disaggregated
    /// serving exists, so requests are served aggregated either way).
    #[arg(long, env = "DYN_DECODE_FALLBACK", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub decode_fallback: bool,

    /// KV events are always consumed from the durable stream; accepted for compatibility.
    #[arg(long, env = "DYN_ROUTER_DURABLE_KV_EVENTS", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_durable_kv_events: bool,

    /// Prefill load model: `none` counts uncached prompt tokens until the first token; `aic` /
    /// `ais` (a predicted prefill duration) start with a WARN and count as `none` until the
    /// predictor exists (they need `--router-mode kv`, `--router-track-prefill-tokens` and the
    /// `--ais-backend`, `--ais-system` and `--ais-model-path` options).
    #[arg(long, env = "DYN_ROUTER_PREFILL_LOAD_MODEL", default_value = "none")]
    pub router_prefill_load_model: String,

    /// Apply threads of the in-process KV index.
    #[arg(long, env = "DYN_ROUTER_EVENT_THREADS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub router_event_threads: u64,

    /// Read KV overlap from `kvmesh-indexer` shards over gRPC instead of an index kept in this
    /// process from the event stream.
    #[arg(long, env = "DYN_USE_REMOTE_INDEXER", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub use_remote_indexer: bool,
    /// Turn --use-remote-indexer off.
    #[arg(long, overrides_with = "use_remote_indexer")]
    pub no_use_remote_indexer: bool,

    /// Also serve this process's index as `kvmesh.v1.Indexer` (registered as an indexer replica
    /// owning every partition) on --tcp-rpc-host/--tcp-rpc-port; needs kv mode, not with
    /// --use-remote-indexer.
    #[arg(long, env = "DYN_SERVE_INDEXER", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub serve_indexer: bool,
    /// Turn --serve-indexer off.
    #[arg(long, overrides_with = "serve_indexer")]
    pub no_serve_indexer: bool,

    /// Share active load with router replicas.
    #[arg(long, env = "DYN_ROUTER_REPLICA_SYNC", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_replica_sync: bool,
    /// Turn --router-replica-sync off.
    #[arg(long, overrides_with = "router_replica_sync")]
    pub no_router_replica_sync: bool,

    /// Track the blocks of active requests (decode load).
    #[arg(long, visible_alias = "track-active-blocks", env = "DYN_ROUTER_TRACK_ACTIVE_BLOCKS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_track_active_blocks: bool,
    /// Do not track active blocks.
    #[arg(
        long,
        visible_alias = "no-track-active-blocks",
        overrides_with = "router_track_active_blocks"
    )]
    pub no_router_track_active_blocks: bool,

    /// Assume requests sharing a prefix share KV blocks on the worker.
    #[arg(long, visible_alias = "assume-kv-reuse", env = "DYN_ROUTER_ASSUME_KV_REUSE", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_assume_kv_reuse: bool,
    /// Do not assume KV reuse.
    #[arg(
        long,
        visible_alias = "no-assume-kv-reuse",
        overrides_with = "router_assume_kv_reuse"
    )]
    pub no_router_assume_kv_reuse: bool,

    /// Grow tracked blocks as output is generated.
    #[arg(long, visible_alias = "track-output-blocks", env = "DYN_ROUTER_TRACK_OUTPUT_BLOCKS", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_track_output_blocks: bool,
    /// Do not track output blocks.
    #[arg(
        long,
        visible_alias = "no-track-output-blocks",
        overrides_with = "router_track_output_blocks"
    )]
    pub no_router_track_output_blocks: bool,

    /// Cost per request already active on a worker.
    #[arg(long, env = "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", default_value_t = 0.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_decode_active_request_weight: f64,

    /// Track prefill tokens of active requests until their first token.
    #[arg(long, env = "DYN_ROUTER_TRACK_PREFILL_TOKENS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_track_prefill_tokens: bool,
    /// Do not track prefill tokens.
    #[arg(long, overrides_with = "router_track_prefill_tokens")]
    pub no_router_track_prefill_tokens: bool,

    /// Park requests when every worker's active prefill exceeds this fraction of its
    /// max_num_batched_tokens (unset = no queue).
    #[arg(long, env = "DYN_ROUTER_QUEUE_THRESHOLD", value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_queue_threshold: Option<f64>,

    /// Order of parked requests.
    #[arg(
        long,
        env = "DYN_ROUTER_QUEUE_POLICY",
        value_enum,
        default_value = "fcfs"
    )]
    pub router_queue_policy: QueuePolicy,

    /// Most requests parked in the queue; past it a request is refused as overloaded (kvmesh
    /// addition).
    #[arg(long, env = "KVMESH_ROUTER_QUEUE_MAX_LEN", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub router_queue_max_len: u64,

    /// Longest a request stays parked, in milliseconds; then it is refused as overloaded
    /// (0 = no limit; kvmesh addition).
    #[arg(
        long,
        env = "KVMESH_ROUTER_QUEUE_MAX_WAIT_MS",
        default_value_t = 60_000
    )]
    pub router_queue_max_wait_ms: u64,

    /// Busy when KV usage exceeds this fraction of total_kv_blocks (0–1, or None).
    #[arg(long, env = "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", value_parser = nullable_fraction, allow_negative_numbers = true)]
    pub active_decode_blocks_threshold: Option<Nullable<f64>>,

    /// Busy when active prefill tokens exceed this (or None).
    #[arg(long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", value_parser = nullable_tokens, allow_negative_numbers = true)]
    pub active_prefill_tokens_threshold: Option<Nullable<u64>>,

    /// Busy when active prefill tokens exceed this fraction of max_num_batched_tokens (or None).
    #[arg(long, env = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC", value_parser = nullable_non_negative, allow_negative_numbers = true)]
    pub active_prefill_tokens_threshold_frac: Option<Nullable<f64>>,

    /// Seconds after which a tracked request is presumed lost and freed.
    #[arg(
        long,
        hide = true,
        env = "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS",
        default_value_t = 300
    )]
    pub router_active_request_expiry_secs: u64,

    /// Queue wait in seconds after which overlap is re-queried at dequeue (0 = never).
    #[arg(long, hide = true, env = "DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS", default_value_t = 10.0, value_parser = finite_non_negative, allow_negative_numbers = true)]
    pub router_overlap_refresh_after_secs: f64,

    /// Weight of an accelerator worker against a CPU worker in device-aware-weighted mode.
    #[arg(long, hide = true, env = "DYN_ENCODER_CUDA_TO_CPU_RATIO", default_value_t = 8.0, value_parser = positive, allow_negative_numbers = true)]
    pub encoder_cuda_to_cpu_ratio: f64,

    /// Ejection of failing workers.
    #[command(flatten)]
    pub ejection: EjectionArgs,

    /// Fixed or learned KV cost weights.
    #[command(flatten)]
    pub adaptive: AdaptiveArgs,

    /// Dynamo's router flags that kvmesh accepts but does not act on yet.
    #[command(flatten)]
    pub later: LaterRouterArgs,
}

impl RouterArgs {
    /// The configuration, reading the deprecated `DYN_OVERLAP_SCORE_WEIGHT` from the process
    /// environment.
    pub fn to_config(&self) -> Result<RouterConfig, ConfigError> {
        self.to_config_with_env(|name| std::env::var(name).ok())
    }

    /// The configuration, with `env` as the environment (tests).
    pub fn to_config_with_env(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<RouterConfig, ConfigError> {
        let mut kv = KvRouterConfig {
            overlap_score_credit: self.router_kv_overlap_score_credit,
            overlap_score_credit_decay: self.router_kv_overlap_score_credit_decay,
            prefill_load_scale: self.router_prefill_load_scale,
            host_cache_hit_weight: self.router_host_cache_hit_weight,
            disk_cache_hit_weight: self.router_disk_cache_hit_weight,
            temperature: self.router_temperature,
            decode_active_request_weight: self.router_decode_active_request_weight,
            track_active_blocks: negatable(
                self.router_track_active_blocks,
                self.no_router_track_active_blocks,
            ),
            track_output_blocks: negatable(
                self.router_track_output_blocks,
                self.no_router_track_output_blocks,
            ),
            track_prefill_tokens: negatable(
                self.router_track_prefill_tokens,
                self.no_router_track_prefill_tokens,
            ),
            assume_kv_reuse: negatable(self.router_assume_kv_reuse, self.no_router_assume_kv_reuse),
            load_aware: negatable(self.load_aware, self.no_load_aware),
            use_kv_events: negatable(self.router_kv_events, self.no_router_kv_events),
            ttl: Duration::from_secs_f64(self.router_ttl_secs),
            max_tree_size: usize::try_from(self.router_max_tree_size).unwrap_or(usize::MAX),
            prune_target_ratio: self.router_prune_target_ratio,
            approx_cache_policy: self.router_approximate_cache_policy,
            predicted_ttl: self.router_predicted_ttl_secs.map(Duration::from_secs_f64),
            event_threads: usize::try_from(self.router_event_threads).unwrap_or(usize::MAX),
            active_request_expiry: Duration::from_secs(self.router_active_request_expiry_secs),
            overlap_refresh_after: (self.router_overlap_refresh_after_secs > 0.0)
                .then(|| Duration::from_secs_f64(self.router_overlap_refresh_after_secs)),
            use_remote_indexer: negatable(self.use_remote_indexer, self.no_use_remote_indexer),
            serve_indexer: negatable(self.serve_indexer, self.no_serve_indexer),
            block_hash_cache_bytes: usize::try_from(
                self.router_block_hash_cache_mb.saturating_mul(1 << 20),
            )
            .unwrap_or(usize::MAX),
            weights: self.adaptive.router_kv_weights,
            cost_policy: crate::cost::CostPolicy::Default,
        };
        self.check_unsupported()?;
        self.later_notices(&env)?;
        if let Some(weight) = self.legacy_weight(&env)? {
            apply_legacy_overlap_weight(
                weight,
                &mut kv.overlap_score_credit,
                &mut kv.prefill_load_scale,
            );
        }
        let config = RouterConfig {
            mode: self.router_mode,
            kv,
            busy: BusyThresholds {
                active_decode_blocks_threshold: self
                    .active_decode_blocks_threshold
                    .and_then(|n| n.0),
                active_prefill_tokens_threshold: self
                    .active_prefill_tokens_threshold
                    .and_then(|n| n.0),
                active_prefill_tokens_threshold_frac: self
                    .active_prefill_tokens_threshold_frac
                    .and_then(|n| n.0),
            },
            queue_threshold: self.router_queue_threshold,
            queue_policy: self.router_queue_policy,
            queue_max_len: usize::try_from(self.router_queue_max_len).unwrap_or(usize::MAX),
            queue_max_wait: (self.router_queue_max_wait_ms > 0)
                .then(|| Duration::from_millis(self.router_queue_max_wait_ms)),
            session_affinity_ttl: self
                .router_session_affinity_ttl_secs
                .map(|secs| Duration::from_secs(u64::from(secs))),
            session_affinity_mode: self.router_session_affinity_mode,
            min_initial_workers: self.router_min_initial_workers,
            encoder_cuda_to_cpu_ratio: self.encoder_cuda_to_cpu_ratio,
            replica_sync: negatable(self.router_replica_sync, self.no_router_replica_sync),
            ejection: self.ejection.to_config(),
        }
        .resolved();
        config.validate()?;
        Ok(config)
    }

    /// Every WARN line start-up logs: deprecated spellings in `argv` and deprecated options in
    /// use, then each accepted flag kvmesh does not act on yet and what it does instead.
    pub fn startup_warnings<I, S>(&self, argv: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut warnings = self.deprecation_warnings(argv);
        warnings.extend(
            self.later_notices(&|name: &str| std::env::var(name).ok())
                .unwrap_or_default(),
        );
        warnings
    }

    fn later_notices(
        &self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, ConfigError> {
        let kv_mode =
            self.router_mode == RouterMode::Kv || negatable(self.load_aware, self.no_load_aware);
        self.later.notices(
            env,
            &self.router_prefill_load_model,
            kv_mode,
            negatable(
                self.router_track_prefill_tokens,
                self.no_router_track_prefill_tokens,
            ),
        )
    }

    /// Refuses the values of this table's flags that name features not in this release, naming
    /// the flag; `public-xxh3-v1` and `none` are the working values.
    fn check_unsupported(&self) -> Result<(), ConfigError> {
        match self.router_tracking_hash.as_str() {
            "public-xxh3-v1" => {}
            "keyed-xxh3-v1" => {
                return Err(ConfigError(
                    "--router-tracking-hash (DYN_ROUTER_TRACKING_HASH): keyed-xxh3-v1 is not supported in this release; use public-xxh3-v1".into(),
                ));
            }
            other => {
                return Err(ConfigError(format!(
                    "--router-tracking-hash (DYN_ROUTER_TRACKING_HASH): unknown hash {other:?}; expected public-xxh3-v1 or keyed-xxh3-v1"
                )));
            }
        }
        if self.router_tracking_key_file.is_some() || self.router_tracking_key_id.is_some() {
            return Err(ConfigError(
                "--router-tracking-key-file (DYN_ROUTER_TRACKING_KEY_FILE) / --router-tracking-key-id (DYN_ROUTER_TRACKING_KEY_ID): only used by keyed-xxh3-v1, which is not supported in this release".into(),
            ));
        }
        match self.router_prefill_load_model.as_str() {
            "none" | "aic" | "ais" => Ok(()),
            other => Err(ConfigError(format!(
                "--router-prefill-load-model (DYN_ROUTER_PREFILL_LOAD_MODEL): unknown model {other:?}; expected none, aic or ais"
            ))),
        }
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
