//! Engine events to kvmesh events (docs/kv-events.md: "Conversion", "Hashing", "Event model").
//!
//! The engine's own block hashes cannot be recomputed by kvmesh (vLLM's are a sha256 chain over
//! pickled tokens), so each stored block keeps the engine hash as its name and gets the
//! `tokens_hash` kvmesh computes from its tokens: the key routers and indexers agree on.

use kvmesh_kv::{BlockHasher, Tier, seed_for};
use kvmesh_proto::v1::{
    KvCleared, KvEvent, KvRemoved, KvStored, KvStoredBlock, StorageTier, kv_event,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::wire::{BlockRemoved, BlockStored, EngineEvent};

/// Why an engine event was not republished as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A KV group other than the main full-attention one (group_idx ≠ 0 or another spec kind).
    NonMainGroup,
    /// The event's block size differs from the model's: none of its blocks can be hashed.
    BlockSizeMismatch,
    /// Not even the first block has all its tokens.
    TokensShort,
    /// No blocks or hashes at all.
    Empty,
    /// A stored event naming one hash twice (parent included): republished as an empty removal
    /// so the event id stays consumed, as Dynamo does.
    SelfReference,
}

impl Skip {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Skip::NonMainGroup => "non_main_group",
            Skip::BlockSizeMismatch => "block_size_mismatch",
            Skip::TokensShort => "tokens_short",
            Skip::Empty => "empty",
            Skip::SelfReference => "self_reference",
        }
    }
}

/// The result of converting one engine event.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    /// The kvmesh event to publish (its `event_id` is assigned by the publisher), if any.
    pub event: Option<KvEvent>,
    /// Why the event was dropped or altered, if it was.
    pub skip: Option<Skip>,
    /// Stored blocks dropped for a block-size mismatch or missing tokens.
    pub dropped_blocks: u64,
}

impl Conversion {
    fn publish(tier: StorageTier, kind: kv_event::Kind) -> Self {
        Self {
            event: Some(KvEvent {
                event_id: 0,
                tier: tier as i32,
                kind: Some(kind),
            }),
            skip: None,
            dropped_blocks: 0,
        }
    }

    fn skipped(skip: Skip, dropped_blocks: u64) -> Self {
        Self {
            event: None,
            skip: Some(skip),
            dropped_blocks,
        }
    }
}

/// Converts engine events for one model's block size.
#[derive(Debug, Clone)]
pub struct Converter {
    block_size: usize,
}

impl Converter {
    /// A converter for blocks of `block_size` tokens (the model card's `kv_cache_block_size`).
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
        }
    }

    /// Tokens per block this converter expects.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Converts one engine event.
    pub fn convert(&self, event: &EngineEvent) -> Conversion {
        if !event.is_main_group() {
            return Conversion::skipped(Skip::NonMainGroup, 0);
        }
        match event {
            EngineEvent::Stored(stored) => self.convert_stored(stored),
            EngineEvent::Removed(removed) => convert_removed(removed),
            EngineEvent::Cleared => {
                Conversion::publish(StorageTier::Device, kv_event::Kind::Cleared(KvCleared {}))
            }
        }
    }

    fn convert_stored(&self, stored: &BlockStored) -> Conversion {
        let num_blocks = stored.block_hashes.len();
        if num_blocks == 0 {
            return Conversion::skipped(Skip::Empty, 0);
        }
        if stored.block_size != self.block_size as u64 {
            return Conversion::skipped(Skip::BlockSizeMismatch, num_blocks as u64);
        }
        let tier = tier_of(stored.medium.as_deref());
        if has_self_reference(stored) {
            let mut conversion = Conversion::publish(
                tier,
                kv_event::Kind::Removed(KvRemoved {
                    block_hashes: Vec::new(),
                }),
            );
            conversion.skip = Some(Skip::SelfReference);
            return conversion;
        }
        let seed = seed_for(stored.lora_name.as_deref(), None);
        let mut hasher = BlockHasher::new(self.block_size, seed);
        let mut blocks = Vec::with_capacity(num_blocks);
        for (index, (&block_hash, tokens)) in stored
            .block_hashes
            .iter()
            .zip(stored.token_ids.chunks_exact(self.block_size))
            .enumerate()
        {
            let mut mm_hashes = stored.mm_hashes.get(index).cloned().unwrap_or_default();
            mm_hashes.sort_unstable();
            let tokens_hash = if mm_hashes.is_empty() {
                hasher.hash_block(tokens)
            } else {
                multimodal_block_hash(tokens, &mm_hashes, seed)
            };
            blocks.push(KvStoredBlock {
                block_hash,
                tokens_hash,
                mm_hashes,
            });
        }
        let dropped = (num_blocks - blocks.len()) as u64;
        if blocks.is_empty() {
            return Conversion::skipped(Skip::TokensShort, dropped);
        }
        let mut conversion = Conversion::publish(
            tier,
            kv_event::Kind::Stored(KvStored {
                parent_hash: stored.parent_block_hash,
                blocks,
                start_position: None,
            }),
        );
        conversion.dropped_blocks = dropped;
        conversion
    }
}

fn convert_removed(removed: &BlockRemoved) -> Conversion {
    if removed.block_hashes.is_empty() {
        return Conversion::skipped(Skip::Empty, 0);
    }
    Conversion::publish(
        tier_of(removed.medium.as_deref()),
        kv_event::Kind::Removed(KvRemoved {
            block_hashes: removed.block_hashes.clone(),
        }),
    )
}

/// The storage tier of an engine `medium` string (docs/kv-events.md, "Event model"; absent or
/// unknown is device).
pub fn tier_of(medium: Option<&str>) -> StorageTier {
    match Tier::from_medium(medium) {
        Tier::Device => StorageTier::Device,
        Tier::HostPinned => StorageTier::HostPinned,
        Tier::Disk => StorageTier::Disk,
        Tier::External => StorageTier::External,
    }
}

fn has_self_reference(stored: &BlockStored) -> bool {
    let mut hashes: Vec<u64> = stored.block_hashes.clone();
    hashes.extend(stored.parent_block_hash);
    hashes.sort_unstable();
    hashes.windows(2).any(|pair| pair[0] == pair[1])
}

/// Local hash of a block with multimodal content (docs/kv-events.md, "Hashing"): the token bytes
/// followed by each mm hash (u64 little-endian, ascending), with the request's seed.
pub fn multimodal_block_hash(tokens: &[u32], sorted_mm_hashes: &[u64], seed: u64) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4 + sorted_mm_hashes.len() * 8);
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    for mm_hash in sorted_mm_hashes {
        bytes.extend_from_slice(&mm_hash.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, seed)
}

#[cfg(test)]
mod tests {
    use kvmesh_kv::compute_block_hashes;

    use super::*;

    fn stored(hashes: &[u64], tokens: Vec<u32>, block_size: u64) -> EngineEvent {
        EngineEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            token_ids: tokens,
            block_size,
            ..Default::default()
        })
    }

    fn stored_blocks(conversion: &Conversion) -> &KvStored {
        match conversion.event.as_ref().and_then(|e| e.kind.as_ref()) {
            Some(kv_event::Kind::Stored(stored)) => stored,
            other => panic!("not a stored event: {other:?}"),
        }
    }

    #[test]
    fn golden_multimodal_hash() {
        assert_eq!(
            multimodal_block_hash(&[1, 2, 3, 4], &[5, 9], 1337),
            235436700144873471
        );
    }

    #[test]
    fn stored_blocks_get_kvmesh_local_hashes() {
        let tokens: Vec<u32> = (1..=12).collect();
        let conversion = Converter::new(4).convert(&stored(&[10, 11, 12], tokens, 4));
        let stored = stored_blocks(&conversion);
        let hashes: Vec<u64> = stored.blocks.iter().map(|b| b.tokens_hash).collect();
        assert_eq!(
            hashes,
            [
                14643705804678351452,
                16777012769546811212,
                483935686894639516
            ]
        );
        assert_eq!(stored.blocks[2].block_hash, 12);
        assert_eq!(conversion.skip, None);
    }

    #[test]
    fn lora_name_changes_the_seed() {
        let EngineEvent::Stored(mut event) = stored(&[1], vec![1, 2, 3, 4], 4) else {
            unreachable!()
        };
        event.lora_name = Some("my-lora".into());
        let conversion = Converter::new(4).convert(&EngineEvent::Stored(event));
        assert_eq!(
            stored_blocks(&conversion).blocks[0].tokens_hash,
            15671544057904749233
        );
    }

    #[test]
    fn token_shortage_truncates_and_mismatch_drops() {
        let converter = Converter::new(4);
        let short = converter.convert(&stored(&[1, 2, 3], (0..9).collect(), 4));
        assert_eq!(stored_blocks(&short).blocks.len(), 2);
        assert_eq!(short.dropped_blocks, 1);
        let none = converter.convert(&stored(&[1, 2], vec![1, 2], 4));
        assert_eq!(
            (none.event, none.skip, none.dropped_blocks),
            (None, Some(Skip::TokensShort), 2)
        );
        let mismatch = converter.convert(&stored(&[1, 2], (0..16).collect(), 8));
        assert_eq!(mismatch.skip, Some(Skip::BlockSizeMismatch));
        assert_eq!(mismatch.dropped_blocks, 2);
        assert!(mismatch.event.is_none());
    }

    #[test]
    fn self_reference_becomes_an_empty_removal() {
        let EngineEvent::Stored(mut event) = stored(&[7, 8], (0..8).collect(), 4) else {
            unreachable!()
        };
        event.parent_block_hash = Some(8);
        let conversion = Converter::new(4).convert(&EngineEvent::Stored(event));
        assert_eq!(conversion.skip, Some(Skip::SelfReference));
        assert!(matches!(
            conversion.event.and_then(|e| e.kind),
            Some(kv_event::Kind::Removed(KvRemoved { block_hashes })) if block_hashes.is_empty()
        ));
    }

    #[test]
    fn mm_hashes_are_sorted_and_mixed_in() {
        let EngineEvent::Stored(mut event) = stored(&[1, 2], (1..=8).collect(), 4) else {
            unreachable!()
        };
        event.mm_hashes = vec![vec![9, 5]];
        let conversion = Converter::new(4).convert(&EngineEvent::Stored(event));
        let blocks = &stored_blocks(&conversion).blocks;
        assert_eq!(blocks[0].mm_hashes, [5, 9]);
        assert_eq!(blocks[0].tokens_hash, 235436700144873471);
        assert_eq!(
            blocks[1].tokens_hash,
            compute_block_hashes(&[5, 6, 7, 8], 4, 1337)[0]
        );
    }

    #[test]
    fn tiers_and_groups() {
        let removed = |medium: &str, group_idx| {
            EngineEvent::Removed(BlockRemoved {
                block_hashes: vec![1],
                medium: Some(medium.into()),
                group_idx,
            })
        };
        let converter = Converter::new(4);
        let tier = |event: &EngineEvent| converter.convert(event).event.map(|e| e.tier);
        assert_eq!(
            tier(&removed("CPU_TIER1", 0)),
            Some(StorageTier::HostPinned as i32)
        );
        assert_eq!(tier(&removed("NVME", 0)), Some(StorageTier::Disk as i32));
        assert_eq!(
            tier(&removed("REMOTE", 0)),
            Some(StorageTier::External as i32)
        );
        assert_eq!(tier(&removed("GPU", 0)), Some(StorageTier::Device as i32));
        assert_eq!(
            converter.convert(&removed("GPU", 1)).skip,
            Some(Skip::NonMainGroup)
        );
        let EngineEvent::Stored(mut sliding) = stored(&[1], (0..4).collect(), 4) else {
            unreachable!()
        };
        sliding.kv_cache_spec_kind = Some("sliding_window".into());
        let conversion = converter.convert(&EngineEvent::Stored(sliding.clone()));
        assert_eq!(conversion.skip, Some(Skip::NonMainGroup));
        sliding.kv_cache_spec_kind = Some("mla_attention".into());
        assert!(
            converter
                .convert(&EngineEvent::Stored(sliding))
                .event
                .is_some()
        );
    }
}
