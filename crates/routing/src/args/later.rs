//! Router flags of Dynamo that kvmesh parses and validates but does not act on yet (the `later`
//! tier of docs/flags.md): the policy configuration, conditional disaggregation, the shared
//! cache, the session prefix index, persisted snapshots, the active-sequence stride and the
//! AISimulate (`aic`/`ais`) perf model. A Dynamo command line that sets them starts; each one set
//! away from its default logs one WARN saying what kvmesh does instead ([`LaterRouterArgs::notices`]).

use std::path::PathBuf;

use clap::Args;
use kvmesh_core::flags::{negatable, parse_bool};

use super::values::unit_interval;
use crate::config::ConfigError;

/// Keys the conditional-disaggregation JSON may hold.
const CONDITIONAL_DISAGG_KEYS: [&str; 5] = [
    "policy",
    "eff_isl_threshold",
    "eff_isl_ratio_threshold",
    "prefill_busy_threshold",
    "decode_busy_threshold",
];

/// The AISimulate options: spelled `--ais-*` (`DYN_AIS_*`), with the older `--aic-*` spelling
/// as an alias and the older `DYN_AIC_*` variables read when the new ones are unset.
#[derive(Debug, Clone, Default, Args)]
pub struct AisArgs {
    /// Whole perf-model configuration, as JSON or a JSON/YAML file (not used by kvmesh).
    #[arg(long, env = "DYN_AIS_PERF_CONFIG")]
    pub ais_perf_config: Option<String>,
    /// Engine family of the perf model, e.g. `vllm` (required with `--router-prefill-load-model`
    /// `aic` or `ais`).
    #[arg(long, visible_alias = "aic-backend", env = "DYN_AIS_BACKEND")]
    pub ais_backend: Option<String>,
    /// Hardware of the perf model, e.g. `h200_sxm` (required with `aic` or `ais`).
    #[arg(long, visible_alias = "aic-system", env = "DYN_AIS_SYSTEM")]
    pub ais_system: Option<String>,
    /// Pinned perf database version.
    #[arg(
        long,
        visible_alias = "aic-backend-version",
        env = "DYN_AIS_BACKEND_VERSION"
    )]
    pub ais_backend_version: Option<String>,
    /// Tensor-parallel size of the modelled deployment.
    #[arg(long, visible_alias = "aic-tp-size", env = "DYN_AIS_TP_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub ais_tp_size: Option<u32>,
    /// Model looked up in the perf database (required with `aic` or `ais`).
    #[arg(long, visible_alias = "aic-model-path", env = "DYN_AIS_MODEL_PATH")]
    pub ais_model_path: Option<String>,
    /// MoE tensor-parallel size.
    #[arg(long, visible_alias = "aic-moe-tp-size", env = "DYN_AIS_MOE_TP_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub ais_moe_tp_size: Option<u32>,
    /// MoE expert-parallel size.
    #[arg(long, visible_alias = "aic-moe-ep-size", env = "DYN_AIS_MOE_EP_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub ais_moe_ep_size: Option<u32>,
    /// Attention data-parallel size.
    #[arg(long, visible_alias = "aic-attention-dp-size", env = "DYN_AIS_ATTENTION_DP_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub ais_attention_dp_size: Option<u32>,
    /// Speculative draft tokens per step.
    #[arg(long, visible_alias = "aic-nextn", env = "DYN_AIS_NEXTN")]
    pub ais_nextn: Option<u32>,
    /// Comma-separated acceptance rates of the drafts, each in [0, 1].
    #[arg(long, visible_alias = "aic-nextn-accept-rates", env = "DYN_AIS_NEXTN_ACCEPT_RATES", value_parser = accept_rates)]
    pub ais_nextn_accept_rates: Option<String>,
    /// Seed of the speculative-acceptance simulation.
    #[arg(long, visible_alias = "aic-mtp-seed", env = "DYN_AIS_MTP_SEED")]
    pub ais_mtp_seed: Option<u64>,
}

/// The `later` router flags (see the module docs).
#[derive(Debug, Clone, Args)]
pub struct LaterRouterArgs {
    /// YAML file of router policy classes and worker selection (not applied by kvmesh).
    #[arg(long, env = "DYN_ROUTER_POLICY_CONFIG", value_parser = existing_file)]
    pub router_policy_config: Option<PathBuf>,
    /// Named worker-selection policy for prefill workers (not applied).
    #[arg(long, env = "DYN_ROUTER_PREFILL_POLICY")]
    pub router_prefill_policy: Option<String>,
    /// Named worker-selection policy for decode workers (not applied).
    #[arg(long, env = "DYN_ROUTER_DECODE_POLICY")]
    pub router_decode_policy: Option<String>,
    /// Let the router skip remote prefill for some requests (kvmesh serves aggregated).
    #[arg(long, env = "DYN_ROUTER_CONDITIONAL_DISAGG", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_conditional_disagg: bool,
    /// Turn --router-conditional-disagg off.
    #[arg(long, overrides_with = "router_conditional_disagg")]
    pub no_router_conditional_disagg: bool,
    /// JSON object of the conditional-disaggregation policy.
    #[arg(long, env = "DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG", value_parser = conditional_disagg_config)]
    pub router_conditional_disagg_config: Option<String>,
    /// Track per-session block lineage in a prefix index (no routing effect in Dynamo either).
    #[arg(long, env = "DYN_ENABLE_SESSION_PREFIX_INDEX", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_session_prefix_index: bool,
    /// Turn --enable-session-prefix-index off.
    #[arg(long, overrides_with = "enable_session_prefix_index")]
    pub no_enable_session_prefix_index: bool,
    /// Weight of a shared-cache hit against a device hit, 0–1.
    #[arg(long, env = "DYN_SHARED_CACHE_MULTIPLIER", value_parser = unit_interval, allow_negative_numbers = true)]
    pub shared_cache_multiplier: Option<f64>,
    /// External shared KV cache to query: `none` or `hicache`.
    #[arg(long, env = "DYN_SHARED_CACHE_TYPE", default_value = "none", value_parser = ["none", "hicache"])]
    pub shared_cache_type: String,
    /// Events between persisted index snapshots.
    #[arg(
        long,
        env = "DYN_ROUTER_SNAPSHOT_THRESHOLD",
        default_value_t = 1_000_000
    )]
    pub router_snapshot_threshold: u32,
    /// Purge persisted router state at start.
    #[arg(long, env = "DYN_ROUTER_RESET_STATES", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub router_reset_states: bool,
    /// Update active-sequence tracking every N tokens.
    #[arg(long, env = "DYN_ROUTER_ACTIVE_SEQUENCE_STRIDE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub router_active_sequence_stride: u32,
    /// Coefficients `a,b,c` of kvmesh's prefill-duration predictor, ms = a + b·T + c·T² for T
    /// uncached tokens (kvmesh addition; used once the `aic` load model is).
    #[arg(long, env = "KVMESH_ROUTER_PREFILL_PREDICTOR_POLY", value_parser = predictor_poly)]
    pub router_prefill_predictor_poly: Option<String>,
    /// The AISimulate perf-model options.
    #[command(flatten)]
    pub ais: AisArgs,
}

impl LaterRouterArgs {
    /// One WARN line for each of these flags set away from its default; an error for a value
    /// that is invalid in combination (naming the flag). `env` reads the older `DYN_AIC_*`
    /// variables; `prefill_load_model` and `kv_mode` are the active router flags the AIC
    /// requirements refer to.
    pub fn notices(
        &self,
        env: &impl Fn(&str) -> Option<String>,
        prefill_load_model: &str,
        kv_mode: bool,
        track_prefill_tokens: bool,
    ) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let mut later = |flag: &str, instead: &str| {
            warnings.push(format!("{flag} is not implemented yet; kvmesh {instead}"));
        };
        if self.router_policy_config.is_some() {
            later(
                "--router-policy-config",
                "routes with the --router-* flags (one policy class)",
            );
        }
        if self.router_prefill_policy.is_some() || self.router_decode_policy.is_some() {
            later(
                "--router-prefill-policy/--router-decode-policy",
                "uses its built-in worker selection",
            );
        }
        if negatable(
            self.router_conditional_disagg,
            self.no_router_conditional_disagg,
        ) || self.router_conditional_disagg_config.is_some()
        {
            later(
                "--router-conditional-disagg",
                "serves every request aggregated",
            );
        }
        if negatable(
            self.enable_session_prefix_index,
            self.no_enable_session_prefix_index,
        ) {
            later(
                "--enable-session-prefix-index",
                "keeps no session prefix index (it has no routing effect)",
            );
        }
        if self.shared_cache_type != "none" || self.shared_cache_multiplier.is_some() {
            later(
                "--shared-cache-type/--shared-cache-multiplier",
                "counts device, host and disk overlap only",
            );
        }
        if self.router_snapshot_threshold != 1_000_000 || self.router_reset_states {
            later(
                "--router-snapshot-threshold/--router-reset-states",
                "rebuilds its index from the durable event stream at start",
            );
        }
        if self.router_active_sequence_stride != 1 {
            later(
                "--router-active-sequence-stride",
                "tracks active sequences on every token",
            );
        }
        let ais = self.ais.resolved(env)?;
        if matches!(prefill_load_model, "aic" | "ais") {
            if !kv_mode {
                return Err(ConfigError(format!(
                    "--router-prefill-load-model (DYN_ROUTER_PREFILL_LOAD_MODEL): {prefill_load_model} needs --router-mode kv"
                )));
            }
            if !track_prefill_tokens {
                return Err(ConfigError(format!(
                    "--router-prefill-load-model (DYN_ROUTER_PREFILL_LOAD_MODEL): {prefill_load_model} needs --router-track-prefill-tokens"
                )));
            }
            for (flag, value) in [
                ("--ais-backend (DYN_AIS_BACKEND)", &ais.ais_backend),
                ("--ais-system (DYN_AIS_SYSTEM)", &ais.ais_system),
                ("--ais-model-path (DYN_AIS_MODEL_PATH)", &ais.ais_model_path),
            ] {
                if value.is_none() {
                    return Err(ConfigError(format!(
                        "{flag}: required with --router-prefill-load-model {prefill_load_model}"
                    )));
                }
            }
            later(
                &format!("--router-prefill-load-model {prefill_load_model}"),
                "counts uncached prompt tokens as prefill load (the `none` model)",
            );
        } else if ais.is_set() || self.router_prefill_predictor_poly.is_some() {
            later(
                "--ais-*/--aic-* perf-model options",
                "uses them only with --router-prefill-load-model aic or ais, which it does not implement yet",
            );
        }
        Ok(warnings)
    }
}

impl AisArgs {
    /// These options with each unset one read from its older `DYN_AIC_*` variable, checked.
    pub fn resolved(&self, env: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let legacy = |name: &str| env(&format!("DYN_AIC_{name}")).filter(|v| !v.trim().is_empty());
        let legacy_number = |name: &str| -> Result<Option<u32>, ConfigError> {
            legacy(name)
                .map(|raw| {
                    raw.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| {
                            ConfigError(format!(
                                "--aic-{} (DYN_AIC_{name}): expected a positive integer, got {raw:?}",
                                name.to_ascii_lowercase().replace('_', "-")
                            ))
                        })
                })
                .transpose()
        };
        let mut ais = self.clone();
        ais.ais_backend = ais.ais_backend.or_else(|| legacy("BACKEND"));
        ais.ais_system = ais.ais_system.or_else(|| legacy("SYSTEM"));
        ais.ais_backend_version = ais
            .ais_backend_version
            .or_else(|| legacy("BACKEND_VERSION"));
        ais.ais_model_path = ais.ais_model_path.or_else(|| legacy("MODEL_PATH"));
        ais.ais_tp_size = ais.ais_tp_size.or(legacy_number("TP_SIZE")?);
        ais.ais_moe_tp_size = ais.ais_moe_tp_size.or(legacy_number("MOE_TP_SIZE")?);
        ais.ais_moe_ep_size = ais.ais_moe_ep_size.or(legacy_number("MOE_EP_SIZE")?);
        ais.ais_attention_dp_size = ais
            .ais_attention_dp_size
            .or(legacy_number("ATTENTION_DP_SIZE")?);
        if ais.ais_moe_tp_size.is_some()
            || ais.ais_moe_ep_size.is_some()
            || ais.ais_attention_dp_size.is_some()
        {
            let tp = ais.ais_tp_size.unwrap_or(1);
            let dp = ais.ais_attention_dp_size.unwrap_or(1);
            let moe_tp = ais.ais_moe_tp_size.unwrap_or(1);
            let moe_ep = ais.ais_moe_ep_size.unwrap_or(1);
            if tp * dp != moe_tp * moe_ep {
                return Err(ConfigError(format!(
                    "--ais-moe-tp-size/--ais-moe-ep-size: tp_size x attention_dp_size ({tp} x {dp}) must equal moe_tp_size x moe_ep_size ({moe_tp} x {moe_ep})"
                )));
            }
        }
        Ok(ais)
    }

    fn is_set(&self) -> bool {
        self.ais_perf_config.is_some()
            || self.ais_backend.is_some()
            || self.ais_system.is_some()
            || self.ais_backend_version.is_some()
            || self.ais_tp_size.is_some()
            || self.ais_model_path.is_some()
            || self.ais_moe_tp_size.is_some()
            || self.ais_moe_ep_size.is_some()
            || self.ais_attention_dp_size.is_some()
            || self.ais_nextn.is_some()
            || self.ais_nextn_accept_rates.is_some()
            || self.ais_mtp_seed.is_some()
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

fn conditional_disagg_config(value: &str) -> Result<String, String> {
    let parsed: serde_json::Value =
        serde_json::from_str(value).map_err(|error| format!("not valid JSON: {error}"))?;
    let object = parsed
        .as_object()
        .ok_or_else(|| "must be a JSON object".to_string())?;
    if let Some(unknown) = object
        .keys()
        .find(|key| !CONDITIONAL_DISAGG_KEYS.contains(&key.as_str()))
    {
        return Err(format!(
            "unknown key {unknown:?}; expected {}",
            CONDITIONAL_DISAGG_KEYS.join(", ")
        ));
    }
    Ok(value.to_string())
}

fn accept_rates(value: &str) -> Result<String, String> {
    for rate in value.split(',') {
        unit_interval(rate)?;
    }
    Ok(value.to_string())
}

fn predictor_poly(value: &str) -> Result<String, String> {
    let coefficients: Vec<&str> = value.split(',').collect();
    if coefficients.len() != 3
        || coefficients
            .iter()
            .any(|c| c.trim().parse::<f64>().map_or(true, |x| !x.is_finite()))
    {
        return Err(format!("expected three numbers a,b,c, got {value:?}"));
    }
    Ok(value.to_string())
}
