//! One request inside the engine: its tokens, block hashes, KV progress and output generator.

use kvmesh_kv::{BlockHasher, LocalBlockHash, SequenceHash, hashing::chain_seq_hash, seed_for};

use super::logprobs::{self, TokenLogprobs};
use super::pool::Slot;
use super::sampler::{Vocab, Xoshiro256, thinking_len};
use super::types::{EngineRequest, EngineSampling, FinishKind};
use super::{EngineConfig, ReasoningConfig};

/// A request's scheduling state. Its KV holds `num_computed` tokens in `blocks`; the tokens past
/// that (the rest of the prompt, or the last generated token) are computed by later passes.
#[derive(Debug)]
pub(crate) struct Sequence {
    pub(crate) key: u64,
    /// Prompt followed by every generated token.
    pub(crate) tokens: Vec<u32>,
    pub(crate) num_prompt_tokens: usize,
    pub(crate) num_computed: usize,
    pub(crate) blocks: Vec<Slot>,
    /// Hashes of every full block of `tokens` (only with prefix caching).
    local_hashes: Vec<LocalBlockHash>,
    seq_hashes: Vec<SequenceHash>,
    hasher: Option<BlockHasher>,
    /// Prefill lasts until `num_computed` reaches this (set at each admission).
    pub(crate) prefill_target: usize,
    /// Tokens scheduled for the pass being built; 0 when not scheduled.
    pub(crate) num_scheduled: usize,
    pub(crate) cached_tokens: u32,
    pub(crate) is_admitted_before: bool,
    max_tokens: u32,
    min_tokens: u32,
    stop_token_ids: Vec<u32>,
    num_thinking: u32,
    reasoning: Option<ReasoningConfig>,
    rng: Xoshiro256,
    sampling: EngineSampling,
    forced_output: Vec<u32>,
    /// Seeds the generator of each position's log probabilities, so they do not depend on how
    /// many alternatives were asked for, and asking for them never changes the tokens.
    logprob_seed: u64,
}

/// A sampled token and whether it ended the sequence.
pub(crate) struct Sampled {
    pub(crate) token_id: u32,
    pub(crate) is_first: bool,
    pub(crate) finish: Option<FinishKind>,
    pub(crate) logprobs: Option<Box<TokenLogprobs>>,
}

impl Sequence {
    /// Validates a request and builds its sequence; the error is the message of its
    /// [`FinishKind::Error`] output.
    pub(crate) fn new(request: EngineRequest, config: &EngineConfig) -> Result<Self, String> {
        let EngineRequest {
            key,
            request_id,
            prompt,
            max_tokens,
            min_tokens,
            stop_token_ids,
            ignore_eos: _,
            lora_name,
            cache_salt,
            sampling,
            forced_output,
            max_thinking_tokens,
            prompt_hashes,
        } = request;
        if prompt.is_empty() {
            return Err("prompt is empty".to_owned());
        }
        let num_prompt_tokens = prompt.len();
        let mut max_tokens = max_tokens.unwrap_or(config.default_max_tokens);
        if max_tokens == 0 {
            return Err("max_tokens must be at least 1".to_owned());
        }
        if let Some(max_model_len) = config.max_model_len {
            if num_prompt_tokens >= max_model_len {
                return Err(format!(
                    "prompt of {num_prompt_tokens} tokens leaves no room for output within \
                     max_model_len {max_model_len}"
                ));
            }
            let room = u32::try_from(max_model_len - num_prompt_tokens).unwrap_or(u32::MAX);
            max_tokens = max_tokens.min(room);
        }
        let block_size = config.block_size.max(1);
        let num_prompt_blocks = num_prompt_tokens.div_ceil(block_size);
        if num_prompt_blocks > config.num_gpu_blocks {
            return Err(format!(
                "prompt of {num_prompt_tokens} tokens needs {num_prompt_blocks} KV blocks, the \
                 pool has {}",
                config.num_gpu_blocks
            ));
        }
        // The pool is an implicit context limit: a sequence alone on the rank must be able to
        // hold its prompt and every output but the last (whose KV is never computed).
        let kv_capacity = config.num_gpu_blocks.saturating_mul(block_size);
        let room = u32::try_from(kv_capacity + 1 - num_prompt_tokens).unwrap_or(u32::MAX);
        max_tokens = max_tokens.min(room);
        // Sorted for a binary search per generated token: the list comes from the request.
        let mut stop_token_ids = stop_token_ids;
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        let hash_seed = seed_for(lora_name.as_deref(), cache_salt.as_deref());
        let hasher = config
            .enable_prefix_caching
            .then(|| BlockHasher::new(block_size, hash_seed));
        // Hashes the caller computed are taken only when they are what hashing here would give:
        // the same block size and seed, one per full block of the prompt.
        let (local_hashes, seq_hashes) = match prompt_hashes {
            Some(hashes)
                if hasher.is_some()
                    && hashes.block_size == block_size
                    && hashes.seed == hash_seed
                    && hashes.local.len() == num_prompt_tokens / block_size
                    && hashes.seq.len() == hashes.local.len() =>
            {
                (hashes.local, hashes.seq)
            }
            _ => (Vec::new(), Vec::new()),
        };
        let rng = Xoshiro256::for_output(
            config.seed,
            &prompt,
            &request_id,
            sampling.greedy,
            sampling.seed,
        );
        let logprob_seed = rng.side_seed();
        let mut sequence = Self {
            key,
            tokens: prompt,
            num_prompt_tokens,
            num_computed: 0,
            blocks: Vec::new(),
            local_hashes,
            seq_hashes,
            hasher,
            prefill_target: 0,
            num_scheduled: 0,
            cached_tokens: 0,
            is_admitted_before: false,
            max_tokens,
            min_tokens: min_tokens.min(max_tokens),
            stop_token_ids,
            num_thinking: thinking_budget(
                thinking_len(config.reasoning.as_ref(), max_tokens),
                config.reasoning.as_ref(),
                max_thinking_tokens,
            ),
            reasoning: config.reasoning.clone(),
            rng,
            sampling,
            forced_output,
            logprob_seed,
        };
        sequence.extend_hashes();
        Ok(sequence)
    }

    pub(crate) fn num_outputs(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    pub(crate) fn is_prefilling(&self) -> bool {
        self.num_computed < self.prefill_target
    }

    /// Sequence hash of full block `index`, when prefix caching is on and the block is full.
    pub(crate) fn block_hash(&self, index: usize) -> Option<(SequenceHash, LocalBlockHash)> {
        Some((*self.seq_hashes.get(index)?, *self.local_hashes.get(index)?))
    }

    /// Sequence hashes of every full block (empty without prefix caching).
    pub(crate) fn seq_hashes(&self) -> &[SequenceHash] {
        &self.seq_hashes
    }

    /// Hashes the blocks `tokens` has filled since the last call.
    fn extend_hashes(&mut self) {
        let Some(hasher) = &mut self.hasher else {
            return;
        };
        let block_size = hasher.block_size();
        while (self.local_hashes.len() + 1) * block_size <= self.tokens.len() {
            let start = self.local_hashes.len() * block_size;
            let local = hasher.hash_block(&self.tokens[start..start + block_size]);
            let seq = match self.seq_hashes.last() {
                None => local,
                Some(&parent) => chain_seq_hash(parent, local),
            };
            self.local_hashes.push(local);
            self.seq_hashes.push(seq);
        }
    }

    /// Produces the next output token (the pass finished computing every known token) and
    /// decides whether the sequence ends with it.
    pub(crate) fn sample(&mut self, vocab: &Vocab) -> Sampled {
        let index = self.num_outputs() as u32;
        let is_first = index == 0;
        // A reasoning model thinks first; forced (guided) output follows the thinking.
        let forced = index
            .checked_sub(self.num_thinking)
            .and_then(|at| self.forced_output.get(at as usize))
            .copied();
        let marker = match &self.reasoning {
            Some(reasoning) if index < self.num_thinking => {
                let at = index as usize;
                let end_from =
                    (self.num_thinking as usize).saturating_sub(reasoning.end_thinking.len());
                if at < reasoning.start_thinking.len() {
                    Some(reasoning.start_thinking[at])
                } else if at >= end_from {
                    reasoning.end_thinking.get(at - end_from).copied()
                } else {
                    None
                }
            }
            _ => None,
        };
        let token_id = forced
            .or(marker)
            .unwrap_or_else(|| vocab.draw(&mut self.rng));
        let logprobs = self.sampling.logprobs.map(|num_top| {
            let mut rng = Xoshiro256::from_seed(self.logprob_seed ^ u64::from(index));
            Box::new(logprobs::draw(
                &mut rng,
                vocab,
                token_id,
                self.sampling.greedy,
                num_top,
            ))
        });
        self.tokens.push(token_id);
        self.extend_hashes();
        let num_outputs = index + 1;
        // As vLLM: a stop token wins over the length limit on the same token.
        let finish = if forced.is_some()
            && num_outputs as usize == self.num_thinking as usize + self.forced_output.len()
        {
            Some(FinishKind::Eos)
        } else if marker.is_none()
            && num_outputs >= self.min_tokens
            && self.stop_token_ids.binary_search(&token_id).is_ok()
        {
            Some(FinishKind::Stop)
        } else if num_outputs >= self.max_tokens {
            Some(FinishKind::Length)
        } else {
            None
        };
        Sampled {
            token_id,
            is_first,
            finish,
            logprobs,
        }
    }
}

/// The thinking section's length under a request's `max_thinking_tokens` (tokens between the
/// markers), markers included; the markers always fit whole or not at all.
fn thinking_budget(len: u32, reasoning: Option<&ReasoningConfig>, budget: Option<u32>) -> u32 {
    match (reasoning, budget) {
        (Some(reasoning), Some(budget)) if len > 0 => {
            len.min(budget.saturating_add(reasoning.marker_len()))
        }
        _ => len,
    }
}
