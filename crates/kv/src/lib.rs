//! KV cache block identity: the hashing every engine, router and indexer must agree on.
//!
//! Hashes follow `specs/kv-events.md` bit for bit (XXH3-64 over little-endian u32 token ids, seed
//! 1337 mixed with the LoRA name), so blocks reported by vLLM, SGLang or the kvmesh mocker index
//! the same way as prompts hashed by the router.

pub mod hashing;

pub use hashing::{
    BlockHasher, LocalBlockHash, SequenceHash, compute_block_hashes, compute_seq_hashes,
    kv_partition, seed_for,
};
