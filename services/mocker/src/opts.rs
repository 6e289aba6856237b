//! The mocker's configuration, under Dynamo's mocker flag names (docs/mocker.md, "Flags").

use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};
use kvmesh_runtime::config::{RuntimeOpts, parse_bool};

use kvmesh_llm::reasoning::ReasoningFormat;
use kvmesh_llm::tool_calls::ToolCallFormat;

use crate::engine::{EngineConfig, PreemptionMode, ReasoningConfig};

/// Which running sequence a full KV pool evicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionPolicy {
    /// The newest running sequence (vLLM v1 default).
    Lifo,
    /// The oldest running sequence.
    Fifo,
}

/// Options of `kvmesh-mocker`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvmesh-mocker",
    version,
    about = "Mock inference engine for kvmesh"
)]
pub struct MockerOpts {
    /// Shared runtime options (discovery, planes, logging).
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Model directory: tokenizer (for the vocabulary) and config.
    #[arg(long, env = "KVMESH_MOCKER_MODEL_PATH")]
    pub model_path: PathBuf,

    /// Where to register: `dyn://{namespace}.{component}.{endpoint}`.
    #[arg(long, env = "KVMESH_MOCKER_ENDPOINT", default_value = "dyn://dynamo.backend.generate", value_parser = parse_endpoint)]
    pub endpoint: EndpointPath,

    /// Served model name (default: the model directory's name).
    #[arg(long, env = "KVMESH_MOCKER_MODEL_NAME")]
    pub model_name: Option<String>,

    /// Engine options.
    #[command(flatten)]
    pub engine: EngineArgs,

    /// For tests: a file read at every Generate call; `stall` accepts requests and never
    /// answers, `fail` fails them at once, anything else serves (kvmesh; docs/mocker.md, "Fault
    /// injection").
    #[arg(long, env = "KVMESH_MOCKER_FAULT_FILE")]
    pub fault_file: Option<PathBuf>,
}

/// The engine options of the mocker, shared with `kvmesh up`.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// KV blocks per data-parallel rank.
    #[arg(long, env = "KVMESH_MOCKER_NUM_GPU_BLOCKS", default_value_t = 16384, value_parser = clap::value_parser!(u64).range(1..))]
    pub num_gpu_blocks_override: u64,

    /// Tokens per KV block.
    #[arg(long, env = "KVMESH_MOCKER_BLOCK_SIZE", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub block_size: u64,

    /// Longest prompt plus output (unset: the model config's context length, or no limit).
    #[arg(long, env = "KVMESH_MOCKER_MAX_MODEL_LEN", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_model_len: Option<u64>,

    /// Most sequences running at once.
    #[arg(long, env = "KVMESH_MOCKER_MAX_NUM_SEQS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_num_seqs: u64,

    /// Token budget of one scheduler pass.
    #[arg(long, env = "KVMESH_MOCKER_MAX_NUM_BATCHED_TOKENS", default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_num_batched_tokens: u64,

    /// Share cached prefix blocks between requests.
    #[arg(long, env = "KVMESH_MOCKER_ENABLE_PREFIX_CACHING", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_prefix_caching: bool,

    /// Disable prefix caching.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,

    /// Split long prompts over several passes.
    #[arg(long, env = "KVMESH_MOCKER_ENABLE_CHUNKED_PREFILL", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub enable_chunked_prefill: bool,

    /// Disable chunked prefill.
    #[arg(long, overrides_with = "enable_chunked_prefill")]
    pub no_enable_chunked_prefill: bool,

    /// Which running sequence to preempt when the KV pool is full.
    #[arg(
        long,
        env = "KVMESH_MOCKER_PREEMPTION_MODE",
        value_enum,
        default_value = "lifo"
    )]
    pub preemption_mode: PreemptionPolicy,

    /// Divide every simulated duration by this (0 = no sleeping at all).
    #[arg(long, env = "KVMESH_MOCKER_SPEEDUP_RATIO", default_value_t = 1.0, value_parser = non_negative, allow_negative_numbers = true)]
    pub speedup_ratio: f64,

    /// Further divide the decode part of every pass by this.
    #[arg(long, env = "KVMESH_MOCKER_DECODE_SPEEDUP_RATIO", default_value_t = 1.0, value_parser = positive, allow_negative_numbers = true)]
    pub decode_speedup_ratio: f64,

    /// Independent data-parallel ranks per worker.
    #[arg(long, env = "KVMESH_MOCKER_DATA_PARALLEL_SIZE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub data_parallel_size: u32,

    /// Seconds to wait before registering (simulates model loading).
    #[arg(long, env = "KVMESH_MOCKER_STARTUP_TIME", value_parser = non_negative, allow_negative_numbers = true)]
    pub startup_time: Option<f64>,

    /// Workers in this process, each with its own instance id and gRPC server.
    #[arg(long, env = "KVMESH_MOCKER_NUM_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub num_workers: u32,

    /// Seconds between worker start-ups; -1 picks 0.1 s for 33-128 workers, 0.2 s above, else 0.
    #[arg(long, env = "KVMESH_MOCKER_STAGGER_DELAY", default_value_t = -1.0, allow_negative_numbers = true)]
    pub stagger_delay: f64,

    /// Reasoning output as JSON `{start_thinking_token_id, end_thinking_token_id, thinking_ratio}`.
    #[arg(long, env = "KVMESH_MOCKER_REASONING", value_parser = parse_reasoning)]
    pub reasoning: Option<ReasoningConfig>,

    /// The syntax the model writes tool calls in (as Dynamo's workers take it): published as
    /// the model card's `tool_call_parser`, so the frontend reads calls out of the output, and
    /// the syntax the mock engine writes its calls in (docs/mocker.md, "Tool calls").
    #[arg(long = "dyn-tool-call-parser", env = "KVMESH_MOCKER_TOOL_CALL_PARSER", value_parser = parse_tool_call_parser)]
    pub tool_call_parser: Option<ToolCallFormat>,

    /// The syntax the model marks its thinking with (as Dynamo's workers take it): published as
    /// the model card's `reasoning_parser`, so the frontend splits reasoning from content, and,
    /// unless `--reasoning` is set, the markers the mock engine thinks between (half of each
    /// output; docs/mocker.md, "Reasoning").
    #[arg(long = "dyn-reasoning-parser", env = "KVMESH_MOCKER_REASONING_PARSER", value_parser = parse_reasoning_parser)]
    pub reasoning_parser: Option<ReasoningFormat>,

    /// JSON file whose keys override the options above (Dynamo's `--extra-engine-args`).
    #[arg(long, env = "KVMESH_MOCKER_EXTRA_ENGINE_ARGS")]
    pub extra_engine_args: Option<PathBuf>,

    /// Seed of the output-token generator.
    #[arg(long, env = "KVMESH_MOCKER_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Output tokens when a request sets no max_tokens.
    #[arg(long, env = "KVMESH_MOCKER_DEFAULT_MAX_TOKENS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_tokens: u32,
}

/// A parsed `dyn://namespace.component.endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPath {
    /// Namespace.
    pub namespace: String,
    /// Component, e.g. `backend`.
    pub component: String,
    /// Endpoint, e.g. `generate`.
    pub endpoint: String,
}

/// Parses `dyn://namespace.component.endpoint` (the `dyn://` prefix is optional).
pub fn parse_endpoint(value: &str) -> Result<EndpointPath, String> {
    let rest = value.strip_prefix("dyn://").unwrap_or(value);
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        [namespace, component, endpoint]
            if parts.iter().all(|p| !p.is_empty() && !p.contains('/')) =>
        {
            Ok(EndpointPath {
                namespace: namespace.to_string(),
                component: component.to_string(),
                endpoint: endpoint.to_string(),
            })
        }
        _ => Err(format!(
            "expected dyn://namespace.component.endpoint, got {value:?}"
        )),
    }
}

fn non_negative(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("must be a number >= 0, got {value}")),
    }
}

fn positive(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a number > 0, got {value}")),
    }
}

fn parse_tool_call_parser(value: &str) -> Result<ToolCallFormat, String> {
    ToolCallFormat::from_name(value).ok_or_else(|| {
        format!(
            "unknown tool-call parser {value:?}; known: {}",
            ToolCallFormat::NAMES.join(", ")
        )
    })
}

fn parse_reasoning_parser(value: &str) -> Result<ReasoningFormat, String> {
    ReasoningFormat::from_name(value).ok_or_else(|| {
        format!(
            "unknown reasoning parser {value:?}; known: {}",
            ReasoningFormat::NAMES.join(", ")
        )
    })
}

fn parse_reasoning(value: &str) -> Result<ReasoningConfig, String> {
    #[derive(serde::Deserialize)]
    struct Raw {
        start_thinking_token_id: u32,
        end_thinking_token_id: u32,
        thinking_ratio: f64,
    }
    let raw: Raw = serde_json::from_str(value).map_err(|e| format!("invalid JSON: {e}"))?;
    if !(0.0..=1.0).contains(&raw.thinking_ratio) {
        return Err("thinking_ratio must be within [0, 1]".into());
    }
    Ok(ReasoningConfig::single(
        raw.start_thinking_token_id,
        raw.end_thinking_token_id,
        raw.thinking_ratio,
    ))
}

impl EngineArgs {
    /// Applies `--extra-engine-args`: a JSON object whose keys are option names (snake or kebab
    /// case) overriding the parsed values.
    pub fn apply_extra_engine_args(&mut self) -> Result<(), String> {
        let Some(path) = &self.extra_engine_args else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--extra-engine-args {}: {e}", path.display()))?;
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
            .map_err(|e| format!("--extra-engine-args {}: {e}", path.display()))?;
        for (key, value) in map {
            let key = key.replace('-', "_");
            let as_u64 = || {
                value.as_u64().ok_or_else(|| {
                    format!("--extra-engine-args: {key} must be an unsigned integer")
                })
            };
            let as_bool = || {
                value
                    .as_bool()
                    .ok_or_else(|| format!("--extra-engine-args: {key} must be a boolean"))
            };
            match key.as_str() {
                "num_gpu_blocks_override" | "num_gpu_blocks" => {
                    self.num_gpu_blocks_override = as_u64()?.max(1)
                }
                "block_size" => self.block_size = as_u64()?.max(1),
                "max_model_len" => self.max_model_len = Some(as_u64()?.max(1)),
                "max_num_seqs" => self.max_num_seqs = as_u64()?.max(1),
                "max_num_batched_tokens" => self.max_num_batched_tokens = as_u64()?.max(1),
                "enable_prefix_caching" => self.enable_prefix_caching = as_bool()?,
                "enable_chunked_prefill" => self.enable_chunked_prefill = as_bool()?,
                "speedup_ratio" => {
                    self.speedup_ratio = value
                        .as_f64()
                        .filter(|v| *v >= 0.0)
                        .ok_or("--extra-engine-args: speedup_ratio must be >= 0")?
                }
                "data_parallel_size" => self.data_parallel_size = as_u64()?.clamp(1, 1024) as u32,
                other => tracing::warn!(key = other, "ignoring unknown extra engine arg"),
            }
        }
        Ok(())
    }

    /// Whether prefix caching is on after `--no-enable-prefix-caching`.
    pub fn prefix_caching(&self) -> bool {
        kvmesh_runtime::config::negatable(self.enable_prefix_caching, self.no_enable_prefix_caching)
    }

    /// Whether chunked prefill is on after `--no-enable-chunked-prefill`.
    pub fn chunked_prefill(&self) -> bool {
        kvmesh_runtime::config::negatable(
            self.enable_chunked_prefill,
            self.no_enable_chunked_prefill,
        )
    }

    /// Delay between worker start-ups, resolving the automatic value.
    pub fn stagger(&self) -> std::time::Duration {
        let seconds = if self.stagger_delay < 0.0 {
            match self.num_workers {
                0..=32 => 0.0,
                33..=128 => 0.1,
                _ => 0.2,
            }
        } else {
            self.stagger_delay
        };
        std::time::Duration::from_secs_f64(seconds)
    }

    /// The engine-core configuration these options describe.
    pub fn engine_config(
        &self,
        vocab_size: u32,
        special_ids: Vec<u32>,
        max_model_len: Option<usize>,
    ) -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: self.num_gpu_blocks_override as usize,
            block_size: self.block_size as usize,
            max_num_seqs: self.max_num_seqs as usize,
            max_num_batched_tokens: self.max_num_batched_tokens as usize,
            enable_prefix_caching: self.prefix_caching(),
            enable_chunked_prefill: self.chunked_prefill(),
            preemption_mode: match self.preemption_mode {
                PreemptionPolicy::Lifo => PreemptionMode::Lifo,
                PreemptionPolicy::Fifo => PreemptionMode::Fifo,
            },
            max_model_len: self.max_model_len.map(|v| v as usize).or(max_model_len),
            default_max_tokens: self.default_max_tokens,
            seed: self.seed,
            vocab_size,
            special_token_ids: special_ids,
            word_token_ids: Vec::new(),
            reasoning: self.reasoning.clone(),
            kv_cache_trace: kvmesh_runtime::config::env_truthy("DYN_MOCKER_KV_CACHE_TRACE"),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn endpoint_parses() {
        let path = parse_endpoint("dyn://ns1.backend.generate").unwrap();
        assert_eq!(path.namespace, "ns1");
        assert_eq!(path.component, "backend");
        assert!(parse_endpoint("dyn://a.b").is_err());
    }

    #[test]
    fn env_names_are_unique() {
        kvmesh_runtime::config::check_unique_env(&MockerOpts::command()).unwrap();
    }

    #[test]
    fn negated_flags_win() {
        let opts =
            MockerOpts::try_parse_from(["m", "--model-path", "/tmp", "--no-enable-prefix-caching"])
                .unwrap();
        assert!(!opts.engine.prefix_caching());
        assert!(opts.engine.chunked_prefill());
    }
}
