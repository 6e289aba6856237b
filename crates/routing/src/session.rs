//! Session affinity (docs/routing.md, "Session affinity"): requests of one session stick to one
//! (worker, dp_rank).

use std::collections::HashMap;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use crate::config::SessionAffinityMode;

/// One session's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    pub target: WorkerKey,
    pub mode: SessionAffinityMode,
    /// Requests of the session in flight; a binding with any never expires.
    pub inflight: u32,
    /// When the last request ended (or the binding was made).
    pub idle_since: Duration,
    pub ttl: Duration,
    /// Tells this binding from an earlier one of the same session id (dropped, then made again),
    /// so a request of the earlier one cannot release or drop this one.
    pub generation: u64,
}

/// A request's reference on a session binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionHold {
    pub id: String,
    pub generation: u64,
}

impl Binding {
    fn is_expired(&self, now: Duration) -> bool {
        self.inflight == 0 && now >= self.idle_since.saturating_add(self.ttl)
    }
}

/// Session id → binding.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: HashMap<String, Binding>,
    next_generation: u64,
}

impl Sessions {
    /// The live binding of a session (an expired one is removed).
    pub fn live(&mut self, id: &str, now: Duration) -> Option<Binding> {
        let binding = *self.map.get(id)?;
        if binding.is_expired(now) {
            self.map.remove(id);
            return None;
        }
        Some(binding)
    }

    /// Binds (or rebinds) a session and counts one more request in flight on it.
    pub fn acquire(
        &mut self,
        id: &str,
        target: WorkerKey,
        mode: SessionAffinityMode,
        ttl: Duration,
        now: Duration,
    ) -> SessionHold {
        let generation = self.next_generation;
        let binding = self.map.entry(id.to_string()).or_insert(Binding {
            target,
            mode,
            inflight: 0,
            idle_since: now,
            ttl,
            generation,
        });
        if binding.generation == generation {
            self.next_generation += 1;
        }
        binding.target = target;
        binding.mode = mode;
        binding.ttl = ttl;
        binding.inflight += 1;
        SessionHold {
            id: id.to_string(),
            generation: binding.generation,
        }
    }

    /// A request of the session ended: its idle timer restarts; `drop_binding` removes it (a
    /// failure of the bound worker). A hold on an earlier binding of the id changes nothing.
    pub fn release(&mut self, hold: &SessionHold, now: Duration, drop_binding: bool) {
        let Some(binding) = self.map.get_mut(&hold.id) else {
            return;
        };
        if binding.generation != hold.generation {
            return;
        }
        if drop_binding {
            self.map.remove(&hold.id);
            return;
        }
        binding.inflight = binding.inflight.saturating_sub(1);
        binding.idle_since = now;
    }

    /// Drops a binding (failure to select or dispatch).
    pub fn remove(&mut self, id: &str) {
        self.map.remove(id);
    }

    /// Drops every binding to a worker that left.
    pub fn remove_worker(&mut self, worker_id: u64) {
        self.map.retain(|_, b| b.target.worker_id != worker_id);
    }

    /// A replica's binding: first live binding wins, a matching one refreshes it, a conflicting
    /// live one is ignored.
    pub fn apply_remote(
        &mut self,
        id: &str,
        target: WorkerKey,
        mode: SessionAffinityMode,
        ttl: Duration,
        now: Duration,
    ) {
        match self.live(id, now) {
            Some(binding) if binding.target == target => {
                if let Some(b) = self.map.get_mut(id) {
                    b.idle_since = b.idle_since.max(now);
                }
            }
            Some(_) => {}
            None => {
                let generation = self.next_generation;
                self.next_generation += 1;
                self.map.insert(
                    id.to_string(),
                    Binding {
                        target,
                        mode,
                        inflight: 0,
                        idle_since: now,
                        ttl,
                        generation,
                    },
                );
            }
        }
    }

    /// Removes expired bindings (bounds memory when sessions stop coming).
    pub fn sweep(&mut self, now: Duration) {
        self.map.retain(|_, b| !b.is_expired(now));
    }

    /// Live or not-yet-swept bindings.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W1: WorkerKey = WorkerKey::new(1, 0);
    const W2: WorkerKey = WorkerKey::new(2, 0);

    #[test]
    fn in_flight_requests_block_expiry_and_idle_timer_restarts() {
        let s = Duration::from_secs;
        let mut sessions = Sessions::default();
        let hold = sessions.acquire("a", W1, SessionAffinityMode::Hard, s(10), s(0));
        assert!(
            sessions.live("a", s(100)).is_some(),
            "in flight: never expires"
        );
        sessions.release(&hold, s(100), false);
        assert!(sessions.live("a", s(109)).is_some());
        assert!(sessions.live("a", s(110)).is_none());
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn failures_and_departures_drop_bindings() {
        let s = Duration::from_secs;
        let mut sessions = Sessions::default();
        let hold = sessions.acquire("a", W1, SessionAffinityMode::Hard, s(10), s(0));
        sessions.release(&hold, s(1), true);
        assert!(sessions.live("a", s(1)).is_none());
        sessions.acquire("b", W2, SessionAffinityMode::Soft, s(10), s(0));
        sessions.remove_worker(2);
        assert!(sessions.live("b", s(0)).is_none());
    }

    #[test]
    fn remote_bindings_first_wins_matching_refreshes() {
        let s = Duration::from_secs;
        let mut sessions = Sessions::default();
        sessions.apply_remote("a", W1, SessionAffinityMode::Hard, s(10), s(0));
        sessions.apply_remote("a", W2, SessionAffinityMode::Hard, s(10), s(5));
        assert_eq!(sessions.live("a", s(5)).map(|b| b.target), Some(W1));
        sessions.apply_remote("a", W1, SessionAffinityMode::Hard, s(10), s(8));
        assert!(sessions.live("a", s(17)).is_some(), "refreshed at 8");
        assert!(sessions.live("a", s(18)).is_none());
    }

    #[test]
    fn a_request_of_an_earlier_binding_leaves_the_current_one_alone() {
        let s = Duration::from_secs;
        let mut sessions = Sessions::default();
        let first = sessions.acquire("a", W1, SessionAffinityMode::Hard, s(10), s(0));
        let failed = sessions.acquire("a", W1, SessionAffinityMode::Hard, s(10), s(0));
        assert_eq!(first, failed, "one binding, two holds");
        sessions.remove("a"); // a selection failed: the binding goes
        let current = sessions.acquire("a", W2, SessionAffinityMode::Hard, s(10), s(1));
        assert_ne!(current.generation, first.generation);
        // The first binding's requests end (one of them failing): the new binding keeps its
        // request in flight and its target.
        sessions.release(&first, s(2), false);
        sessions.release(&failed, s(2), true);
        assert_eq!(sessions.live("a", s(100)).map(|b| b.target), Some(W2));
        sessions.release(&current, s(100), false);
        assert!(sessions.live("a", s(110)).is_none());
    }
}
