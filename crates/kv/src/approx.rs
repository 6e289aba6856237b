//! The approximate index: what workers probably cache, inferred from routing decisions.
//!
//! Without KV events (`--no-router-kv-events`; docs/routing.md, "Approximate mode") the router
//! records each decision as if the chosen (worker, dp_rank) had stored the request's blocks, with
//! the request's sequence hashes as engine hashes. Entries then leave by one of two policies:
//!
//! * `ttl`: an entry expires `ttl` after its last insertion (re-insertion refreshes it);
//! * `lru`: each rank keeps at most its advertised `total_kv_blocks` entries, least recently
//!   inserted leaving first.
//!
//! Under both, when the index holds more than `max_tree_size` (block, member) entries it prunes
//! the earliest-expiring (least recently inserted) ones, deeper first on ties, down to
//! `max_tree_size · prune_target_ratio`.
//!
//! Time is passed in by the caller as a [`Duration`] since any fixed origin; nothing here reads a
//! clock, so the router's virtual-time benchmark is deterministic.
//!
//! The predicted side index (docs/routing.md, "Predicted side index") is this same structure
//! with a TTL, kept next to an event-fed index; combine the two answers with
//! [`crate::OverlapScores::max_device_with`].

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::events::{KvStored, KvStoredBlock, Tier, WorkerKey};
use crate::radix::RadixIndex;
use crate::scores::OverlapScores;

/// How entries leave the approximate index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ApproxPolicy {
    /// Expire this long after the last insertion (`--router-ttl-secs`).
    Ttl(Duration),
    /// Evict least recently inserted beyond each rank's capacity ([`ApproxIndex::set_capacity`]).
    Lru,
}

/// Settings of an [`ApproxIndex`] (`--router-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApproxConfig {
    /// Expiry policy.
    pub policy: ApproxPolicy,
    /// Entries above which the index prunes (`--router-max-tree-size`).
    pub max_tree_size: usize,
    /// Fraction of `max_tree_size` a prune goes down to (`--router-prune-target-ratio`).
    pub prune_target_ratio: f64,
}

impl Default for ApproxConfig {
    /// The router's defaults: TTL 120 s, 1 048 576 entries, prune to 80 %.
    fn default() -> Self {
        Self {
            policy: ApproxPolicy::Ttl(Duration::from_secs(120)),
            max_tree_size: 1 << 20,
            prune_target_ratio: 0.8,
        }
    }
}

impl ApproxConfig {
    /// Settings of the predicted side index: TTL `ttl` (`--router-predicted-ttl-secs`), default
    /// size limits.
    pub fn predicted(ttl: Duration) -> Self {
        Self {
            policy: ApproxPolicy::Ttl(ttl),
            ..Self::default()
        }
    }
}

/// Order key of an entry: last insertion, then deeper first.
type OrderKey = (Duration, Reverse<u32>, WorkerKey, u64);

/// Event-less index fed by routing decisions (see the module docs).
#[derive(Debug)]
pub struct ApproxIndex {
    index: RadixIndex,
    config: ApproxConfig,
    /// (member, sequence hash) → (last insertion, depth).
    touched: HashMap<(WorkerKey, u64), (Duration, u32)>,
    /// Every entry, earliest insertion first, deeper first on ties.
    order: BTreeSet<OrderKey>,
    /// LRU only: each member's entries in the same order.
    per_member: HashMap<WorkerKey, BTreeSet<(Duration, Reverse<u32>, u64)>>,
    /// LRU only: advertised capacity per member.
    capacity: HashMap<WorkerKey, u64>,
}

impl ApproxIndex {
    /// An empty approximate index.
    pub fn new(config: ApproxConfig) -> Self {
        Self {
            index: RadixIndex::new(),
            config,
            touched: HashMap::new(),
            order: BTreeSet::new(),
            per_member: HashMap::new(),
            capacity: HashMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ApproxConfig {
        &self.config
    }

    /// The underlying index (read-only: digest, counts, dumps).
    pub fn index(&self) -> &RadixIndex {
        &self.index
    }

    /// Records that a request with these blocks was routed to `worker` at `now`: its blocks are
    /// inserted (or refreshed) as device blocks, keyed by the sequence hashes. Extra hashes of the
    /// longer slice are ignored. Expires and prunes as needed.
    pub fn record_routing_decision(
        &mut self,
        worker: WorkerKey,
        local_hashes: &[u64],
        sequence_hashes: &[u64],
        now: Duration,
    ) {
        self.advance(now);
        let len = local_hashes.len().min(sequence_hashes.len());
        if len == 0 || self.index.is_worker_removed(worker.worker_id) {
            return;
        }
        let Some(id) = self.index.member_id_or_insert(worker) else {
            return;
        };
        let stored = KvStored {
            parent_hash: None,
            blocks: sequence_hashes[..len]
                .iter()
                .zip(&local_hashes[..len])
                .map(|(&seq, &local)| KvStoredBlock::new(seq, local))
                .collect(),
            start_position: None,
        };
        self.index.store(id, Tier::Device, &stored);
        for (depth, &hash) in sequence_hashes[..len].iter().enumerate() {
            if self.index.holds_hash(id, hash) {
                self.touch(worker, hash, depth as u32 + 1, now);
            }
        }
        if self.config.policy == ApproxPolicy::Lru {
            self.enforce_capacity(worker);
        }
        self.prune();
        self.index.reclaim();
    }

    /// Sets a rank's advertised capacity (`total_kv_blocks`, LRU policy) and evicts down to it.
    pub fn set_capacity(&mut self, worker: WorkerKey, total_kv_blocks: u64) {
        self.capacity.insert(worker, total_kv_blocks);
        if self.config.policy == ApproxPolicy::Lru {
            self.enforce_capacity(worker);
        }
        self.index.reclaim();
    }

    /// Moves time to `now`: TTL entries whose expiry is at or before `now` are removed.
    pub fn advance(&mut self, now: Duration) {
        let ApproxPolicy::Ttl(ttl) = self.config.policy else {
            return;
        };
        while let Some(&first) = self.order.first() {
            if first.0.saturating_add(ttl) > now {
                break;
            }
            self.evict(first);
        }
        self.index.reclaim();
    }

    /// Matches a sequence (see [`RadixIndex::find_matches`]); entries past their TTL stay visible
    /// until [`Self::advance`] (or the next record) removes them.
    pub fn find_matches(&self, local_hashes: &[u64]) -> OverlapScores {
        self.index.find_matches(local_hashes)
    }

    /// Advances to `now`, then matches.
    pub fn find_matches_at(&mut self, local_hashes: &[u64], now: Duration) -> OverlapScores {
        self.advance(now);
        self.index.find_matches(local_hashes)
    }

    /// Records decisions for a worker again after [`Self::remove_worker`]: it registered again
    /// under the same id.
    pub fn readmit_worker(&mut self, worker_id: u64) {
        self.index.readmit_worker(worker_id);
    }

    /// Drops a worker that left discovery (all dp ranks) and ignores it from now on.
    pub fn remove_worker(&mut self, worker_id: u64) {
        self.index.remove_worker(worker_id);
        self.touched
            .retain(|(worker, _), _| worker.worker_id != worker_id);
        self.order
            .retain(|(_, _, worker, _)| worker.worker_id != worker_id);
        self.per_member
            .retain(|worker, _| worker.worker_id != worker_id);
        self.capacity
            .retain(|worker, _| worker.worker_id != worker_id);
    }

    /// (block, member) entries.
    pub fn num_blocks(&self) -> u64 {
        self.index.num_blocks()
    }

    fn touch(&mut self, worker: WorkerKey, hash: u64, depth: u32, now: Duration) {
        if let Some((old_time, old_depth)) = self.touched.insert((worker, hash), (now, depth)) {
            self.order
                .remove(&(old_time, Reverse(old_depth), worker, hash));
            if let Some(set) = self.per_member.get_mut(&worker) {
                set.remove(&(old_time, Reverse(old_depth), hash));
            }
        }
        self.order.insert((now, Reverse(depth), worker, hash));
        if self.config.policy == ApproxPolicy::Lru {
            self.per_member
                .entry(worker)
                .or_default()
                .insert((now, Reverse(depth), hash));
        }
    }

    fn evict(&mut self, key: OrderKey) {
        let (time, depth, worker, hash) = key;
        self.order.remove(&key);
        self.touched.remove(&(worker, hash));
        if let Some(set) = self.per_member.get_mut(&worker) {
            set.remove(&(time, depth, hash));
        }
        if let Some(id) = self.index.member_id(worker) {
            self.index.remove_hashes(id, Tier::Device, &[hash]);
        }
    }

    fn enforce_capacity(&mut self, worker: WorkerKey) {
        let Some(&capacity) = self.capacity.get(&worker) else {
            return;
        };
        loop {
            let Some(set) = self.per_member.get(&worker) else {
                return;
            };
            if set.len() as u64 <= capacity {
                return;
            }
            let Some(&(time, depth, hash)) = set.first() else {
                return;
            };
            self.evict((time, depth, worker, hash));
        }
    }

    fn prune(&mut self) {
        if self.index.num_blocks() <= self.config.max_tree_size as u64 {
            return;
        }
        let target = (self.config.max_tree_size as f64 * self.config.prune_target_ratio) as u64;
        while self.index.num_blocks() > target {
            let Some(&first) = self.order.first() else {
                return;
            };
            self.evict(first);
        }
    }
}
