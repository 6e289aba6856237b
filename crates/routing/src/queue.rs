//! The router queue (docs/routing.md, "Queue"): requests parked until a rank has prefill
//! capacity.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kvmesh_kv::OverlapScores;

use crate::config::QueuePolicy;
use crate::core::PreparedRequest;
use crate::request::Ticket;

/// A parked request with what was known when it parked.
#[derive(Debug)]
pub(crate) struct Parked {
    pub ticket: Ticket,
    pub prepared: PreparedRequest,
    pub overlap: Option<OverlapScores>,
    /// When the overlap above was read.
    pub queried_at: Duration,
    /// When the request parked, for `--router-queue-max-wait-ms`.
    pub parked_at: Duration,
}

/// Total order on f64 keys (NaN never occurs; `total_cmp` keeps the map sound regardless).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key(f64);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Highest `(strict_priority, key)` first, then arrival order.
pub(crate) type Slot = (Reverse<u32>, Reverse<Key>, u64);

/// Parked requests in policy order, and in arrival order for the wait limit.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    entries: BTreeMap<Slot, Parked>,
    by_ticket: HashMap<Ticket, Slot>,
    by_arrival: BTreeMap<(Duration, u64), Slot>,
    next_seq: u64,
}

/// The policy key: `p = max(priority, 0)`, `t` = arrival seconds since router start;
/// `fcfs` `p − t`, `lcfs` `p + t`, `wspt` `(1 + p) / max(1, uncached tokens)`.
pub(crate) fn policy_key(
    policy: QueuePolicy,
    priority: i32,
    arrival: Duration,
    uncached_tokens: u64,
) -> f64 {
    let p = f64::from(priority.max(0));
    let t = arrival.as_secs_f64();
    match policy {
        QueuePolicy::Fcfs => p - t,
        QueuePolicy::Lcfs => p + t,
        QueuePolicy::Wspt => (1.0 + p) / (uncached_tokens.max(1) as f64),
    }
}

impl Queue {
    /// Parks a request under its strict priority and policy key.
    pub fn push(&mut self, strict_priority: u32, key: f64, parked: Parked) {
        let slot = (Reverse(strict_priority), Reverse(Key(key)), self.next_seq);
        self.next_seq += 1;
        self.insert(slot, parked);
    }

    /// Removes the head with its place, so it can be put back unchanged if it cannot go yet.
    pub fn pop_with_slot(&mut self) -> Option<(Slot, Parked)> {
        let (slot, parked) = self.entries.pop_first()?;
        self.by_ticket.remove(&parked.ticket);
        self.by_arrival.remove(&(parked.parked_at, slot.2));
        Some((slot, parked))
    }

    /// Puts back a request taken with [`Self::pop_with_slot`] at its old place.
    pub fn reinsert(&mut self, slot: Slot, parked: Parked) {
        self.insert(slot, parked);
    }

    /// Removes a parked request (client disconnect).
    pub fn remove(&mut self, ticket: Ticket) -> Option<Parked> {
        let slot = self.by_ticket.remove(&ticket)?;
        let parked = self.entries.remove(&slot)?;
        self.by_arrival.remove(&(parked.parked_at, slot.2));
        Some(parked)
    }

    /// Removes the longest-parked request if it parked at or before `cutoff`.
    pub fn pop_parked_before(&mut self, cutoff: Duration) -> Option<Parked> {
        let (&(parked_at, _), &slot) = self.by_arrival.first_key_value()?;
        if parked_at > cutoff {
            return None;
        }
        self.by_arrival.pop_first();
        let parked = self.entries.remove(&slot)?;
        self.by_ticket.remove(&parked.ticket);
        Some(parked)
    }

    fn insert(&mut self, slot: Slot, parked: Parked) {
        self.by_ticket.insert(parked.ticket, slot);
        self.by_arrival.insert((parked.parked_at, slot.2), slot);
        self.entries.insert(slot, parked);
    }

    /// Parked requests.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_policies() {
        let s = Duration::from_secs;
        // fcfs: earlier first, priority shifts by seconds.
        assert!(
            policy_key(QueuePolicy::Fcfs, 0, s(1), 0) > policy_key(QueuePolicy::Fcfs, 0, s(2), 0)
        );
        assert_eq!(policy_key(QueuePolicy::Fcfs, 3, s(5), 0), -2.0);
        assert_eq!(policy_key(QueuePolicy::Fcfs, -7, s(5), 0), -5.0);
        // lcfs: later first.
        assert!(
            policy_key(QueuePolicy::Lcfs, 0, s(2), 0) > policy_key(QueuePolicy::Lcfs, 0, s(1), 0)
        );
        // wspt: shorter uncached work first.
        assert!(
            policy_key(QueuePolicy::Wspt, 0, s(9), 100)
                > policy_key(QueuePolicy::Wspt, 0, s(1), 1000)
        );
        assert_eq!(policy_key(QueuePolicy::Wspt, 1, s(0), 0), 2.0);
    }
}
