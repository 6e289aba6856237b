//! The scheduler of one data-parallel rank (docs/mocker.md, "Scheduler"): a FCFS waiting queue
//! and a running set sharing one block pool, stepped one pass at a time by a driver.

use std::collections::{HashSet, VecDeque};

use super::pool::{BlockPool, Lookup, Slot};
use super::sampler::Vocab;
use super::sequence::Sequence;
use super::timing;
use super::types::{EngineRequest, FinishKind, LoadSnapshot, StepOutput, TokenOutput};
use super::{EngineConfig, PreemptionMode};

/// One data-parallel rank of the mock engine: block pool, scheduler and token generator.
///
/// Exists so a real-time server and a virtual-time simulator drive the same logic: it has no
/// clock, each [`Self::step`] is one scheduler pass, and the driver decides how long the pass
/// takes.
#[derive(Debug)]
pub struct DpEngine {
    config: EngineConfig,
    dp_rank: u32,
    vocab: Vocab,
    pool: BlockPool,
    /// Queued for admission; preempted sequences go back to the front.
    waiting: VecDeque<Sequence>,
    /// Admitted sequences in admission order (oldest first).
    running: Vec<Sequence>,
    live_keys: HashSet<u64>,
    /// Error finishes found outside a pass, reported by the next one.
    pending_outputs: Vec<TokenOutput>,
}

impl DpEngine {
    /// Creates an idle rank. An invalid `config` (see [`EngineConfig::validate`]) still runs:
    /// zero sizes count as 1.
    pub fn new(mut config: EngineConfig, dp_rank: u32) -> Self {
        config.num_gpu_blocks = config.num_gpu_blocks.max(1);
        config.block_size = config.block_size.max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        Self {
            vocab: Vocab::new(
                config.vocab_size,
                &config.special_token_ids,
                config.word_token_ids.as_slice().into(),
            ),
            pool: BlockPool::new(config.num_gpu_blocks, config.kv_cache_trace),
            config,
            dp_rank,
            waiting: VecDeque::new(),
            running: Vec::new(),
            live_keys: HashSet::new(),
            pending_outputs: Vec::new(),
        }
    }

    /// The rank this engine serves, as given to [`Self::new`].
    pub fn dp_rank(&self) -> u32 {
        self.dp_rank
    }

    /// The configuration in effect (sizes clamped to at least 1).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request. One that can never run (empty prompt, `max_tokens` 0, prompt not leaving
    /// room for output within `max_model_len`, prompt larger than the KV pool, key already live)
    /// finishes with a [`FinishKind::Error`] output in the next [`Self::step`].
    ///
    /// `max_tokens` is capped so prompt plus output fits `max_model_len` and the KV pool, so a
    /// sequence alone on the rank can always finish.
    pub fn add_request(&mut self, request: EngineRequest) {
        let key = request.key;
        if self.live_keys.contains(&key) {
            self.pending_outputs.push(error_output(
                key,
                format!("request key {key} is already in use"),
            ));
            return;
        }
        match Sequence::new(request, &self.config) {
            Ok(sequence) => {
                self.live_keys.insert(key);
                self.waiting.push_back(sequence);
            }
            Err(message) => self.pending_outputs.push(error_output(key, message)),
        }
    }

    /// Drops a waiting or running request without any further output; its blocks go to the
    /// inactive pool as on completion. Returns whether the request was live.
    pub fn cancel(&mut self, key: u64) -> bool {
        if !self.live_keys.remove(&key) {
            return false;
        }
        if let Some(position) = self.running.iter().position(|seq| seq.key == key) {
            let sequence = self.running.remove(position);
            self.pool.release(&sequence.blocks);
        } else if let Some(position) = self.waiting.iter().position(|seq| seq.key == key) {
            self.waiting.remove(position);
        }
        true
    }

    /// Whether [`Self::step`] would do or report anything: requests to run, outputs or KV events
    /// owed.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.waiting.is_empty()
            || !self.pending_outputs.is_empty()
            || self.pool.has_pending_events()
    }

    /// The rank's current load.
    pub fn load(&self) -> LoadSnapshot {
        LoadSnapshot {
            kv_used_blocks: self.pool.num_used(),
            kv_total_blocks: self.pool.num_blocks(),
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            waiting_prefill_tokens: self
                .waiting
                .iter()
                .map(|seq| seq.tokens.len() - seq.num_computed)
                .sum(),
        }
    }

    /// Drops every inactive cached block; the next [`Self::step`]'s events begin with
    /// [`super::KvCacheEvent::Cleared`], followed by a `Stored` for each block still in use so the
    /// indexers' view stays exact. Returns the number of blocks dropped; 0 and no event without
    /// prefix caching.
    pub fn clear_cache(&mut self) -> usize {
        if !self.config.enable_prefix_caching {
            return 0;
        }
        self.pool.clear()
    }

    /// Runs one scheduler pass: schedules running sequences (decode 1 token, prefill a chunk),
    /// preempting when blocks run out, admits waiting requests while budget, seats and blocks
    /// allow, then produces a token for every sequence whose known tokens are now all computed.
    /// A pass with no work returns an empty output with zero durations.
    pub fn step(&mut self) -> StepOutput {
        let mut output = StepOutput {
            outputs: std::mem::take(&mut self.pending_outputs),
            ..StepOutput::default()
        };
        let mut budget = self.config.max_num_batched_tokens;
        output.num_preemptions = self.schedule_running(&mut budget, &mut output.outputs);
        if output.num_preemptions == 0 {
            self.admit_waiting(&mut budget, &mut output.outputs);
        }

        for sequence in self.running.iter().filter(|seq| seq.num_scheduled > 0) {
            if sequence.is_prefilling() {
                output.num_prefill_tokens += sequence.num_scheduled;
            } else {
                output.num_decode_seqs += 1;
            }
        }
        if output.num_prefill_tokens > 0 {
            output.prefill_ms = timing::prefill_ms(output.num_prefill_tokens);
        }
        if output.num_decode_seqs > 0 {
            let usage = self.pool.num_used() as f64 / self.pool.num_blocks() as f64;
            output.decode_ms = timing::decode_ms(usage);
        }

        let mut index = 0;
        while index < self.running.len() {
            let sequence = &mut self.running[index];
            let num_scheduled = std::mem::take(&mut sequence.num_scheduled);
            sequence.num_computed += num_scheduled;
            if num_scheduled == 0 || sequence.num_computed < sequence.tokens.len() {
                index += 1;
                continue;
            }
            let sampled = sequence.sample(&self.vocab);
            let is_finished = sampled.finish.is_some();
            output.outputs.push(TokenOutput {
                key: sequence.key,
                token_id: sampled.token_id,
                is_first: sampled.is_first,
                cached_tokens: sequence.cached_tokens,
                finish: sampled.finish,
                logprobs: sampled.logprobs,
            });
            if is_finished {
                let sequence = self.running.remove(index);
                self.pool.release(&sequence.blocks);
                self.live_keys.remove(&sequence.key);
            } else {
                index += 1;
            }
        }
        output.kv_events = self.pool.take_events();
        output
    }

    /// Schedules the running sequences in admission order; returns the number preempted.
    fn schedule_running(&mut self, budget: &mut usize, outputs: &mut Vec<TokenOutput>) -> usize {
        let block_size = self.config.block_size;
        let mut num_preemptions = 0;
        let mut index = 0;
        while index < self.running.len() && *budget > 0 {
            let sequence = &self.running[index];
            let num_tokens = (sequence.tokens.len() - sequence.num_computed).min(*budget);
            let target = sequence.num_computed + num_tokens;
            loop {
                let cost = allocation_cost(&self.pool, &self.running[index], target, block_size);
                if cost <= self.pool.num_available() as isize {
                    let sequence = &mut self.running[index];
                    allocate(&mut self.pool, sequence, target, block_size);
                    sequence.num_scheduled = num_tokens;
                    *budget -= num_tokens;
                    index += 1;
                    break;
                }
                if self.running.len() == 1 {
                    // Unreachable while max_tokens is capped to the pool; never stall on it.
                    let sequence = self.running.remove(index);
                    self.pool.release(&sequence.blocks);
                    self.live_keys.remove(&sequence.key);
                    outputs.push(error_output(
                        sequence.key,
                        "sequence outgrew the KV cache".to_owned(),
                    ));
                    break;
                }
                let victim = match self.config.preemption_mode {
                    PreemptionMode::Lifo => self.running.len() - 1,
                    PreemptionMode::Fifo => 0,
                };
                *budget += self.running[victim].num_scheduled;
                self.preempt(victim);
                num_preemptions += 1;
                if victim == index {
                    break;
                }
                if victim < index {
                    index -= 1;
                }
            }
        }
        num_preemptions
    }

    /// Releases a running sequence's blocks and puts it at the front of the waiting queue, to be
    /// recomputed (prompt and generated tokens) when admitted again.
    fn preempt(&mut self, index: usize) {
        let mut sequence = self.running.remove(index);
        self.pool.release(&sequence.blocks);
        sequence.blocks.clear();
        sequence.num_computed = 0;
        sequence.num_scheduled = 0;
        if self.config.kv_cache_trace {
            tracing::info!(key = sequence.key, "sequence preempted");
        }
        self.waiting.push_front(sequence);
    }

    /// Admits waiting sequences in order while budget, seats and blocks allow.
    fn admit_waiting(&mut self, budget: &mut usize, outputs: &mut Vec<TokenOutput>) {
        let block_size = self.config.block_size;
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(sequence) = self.waiting.front() else {
                break;
            };
            let num_tokens = sequence.tokens.len();
            // Never count the last token as cached: the pass must compute something to produce
            // logits, so an all-cached prompt recomputes its last block.
            let max_hit_blocks = (num_tokens - 1) / block_size;
            let num_hit_blocks = sequence
                .seq_hashes()
                .iter()
                .take(max_hit_blocks)
                .take_while(|&&hash| self.pool.lookup(hash) != Lookup::Absent)
                .count();
            let num_cached = num_hit_blocks * block_size;
            let num_remaining = num_tokens - num_cached;
            let num_scheduled = if self.config.enable_chunked_prefill {
                num_remaining.min(*budget)
            } else if num_remaining > self.config.max_num_batched_tokens {
                let key = sequence.key;
                self.waiting.pop_front();
                self.live_keys.remove(&key);
                outputs.push(error_output(
                    key,
                    format!(
                        "{num_remaining} tokens to prefill exceed max_num_batched_tokens {} \
                         and chunked prefill is off",
                        self.config.max_num_batched_tokens
                    ),
                ));
                continue;
            } else if num_remaining > *budget {
                break;
            } else {
                num_remaining
            };
            let target = num_cached + num_scheduled;
            let cost = allocation_cost(&self.pool, sequence, target, block_size);
            if cost > self.pool.num_available() as isize {
                break;
            }
            let Some(mut sequence) = self.waiting.pop_front() else {
                break;
            };
            allocate(&mut self.pool, &mut sequence, target, block_size);
            sequence.num_computed = num_cached;
            sequence.prefill_target = num_tokens;
            sequence.num_scheduled = num_scheduled;
            if !sequence.is_admitted_before {
                sequence.is_admitted_before = true;
                sequence.cached_tokens = num_cached as u32;
            }
            *budget -= num_scheduled;
            self.running.push(sequence);
        }
    }

    /// The pool, for consistency checks in tests.
    #[cfg(test)]
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }
}

fn error_output(key: u64, message: String) -> TokenOutput {
    TokenOutput {
        key,
        token_id: 0,
        is_first: false,
        cached_tokens: 0,
        finish: Some(FinishKind::Error(message)),
        logprobs: None,
    }
}

/// Net blocks [`allocate`] takes from the available ones (free plus evictable) so that `sequence`
/// holds `target` computed tokens: a new or reactivated block costs 1, a reference on an active
/// block nothing, and a private block that fills up and turns out to be cached frees itself.
fn allocation_cost(
    pool: &BlockPool,
    sequence: &Sequence,
    target: usize,
    block_size: usize,
) -> isize {
    let num_held = sequence.blocks.len();
    let mut cost = 0isize;
    if num_held > 0
        && sequence.blocks[num_held - 1] == Slot::Private
        && num_held * block_size <= target
        && let Some((hash, _)) = sequence.block_hash(num_held - 1)
        && pool.lookup(hash) == Lookup::Active
    {
        cost -= 1;
    }
    for index in num_held..target.div_ceil(block_size) {
        let is_full = (index + 1) * block_size <= target;
        match sequence.block_hash(index).filter(|_| is_full) {
            Some((hash, _)) if pool.lookup(hash) == Lookup::Active => {}
            _ => cost += 1,
        }
    }
    cost
}

/// Gives `sequence` the blocks to hold `target` computed tokens: full blocks by sequence hash
/// (shared), the trailing partial block private. The caller checked [`allocation_cost`].
fn allocate(pool: &mut BlockPool, sequence: &mut Sequence, target: usize, block_size: usize) {
    let num_held = sequence.blocks.len();
    let parent_of = |sequence: &Sequence, index: usize| {
        index
            .checked_sub(1)
            .and_then(|parent| sequence.block_hash(parent))
            .map(|(hash, _)| hash)
    };
    if num_held > 0
        && sequence.blocks[num_held - 1] == Slot::Private
        && num_held * block_size <= target
        && let Some((hash, local)) = sequence.block_hash(num_held - 1)
    {
        pool.promote_private(hash, local, parent_of(sequence, num_held - 1));
        sequence.blocks[num_held - 1] = Slot::Shared(hash);
    }
    for index in num_held..target.div_ceil(block_size) {
        let is_full = (index + 1) * block_size <= target;
        match sequence.block_hash(index).filter(|_| is_full) {
            Some((hash, local)) => {
                pool.acquire_shared(hash, local, parent_of(sequence, index));
                sequence.blocks.push(Slot::Shared(hash));
            }
            None => {
                pool.allocate_private();
                sequence.blocks.push(Slot::Private);
            }
        }
    }
}

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
