//! Engine-neutral KV events, mirroring `proto/kvmesh/v1/events.proto` (docs/kv-events.md,
//! "Event model" and "Transport").
//!
//! The index crate does not depend on the protobuf crate: the service layer converts
//! `kvmesh.v1.KvEventBatch` into these types field for field, so the index can be embedded, tested
//! and benchmarked without gRPC or NATS.

/// One data-parallel rank of one worker: the unit the index tracks blocks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WorkerKey {
    /// Discovery instance id of the worker (never reused).
    pub worker_id: u64,
    /// Data-parallel rank inside the worker.
    pub dp_rank: u32,
}

impl WorkerKey {
    /// Builds a key; exists so call sites read `WorkerKey::new(id, rank)`.
    pub const fn new(worker_id: u64, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }
}

/// Storage tier of a block, in the order the router prefers them (fastest first).
///
/// The discriminants equal the protobuf enum values and the `u8(tier)` of the state digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Tier {
    /// GPU memory.
    #[default]
    Device = 0,
    /// Host (pinned CPU) memory.
    HostPinned = 1,
    /// Local disk or NVMe.
    Disk = 2,
    /// A remote or shared store.
    External = 3,
}

impl Tier {
    /// Every tier, fastest first; index `i` has discriminant `i`.
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::HostPinned, Tier::Disk, Tier::External];

    /// Tier from its protobuf / digest number; unknown numbers read as device
    /// (docs/kv-events.md, "Event model").
    pub fn from_u8(value: u8) -> Tier {
        match value {
            1 => Tier::HostPinned,
            2 => Tier::Disk,
            3 => Tier::External,
            _ => Tier::Device,
        }
    }

    /// Tier from an engine's `medium` string (docs/kv-events.md, "Event model"); absent or
    /// unknown is device.
    pub fn from_medium(medium: Option<&str>) -> Tier {
        match medium.map(str::to_ascii_uppercase).as_deref() {
            Some("CPU" | "CPU_PINNED" | "CPU_TIER1") => Tier::HostPinned,
            Some("CPU_TIER2" | "DISK" | "NVME") => Tier::Disk,
            Some("EXTERNAL" | "NETWORK" | "REMOTE" | "SHARED") => Tier::External,
            _ => Tier::Device,
        }
    }

    /// Position of the tier in [`Tier::ALL`] and in per-tier arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A run of consecutive events from one (worker, dp_rank), or a worker-removed marker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvEventBatch {
    /// Discovery instance id of the worker that owns the blocks.
    pub worker_id: u64,
    /// Data-parallel rank inside the worker.
    pub dp_rank: u32,
    /// Events with consecutive event ids, oldest first.
    pub events: Vec<KvEvent>,
    /// Wall-clock publish time in ms since the Unix epoch (carried through, unused by the index).
    pub published_at_ms: u64,
    /// Marker: the worker left discovery; drop every block of every dp rank and ignore the worker
    /// from now on. `events` and `dp_rank` are ignored when set.
    pub worker_removed: bool,
    /// Marker: a removed worker registered again under the same id (its lease came back); its
    /// later events are applied again. `events` and `dp_rank` are ignored when set.
    pub worker_readmitted: bool,
}

impl KvEventBatch {
    /// The (worker, dp_rank) the batch belongs to.
    pub fn worker(&self) -> WorkerKey {
        WorkerKey::new(self.worker_id, self.dp_rank)
    }

    /// A worker-removed marker for `worker_id` (docs/kv-events.md, "Worker removal").
    pub fn worker_removed(worker_id: u64) -> Self {
        Self {
            worker_id,
            worker_removed: true,
            ..Self::default()
        }
    }

    /// A worker-readmitted marker for `worker_id` (docs/kv-events.md, "Worker removal").
    pub fn worker_readmitted(worker_id: u64) -> Self {
        Self {
            worker_id,
            worker_readmitted: true,
            ..Self::default()
        }
    }

    /// Whether the batch is a marker (removed or readmitted) rather than a run of events.
    pub fn is_marker(&self) -> bool {
        self.worker_removed || self.worker_readmitted
    }

    /// Block operations the batch carries (stored blocks + removed hashes; a clear counts 1).
    ///
    /// Used to size apply-lane work and by benchmarks that count block operations.
    pub fn block_ops(&self) -> usize {
        self.events.iter().map(KvEvent::block_ops).sum::<usize>() + usize::from(self.is_marker())
    }
}

/// One change to a worker's KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// Per (worker, dp_rank) sequence number, from 0, +1 per event.
    pub event_id: u64,
    /// Tier the event applies to.
    pub tier: Tier,
    /// What happened.
    pub kind: KvEventKind,
}

impl KvEvent {
    /// Block operations in this event (stored blocks or removed hashes; a clear counts 1).
    pub fn block_ops(&self) -> usize {
        match &self.kind {
            KvEventKind::Stored(stored) => stored.blocks.len(),
            KvEventKind::Removed(removed) => removed.block_hashes.len(),
            KvEventKind::Cleared => 1,
        }
    }
}

/// The three kinds of KV event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEventKind {
    /// Blocks were stored.
    Stored(KvStored),
    /// Blocks were evicted.
    Removed(KvRemoved),
    /// Every block of the (worker, dp_rank) was dropped.
    Cleared,
}

/// A chain of newly stored full blocks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvStored {
    /// Engine hash of the block before the first one; `None` means the chain starts at the root.
    pub parent_hash: Option<u64>,
    /// The blocks, in prompt order.
    pub blocks: Vec<KvStoredBlock>,
    /// Block index of the first block, when the engine knows it (carried through, not checked).
    pub start_position: Option<u32>,
}

/// One stored block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvStoredBlock {
    /// The engine's id for the block (opaque; referenced by later `parent_hash` and removals).
    pub block_hash: u64,
    /// kvmesh local hash of the block's tokens: the key the index navigates by.
    pub tokens_hash: u64,
    /// Hashes of multimodal objects inside the block (already mixed into `tokens_hash`).
    pub mm_hashes: Vec<u64>,
}

impl KvStoredBlock {
    /// A block without multimodal content.
    pub fn new(block_hash: u64, tokens_hash: u64) -> Self {
        Self {
            block_hash,
            tokens_hash,
            mm_hashes: Vec::new(),
        }
    }
}

/// Blocks evicted from a tier.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvRemoved {
    /// Engine hashes of the removed blocks.
    pub block_hashes: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medium_strings_map_to_tiers() {
        assert_eq!(Tier::from_medium(Some("GPU")), Tier::Device);
        assert_eq!(Tier::from_medium(Some("cpu_pinned")), Tier::HostPinned);
        assert_eq!(Tier::from_medium(Some("NVME")), Tier::Disk);
        assert_eq!(Tier::from_medium(Some("SHARED")), Tier::External);
        assert_eq!(Tier::from_medium(Some("weird")), Tier::Device);
        assert_eq!(Tier::from_medium(None), Tier::Device);
        for tier in Tier::ALL {
            assert_eq!(Tier::from_u8(tier as u8), tier);
        }
    }
}
