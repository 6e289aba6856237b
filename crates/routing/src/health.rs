//! Ejection of failing workers (docs/routing.md, "Ejection of failing workers").
//!
//! A worker that fails fast frees its requests at once, so by load alone it looks idle and every
//! policy that prefers light workers sends it more. [`WorkerHealth`] counts each worker's
//! consecutive failures (requests that ended as [`crate::TerminalPath::WorkerFailed`] or
//! [`crate::TerminalPath::Migrated`]); at the threshold the worker is ejected: no decision
//! chooses it until its back-off has passed. Then it is half-open: one request is let through as
//! a probe. The probe's first token or completion readmits the worker; its failure ejects it
//! again for twice as long (up to the maximum). A success of any request resets the count.
//!
//! Pure state with time passed in, like the rest of the core.

use std::collections::HashMap;
use std::time::Duration;

use crate::tracker::ReqKey;

/// When workers are ejected and for how long (`--router-ejection-*`, kvmesh additions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EjectionConfig {
    /// Consecutive failures that eject a worker; 0 turns ejection off.
    pub consecutive_failures: u32,
    /// The first ejection's length; each failed probe doubles it.
    pub base_backoff: Duration,
    /// The longest ejection.
    pub max_backoff: Duration,
}

impl Default for EjectionConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 3,
            base_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// Where one worker stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Routable; `failures` in a row so far.
    Admitted { failures: u32 },
    /// Not routable before `until`; then one probe may go.
    Ejected { until: Duration, backoff: Duration },
    /// The probe `probe` is out; nothing else goes until it ends.
    Probing { probe: ReqKey, backoff: Duration },
}

/// A change of a worker's standing, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Ejected for this long (again, when a probe failed).
    Ejected(Duration),
    /// A probe succeeded: routable again.
    Readmitted,
}

/// Failure counts and ejections of one model's workers.
#[derive(Debug, Default)]
pub(crate) struct WorkerHealth {
    config: EjectionConfig,
    workers: HashMap<u64, State>,
    ejections: u64,
    readmissions: u64,
}

impl WorkerHealth {
    pub(crate) fn new(config: EjectionConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Whether a decision may choose `worker_id` now: admitted, or ejected with its back-off
    /// over and no probe out (the request it gets becomes the probe, see [`Self::routed`]).
    pub(crate) fn admits(&self, worker_id: u64, now: Duration) -> bool {
        match self.workers.get(&worker_id) {
            None | Some(State::Admitted { .. }) => true,
            Some(State::Ejected { until, .. }) => now >= *until,
            Some(State::Probing { .. }) => false,
        }
    }

    /// A request was routed to `worker_id` at `now`: when the worker is ejected and its back-off
    /// is over, the request is its probe.
    pub(crate) fn routed(&mut self, worker_id: u64, key: &ReqKey, now: Duration) {
        if let Some(state) = self.workers.get_mut(&worker_id)
            && let State::Ejected { backoff, until } = *state
            && now >= until
        {
            *state = State::Probing {
                probe: key.clone(),
                backoff,
            };
        }
    }

    /// The worker produced for `key` (a first token, or a completion).
    pub(crate) fn succeeded(&mut self, worker_id: u64, key: &ReqKey) -> Option<HealthChange> {
        let state = self.workers.get_mut(&worker_id)?;
        match state {
            State::Admitted { .. } => {
                self.workers.remove(&worker_id);
                None
            }
            State::Probing { probe, .. } if probe == key => {
                self.workers.remove(&worker_id);
                self.readmissions += 1;
                Some(HealthChange::Readmitted)
            }
            // Requests routed before the ejection say little about the worker now: only the
            // probe decides.
            State::Probing { .. } | State::Ejected { .. } => None,
        }
    }

    /// The worker failed `key` at `now`.
    pub(crate) fn failed(
        &mut self,
        worker_id: u64,
        key: &ReqKey,
        now: Duration,
    ) -> Option<HealthChange> {
        let threshold = self.config.consecutive_failures;
        if threshold == 0 {
            return None;
        }
        let state = self
            .workers
            .entry(worker_id)
            .or_insert(State::Admitted { failures: 0 });
        let backoff = match state {
            State::Admitted { failures } => {
                *failures += 1;
                if *failures < threshold {
                    return None;
                }
                self.config.base_backoff
            }
            State::Probing { probe, backoff } if probe == key => {
                (*backoff * 2).min(self.config.max_backoff)
            }
            State::Probing { .. } | State::Ejected { .. } => return None,
        };
        *state = State::Ejected {
            until: now + backoff,
            backoff,
        };
        self.ejections += 1;
        Some(HealthChange::Ejected(backoff))
    }

    /// A request ended without saying anything about its worker (cancelled, client gone,
    /// expired): a probe's slot opens for the next request.
    pub(crate) fn ended_neutral(&mut self, worker_id: u64, key: &ReqKey, now: Duration) {
        if let Some(state) = self.workers.get_mut(&worker_id)
            && let State::Probing { probe, backoff } = state
            && probe == key
        {
            *state = State::Ejected {
                until: now,
                backoff: *backoff,
            };
        }
    }

    /// Forgets a worker that left discovery.
    pub(crate) fn remove(&mut self, worker_id: u64) {
        self.workers.remove(&worker_id);
    }

    /// Workers that are ejected or probing at `now` (a worker whose back-off is over counts
    /// until its probe succeeds).
    pub(crate) fn num_ejected(&self) -> usize {
        self.workers
            .values()
            .filter(|state| !matches!(state, State::Admitted { .. }))
            .count()
    }

    /// Whether `worker_id` is ejected or probing.
    pub(crate) fn is_ejected(&self, worker_id: u64) -> bool {
        self.workers
            .get(&worker_id)
            .is_some_and(|state| !matches!(state, State::Admitted { .. }))
    }

    /// Ejections so far (a failed probe counts again).
    pub(crate) fn ejections(&self) -> u64 {
        self.ejections
    }

    /// Readmissions so far.
    pub(crate) fn readmissions(&self) -> u64 {
        self.readmissions
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
