//! One decision: filters, overlap, the queue, scoring, selection and recording (docs/routing.md:
//! "Candidates and filters", "KV routing flow", "Selection", "Queue", "Session affinity",
//! "Pins and routing headers").

use std::time::Duration;

use kvmesh_kv::{OverlapScores, WorkerKey};

use super::RouterCore;
use crate::config::{RouterMode, SessionAffinityMode};
use crate::core::PreparedRequest;
use crate::cost::EffectiveKv;
use crate::error::RouteError;
use crate::queue::{Parked, policy_key};
use crate::request::{Dispatched, RouteOutcome, RouteRequest, RouterConfigOverride, Ticket};

/// Longest session id a request may carry: bindings are kept per id and replicated to every
/// router replica.
pub(crate) const MAX_SESSION_ID_BYTES: usize = 256;

/// Longest idle TTL a request may ask for its own session binding (a day): bindings are swept
/// only after their TTL, so an unbounded one set by a client would never be freed.
pub(crate) const MAX_SESSION_BIND_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Where a request may go, after pins and session bindings.
#[derive(Debug, Clone, Default)]
pub(super) struct Plan {
    pub pin_worker: Option<u64>,
    pub pin_rank: Option<u32>,
    /// Soft binding: chosen directly when eligible.
    pub preferred: Option<WorkerKey>,
    pub session: Option<SessionPlan>,
}

#[derive(Debug, Clone)]
pub(super) struct SessionPlan {
    pub id: String,
    pub ttl: Duration,
    pub mode: SessionAffinityMode,
    pub is_bound: bool,
}

/// An eligible (worker, dp_rank); outside `kv` mode the rank is the one requests are tracked
/// under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate {
    pub key: WorkerKey,
    pub is_cpu: bool,
}

impl RouterCore {
    /// Routes a request: hashes it, queries the attached index, decides and tracks it (or parks
    /// it). The decision must later be released with [`RouterCore::free`].
    pub fn route(
        &mut self,
        request: &RouteRequest<'_>,
        now: Duration,
    ) -> Result<RouteOutcome, RouteError> {
        let prepared = self.prepare(request);
        self.route_prepared(prepared, None, now)
    }

    /// Routes a request hashed beforehand. `primary` is the event-fed index's answer when the
    /// caller queried it (outside a lock, or from remote shards); `None` makes the router query
    /// its attached source itself when the mode and credit need overlap.
    pub fn route_prepared(
        &mut self,
        prepared: PreparedRequest,
        primary: Option<OverlapScores>,
        now: Duration,
    ) -> Result<RouteOutcome, RouteError> {
        self.tick(now);
        if !self.is_ready {
            return Err(RouteError::NotReady);
        }
        let eff = self.effective_kv(prepared.hints.config_override.as_ref());
        let plan = self.plan(&prepared, now)?;
        let candidates = self.eligible(&prepared, &plan, now)?;
        let overlap = self.overlap(&prepared, &eff, primary, now);
        if self.config.queue_threshold.is_some()
            && (!self.queue.is_empty() || self.all_full(&candidates))
        {
            if self.queue.len() >= self.config.queue_max_len {
                return Err(RouteError::Overloaded);
            }
            let ticket = Ticket(self.next_ticket);
            self.next_ticket += 1;
            let best = candidates
                .iter()
                .map(|c| overlap.as_ref().map_or(0, |o| o.device(c.key)))
                .max()
                .unwrap_or(0);
            let uncached = prepared
                .isl
                .saturating_sub(u64::from(best) * u64::from(self.block_size));
            let key = policy_key(
                self.config.queue_policy,
                prepared.hints.priority,
                now,
                uncached,
            );
            let strict = prepared.hints.strict_priority;
            self.queue.push(
                strict,
                key,
                Parked {
                    ticket,
                    prepared,
                    overlap,
                    queried_at: now,
                    parked_at: now,
                },
            );
            return Ok(RouteOutcome::Queued(ticket));
        }
        let decision =
            self.select_and_record(prepared, &eff, &plan, &candidates, overlap.as_ref(), now);
        Ok(RouteOutcome::Routed(decision))
    }

    /// Lets parked requests go, head first, while the head has a rank with capacity.
    pub(super) fn drain_queue(&mut self, now: Duration) {
        self.expire_parked(now);
        while let Some((slot, parked)) = self.queue.pop_with_slot() {
            let eff = self.effective_kv(parked.prepared.hints.config_override.as_ref());
            let candidates = self.plan(&parked.prepared, now).and_then(|plan| {
                self.eligible(&parked.prepared, &plan, now)
                    .map(|c| (plan, c))
            });
            let (plan, candidates) = match candidates {
                Ok(found) => found,
                Err(error) => {
                    self.dispatched.push(Dispatched {
                        ticket: parked.ticket,
                        request_id: parked.prepared.request_id,
                        result: Err(error),
                    });
                    continue;
                }
            };
            if self.all_full(&candidates) {
                self.queue.reinsert(slot, parked);
                break;
            }
            let can_requery = self.primary.is_some() || self.approx.is_some();
            let is_stale = self
                .config
                .kv
                .overlap_refresh_after
                .is_some_and(|after| now.saturating_sub(parked.queried_at) > after);
            let overlap = if can_requery && is_stale {
                self.overlap(&parked.prepared, &eff, None, now)
            } else {
                parked.overlap
            };
            let ticket = parked.ticket;
            let decision = self.select_and_record(
                parked.prepared,
                &eff,
                &plan,
                &candidates,
                overlap.as_ref(),
                now,
            );
            self.dispatched.push(Dispatched {
                ticket,
                request_id: decision.request_id.clone(),
                result: Ok(decision),
            });
        }
    }

    /// Refuses, as overloaded, every request parked longer than `--router-queue-max-wait-ms`.
    /// A parked request holds no load yet, so nothing else is released.
    fn expire_parked(&mut self, now: Duration) {
        let Some(max_wait) = self.config.queue_max_wait else {
            return;
        };
        let Some(cutoff) = now.checked_sub(max_wait) else {
            return;
        };
        while let Some(parked) = self.queue.pop_parked_before(cutoff) {
            tracing::debug!(request_id = %parked.prepared.request_id, "queue wait limit reached");
            self.dispatched.push(Dispatched {
                ticket: parked.ticket,
                request_id: parked.prepared.request_id,
                result: Err(RouteError::Overloaded),
            });
        }
    }

    /// The router's cost options for one request: the config, the learned weights in `auto`
    /// mode, then the request's override.
    fn effective_kv(&self, over: Option<&RouterConfigOverride>) -> EffectiveKv {
        let learned = self.adaptive.as_ref().map(|a| a.weights());
        EffectiveKv::with_learned(&self.config.kv, learned.as_ref(), over)
    }

    /// Pins from hints, then the session binding (an explicit pin wins over a binding).
    fn plan(&mut self, prepared: &PreparedRequest, now: Duration) -> Result<Plan, RouteError> {
        let hints = &prepared.hints;
        let mut plan = Plan {
            pin_worker: hints.backend_instance_id,
            pin_rank: hints.dp_rank,
            ..Plan::default()
        };
        if self.config.mode == RouterMode::Direct {
            if plan.pin_worker.is_none() {
                return Err(RouteError::BadRequest(
                    "direct routing needs a target worker: set nvext.backend_instance_id or the \
                     x-dynamo-worker-instance-id header"
                        .into(),
                ));
            }
            return Ok(plan);
        }
        let Some(id) = hints.session_id.as_deref().filter(|id| !id.is_empty()) else {
            return Ok(plan);
        };
        if id.len() > MAX_SESSION_ID_BYTES {
            return Err(RouteError::BadRequest(format!(
                "session id is {} bytes; at most {MAX_SESSION_ID_BYTES} are allowed",
                id.len()
            )));
        }
        let Some(ttl) = hints
            .session_bind_ttl
            .map(|ttl| ttl.min(MAX_SESSION_BIND_TTL))
            .or(self.config.session_affinity_ttl)
        else {
            return Ok(plan);
        };
        let mode = self.config.session_affinity_mode;
        let binding = self.sessions.live(id, now);
        if let Some(binding) = binding
            && plan.pin_worker.is_none()
        {
            match mode {
                SessionAffinityMode::Hard => {
                    plan.pin_worker = Some(binding.target.worker_id);
                    if self.config.mode == RouterMode::Kv {
                        plan.pin_rank = Some(binding.target.dp_rank);
                    }
                }
                SessionAffinityMode::Soft => plan.preferred = Some(binding.target),
            }
        }
        plan.session = Some(SessionPlan {
            id: id.to_string(),
            ttl,
            mode,
            is_bound: binding.is_some(),
        });
        Ok(plan)
    }

    /// Candidates after allowed ids, pins and busy (docs/routing.md, "Candidates and filters"); a
    /// failure drops a hard binding that caused it.
    fn eligible(
        &mut self,
        prepared: &PreparedRequest,
        plan: &Plan,
        now: Duration,
    ) -> Result<Vec<Candidate>, RouteError> {
        let result = self.eligible_inner(prepared, plan, now);
        if let (Err(error), Some(session)) = (&result, &plan.session)
            && session.is_bound
            && error.drops_session()
        {
            self.sessions.remove(&session.id);
        }
        result
    }

    fn eligible_inner(
        &mut self,
        prepared: &PreparedRequest,
        plan: &Plan,
        now: Duration,
    ) -> Result<Vec<Candidate>, RouteError> {
        let is_kv = self.config.mode == RouterMode::Kv;
        let needs_device = self.config.mode == RouterMode::DeviceAwareWeighted;
        let allowed = prepared.hints.allowed_worker_ids.as_deref();
        let mut out = Vec::with_capacity(self.workers.len());
        for info in self.workers.values() {
            if allowed.is_some_and(|ids| !ids.contains(&info.worker_id))
                || plan.pin_worker.is_some_and(|pin| pin != info.worker_id)
            {
                continue;
            }
            // Only device-aware routing reads the device type (a string compare per worker).
            let is_cpu = needs_device && info.is_cpu();
            if is_kv {
                let Some(runtime) = info.runtime else {
                    continue;
                };
                for rank in runtime.ranks() {
                    if plan.pin_rank.is_none_or(|pin| pin == rank) {
                        out.push(Candidate {
                            key: WorkerKey::new(info.worker_id, rank),
                            is_cpu,
                        });
                    }
                }
            } else {
                let rank = match plan.pin_rank {
                    Some(rank) if info.ranks().contains(&rank) => rank,
                    Some(_) => continue,
                    None => info.default_rank(),
                };
                out.push(Candidate {
                    key: WorkerKey::new(info.worker_id, rank),
                    is_cpu,
                });
            }
        }
        if out.is_empty() {
            return Err(RouteError::NoEndpoint);
        }
        // Ejected workers are left out while anything else remains: with every candidate
        // ejected, routing to one of them beats refusing the request.
        if out.iter().any(|c| self.health.admits(c.key.worker_id, now)) {
            out.retain(|c| self.health.admits(c.key.worker_id, now));
        }
        if self.busy.is_any_set() {
            let by_rank = is_kv || plan.pin_rank.is_some();
            out.retain(|c| {
                if by_rank {
                    !self.is_rank_busy(c.key)
                } else {
                    !self.is_worker_busy(c.key.worker_id)
                }
            });
            if out.is_empty() {
                return Err(RouteError::Overloaded);
            }
        }
        Ok(out)
    }

    /// Device and tier overlap per candidate, or `None` when the decision does not use it.
    fn overlap(
        &mut self,
        prepared: &PreparedRequest,
        eff: &EffectiveKv,
        primary: Option<OverlapScores>,
        now: Duration,
    ) -> Option<OverlapScores> {
        if self.config.mode != RouterMode::Kv
            || !eff.queries_index()
            || prepared.local_hashes.is_empty()
        {
            return None;
        }
        let mut scores = if let Some(approx) = self.approx.as_mut() {
            approx.find_matches_at(&prepared.local_hashes, now)
        } else if let Some(scores) = primary {
            scores
        } else if let Some(source) = &self.primary {
            source.find_matches(&self.model, &prepared.local_hashes)
        } else {
            OverlapScores::default()
        };
        if let Some(side) = self.side.as_mut() {
            let predicted = side.find_matches_at(&prepared.local_hashes, now);
            scores.max_device_with(&predicted);
        }
        Some(scores)
    }

    /// Whether every candidate's active prefill exceeds `queue_threshold · mnbt` (a candidate
    /// without mnbt, or with prefill tracking off, is never full).
    fn all_full(&self, candidates: &[Candidate]) -> bool {
        let Some(threshold) = self.config.queue_threshold else {
            return false;
        };
        if !self.config.kv.track_prefill_tokens {
            return false;
        }
        candidates.iter().all(|c| {
            let mnbt = self
                .workers
                .get(&c.key.worker_id)
                .and_then(|w| w.runtime)
                .and_then(|r| r.max_num_batched_tokens);
            mnbt.is_some_and(|mnbt| {
                self.tracker.prefill_tokens(c.key) as f64 > threshold * mnbt as f64
            })
        })
    }
}
