//! KV cache block identity and the block index.
//!
//! * [`hashing`]: the hashing every engine, router and indexer must agree on, bit for bit with
//!   Dynamo (docs/kv-events.md, "Hashing").
//! * [`RadixIndex`]: the single-threaded index of which (worker, dp_rank) holds which blocks, in
//!   which tier (docs/indexer.md, "Tree semantics"), with event ordering rules, counters, digest
//!   and dumps.
//! * [`ConcurrentIndex`]: the same index split over apply lanes, answering queries on the caller's
//!   thread while events apply.
//! * [`ApproxIndex`]: the event-less index fed by routing decisions (TTL or LRU), also used as
//!   the router's predicted side index.
//! * [`replay`]: the Mooncake-trace replay benchmark behind `kvmesh bench indexer`.
//! * [`BlockHashCache`]: block hashes found again by prompt prefix, so a long conversation's
//!   next turn hashes only its new blocks (the router's and the mock engine's).

pub mod approx;
pub mod concurrent;
pub mod counters;
pub mod events;
pub mod hash_cache;
pub mod hashing;
pub mod radix;
pub mod replay;
pub mod scores;
mod table;

pub use approx::{ApproxConfig, ApproxIndex, ApproxPolicy};
pub use concurrent::{ConcurrentIndex, LaneClosed};
pub use counters::{EventCounters, EventStatus, EventType, StatusCounts};
pub use events::{
    KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier, WorkerKey,
};
pub use hash_cache::BlockHashCache;
pub use hashing::{
    BlockHashMap, BlockHashSet, BlockHasher, IdentityHasher, LocalBlockHash, SequenceHash,
    chain_seq_hash, compute_block_hashes, compute_seq_hashes, kv_partition, seed_for,
};
pub use radix::{ApplyCursor, IndexDump, RadixIndex, WorkerCursor, digest_term};
pub use scores::{MemberScore, OverlapScores};
