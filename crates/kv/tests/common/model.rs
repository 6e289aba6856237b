//! A deliberately naive model of the index semantics, for property tests: every member keeps
//! `engine hash → (full path of tokens hashes, tiers)` and every query scans everything.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kvmesh_kv::{
    EventCounters, KvEventBatch, KvEventKind, MemberScore, OverlapScores, Tier, WorkerKey,
    digest_term,
};

#[derive(Debug, Default, Clone)]
struct MemberModel {
    last: Option<u64>,
    blocks: HashMap<u64, (Vec<u64>, u8)>,
}

/// The reference model.
#[derive(Debug, Default, Clone)]
pub struct Model {
    members: BTreeMap<WorkerKey, MemberModel>,
    removed: BTreeSet<u64>,
    pub counters: EventCounters,
    /// Every path ever stored (to build queries from).
    pub paths: BTreeSet<Vec<u64>>,
}

impl Model {
    pub fn apply(&mut self, batch: &KvEventBatch) {
        if self.removed.contains(&batch.worker_id) {
            self.counters.ignored_removed_worker += batch.events.len() as u64;
            return;
        }
        if batch.worker_removed {
            self.removed.insert(batch.worker_id);
            self.counters.workers_removed += 1;
            self.members
                .retain(|key, _| key.worker_id != batch.worker_id);
            return;
        }
        if batch.events.is_empty() {
            return;
        }
        let key = batch.worker();
        for event in &batch.events {
            let member = self.members.entry(key).or_default();
            match member.last {
                Some(last) if event.event_id <= last => {
                    self.counters.duplicates += 1;
                    continue;
                }
                Some(last) if event.event_id > last + 1 => self.counters.gaps += 1,
                _ => {}
            }
            member.last = Some(event.event_id);
            let bit = 1u8 << (event.tier as u8);
            match &event.kind {
                KvEventKind::Stored(stored) => {
                    let mut hashes: Vec<u64> = stored.blocks.iter().map(|b| b.block_hash).collect();
                    hashes.extend(stored.parent_hash);
                    let unique: BTreeSet<u64> = hashes.iter().copied().collect();
                    if unique.len() != hashes.len() {
                        self.counters.stored.invalid_block += 1;
                        continue;
                    }
                    let mut path = match stored.parent_hash {
                        None => Vec::new(),
                        Some(parent) => match member.blocks.get(&parent) {
                            Some((path, _)) => path.clone(),
                            None => {
                                self.counters.stored.parent_block_not_found += 1;
                                continue;
                            }
                        },
                    };
                    for block in &stored.blocks {
                        path.push(block.tokens_hash);
                        self.paths.insert(path.clone());
                        match member.blocks.get_mut(&block.block_hash) {
                            Some((old, tiers)) if *old == path => *tiers |= bit,
                            _ => {
                                member.blocks.insert(block.block_hash, (path.clone(), bit));
                            }
                        }
                    }
                    self.counters.stored.ok += 1;
                }
                KvEventKind::Removed(removed) => {
                    let mut is_missing = false;
                    for hash in &removed.block_hashes {
                        match member.blocks.get_mut(hash) {
                            Some((_, tiers)) if *tiers & bit != 0 => {
                                *tiers &= !bit;
                                if *tiers == 0 {
                                    member.blocks.remove(hash);
                                }
                            }
                            _ => is_missing = true,
                        }
                    }
                    if is_missing {
                        self.counters.removed.block_not_found += 1;
                    } else {
                        self.counters.removed.ok += 1;
                    }
                }
                KvEventKind::Cleared => {
                    member.blocks.clear();
                    self.counters.cleared.ok += 1;
                }
            }
        }
    }

    fn tree_size(member: &MemberModel) -> u64 {
        let paths: BTreeSet<&Vec<u64>> = member.blocks.values().map(|(path, _)| path).collect();
        paths.len() as u64
    }

    pub fn num_blocks(&self) -> u64 {
        self.members.values().map(Self::tree_size).sum()
    }

    pub fn digest(&self) -> u64 {
        let mut digest = 0u64;
        for (key, member) in &self.members {
            for (&hash, (path, tiers)) in &member.blocks {
                for tier in Tier::ALL {
                    if tiers & (1 << tier as u8) != 0 {
                        let tokens = *path.last().expect("non-empty path");
                        digest = digest.wrapping_add(digest_term(
                            *key,
                            tier,
                            hash,
                            tokens,
                            path.len() as u32,
                        ));
                    }
                }
            }
        }
        digest
    }

    pub fn last_event_id(&self, key: WorkerKey) -> Option<u64> {
        self.members.get(&key).and_then(|member| member.last)
    }

    pub fn workers(&self) -> Vec<WorkerKey> {
        self.members.keys().copied().collect()
    }

    pub fn find_matches(&self, query: &[u64]) -> OverlapScores {
        let mut out = OverlapScores::default();
        for (key, member) in &self.members {
            let tiers_at = |depth: usize| -> u32 {
                member
                    .blocks
                    .values()
                    .filter(|(path, _)| path.as_slice() == &query[..=depth])
                    .fold(0u32, |mask, (_, tiers)| mask | u32::from(*tiers))
            };
            if query.is_empty() {
                continue;
            }
            let first = tiers_at(0);
            if first == 0 {
                continue;
            }
            let mut phase = first.trailing_zeros() as usize;
            let mut ends = [0u32; 4];
            let mut alive = 0usize;
            for depth in 1..query.len() {
                let tiers = tiers_at(depth);
                if tiers == 0 {
                    break;
                }
                if tiers & ((2u32 << phase) - 1) == 0 {
                    let next = tiers.trailing_zeros() as usize;
                    for end in &mut ends[phase..next] {
                        *end = depth as u32;
                    }
                    phase = next;
                }
                alive = depth;
            }
            for end in &mut ends[phase..] {
                *end = alive as u32 + 1;
            }
            if out.frequencies.len() < alive + 1 {
                out.frequencies.resize(alive + 1, 0);
            }
            for freq in &mut out.frequencies[..=alive] {
                *freq += 1;
            }
            out.scores.push(MemberScore {
                worker: *key,
                device: ends[0],
                host_pinned: ends[1] - ends[0],
                disk: ends[2] - ends[1],
                external: ends[3] - ends[2],
                tree_size: Self::tree_size(member),
            });
        }
        out
    }
}
