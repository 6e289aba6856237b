//! The answer to "how many leading blocks of this sequence does each (worker, dp_rank) cache?".

use crate::events::{Tier, WorkerKey};

/// Matched blocks of one (worker, dp_rank), per tier, plus the blocks it holds in all.
///
/// `device` is the number of leading blocks held on the device; each slower tier counts the
/// blocks matched *beyond* the faster tiers (the host and disk overlaps of docs/routing.md,
/// "Cost function"). A block counts in a slower tier's run when the member holds it in that tier
/// or a faster one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberScore {
    /// The (worker, dp_rank).
    pub worker: WorkerKey,
    /// Leading blocks held on the device.
    pub device: u32,
    /// Further blocks matched in host (pinned) memory.
    pub host_pinned: u32,
    /// Further blocks matched on disk.
    pub disk: u32,
    /// Further blocks matched in an external store.
    pub external: u32,
    /// Blocks the member holds in the whole index (`tree_sizes`).
    pub tree_size: u64,
}

impl MemberScore {
    /// Matched blocks attributed to one tier.
    pub fn tier(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => self.device,
            Tier::HostPinned => self.host_pinned,
            Tier::Disk => self.disk,
            Tier::External => self.external,
        }
    }

    /// Leading blocks matched in any tier.
    pub fn total(&self) -> u32 {
        self.device + self.host_pinned + self.disk + self.external
    }
}

/// Result of `find_matches` (docs/indexer.md, "Matching").
///
/// One row per member that matched at least one block in any tier (members matching nothing are
/// absent), sorted by [`WorkerKey`]. Dynamo's `scores` map is the `device` column, its
/// `tier_scores` the other columns and its `tree_sizes` the `tree_size` column of these rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OverlapScores {
    /// Per-member rows, sorted by worker.
    pub scores: Vec<MemberScore>,
    /// Entry `i`: members still matching (any tier) at block `i` of the query; non-increasing,
    /// ends at the last block anyone matched.
    pub frequencies: Vec<u32>,
}

impl OverlapScores {
    /// The row of one member.
    pub fn get(&self, worker: WorkerKey) -> Option<&MemberScore> {
        self.scores
            .binary_search_by_key(&worker, |row| row.worker)
            .ok()
            .map(|i| &self.scores[i])
    }

    /// Device-tier matched blocks of one member (0 when absent).
    pub fn device(&self, worker: WorkerKey) -> u32 {
        self.get(worker).map_or(0, |row| row.device)
    }

    /// Matched blocks of one member attributed to `tier` (0 when absent).
    pub fn tier_score(&self, worker: WorkerKey, tier: Tier) -> u32 {
        self.get(worker).map_or(0, |row| row.tier(tier))
    }

    /// Merges the answer of an index over disjoint workers (another lane or shard): rows are
    /// united, frequencies summed element-wise (docs/indexer.md, "Fan-out and merge").
    pub fn merge(&mut self, other: OverlapScores) {
        self.scores.extend(other.scores);
        self.scores.sort_unstable_by_key(|row| row.worker);
        add_frequencies(&mut self.frequencies, &other.frequencies);
    }

    /// Raises each member's device score to the side index's where that is larger, adding rows the
    /// side index has and this answer lacks (docs/routing.md, "Predicted side index").
    pub fn max_device_with(&mut self, side: &OverlapScores) {
        for row in &side.scores {
            if row.device == 0 {
                continue;
            }
            match self
                .scores
                .binary_search_by_key(&row.worker, |own| own.worker)
            {
                Ok(i) => self.scores[i].device = self.scores[i].device.max(row.device),
                Err(i) => self.scores.insert(
                    i,
                    MemberScore {
                        worker: row.worker,
                        device: row.device,
                        ..MemberScore::default()
                    },
                ),
            }
        }
    }

    pub(crate) fn sort(&mut self) {
        self.scores.sort_unstable_by_key(|row| row.worker);
    }
}

pub(crate) fn add_frequencies(into: &mut Vec<u32>, other: &[u32]) {
    if into.len() < other.len() {
        into.resize(other.len(), 0);
    }
    for (sum, value) in into.iter_mut().zip(other) {
        *sum += value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(worker_id: u64, device: u32) -> MemberScore {
        MemberScore {
            worker: WorkerKey::new(worker_id, 0),
            device,
            ..MemberScore::default()
        }
    }

    #[test]
    fn merge_unites_rows_and_sums_frequencies() {
        let mut a = OverlapScores {
            scores: vec![row(3, 2)],
            frequencies: vec![1, 1],
        };
        let b = OverlapScores {
            scores: vec![row(1, 3)],
            frequencies: vec![1, 1, 1],
        };
        a.merge(b);
        assert_eq!(a.scores, vec![row(1, 3), row(3, 2)]);
        assert_eq!(a.frequencies, vec![2, 2, 1]);
        assert_eq!(a.device(WorkerKey::new(3, 0)), 2);
        assert_eq!(a.device(WorkerKey::new(9, 0)), 0);
    }

    #[test]
    fn max_device_takes_the_larger() {
        let mut primary = OverlapScores {
            scores: vec![row(1, 2), row(3, 5)],
            frequencies: vec![],
        };
        let side = OverlapScores {
            scores: vec![row(1, 4), row(2, 1), row(3, 1)],
            frequencies: vec![],
        };
        primary.max_device_with(&side);
        assert_eq!(primary.scores, vec![row(1, 4), row(2, 1), row(3, 5)]);
    }
}
