//! The router's configuration as one typed struct, with Dynamo's defaults and the resolution
//! rules for deprecated and implied options (docs/flags.md, "Router flags" and "Deprecated and
//! implied options").
//!
//! [`RouterConfig`] is what the routing core reads; [`crate::RouterArgs`] is the clap form that
//! converts into it. A simulator or a test builds a `RouterConfig` directly and gets the same
//! behaviour, because every rule that derives one option from another lives in
//! [`RouterConfig::resolved`], not in the CLI layer.

use std::time::Duration;

use clap::ValueEnum;

/// Routing policies (`--router-mode`; docs/routing.md, "Modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    /// Each eligible worker in turn, ids ascending.
    #[default]
    RoundRobin,
    /// A uniformly random eligible worker.
    Random,
    /// The less loaded of two random workers.
    PowerOfTwo,
    /// KV-cache-aware routing with the cost model of docs/routing.md, "Cost function".
    Kv,
    /// The worker named by the request.
    Direct,
    /// The worker with the fewest requests in flight.
    LeastLoaded,
    /// CPU versus accelerator groups weighted by `DYN_ENCODER_CUDA_TO_CPU_RATIO`.
    DeviceAwareWeighted,
}

/// Default of `--router-queue-max-len`: room for bursts far above any worker's batch, small
/// enough that parked prompts cannot exhaust memory.
pub const DEFAULT_QUEUE_MAX_LEN: usize = 4096;

/// Default of `--router-queue-max-wait-ms`: a client is told the mesh is overloaded rather than
/// kept waiting longer than this.
pub const DEFAULT_QUEUE_MAX_WAIT: Duration = Duration::from_secs(60);

/// Order in which parked requests leave the queue (docs/routing.md, "Queue").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePolicy {
    /// First come, first served, shifted by priority: key `p − t`.
    #[default]
    Fcfs,
    /// Last come, first served (policy YAML only, not a CLI value): key `p + t`.
    #[value(skip)]
    Lcfs,
    /// Weighted shortest processing time: key `(1 + p) / max(1, uncached tokens)`.
    Wspt,
}

/// What a session binding means (`--router-session-affinity-mode`; docs/routing.md,
/// "Session affinity").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionAffinityMode {
    /// The bound worker or nothing (busy ⇒ overloaded, never rerouted).
    #[default]
    Hard,
    /// The bound worker when it is eligible, otherwise normal routing.
    Soft,
}

/// Eviction policy of the approximate index (`--router-approximate-cache-policy`;
/// docs/routing.md, "Approximate mode").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApproxCachePolicy {
    /// Entries expire `--router-ttl-secs` after their last insertion.
    #[default]
    Ttl,
    /// Each rank keeps at most its advertised `total_kv_blocks` entries.
    Lru,
}

/// The three busy thresholds (docs/routing.md, "Busy detection and overload"); each check is on
/// only when its threshold is set.
///
/// Exists as its own struct because `/busy_threshold` reads and replaces it at run time.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct BusyThresholds {
    /// Fraction of `total_kv_blocks` above which a rank's decode latch sets (0–1).
    pub active_decode_blocks_threshold: Option<f64>,
    /// Active prefill tokens above which a rank is busy.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Fraction of `max_num_batched_tokens` above which a rank is busy.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

impl BusyThresholds {
    /// Checks ranges, naming the flag: the decode threshold is a fraction in [0, 1], the
    /// prefill fraction finite and non-negative. Applies to flags and to run-time changes alike.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(threshold) = self.active_decode_blocks_threshold {
            unit_interval(
                "--active-decode-blocks-threshold (DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD)",
                threshold,
            )?;
        }
        if let Some(frac) = self.active_prefill_tokens_threshold_frac {
            finite_non_negative(
                "--active-prefill-tokens-threshold-frac (DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC)",
                frac,
            )?;
        }
        Ok(())
    }

    /// Whether any check is on (the busy filter is skipped entirely otherwise).
    pub fn is_any_set(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
    }
}

/// Options of `kv` mode: the cost model, load tracking and the index (docs/routing.md:
/// "KV routing flow" through "Load tracking", "Approximate mode", "Predicted side index").
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KvRouterConfig {
    /// Credit per device-cached block against prefill (0 ⇒ the index is never queried).
    pub overlap_score_credit: f64,
    /// How fast device credit decays on workers with excess active prefill.
    pub overlap_score_credit_decay: f64,
    /// Weight of the adjusted prefill blocks in the cost.
    pub prefill_load_scale: f64,
    /// Credit per block matched in host memory beyond the device match.
    pub host_cache_hit_weight: f64,
    /// Credit per block matched on disk beyond the faster tiers.
    pub disk_cache_hit_weight: f64,
    /// Softmax temperature of the selection (0 = lowest cost).
    pub temperature: f64,
    /// Cost per request already active on the candidate.
    pub decode_active_request_weight: f64,
    /// Track the blocks of active requests (the decode term and the decode busy projection).
    pub track_active_blocks: bool,
    /// Grow tracked blocks as output is generated.
    pub track_output_blocks: bool,
    /// Track prefill tokens of active requests until their first token.
    pub track_prefill_tokens: bool,
    /// Assume requests sharing a prefix share KV blocks on the worker (dedup tracked blocks).
    pub assume_kv_reuse: bool,
    /// Load-only kv routing (`--load-aware`); applied by [`RouterConfig::resolved`].
    pub load_aware: bool,
    /// Index fed by KV events (`true`) or the router's own approximate index (`false`).
    pub use_kv_events: bool,
    /// TTL of approximate-index entries.
    pub ttl: Duration,
    /// Approximate-index entries above which it prunes.
    pub max_tree_size: usize,
    /// Fraction of `max_tree_size` a prune goes down to.
    pub prune_target_ratio: f64,
    /// Eviction policy of the approximate index.
    pub approx_cache_policy: ApproxCachePolicy,
    /// TTL of the predicted side index; `None` = no side index.
    pub predicted_ttl: Option<Duration>,
    /// Apply lanes of an in-process event-fed index.
    pub event_threads: usize,
    /// Age after which a tracked request is presumed lost and freed.
    pub active_request_expiry: Duration,
    /// Queue wait after which overlap is re-queried at dequeue; `None` = never.
    pub overlap_refresh_after: Option<Duration>,
    /// Read overlap from indexer shards over gRPC (`--use-remote-indexer`) rather than from an
    /// index this process keeps from the event stream.
    pub use_remote_indexer: bool,
    /// Serve this process's index to others (`--serve-indexer`).
    pub serve_indexer: bool,
    /// Bytes of block hashes kept for prompt prefixes, so a later turn hashes only its new
    /// blocks (0 = hash every prompt whole).
    pub block_hash_cache_bytes: usize,
    /// Fixed credit and scale, or learned online from them (`--router-kv-weights`).
    pub weights: crate::adaptive::KvWeightsMode,
    /// The formula that scores a candidate (only the benchmark sets anything but the default).
    pub cost_policy: crate::cost::CostPolicy,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        Self {
            overlap_score_credit: 1.0,
            overlap_score_credit_decay: 0.0,
            prefill_load_scale: 1.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
            temperature: 0.0,
            decode_active_request_weight: 0.0,
            track_active_blocks: true,
            track_output_blocks: false,
            track_prefill_tokens: true,
            assume_kv_reuse: true,
            load_aware: false,
            use_kv_events: true,
            ttl: Duration::from_secs(120),
            max_tree_size: 1 << 20,
            prune_target_ratio: 0.8,
            approx_cache_policy: ApproxCachePolicy::Ttl,
            predicted_ttl: None,
            event_threads: 4,
            active_request_expiry: Duration::from_secs(300),
            overlap_refresh_after: Some(Duration::from_secs(10)),
            use_remote_indexer: false,
            serve_indexer: false,
            block_hash_cache_bytes: 32 << 20,
            weights: crate::adaptive::KvWeightsMode::Fixed,
            cost_policy: crate::cost::CostPolicy::Default,
        }
    }
}

/// Every option the routing core reads (see the module docs).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RouterConfig {
    /// Routing policy.
    pub mode: RouterMode,
    /// `kv` mode options.
    pub kv: KvRouterConfig,
    /// Busy thresholds at start (changeable at run time).
    pub busy: BusyThresholds,
    /// Queue threshold: park when every eligible rank has more active prefill tokens than this
    /// fraction of its `max_num_batched_tokens`; `None` = no queue.
    pub queue_threshold: Option<f64>,
    /// Queue order.
    pub queue_policy: QueuePolicy,
    /// Most parked requests; a request that would park past it is refused as overloaded.
    pub queue_max_len: usize,
    /// Longest a request stays parked before it is refused as overloaded; `None` = no limit.
    pub queue_max_wait: Option<Duration>,
    /// Idle TTL of session bindings; `None` = session affinity off.
    pub session_affinity_ttl: Option<Duration>,
    /// Binding strictness.
    pub session_affinity_mode: SessionAffinityMode,
    /// Workers with runtime config needed before the router is ready.
    pub min_initial_workers: u32,
    /// Weight of a non-CPU worker against a CPU worker in `device-aware-weighted`.
    pub encoder_cuda_to_cpu_ratio: f64,
    /// Publish tracker changes as [`crate::SyncEvent`]s for replicas.
    pub replica_sync: bool,
    /// When failing workers are ejected, and for how long.
    pub ejection: crate::health::EjectionConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            mode: RouterMode::RoundRobin,
            kv: KvRouterConfig::default(),
            busy: BusyThresholds::default(),
            queue_threshold: None,
            queue_policy: QueuePolicy::Fcfs,
            queue_max_len: DEFAULT_QUEUE_MAX_LEN,
            queue_max_wait: Some(DEFAULT_QUEUE_MAX_WAIT),
            session_affinity_ttl: None,
            session_affinity_mode: SessionAffinityMode::Hard,
            min_initial_workers: 0,
            encoder_cuda_to_cpu_ratio: 8.0,
            replica_sync: false,
            ejection: crate::health::EjectionConfig::default(),
        }
    }
}

/// An invalid option; the message names the flag (and its environment variable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl RouterConfig {
    /// A default configuration in `mode`.
    pub fn with_mode(mode: RouterMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Applies the implied settings: `--load-aware` means kv mode with credit 0, no KV events,
    /// no KV-reuse assumption, and active blocks and prefill tokens tracked (a predicted index
    /// then fails validation, as it does with `--no-router-kv-events`).
    pub fn resolved(mut self) -> Self {
        if self.kv.load_aware {
            self.mode = RouterMode::Kv;
            self.kv.overlap_score_credit = 0.0;
            self.kv.use_kv_events = false;
            self.kv.assume_kv_reuse = false;
            self.kv.track_active_blocks = true;
            self.kv.track_prefill_tokens = true;
        }
        self
    }

    /// Checks ranges and exclusive options, naming the flag in the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let kv = &self.kv;
        finite_non_negative(
            "--router-kv-overlap-score-credit (DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT)",
            kv.overlap_score_credit,
        )?;
        finite_non_negative(
            "--router-kv-overlap-score-credit-decay (DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY)",
            kv.overlap_score_credit_decay,
        )?;
        finite_non_negative(
            "--router-prefill-load-scale (DYN_ROUTER_PREFILL_LOAD_SCALE)",
            kv.prefill_load_scale,
        )?;
        unit_interval(
            "--router-host-cache-hit-weight (DYN_ROUTER_HOST_CACHE_HIT_WEIGHT)",
            kv.host_cache_hit_weight,
        )?;
        unit_interval(
            "--router-disk-cache-hit-weight (DYN_ROUTER_DISK_CACHE_HIT_WEIGHT)",
            kv.disk_cache_hit_weight,
        )?;
        finite_non_negative(
            "--router-temperature (DYN_ROUTER_TEMPERATURE)",
            kv.temperature,
        )?;
        finite_non_negative(
            "--router-decode-active-request-weight (DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT)",
            kv.decode_active_request_weight,
        )?;
        if kv.serve_indexer && kv.use_remote_indexer {
            return Err(ConfigError(
                "--serve-indexer (DYN_SERVE_INDEXER): cannot be combined with --use-remote-indexer"
                    .into(),
            ));
        }
        if kv.serve_indexer && !(self.mode == RouterMode::Kv && kv.use_kv_events) {
            return Err(ConfigError(
                "--serve-indexer (DYN_SERVE_INDEXER): needs --router-mode kv with KV events".into(),
            ));
        }
        if kv.ttl.is_zero() {
            return Err(ConfigError(
                "--router-ttl-secs (DYN_ROUTER_TTL_SECS): must be > 0".into(),
            ));
        }
        if kv.max_tree_size == 0 {
            return Err(ConfigError(
                "--router-max-tree-size (DYN_ROUTER_MAX_TREE_SIZE): must be >= 1".into(),
            ));
        }
        if !(kv.prune_target_ratio > 0.0 && kv.prune_target_ratio <= 1.0) {
            return Err(ConfigError(format!(
                "--router-prune-target-ratio (DYN_ROUTER_PRUNE_TARGET_RATIO): must be in (0, 1], got {}",
                kv.prune_target_ratio
            )));
        }
        if kv.predicted_ttl.is_some_and(|ttl| ttl.is_zero()) {
            return Err(ConfigError(
                "--router-predicted-ttl-secs (DYN_ROUTER_PREDICTED_TTL_SECS): must be > 0".into(),
            ));
        }
        if kv.predicted_ttl.is_some() && !kv.use_kv_events {
            return Err(ConfigError(
                "--router-predicted-ttl-secs (DYN_ROUTER_PREDICTED_TTL_SECS): needs KV events; \
                 not allowed with --no-router-kv-events or --load-aware"
                    .into(),
            ));
        }
        if kv.event_threads == 0 {
            return Err(ConfigError(
                "--router-event-threads (DYN_ROUTER_EVENT_THREADS): must be >= 1".into(),
            ));
        }
        self.busy.validate()?;
        if let Some(threshold) = self.queue_threshold {
            finite_non_negative(
                "--router-queue-threshold (DYN_ROUTER_QUEUE_THRESHOLD)",
                threshold,
            )?;
        }
        if self.queue_max_len == 0 {
            return Err(ConfigError(
                "--router-queue-max-len (KVMESH_ROUTER_QUEUE_MAX_LEN): must be >= 1".into(),
            ));
        }
        if self.session_affinity_ttl.is_some_and(|ttl| ttl.is_zero()) {
            return Err(ConfigError(
                "--router-session-affinity-ttl-secs (DYN_ROUTER_SESSION_AFFINITY_TTL_SECS): must be >= 1"
                    .into(),
            ));
        }
        if !(self.encoder_cuda_to_cpu_ratio.is_finite() && self.encoder_cuda_to_cpu_ratio > 0.0) {
            return Err(ConfigError(format!(
                "--encoder-cuda-to-cpu-ratio (DYN_ENCODER_CUDA_TO_CPU_RATIO): must be > 0, got {}",
                self.encoder_cuda_to_cpu_ratio
            )));
        }
        Ok(())
    }
}

/// Applies the deprecated `overlap_score_weight` (flag or per-request override): a non-zero
/// weight becomes the prefill load scale; zero turns both scale and credit off. It wins over
/// explicit scale and credit.
pub fn apply_legacy_overlap_weight(weight: f64, credit: &mut f64, scale: &mut f64) {
    if weight == 0.0 {
        *credit = 0.0;
        *scale = 0.0;
    } else {
        *scale = weight;
    }
}

fn finite_non_negative(flag: &str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ConfigError(format!("{flag}: must be >= 0, got {value}")))
    }
}

fn unit_interval(flag: &str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{flag}: must be in [0, 1], got {value}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec() {
        let config = RouterConfig::default();
        assert_eq!(config.mode, RouterMode::RoundRobin);
        assert_eq!(config.kv.overlap_score_credit, 1.0);
        assert_eq!(config.kv.host_cache_hit_weight, 0.75);
        assert_eq!(config.kv.disk_cache_hit_weight, 0.25);
        assert_eq!(config.kv.ttl, Duration::from_secs(120));
        assert_eq!(config.kv.max_tree_size, 1_048_576);
        assert_eq!(config.kv.active_request_expiry, Duration::from_secs(300));
        assert_eq!(
            config.kv.overlap_refresh_after,
            Some(Duration::from_secs(10))
        );
        assert_eq!(config.encoder_cuda_to_cpu_ratio, 8.0);
        config.validate().unwrap();
    }

    #[test]
    fn load_aware_implies_its_settings() {
        let mut config = RouterConfig::default();
        config.kv.load_aware = true;
        let config = config.resolved();
        assert_eq!(config.mode, RouterMode::Kv);
        assert_eq!(config.kv.overlap_score_credit, 0.0);
        assert!(!config.kv.use_kv_events);
        assert!(!config.kv.assume_kv_reuse);
        assert!(config.kv.track_active_blocks && config.kv.track_prefill_tokens);
    }

    #[test]
    fn legacy_weight_maps_to_scale_or_turns_off() {
        let (mut credit, mut scale) = (1.0, 1.0);
        apply_legacy_overlap_weight(2.0, &mut credit, &mut scale);
        assert_eq!((credit, scale), (1.0, 2.0));
        apply_legacy_overlap_weight(0.0, &mut credit, &mut scale);
        assert_eq!((credit, scale), (0.0, 0.0));
    }

    #[test]
    fn validation_names_the_flag() {
        let mut config = RouterConfig::default();
        config.kv.temperature = -1.0;
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.starts_with("--router-temperature (DYN_ROUTER_TEMPERATURE)"),
            "{error}"
        );
        let mut config = RouterConfig::default();
        config.kv.use_kv_events = false;
        config.kv.predicted_ttl = Some(Duration::from_secs(1));
        assert!(
            config
                .validate()
                .unwrap_err()
                .0
                .contains("--router-predicted-ttl-secs")
        );
    }
}
