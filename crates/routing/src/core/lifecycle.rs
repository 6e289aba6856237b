//! A routed request's life after the decision (first token, output, end, expiry) and the
//! replica-sync events that mirror it (docs/routing.md, "Load tracking" and "Replica sync").

use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use super::{EXPIRY_SWEEP_INTERVAL, RouterCore};
use crate::request::{Dispatched, TerminalPath, Ticket};
use crate::sync::{SyncEvent, SyncKind};
use crate::tracker::{ActiveRequest, ReqKey, TrackAdd};

impl RouterCore {
    /// The first token of a request arrived: its prefill load is released.
    pub fn mark_prefill_done(&mut self, request_id: &str, now: Duration) -> bool {
        let key = self.key(request_id);
        self.observe_first_token(&key, now);
        if !self.tracker.mark_prefill_done(&key) {
            return false;
        }
        if let Some(request) = self.tracker.get(&key) {
            let worker = request.worker;
            // The worker produced: it is healthy (a probe readmits it).
            self.note_health(worker.worker_id, &key, TerminalPath::Completed, now);
            self.emit(&key, worker, SyncKind::MarkPrefillCompleted);
        }
        self.drain_queue(now);
        true
    }

    /// A request produced `num_tokens` more tokens (the first also marks prefill done); with
    /// `--router-track-output-blocks` its tracked blocks grow.
    pub fn add_output_tokens(&mut self, request_id: &str, num_tokens: u64, now: Duration) {
        self.mark_prefill_done(request_id, now);
        let key = self.key(request_id);
        self.tracker.add_output_tokens(
            &key,
            num_tokens,
            self.block_size,
            self.config.kv.track_output_blocks,
            &mut self.rng,
        );
    }

    /// A routed request ended by `path`: everything it holds is released. Returns whether it was
    /// still tracked (false after expiry, a departed worker, or a second call).
    pub fn free(&mut self, request_id: &str, path: TerminalPath, now: Duration) -> bool {
        let key = self.key(request_id);
        if let Some(adaptive) = self.adaptive.as_mut() {
            match path {
                TerminalPath::Completed => adaptive.on_completed(&key, now),
                _ => adaptive.forget(&key),
            }
        }
        let Some(request) = self.tracker.free(&key) else {
            return false;
        };
        self.note_health(request.worker.worker_id, &key, path, now);
        self.release_session(&key, &request, path, now);
        self.emit(&key, request.worker, SyncKind::Free { path });
        self.drain_queue(now);
        true
    }

    /// Removes a parked request (its client went away). Returns whether it was still parked.
    pub fn cancel_queued(&mut self, ticket: Ticket) -> bool {
        self.queue.remove(ticket).is_some()
    }

    /// Moves time forward: expires stale requests and bindings when a sweep is due, and lets
    /// parked requests go if capacity allows. Routing calls it too; a service also calls it
    /// periodically so an idle router still expires.
    pub fn tick(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
        if now >= self.next_sweep {
            self.next_sweep = now + EXPIRY_SWEEP_INTERVAL;
            let cutoff = now.saturating_sub(self.config.kv.active_request_expiry);
            let expiry = self.config.kv.active_request_expiry;
            if let Some(adaptive) = self.adaptive.as_mut() {
                adaptive.expire(cutoff);
            }
            if now >= expiry {
                for (key, request) in self.tracker.expire(cutoff) {
                    tracing::warn!(request_id = %key.1, worker_id = request.worker.worker_id, "freeing stale tracked request");
                    self.note_health(request.worker.worker_id, &key, TerminalPath::Expired, now);
                    self.release_session(&key, &request, TerminalPath::Expired, now);
                    let path = TerminalPath::Expired;
                    self.emit(&key, request.worker, SyncKind::Free { path });
                }
            }
            self.sessions.sweep(now);
        }
        self.drain_queue(now);
    }

    /// Parked requests that left the queue since the last call (routed and tracked, or failed).
    pub fn take_dispatched(&mut self) -> Vec<Dispatched> {
        std::mem::take(&mut self.dispatched)
    }

    /// Tracker changes to publish to replicas since the last call (empty without replica sync).
    pub fn take_sync_events(&mut self) -> Vec<SyncEvent> {
        std::mem::take(&mut self.sync_out)
    }

    /// Applies a replica's tracker change (its own events and unknown workers are ignored, except
    /// a report about one of its own requests that another replica passed on).
    pub fn apply_sync_event(&mut self, event: &SyncEvent, now: Duration) {
        if event.router_id == *self.router_id {
            let forwarded = event
                .forwarded_by
                .as_deref()
                .is_some_and(|by| by != &*self.router_id);
            if forwarded {
                match event.kind {
                    SyncKind::Free { path } => {
                        self.free(&event.request_id, path, now);
                    }
                    SyncKind::MarkPrefillCompleted => {
                        self.mark_prefill_done(&event.request_id, now);
                    }
                    SyncKind::Add { .. } | SyncKind::SessionBind { .. } => {}
                }
            }
            return;
        }
        let known = self
            .workers
            .get(&event.worker.worker_id)
            .is_some_and(|w| w.ranks().contains(&event.worker.dp_rank));
        let key: ReqKey = (
            Arc::from(event.router_id.as_str()),
            event.request_id.clone(),
        );
        match &event.kind {
            SyncKind::Add {
                token_sequence_hashes,
                track_prefill_tokens,
                initial_prefill_tokens,
                ..
            } if known => {
                let prefill = if *track_prefill_tokens {
                    initial_prefill_tokens.unwrap_or(0)
                } else {
                    0
                };
                let cache = self.cache_shares(event.worker);
                if let Some(adaptive) = self.adaptive.as_mut() {
                    let observed = (
                        self.tracker.prefill_tokens(event.worker),
                        initial_prefill_tokens.unwrap_or(0),
                        self.tracker.active_blocks(event.worker),
                        self.tracker.requests_on(event.worker),
                    );
                    adaptive.on_routed(
                        key.clone(),
                        event.worker,
                        now,
                        self.block_size,
                        observed,
                        cache,
                    );
                }
                self.tracker.add(
                    key,
                    TrackAdd {
                        worker: event.worker,
                        hashes: token_sequence_hashes.clone(),
                        prefill_tokens: prefill,
                        isl: 0,
                        osl: None,
                        started_at: now,
                        session: None,
                        owner: crate::sync::router_instance(&event.router_id),
                    },
                );
            }
            SyncKind::Add { .. } => {}
            SyncKind::MarkPrefillCompleted => {
                self.observe_first_token(&key, now);
                self.tracker.mark_prefill_done(&key);
            }
            SyncKind::Free { path } => {
                // The replica's end: replicas fit the same decode times as the router that
                // served the request, which fits only completed ones.
                if let Some(adaptive) = self.adaptive.as_mut() {
                    match path {
                        TerminalPath::Completed => adaptive.on_completed(&key, now),
                        _ => adaptive.forget(&key),
                    }
                }
                self.tracker.free(&key);
            }
            SyncKind::SessionBind { session_id } if known => {
                if let Some(ttl) = self.config.session_affinity_ttl {
                    let mode = self.config.session_affinity_mode;
                    self.sessions
                        .apply_remote(session_id, event.worker, mode, ttl, now);
                }
            }
            SyncKind::SessionBind { .. } => {}
        }
        self.drain_queue(now);
    }

    /// Frees every request whose reporter was the discovery instance `instance_id`, now gone: a
    /// frontend that routed through this replica, or a replica whose load this router mirrors
    /// (docs/routing.md, "Load tracking"). Returns how many were freed.
    pub fn release_instance(&mut self, instance_id: u64, now: Duration) -> usize {
        let freed = self.tracker.remove_owned_by(instance_id);
        let count = freed.len();
        for (key, request) in freed {
            self.release_session(&key, &request, TerminalPath::Disconnected, now);
            self.note_health(
                request.worker.worker_id,
                &key,
                TerminalPath::Disconnected,
                now,
            );
            let path = TerminalPath::Disconnected;
            self.emit(&key, request.worker, SyncKind::Free { path });
        }
        if count > 0 {
            tracing::info!(model = %self.model, instance_id = %format!("{instance_id:x}"), count, "released the routings of a departed instance");
            self.drain_queue(now);
        }
        count
    }

    /// Counts how `key`'s request on `worker_id` went for the worker's ejection state
    /// (docs/routing.md, "Ejection of failing workers").
    pub(crate) fn note_health(
        &mut self,
        worker_id: u64,
        key: &ReqKey,
        path: TerminalPath,
        now: Duration,
    ) {
        let change = match path {
            TerminalPath::Completed => self.health.succeeded(worker_id, key),
            path if path.is_worker_failure() => self.health.failed(worker_id, key, now),
            _ => {
                self.health.ended_neutral(worker_id, key, now);
                None
            }
        };
        match change {
            Some(crate::health::HealthChange::Ejected(backoff)) => {
                tracing::warn!(model = %self.model, worker_id = %format!("{worker_id:x}"), backoff_secs = backoff.as_secs_f64(), "worker ejected from routing after repeated failures");
            }
            Some(crate::health::HealthChange::Readmitted) => {
                tracing::info!(model = %self.model, worker_id = %format!("{worker_id:x}"), "worker readmitted to routing");
            }
            None => {}
        }
    }

    /// Feeds a first token to the weight learner; logs the weights when they move.
    fn observe_first_token(&mut self, key: &ReqKey, now: Duration) {
        let Some(adaptive) = self.adaptive.as_mut() else {
            return;
        };
        if let Some(weights) = adaptive.on_first_token(key, now) {
            tracing::info!(
                model = %self.model,
                overlap_score_credit = weights.overlap_score_credit,
                prefill_load_scale = weights.prefill_load_scale,
                decode_stall_weight = weights.decode_stall_weight,
                observations = weights.num_observations,
                "kv cost weights moved"
            );
        }
    }

    pub(crate) fn emit(&mut self, key: &ReqKey, worker: WorkerKey, kind: SyncKind) {
        if self.config.replica_sync && key.0 == self.router_id {
            self.sync_out.push(SyncEvent {
                router_id: self.router_id.to_string(),
                request_id: key.1.clone(),
                worker,
                kind,
                forwarded_by: None,
            });
        }
    }

    /// Releases a finished request's hold on its session; the binding is re-announced to
    /// replicas so their idle timers restart too.
    pub(crate) fn release_session(
        &mut self,
        key: &ReqKey,
        request: &ActiveRequest,
        path: TerminalPath,
        now: Duration,
    ) {
        let Some(hold) = &request.session else {
            return;
        };
        let is_current = self
            .sessions
            .live(&hold.id, now)
            .is_some_and(|binding| binding.generation == hold.generation);
        self.sessions.release(hold, now, path.drops_session());
        // Only the binding that still stands is announced again: re-announcing a dropped one
        // would make the replicas keep it until their TTL.
        if is_current && !path.drops_session() {
            let kind = SyncKind::SessionBind {
                session_id: hold.id.clone(),
            };
            self.emit(key, request.worker, kind);
        }
    }
}
