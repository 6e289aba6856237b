//! What goes into and comes out of the engine core.

use super::logprobs::TokenLogprobs;

/// One generation request as the engine core sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineRequest {
    /// Caller-assigned id, unique among live requests of a rank; names the request in
    /// [`TokenOutput`]s and in [`crate::engine::DpEngine::cancel`].
    pub key: u64,
    /// The request's id; with the config seed it seeds the token PRNG of a request that is
    /// neither greedy nor seeded, so the same id and seed always produce the same tokens.
    pub request_id: String,
    /// Prompt token ids; must not be empty.
    pub prompt: Vec<u32>,
    /// Output tokens to produce; `None` means the configured default. Capped so prompt plus
    /// output fits `max_model_len`.
    pub max_tokens: Option<u32>,
    /// Stop tokens are ignored until this many tokens have been produced.
    pub min_tokens: u32,
    /// Drawing one of these ends the request with [`FinishKind::Stop`].
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS. The mock engine never draws EOS (a special token), so its
    /// outputs always run to a stop token or the length limit; explicit stop token ids still
    /// apply, as in vLLM.
    pub ignore_eos: bool,
    /// LoRA adapter; mixed into the block hashes (docs/kv-events.md, "Hashing").
    pub lora_name: Option<String>,
    /// Cache salt (`cache_salt`, `x-tenant-id`); mixed into the block hashes after the LoRA
    /// name, as the router does, so salted prompts share blocks only with the same salt.
    pub cache_salt: Option<String>,
    /// How its tokens are drawn and whether log probabilities come with them.
    pub sampling: EngineSampling,
    /// When not empty, the output is exactly these tokens (guided decoding or tool calls: the
    /// worker wrote the text and tokenized it), after the thinking section when the engine
    /// reasons, cut at `max_tokens`.
    pub forced_output: Vec<u32>,
    /// Most tokens between the thinking markers (`max_thinking_tokens`); `None`: no limit.
    pub max_thinking_tokens: Option<u32>,
    /// The prompt's block hashes when the caller already has them (a worker's block-hash
    /// cache); ignored unless they match the engine's block size and the request's seed.
    pub prompt_hashes: Option<PromptHashes>,
}

/// The local and sequence hashes of every full block of a prompt, hashed with `block_size` and
/// `seed`, so an engine takes them instead of hashing a long prompt again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptHashes {
    /// Tokens per block the hashes were computed with.
    pub block_size: usize,
    /// The hash seed (LoRA name, cache salt) they were computed with.
    pub seed: u64,
    /// Local hash of each full block.
    pub local: Vec<u64>,
    /// Sequence hash of each full block.
    pub seq: Vec<u64>,
}

/// The sampling options the mock engine honours (docs/mocker.md, "Output").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineSampling {
    /// Temperature 0: the output depends on the prompt only, never on the request id.
    pub greedy: bool,
    /// A fixed seed: the output depends on the prompt and this seed only.
    pub seed: Option<u64>,
    /// Report each token's log probability and this many alternatives (at most 20).
    pub logprobs: Option<u32>,
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishKind {
    /// It produced its output length.
    Length,
    /// It drew a stop token.
    Stop,
    /// Its forced output ([`EngineRequest::forced_output`]) is complete, as a constrained
    /// engine ends at EOS once the grammar is satisfied.
    Eos,
    /// It could never run (empty prompt, too long, larger than the KV pool, ...); the message
    /// says why.
    Error(String),
}

/// One event of a request's life: a generated token, possibly with its finish, or an error finish.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    /// The request's [`EngineRequest::key`].
    pub key: u64,
    /// The generated token; 0 (and meaningless) on an [`FinishKind::Error`] output.
    pub token_id: u32,
    /// Whether this is the request's first token.
    pub is_first: bool,
    /// Prompt tokens found in the prefix cache when the request was first admitted; set on the
    /// first token (and on every later one, for convenience).
    pub cached_tokens: u32,
    /// Set on the request's last output; exactly one output per request carries it.
    pub finish: Option<FinishKind>,
    /// The token's log probabilities, when the request asked for them.
    pub logprobs: Option<Box<TokenLogprobs>>,
}

/// One block of a [`KvCacheEvent::Stored`] event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBlock {
    /// The block's sequence hash, which the mocker uses as its engine hash.
    pub block_hash: u64,
    /// The block's local (content) hash.
    pub tokens_hash: u64,
}

/// A change to the set of blocks this rank holds, as published to the indexers
/// (docs/kv-events.md, "Event model"; docs/mocker.md, "What it publishes").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// A chain of newly cached full blocks.
    Stored {
        /// Sequence hash of the block before the first one; `None` at the root.
        parent_hash: Option<u64>,
        /// The blocks, each the child of the previous one.
        blocks: Vec<StoredBlock>,
    },
    /// Blocks whose last copy was evicted.
    Removed {
        /// Sequence hashes of the evicted blocks.
        block_hashes: Vec<u64>,
    },
    /// Every cached block of this rank is gone.
    Cleared,
}

/// What one scheduler pass did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutput {
    /// Unscaled prefill term of the pass (docs/mocker.md, "Timing"); 0 when it had no prefill.
    pub prefill_ms: f64,
    /// Unscaled decode term of the pass; 0 when it had no decoding sequence.
    pub decode_ms: f64,
    /// Tokens and finishes, in scheduling order.
    pub outputs: Vec<TokenOutput>,
    /// KV events to publish, in order.
    pub kv_events: Vec<KvCacheEvent>,
    /// Uncached prompt tokens computed by the pass (the `T` of the prefill term).
    pub num_prefill_tokens: usize,
    /// Sequences that decoded one token in the pass.
    pub num_decode_seqs: usize,
    /// Sequences preempted by the pass.
    pub num_preemptions: usize,
}

impl StepOutput {
    /// Whether the pass did nothing at all (no compute, no outputs, no events).
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
            && self.kv_events.is_empty()
            && self.num_prefill_tokens == 0
            && self.num_decode_seqs == 0
    }
}

/// A rank's load as routers see it (`WorkerLoad` without the identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadSnapshot {
    /// Blocks referenced by running sequences.
    pub kv_used_blocks: usize,
    /// Blocks in the pool.
    pub kv_total_blocks: usize,
    /// Sequences admitted and not finished.
    pub num_running: usize,
    /// Sequences queued for admission (new or preempted).
    pub num_waiting: usize,
    /// Tokens the waiting sequences still have to prefill, before any prefix-cache hit.
    pub waiting_prefill_tokens: usize,
}
