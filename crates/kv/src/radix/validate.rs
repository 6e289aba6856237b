//! A from-scratch consistency check of every derived field (tests and debugging).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::apply::tiers_of;
use super::nodes::{ROOT, child_key};
use super::pool::{ALIAS_BIT, TIER_MASK, entry_member};
use super::{RadixIndex, SLOT_MASK, TIER_SHIFT, digest_term};

impl RadixIndex {
    /// Recomputes every derived value (digest, counts, child counts, member entries, alias
    /// counts) from the primary data and reports the first disagreement. O(size of the index).
    ///
    /// Exists for property tests here and in the services built on the index.
    pub fn validate(&self) -> Result<(), String> {
        let mut children: HashMap<u32, u32> = HashMap::new();
        let mut node_entries: HashMap<(u32, u32), u32> = HashMap::new();
        let live: Vec<u32> = self.store.live_ids().collect();
        if live.len() != self.store.len() {
            return Err(format!(
                "{} live records, {} counted",
                live.len(),
                self.store.len()
            ));
        }
        for &slot in &live {
            let key = self.store.key_of(slot);
            let parent = self.store.parent_of(slot);
            let depth = self.store.depth_of(slot);
            if self.store.find(key) != Some(slot) {
                return Err(format!("node {slot} not found by its key"));
            }
            if parent != ROOT {
                *children.entry(parent).or_default() += 1;
                if self.store.depth_of(parent) + 1 != depth {
                    return Err(format!("node {slot} depth {depth} off its parent"));
                }
            } else if depth != 1 {
                return Err(format!("root child {slot} at depth {depth}"));
            }
            if child_key(self.store.key_of(parent), self.tokens_hash(slot)) != key {
                return Err(format!("node {slot} key does not derive from its parent"));
            }
            for e in self.store.entries(slot).iter() {
                if node_entries.insert((slot, entry_member(e)), e).is_some() {
                    return Err(format!(
                        "node {slot} lists member {} twice",
                        entry_member(e)
                    ));
                }
            }
        }
        for &slot in &live {
            let counted = children.get(&slot).copied().unwrap_or(0);
            let recorded = self.store.children_of(slot);
            if counted != recorded {
                return Err(format!("node {slot} children {recorded} != {counted}"));
            }
            if self.store.members_of(slot) == 0 && recorded == 0 {
                return Err(format!("node {slot} is empty but not freed"));
            }
        }
        if self.store.shared().members.load(Ordering::Relaxed) as usize != self.members.len() {
            return Err("published member count is off".to_string());
        }

        // (slot, member) → per-tier count of engine hashes.
        let mut claims: HashMap<(u32, u32), [u32; 4]> = HashMap::new();
        let mut digest = 0u64;
        let mut per_member: HashMap<u32, u64> = HashMap::new();
        for (id, member) in self.members.iter().enumerate() {
            let Some(member) = member else { continue };
            let id = id as u32;
            if self.by_key.get(&member.key) != Some(&id) {
                return Err(format!("member {id} not registered under its key"));
            }
            for (hash, value) in member.lookup.iter() {
                let slot = value & SLOT_MASK;
                let counts = claims.entry((slot, id)).or_default();
                for tier in tiers_of(value >> TIER_SHIFT) {
                    counts[tier.index()] += 1;
                    digest = digest.wrapping_add(digest_term(
                        member.key,
                        tier,
                        hash,
                        self.tokens_hash(slot),
                        self.store.depth_of(slot),
                    ));
                }
            }
        }
        if digest != self.digest {
            return Err("digest differs from recomputation".to_string());
        }
        if claims.len() != node_entries.len() {
            return Err(format!(
                "{} (node, member) claims vs {} node entries",
                claims.len(),
                node_entries.len()
            ));
        }
        for (&(slot, id), counts) in &claims {
            let Some(&e) = node_entries.get(&(slot, id)) else {
                return Err(format!("member {id} claims node {slot} without an entry"));
            };
            *per_member.entry(id).or_default() += 1;
            let tiers = counts
                .iter()
                .enumerate()
                .filter(|&(_, &n)| n > 0)
                .fold(0u32, |mask, (t, _)| mask | (1 << t));
            if tiers != e & TIER_MASK {
                return Err(format!("entry ({slot}, {id}) tiers disagree with lookups"));
            }
            let is_multi = counts.iter().any(|&n| n > 1);
            if e & ALIAS_BIT != 0 {
                if self.aliases.get(&(slot, id)) != Some(counts) {
                    return Err(format!("alias counts of ({slot}, {id}) are off"));
                }
            } else if is_multi {
                return Err(format!("entry ({slot}, {id}) has several hashes, no alias"));
            }
        }
        if self.num_entries != node_entries.len() as u64 {
            return Err("entry count is off".to_string());
        }
        for (id, member) in self.members.iter().enumerate() {
            if let Some(member) = member {
                let counted = per_member.get(&(id as u32)).copied().unwrap_or(0);
                if member.num_blocks != counted {
                    return Err(format!("member {id} tree size is off"));
                }
            }
        }
        Ok(())
    }
}
