//! The engine side of the bridge: vLLM/SGLang ZMQ KV event messages decoded into typed events,
//! with every optional and legacy field rule of docs/kv-events.md, "Engine wire format".
//!
//! Nothing here trusts its input: every shape error is a [`WireError`] the caller counts and
//! skips. A batch whose envelope is readable keeps its good events even when some of its events
//! are malformed, so one bad event never hides its neighbours.

use bytes::Bytes;
use rmpv::Value;

/// A multipart message split into the three frames an engine publisher writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frames {
    /// Topic frame (the SUB socket already filtered on its prefix).
    pub topic: Bytes,
    /// Publisher sequence number, from 0, +1 per batch.
    pub seq: u64,
    /// msgpack event batch.
    pub payload: Bytes,
}

/// Why a message, batch or event could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message does not have the three frames topic, seq, payload.
    #[error("expected 3 frames, got {0}")]
    FrameCount(usize),
    /// The sequence frame is not an 8-byte big-endian integer.
    #[error("sequence frame has {0} bytes, expected 8")]
    SeqFrame(usize),
    /// The payload is not one complete msgpack value.
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    /// The batch envelope has the wrong shape.
    #[error("bad event batch: {0}")]
    Batch(String),
    /// One event has the wrong shape.
    #[error("bad event: {0}")]
    Event(String),
    /// An event whose type tag this bridge does not know.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
}

impl WireError {
    /// Metric label of the error: which layer was malformed.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::FrameCount(_) | WireError::SeqFrame(_) => "frame",
            WireError::Msgpack(_) | WireError::Batch(_) => "payload",
            WireError::Event(_) => "event",
            WireError::UnknownType(_) => "unknown_type",
        }
    }
}

fn event_error(message: impl Into<String>) -> WireError {
    WireError::Event(message.into())
}

/// Splits a multipart message into topic, sequence and payload.
pub fn split_frames(frames: Vec<Bytes>) -> Result<Frames, WireError> {
    let [topic, seq, payload]: [Bytes; 3] = frames
        .try_into()
        .map_err(|frames: Vec<Bytes>| WireError::FrameCount(frames.len()))?;
    Ok(Frames {
        topic,
        seq: parse_seq(&seq)?,
        payload,
    })
}

/// Reads an 8-byte big-endian sequence frame.
pub fn parse_seq(frame: &[u8]) -> Result<u64, WireError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// One decoded event batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineBatch {
    /// Engine timestamp, seconds (informational).
    pub ts: Option<f64>,
    /// Data-parallel rank the engine stamped on the batch; overrides the configured rank.
    pub dp_rank: Option<u32>,
    /// The events in order, each decoded on its own.
    pub events: Vec<Result<EngineEvent, WireError>>,
}

/// One engine KV event, with the fields the bridge uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// `BlockStored`.
    Stored(BlockStored),
    /// `BlockRemoved`.
    Removed(BlockRemoved),
    /// `AllBlocksCleared`.
    Cleared,
}

/// A `BlockStored` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in order.
    pub block_hashes: Vec<u64>,
    /// Engine hash of the block before the first one; `None` starts at the root.
    pub parent_block_hash: Option<u64>,
    /// Token ids of the blocks, concatenated (bigram pairs already flattened).
    pub token_ids: Vec<u32>,
    /// Tokens per block as the engine says.
    pub block_size: u64,
    /// Engine storage medium (`GPU`, `CPU`, ...).
    pub medium: Option<String>,
    /// LoRA adapter name; mixed into the block-hash seed.
    pub lora_name: Option<String>,
    /// Multimodal hashes per block (from `extra_keys` or `block_mm_infos`); may be shorter than
    /// `block_hashes`, a missing entry meaning no multimodal content.
    pub mm_hashes: Vec<Vec<u64>>,
    /// KV cache group; only group 0 is the main one.
    pub group_idx: u64,
    /// KV cache spec kind (`full_attention`, ...); `None` is the default, full attention.
    pub kv_cache_spec_kind: Option<String>,
}

/// A `BlockRemoved` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    /// Engine hashes of the evicted blocks.
    pub block_hashes: Vec<u64>,
    /// Engine storage medium.
    pub medium: Option<String>,
    /// KV cache group; only group 0 is the main one.
    pub group_idx: u64,
}

/// Deepest msgpack nesting accepted. Real batches nest about 6 levels (batch, events, event,
/// extra keys, per-block keys, key tuple); the limit keeps a hostile payload from exhausting the
/// stack while decoding or dropping it.
pub const MAX_DEPTH: usize = 32;

/// KV cache spec kinds of the main (full attention) group; events of other kinds are skipped.
pub const MAIN_SPEC_KINDS: [&str; 3] = ["full_attention", "mla_attention", "sink_full_attention"];

impl EngineEvent {
    /// Whether the event belongs to the main KV group (group 0, a full-attention spec kind).
    pub fn is_main_group(&self) -> bool {
        match self {
            EngineEvent::Stored(stored) => {
                stored.group_idx == 0
                    && stored
                        .kv_cache_spec_kind
                        .as_deref()
                        .is_none_or(|kind| MAIN_SPEC_KINDS.contains(&kind))
            }
            EngineEvent::Removed(removed) => removed.group_idx == 0,
            EngineEvent::Cleared => true,
        }
    }
}

/// Decodes a msgpack event batch: `[ts, events, dp_rank?]` or `{ts, events, data_parallel_rank}`.
pub fn decode_batch(payload: &[u8]) -> Result<EngineBatch, WireError> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut reader, MAX_DEPTH)
        .map_err(|e| WireError::Msgpack(e.to_string()))?;
    if !reader.is_empty() {
        return Err(WireError::Msgpack(format!(
            "{} trailing bytes after the batch",
            reader.len()
        )));
    }
    let (ts, events, dp_rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(entries) => (
            map_get(entries, "ts"),
            map_get(entries, "events"),
            map_get(entries, "data_parallel_rank").or_else(|| map_get(entries, "dp_rank")),
        ),
        _ => return Err(WireError::Batch("not an array or a map".into())),
    };
    let ts = match ts.filter(|v| !v.is_nil()) {
        None => None,
        Some(value) => Some(
            value
                .as_f64()
                .or_else(|| value.as_i64().map(|v| v as f64))
                .ok_or_else(|| WireError::Batch("ts is not a number".into()))?,
        ),
    };
    let events = events
        .and_then(Value::as_array)
        .ok_or_else(|| WireError::Batch("events is not an array".into()))?;
    let dp_rank = match dp_rank.filter(|v| !v.is_nil()) {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|rank| u32::try_from(rank).ok())
                .ok_or_else(|| WireError::Batch("data_parallel_rank is not a u32".into()))?,
        ),
    };
    Ok(EngineBatch {
        ts,
        dp_rank,
        events: events.iter().map(decode_event).collect(),
    })
}

fn map_get<'a>(entries: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// An event's fields, addressed by array position (after the tag) or by map key.
enum Fields<'a> {
    Array(&'a [Value]),
    Map(&'a [(Value, Value)]),
}

impl<'a> Fields<'a> {
    /// The field at array `index` (tag excluded, so the first field is 0) or map key `name`;
    /// nil reads as absent.
    fn get(&self, index: usize, name: &str) -> Option<&'a Value> {
        let value = match self {
            Fields::Array(items) => items.get(index),
            Fields::Map(entries) => map_get(entries, name),
        };
        value.filter(|v| !v.is_nil())
    }

    fn required(&self, index: usize, name: &str) -> Result<&'a Value, WireError> {
        self.get(index, name)
            .ok_or_else(|| event_error(format!("missing {name}")))
    }

    fn string(&self, index: usize, name: &str) -> Result<Option<String>, WireError> {
        match self.get(index, name) {
            None => Ok(None),
            Some(value) => value
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| event_error(format!("{name} is not a string"))),
        }
    }

    fn unsigned(&self, index: usize, name: &str) -> Result<Option<u64>, WireError> {
        match self.get(index, name) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| event_error(format!("{name} is not an unsigned integer"))),
        }
    }
}

/// Decodes one tagged event (`["BlockStored", ...]` or `{"type": "BlockStored", ...}`).
pub fn decode_event(value: &Value) -> Result<EngineEvent, WireError> {
    let (tag, fields) = match value {
        Value::Array(items) => {
            let (tag, rest) = items
                .split_first()
                .ok_or_else(|| event_error("empty event array"))?;
            (tag, Fields::Array(rest))
        }
        Value::Map(entries) => {
            let tag =
                map_get(entries, "type").ok_or_else(|| event_error("event map has no type"))?;
            (tag, Fields::Map(entries))
        }
        _ => return Err(event_error("event is not an array or a map")),
    };
    let tag = tag
        .as_str()
        .ok_or_else(|| event_error("event type is not a string"))?;
    match tag {
        "BlockStored" => decode_stored(&fields).map(EngineEvent::Stored),
        "BlockRemoved" => Ok(EngineEvent::Removed(BlockRemoved {
            block_hashes: hash_list(fields.required(0, "block_hashes")?, "block_hashes")?,
            medium: fields.string(1, "medium")?,
            group_idx: fields.unsigned(2, "group_idx")?.unwrap_or(0),
        })),
        "AllBlocksCleared" => Ok(EngineEvent::Cleared),
        other => Err(WireError::UnknownType(other.to_string())),
    }
}

fn decode_stored(fields: &Fields<'_>) -> Result<BlockStored, WireError> {
    let block_hashes = hash_list(fields.required(0, "block_hashes")?, "block_hashes")?;
    let parent_block_hash = fields
        .get(1, "parent_block_hash")
        .map(|v| hash_value(v, "parent_block_hash"))
        .transpose()?;
    let token_ids = token_list(fields.required(2, "token_ids")?)?;
    let block_size = fields
        .unsigned(3, "block_size")?
        .ok_or_else(|| event_error("missing block_size"))?;
    // Position 4 is the legacy `lora_id`: ignored.
    let medium = fields.string(5, "medium")?;
    let lora_name = fields.string(6, "lora_name")?;
    // Position 7 holds `extra_keys`; producers that send `block_mm_infos` put it there too, and
    // a map may carry either key. Each block's entry tells the two apart by its shape.
    let mm_source = fields
        .get(7, "extra_keys")
        .or_else(|| fields.get(usize::MAX, "block_mm_infos"));
    let mm_hashes = match mm_source {
        None => Vec::new(),
        Some(value) => value
            .as_array()
            .ok_or_else(|| event_error("extra_keys is not an array"))?
            .iter()
            .map(block_mm_hashes)
            .collect::<Result<_, _>>()?,
    };
    Ok(BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        medium,
        lora_name,
        mm_hashes,
        group_idx: fields.unsigned(8, "group_idx")?.unwrap_or(0),
        kv_cache_spec_kind: fields.string(9, "kv_cache_spec_kind")?,
    })
}

/// A block hash sent as u64, i64 (bits reinterpreted) or bytes (the last 8, big-endian).
pub fn hash_value(value: &Value, name: &str) -> Result<u64, WireError> {
    match value {
        Value::Integer(int) => int
            .as_u64()
            .or_else(|| int.as_i64().map(|signed| signed as u64))
            .ok_or_else(|| event_error(format!("{name}: integer out of range"))),
        Value::Binary(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail
                .iter()
                .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte)))
        }
        _ => Err(event_error(format!("{name}: not an integer or bytes"))),
    }
}

fn hash_list(value: &Value, name: &str) -> Result<Vec<u64>, WireError> {
    value
        .as_array()
        .ok_or_else(|| event_error(format!("{name} is not an array")))?
        .iter()
        .map(|v| hash_value(v, name))
        .collect()
}

fn token(value: &Value) -> Result<u32, WireError> {
    value
        .as_u64()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| event_error("token id is not a u32"))
}

/// Token ids, plain or as Eagle bigram pairs `[[a, b], ...]` (tokens = every `a`, then the last
/// `b`).
fn token_list(value: &Value) -> Result<Vec<u32>, WireError> {
    let items = value
        .as_array()
        .ok_or_else(|| event_error("token_ids is not an array"))?;
    if !matches!(items.first(), Some(Value::Array(_))) {
        return items.iter().map(token).collect();
    }
    let mut tokens = Vec::with_capacity(items.len() + 1);
    let mut last = None;
    for pair in items {
        match pair.as_array().map(Vec::as_slice) {
            Some([a, b]) => {
                tokens.push(token(a)?);
                last = Some(b);
            }
            _ => return Err(event_error("token_ids mixes bigram pairs and other values")),
        }
    }
    if let Some(b) = last {
        tokens.push(token(b)?);
    }
    Ok(tokens)
}

/// Multimodal hashes of one block: nil (none), a vLLM `extra_keys` tuple (keys that are 64-hex
/// digests give `u64` of their first 16 hex digits; other keys are ignored), or a
/// `block_mm_infos` entry (`{mm_objects: [{mm_hash, ...}]}`, or the same as arrays).
fn block_mm_hashes(entry: &Value) -> Result<Vec<u64>, WireError> {
    match entry {
        Value::Nil => Ok(Vec::new()),
        Value::Array(keys) => Ok(keys.iter().filter_map(extra_key_mm_hash).collect()),
        Value::Map(entries) => {
            let objects = match map_get(entries, "mm_objects") {
                None | Some(Value::Nil) => return Ok(Vec::new()),
                Some(objects) => objects
                    .as_array()
                    .ok_or_else(|| event_error("mm_objects is not an array"))?,
            };
            objects
                .iter()
                .map(|object| {
                    let hash = match object {
                        Value::Map(fields) => map_get(fields, "mm_hash"),
                        Value::Array(fields) => fields.first(),
                        _ => None,
                    }
                    .ok_or_else(|| event_error("mm object without mm_hash"))?;
                    hash_value(hash, "mm_hash")
                })
                .collect()
        }
        _ => Err(event_error(
            "extra_keys entry is not nil, an array or a map",
        )),
    }
}

/// The mm hash of one `extra_keys` key, if it is a multimodal digest (also looked for as the
/// first element of a `(digest, offset)` tuple).
fn extra_key_mm_hash(key: &Value) -> Option<u64> {
    let text = match key {
        Value::Array(items) => items.first()?.as_str()?,
        other => other.as_str()?,
    };
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&text[..16], 16).ok()
}
