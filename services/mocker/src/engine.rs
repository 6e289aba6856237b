//! The mocker's engine core: paged KV blocks, a vLLM-style scheduler, token generation and the
//! timing model (docs/mocker.md), with no clock and no async.
//!
//! One [`DpEngine`] is one data-parallel rank. A driver calls [`DpEngine::step`] for each scheduler
//! pass and decides what a pass costs in time from [`StepOutput::prefill_ms`] and
//! [`StepOutput::decode_ms`]: the real-time server sleeps, [`sim::Simulation`] advances a virtual
//! clock. Keeping the core synchronous and clock-free is what makes virtual-time runs bit-identical
//! on every machine.

mod dp_engine;
pub mod logprobs;
mod pool;
mod sampler;
mod sequence;
pub mod sim;
pub mod timing;
mod types;

use std::sync::Arc;

pub use self::dp_engine::DpEngine;
pub use self::logprobs::TokenLogprobs;
pub(crate) use self::sampler::Xoshiro256;
pub use self::types::{
    EngineRequest, EngineSampling, FinishKind, KvCacheEvent, LoadSnapshot, PromptHashes,
    StepOutput, StoredBlock, TokenOutput,
};

/// Which running sequence the scheduler preempts when a sequence needs a KV block and none can
/// be freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// The newest running sequence (vLLM v1 default).
    #[default]
    Lifo,
    /// The oldest running sequence.
    Fifo,
}

/// `--reasoning` or `--dyn-reasoning-parser`: wrap the first part of every output in thinking
/// markers, as reasoning models do.
#[derive(Debug, Clone, PartialEq)]
pub struct ReasoningConfig {
    /// Tokens that open the thinking section (the first output tokens).
    pub start_thinking: Arc<[u32]>,
    /// Tokens that close the thinking section.
    pub end_thinking: Arc<[u32]>,
    /// Fraction of the output spent thinking, in `[0, 1]`.
    pub thinking_ratio: f64,
}

impl ReasoningConfig {
    /// Markers of one token each (`--reasoning` JSON).
    pub fn single(
        start_thinking_token_id: u32,
        end_thinking_token_id: u32,
        thinking_ratio: f64,
    ) -> Self {
        Self {
            start_thinking: Arc::from([start_thinking_token_id]),
            end_thinking: Arc::from([end_thinking_token_id]),
            thinking_ratio,
        }
    }

    /// Tokens of both markers.
    pub(crate) fn marker_len(&self) -> u32 {
        (self.start_thinking.len() + self.end_thinking.len()) as u32
    }
}

/// Settings of one data-parallel rank, mirroring the mocker's CLI (docs/mocker.md, "Flags").
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV blocks in this rank's pool.
    pub num_gpu_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Token budget of one scheduler pass.
    pub max_num_batched_tokens: usize,
    /// Share full blocks between requests by sequence hash; also turns KV events on.
    pub enable_prefix_caching: bool,
    /// Split prompts larger than the remaining budget across passes.
    pub enable_chunked_prefill: bool,
    /// Victim choice when the pool runs out.
    pub preemption_mode: PreemptionMode,
    /// Longest prompt plus output; `None` means no limit.
    pub max_model_len: Option<usize>,
    /// Output length of a request that sets no `max_tokens`.
    pub default_max_tokens: u32,
    /// Seeds every request's token PRNG together with its request id.
    pub seed: u64,
    /// Token ids are drawn from `0..vocab_size`.
    pub vocab_size: u32,
    /// Ids never drawn (special tokens); any order, duplicates allowed.
    pub special_token_ids: Vec<u32>,
    /// When not empty, output tokens are drawn from these instead: the model's whole-word
    /// tokens ([`crate::words::whole_word_ids`]), so the output reads as words. The simulator
    /// leaves it empty and draws from the whole vocabulary.
    pub word_token_ids: Vec<u32>,
    /// Thinking markers around the first part of each output.
    pub reasoning: Option<ReasoningConfig>,
    /// Log block allocation and eviction (`DYN_MOCKER_KV_CACHE_TRACE`).
    pub kv_cache_trace: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_gpu_blocks: 16384,
            block_size: 64,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            preemption_mode: PreemptionMode::Lifo,
            max_model_len: None,
            default_max_tokens: 256,
            seed: 0,
            vocab_size: 32000,
            special_token_ids: Vec::new(),
            word_token_ids: Vec::new(),
            reasoning: None,
            kv_cache_trace: false,
        }
    }
}

/// Why an [`EngineConfig`] cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A count or size that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// Every id of the vocabulary is special, so no token can be drawn.
    #[error("vocabulary of {0} ids has no drawable (non-special) token")]
    NoDrawableToken(u32),
    /// `thinking_ratio` is outside `[0, 1]`.
    #[error("reasoning thinking_ratio must be within [0, 1]")]
    ThinkingRatio,
}

impl EngineConfig {
    /// Checks the settings a rank cannot run with, so a process fails at start with a clear
    /// message. [`DpEngine::new`] also accepts an invalid config, clamping sizes to 1 and drawing
    /// token 0 when nothing is drawable, so it never panics.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("block_size", self.block_size),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("vocab_size", self.vocab_size as usize),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.word_token_ids.is_empty()
            && sampler::Vocab::new(self.vocab_size, &self.special_token_ids, Default::default())
                .num_drawable()
                == 0
        {
            return Err(ConfigError::NoDrawableToken(self.vocab_size));
        }
        if let Some(reasoning) = &self.reasoning
            && !(0.0..=1.0).contains(&reasoning.thinking_ratio)
        {
            return Err(ConfigError::ThinkingRatio);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_matches_cli_defaults() {
        let config = EngineConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.num_gpu_blocks, 16384);
        assert_eq!(config.block_size, 64);
        assert_eq!(config.max_num_seqs, 256);
        assert_eq!(config.max_num_batched_tokens, 8192);
        assert_eq!(config.default_max_tokens, 256);
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let zero_blocks = EngineConfig {
            num_gpu_blocks: 0,
            ..EngineConfig::default()
        };
        assert_eq!(
            zero_blocks.validate(),
            Err(ConfigError::Zero("num_gpu_blocks"))
        );
        let all_special = EngineConfig {
            vocab_size: 3,
            special_token_ids: vec![2, 0, 1, 1],
            ..EngineConfig::default()
        };
        assert_eq!(all_special.validate(), Err(ConfigError::NoDrawableToken(3)));
        let ratio = EngineConfig {
            reasoning: Some(ReasoningConfig::single(1, 2, 1.5)),
            ..EngineConfig::default()
        };
        assert_eq!(ratio.validate(), Err(ConfigError::ThinkingRatio));
    }
}
