//! The KV block index (docs/indexer.md, "Tree semantics"; docs/kv-events.md, "Ordering rules"):
//! applied by one thread, queried by any.
//!
//! # Semantics
//!
//! The index is a tree of block positions: a node is the path of local (tokens) hashes from the
//! root. Each node lists its members — `(worker_id, dp_rank)` with the tiers it holds the block
//! in — and each member has a lookup `engine hash → node` through which stored events find their
//! parent and removed events find their blocks. [`RadixIndex::find_matches`] walks a sequence of
//! local hashes and reports, per member, the leading blocks held on the device and the further
//! blocks held in each slower tier.
//!
//! # Layout (why it is fast and small)
//!
//! * **Path-keyed nodes.** A node is found through a flat index under
//!   `key = mix(parent key) ^ tokens_hash`, not reached through child maps. A query computes the
//!   key of every depth from the hashes alone, so its lookups are independent loads the CPU issues
//!   in parallel instead of a pointer chase (Dynamo's positional "Flash" indexer exploits the same
//!   property with `(position, local hash)` maps). Children of one parent never collide; the node
//!   also keeps its parent's number and the find path checks it, so a 64-bit collision between
//!   different paths can only truncate a match, never extend one.
//! * **24-byte nodes** in an arena with stable `u32` numbers (key, parent, depth, child count and
//!   a member word); the path-key index costs one more 12-byte slot per node.
//! * **4-byte member entries.** A node with one member keeps it inline; more go to size-classed
//!   `u32` lists (see `pool`). An entry is member id + alias flag + 4 tier bits. Long lists carry
//!   a signature of their member set, so a prefix shared by hundreds of workers is walked without
//!   comparing hundreds of entries per depth.
//! * **12-byte lookup slots.** Each member's `engine hash → node | tiers << 28` map, like the
//!   path-key index, is a tombstone-free linear-probing table with 12-byte slots at ~2/3 load.
//! * **Dense member ids**, never reused; a query tracks members in thread-local scratch arrays
//!   indexed by id, so intersecting the matching set with a node costs one pass over its entries.
//! * **Warm-up passes**: before applying a window of events the writer reads the lines it will
//!   touch in branch-free loops, so their cache misses overlap instead of serialising.
//! * **Incremental digest and counts**: the order-independent digest (docs/indexer.md, "Digest")
//!   is a wrapping sum, updated on every membership change, so [`RadixIndex::digest`] is O(1).
//!
//! # Concurrency
//!
//! Everything a query reads (node index, nodes, member lists, member infos) is atomics in chunks
//! that never move, published through an immutable layout (`layout`); freed nodes and lists are
//! reused only after an epoch grace period (`epoch`). So `find_matches` takes `&self` and runs
//! lock-free, and [`crate::ConcurrentIndex`] lets queries run on other threads while each lane's
//! thread applies events. The rest (member lookups, counters, digest) belongs to the writer.
//!
//! # Edge cases decided here
//!
//! * Several engine hashes of one member may name the same node (an engine that mixes something
//!   kvmesh does not, e.g. a cache salt). The member holds the node in a tier while any of those
//!   hashes does: per-tier reference counts are kept on the side for such aliased entries only.
//! * A stored event that re-uses an engine hash for a different node moves the hash: it is
//!   detached from its old node first.
//! * A node without members but with children stays (its children keep their path); nodes with
//!   neither are freed, upward.

mod apply;
mod dump;
mod epoch;
mod find;
mod layout;
mod nodes;
mod pool;
mod slice;
mod validate;
mod warm;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use self::dump::{IndexDump, WorkerCursor};
pub(crate) use self::find::find_into;
pub(crate) use self::layout::Shared;
use self::nodes::Store;
pub use self::slice::ApplyCursor;
use crate::counters::EventCounters;
use crate::events::{KvEventBatch, Tier, WorkerKey};
use crate::table::U64Table;

/// Bits of a lookup value that hold the node number; the four above hold the tiers.
const SLOT_MASK: u32 = (1 << 28) - 1;
const TIER_SHIFT: u32 = 28;

/// Digest term of one (block, member, tier) (docs/indexer.md, "Digest"):
/// `xxh3_64(LE64(worker_id) ‖ LE32(dp_rank) ‖ u8(tier) ‖ LE64(engine_hash) ‖ LE64(tokens_hash) ‖
/// LE32(depth), seed 0)`.
///
/// Public so other implementations (the service's tests, a remote replica) can recompute a digest.
pub fn digest_term(
    worker: WorkerKey,
    tier: Tier,
    engine_hash: u64,
    tokens_hash: u64,
    depth: u32,
) -> u64 {
    let mut bytes = [0u8; 33];
    bytes[0..8].copy_from_slice(&worker.worker_id.to_le_bytes());
    bytes[8..12].copy_from_slice(&worker.dp_rank.to_le_bytes());
    bytes[12] = tier as u8;
    bytes[13..21].copy_from_slice(&engine_hash.to_le_bytes());
    bytes[21..29].copy_from_slice(&tokens_hash.to_le_bytes());
    bytes[29..33].copy_from_slice(&depth.to_le_bytes());
    xxh3_64_with_seed(&bytes, 0)
}

/// Per-member state.
#[derive(Debug)]
struct Member {
    key: WorkerKey,
    /// `engine hash → node number | tiers << 28`.
    lookup: U64Table,
    /// Last event id applied; `None` before the first event.
    last_event_id: Option<u64>,
    /// Distinct nodes the member is in (its tree size).
    num_blocks: u64,
    has_warned_gap: bool,
}

/// The KV block index of one model, applied from one thread.
///
/// Exists as the reference semantics of the indexer: the concurrent index runs one of these per
/// apply lane, the approximate index wraps one, and the property tests compare them all against it.
/// Embed it directly when one thread both applies and queries (e.g. the router's in-process index
/// behind its own lock); use [`crate::ConcurrentIndex`] to query while other threads apply.
#[derive(Debug, Default)]
pub struct RadixIndex {
    store: Store,
    /// Indexed by member id; ids are never reused, so a query can trust the id it read.
    members: Vec<Option<Member>>,
    by_key: HashMap<WorkerKey, u32>,
    removed_workers: HashSet<u64>,
    /// How many times each worker was readmitted after a removal, which keeps the stream message
    /// ids of its next markers apart from the last ones (docs/kv-events.md). Not part of a dump, so a replica that loaded a
    /// snapshot may count lower, which only costs the stream's de-duplication of its markers.
    readmissions: HashMap<u64, u32>,
    /// Per-tier engine-hash counts of (node, member) entries named by several engine hashes.
    aliases: HashMap<(u32, u32), [u32; 4]>,
    digest: u64,
    num_entries: u64,
    counters: EventCounters,
    /// Reused buffer of the warm-up passes.
    warm_scratch: Vec<u32>,
    /// All-clear bitmap the self-reference check of long stored events borrows.
    dedup_bitmap: Vec<u64>,
}

impl RadixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// What lock-free queries of this index read (the concurrent index hands it to callers).
    pub(crate) fn shared(&self) -> &std::sync::Arc<Shared> {
        self.store.shared()
    }

    /// Recycles freed memory after a grace period when enough has piled up (callers that
    /// mutate through the crate-internal methods call this between operations).
    pub(crate) fn reclaim(&mut self) {
        self.store.maybe_reclaim();
    }

    /// Applies a batch of one (worker, dp_rank)'s events, or a worker-removed marker, keeping the
    /// per-member order rules (duplicates skipped, gaps applied and counted; docs/kv-events.md,
    /// "Ordering rules").
    pub fn apply(&mut self, batch: &KvEventBatch) {
        self.apply_batch(batch);
    }

    /// Order-independent digest of the whole state (docs/indexer.md, "Digest"); equal on two
    /// indexes holding the same (block, member, tier, engine hash) set.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// (block, member) entries: the sum of every member's tree size. Independent of how workers
    /// are split across lanes or shards, which makes it the `blocks` figure to export.
    pub fn num_blocks(&self) -> u64 {
        self.num_entries
    }

    /// Distinct tree nodes (block positions), including memberless interior ones.
    pub fn num_nodes(&self) -> usize {
        self.store.len()
    }

    /// Every known (worker, dp_rank) (seen in an event and not removed), sorted.
    pub fn workers(&self) -> Vec<WorkerKey> {
        let mut workers: Vec<WorkerKey> = self.by_key.keys().copied().collect();
        workers.sort_unstable();
        workers
    }

    /// Distinct worker ids among [`Self::workers`].
    pub fn num_workers(&self) -> usize {
        let ids: HashSet<u64> = self.by_key.keys().map(|key| key.worker_id).collect();
        ids.len()
    }

    /// Blocks held by one member (0 when unknown).
    pub fn tree_size(&self, worker: WorkerKey) -> u64 {
        self.member_id(worker)
            .and_then(|id| self.member(id))
            .map_or(0, |member| member.num_blocks)
    }

    /// Tree size of every known member, sorted by worker.
    pub fn tree_sizes(&self) -> Vec<(WorkerKey, u64)> {
        let mut sizes: Vec<(WorkerKey, u64)> = self
            .members
            .iter()
            .flatten()
            .map(|member| (member.key, member.num_blocks))
            .collect();
        sizes.sort_unstable();
        sizes
    }

    /// Last event id applied for a member (`None` before its first event).
    pub fn last_event_id(&self, worker: WorkerKey) -> Option<u64> {
        self.member_id(worker)
            .and_then(|id| self.member(id))
            .and_then(|member| member.last_event_id)
    }

    /// Whether a worker-removed marker was applied for `worker_id` (and no readmission since).
    pub fn is_worker_removed(&self, worker_id: u64) -> bool {
        self.removed_workers.contains(&worker_id)
    }

    /// How many times `worker_id` was readmitted after a removal.
    pub fn num_readmissions(&self, worker_id: u64) -> u32 {
        self.readmissions.get(&worker_id).copied().unwrap_or(0)
    }

    /// Lifts a worker-removed marker: the worker registered again under the same id, so its
    /// later events are applied again (from an empty tree). A no-op for a worker not removed.
    pub fn readmit_worker(&mut self, worker_id: u64) {
        if self.removed_workers.remove(&worker_id) {
            *self.readmissions.entry(worker_id).or_default() += 1;
        }
    }

    /// Outcome counters since creation.
    pub fn counters(&self) -> EventCounters {
        self.counters
    }

    /// Heap bytes of the index's data structures, counted from their capacities (hash-map
    /// overheads estimated at one control byte per bucket).
    pub fn memory_bytes(&self) -> usize {
        let member_tables: usize = self
            .members
            .iter()
            .flatten()
            .map(|member| member.lookup.heap_bytes())
            .sum();
        let map_bytes = |capacity: usize, entry: usize| capacity * (entry + 1);
        self.store.heap_bytes()
            + member_tables
            + self.members.capacity() * std::mem::size_of::<Option<Member>>()
            + self.warm_scratch.capacity() * 4
            + self.dedup_bitmap.capacity() * 8
            + map_bytes(
                self.by_key.capacity(),
                std::mem::size_of::<(WorkerKey, u32)>(),
            )
            + map_bytes(self.removed_workers.capacity(), 8)
            + map_bytes(self.readmissions.capacity(), 12)
            + map_bytes(
                self.aliases.capacity(),
                std::mem::size_of::<((u32, u32), [u32; 4])>(),
            )
    }

    /// Removes every block of every dp rank of `worker_id` and ignores the worker from now on
    /// (the effect of a worker-removed marker; applying it twice is a no-op).
    pub fn remove_worker(&mut self, worker_id: u64) {
        if !self.removed_workers.insert(worker_id) {
            return;
        }
        self.counters.workers_removed += 1;
        let ids: Vec<u32> = self
            .by_key
            .iter()
            .filter(|(key, _)| key.worker_id == worker_id)
            .map(|(_, &id)| id)
            .collect();
        for id in ids {
            self.clear_member(id);
            if let Some(member) = self.members[id as usize].take() {
                self.by_key.remove(&member.key);
            }
        }
        self.store.maybe_reclaim();
    }

    pub(crate) fn member_id(&self, worker: WorkerKey) -> Option<u32> {
        self.by_key.get(&worker).copied()
    }

    fn member(&self, id: u32) -> Option<&Member> {
        self.members.get(id as usize).and_then(Option::as_ref)
    }

    /// Id of a member, registering it on first sight; `None` past the entry format's limit.
    pub(crate) fn member_id_or_insert(&mut self, worker: WorkerKey) -> Option<u32> {
        if let Some(&id) = self.by_key.get(&worker) {
            return Some(id);
        }
        let id = u32::try_from(self.members.len()).ok()?;
        if id > pool::MAX_MEMBER_ID {
            return None;
        }
        self.store.writer.ensure_infos(id as usize + 1);
        if let Some(info) = self.store.layout().info(id) {
            info.worker_id.store(worker.worker_id, Ordering::Relaxed);
            info.dp_rank.store(worker.dp_rank, Ordering::Relaxed);
            info.num_blocks.store(0, Ordering::Relaxed);
        }
        // Release: the info is written before queries can learn of the id.
        self.store.shared().members.store(id + 1, Ordering::Release);
        self.members.push(Some(Member {
            key: worker,
            lookup: U64Table::new(),
            last_event_id: None,
            num_blocks: 0,
            has_warned_gap: false,
        }));
        self.by_key.insert(worker, id);
        Some(id)
    }

    /// Adds `delta` to member `id`'s tree size (and the copy queries read).
    fn bump_tree_size(&mut self, id: u32, delta: i64) {
        if let Some(member) = self.members[id as usize].as_mut() {
            member.num_blocks = member.num_blocks.saturating_add_signed(delta);
            if let Some(info) = self.store.layout().info(id) {
                info.num_blocks.store(member.num_blocks, Ordering::Relaxed);
            }
        }
    }

    /// Whether member `id` holds `hash` in any tier.
    pub(crate) fn holds_hash(&self, id: u32, hash: u64) -> bool {
        self.member(id)
            .is_some_and(|member| member.lookup.get(hash).is_some())
    }
}
