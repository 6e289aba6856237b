//! The requests a routing simulation replays: prompts described as segments of deterministic
//! tokens, read from a Mooncake trace or made by the synthetic generator.
//!
//! A prompt is a list of segments; a segment's tokens are a pure function of its id and the
//! position inside it, so two prompts that share a run of segment ids share exactly those tokens,
//! and the engine's prefix cache and the router's block hashes both see the sharing. A trace's
//! hash id is one 512-token segment; a request whose `input_length` ends inside its last block
//! takes that block's leading tokens only, which is a prefix of the same block in longer prompts.

use std::path::Path;

use anyhow::Context;
use kvmesh_kv::replay::{self, TraceRecord};
use kvmesh_mocker::engine::EngineRequest;

/// Tokens per trace hash id (the Mooncake format's block).
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// Token ids are drawn from `0..VOCAB` (the mocker's default vocabulary, no special tokens).
const VOCAB: u64 = 32_000;

/// Mixed into segment ids before they seed the token stream, so segment 0 is not all zeros.
const SEGMENT_SALT: u64 = 0x6b76_6d65_7368_0001;

/// Segment ids at and above this are request-private padding (a trace line whose
/// `input_length` exceeds its blocks); trace hash ids and synthetic ids stay below.
const PADDING_BASE: u64 = 1 << 62;

/// A run of prompt tokens that is the same wherever its id appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Identity of the content.
    pub id: u64,
    /// Tokens in the segment.
    pub len: u32,
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItem {
    /// Arrival at speed 1, in µs since the workload's start.
    pub arrival_us: u64,
    /// The prompt's content; the prompt is their concatenation cut to `input_length`.
    pub segments: Vec<Segment>,
    /// Prompt tokens (at least 1).
    pub input_length: u32,
    /// Tokens to generate (at least 1).
    pub output_length: u32,
}

impl WorkItem {
    /// The prompt's token ids.
    pub fn prompt(&self, key: u64) -> Vec<u32> {
        let want = self.input_length as usize;
        let mut tokens = Vec::with_capacity(want);
        for segment in &self.segments {
            if tokens.len() >= want {
                break;
            }
            let len = (segment.len as usize).min(want - tokens.len());
            push_segment_tokens(segment.id, len, &mut tokens);
        }
        if tokens.len() < want {
            let missing = want - tokens.len();
            push_segment_tokens(PADDING_BASE | key, missing, &mut tokens);
        }
        tokens
    }

    /// The engine request of the `key`-th item (keys are positions in the workload).
    pub fn engine_request(&self, key: u64) -> EngineRequest {
        EngineRequest {
            key,
            request_id: request_id(key),
            prompt: self.prompt(key),
            max_tokens: Some(self.output_length),
            ignore_eos: true,
            ..EngineRequest::default()
        }
    }
}

/// The request id of the `key`-th request (the router tracks requests by id).
pub fn request_id(key: u64) -> String {
    format!("req-{key}")
}

/// Appends the first `len` tokens of segment `id`.
fn push_segment_tokens(id: u64, len: usize, out: &mut Vec<u32>) {
    let mut state = id ^ SEGMENT_SALT;
    out.extend((0..len).map(|_| (splitmix64(&mut state) % VOCAB) as u32));
}

/// SplitMix64: a fast, well-mixed stream from a 64-bit seed.
pub(super) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Reads a Mooncake-format trace (JSON lines with `timestamp` in ms, `input_length`,
/// `output_length` and `hash_ids`) into work items sorted by arrival; at most `max_requests`
/// when set.
pub fn load_trace(path: &Path, max_requests: Option<usize>) -> anyhow::Result<Vec<WorkItem>> {
    let records =
        replay::load_trace_records(path).with_context(|| format!("--trace {}", path.display()))?;
    let mut items = records
        .iter()
        .enumerate()
        .map(|(i, record)| {
            trace_item(record).with_context(|| format!("--trace {} line {}", path.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    items.sort_by_key(|item| item.arrival_us);
    if let Some(max) = max_requests {
        items.truncate(max);
    }
    Ok(items)
}

/// One trace record as a work item. Without `input_length` the prompt is every block in full;
/// without `output_length` the output is one token; an output length of 0 counts as 1 (the
/// engine needs at least one token to report a finish).
pub(super) fn trace_item(record: &TraceRecord) -> anyhow::Result<WorkItem> {
    if !record.timestamp.is_finite() || record.timestamp < 0.0 {
        anyhow::bail!("timestamp must be a non-negative number of ms");
    }
    let full = record.hash_ids.len() as u64 * u64::from(TRACE_BLOCK_TOKENS);
    let input_length = record.input_length.unwrap_or(full);
    if input_length == 0 {
        anyhow::bail!("input_length must be at least 1 (and hash_ids non-empty without it)");
    }
    let input_length = u32::try_from(input_length)
        .map_err(|_| anyhow::anyhow!("input_length {input_length} is too large"))?;
    let output_length = record.output_length.unwrap_or(1).max(1);
    let output_length = u32::try_from(output_length)
        .map_err(|_| anyhow::anyhow!("output_length {output_length} is too large"))?;
    if record.hash_ids.iter().any(|&id| id >= PADDING_BASE) {
        anyhow::bail!("hash ids must be below 2^62");
    }
    Ok(WorkItem {
        arrival_us: (record.timestamp * 1000.0).round() as u64,
        segments: record
            .hash_ids
            .iter()
            .map(|&id| Segment {
                id,
                len: TRACE_BLOCK_TOKENS,
            })
            .collect(),
        input_length,
        output_length,
    })
}

/// Arrival of an item at `speed` (> 1 compresses time), in whole µs.
pub fn scaled_arrival(arrival_us: u64, speed: f64) -> u64 {
    (arrival_us as f64 / speed).round() as u64
}
