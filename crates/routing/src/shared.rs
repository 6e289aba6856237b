//! The routing core for concurrent callers: a lock, a clock, async waiting for queued requests,
//! and a guard that releases a request's load on every terminal path.
//!
//! Hashing and the event-fed index query run before the lock is taken; only filtering, scoring,
//! selection and tracking run under it. A [`RouteGuard`] frees its request when it is finished
//! explicitly ([`RouteGuard::finish`]) or simply dropped — a client disconnect that drops the
//! response stream, a panic unwinding through the handler, an early `?` — so no path can leave
//! load behind. Values that may hold guards are never dropped while the lock is held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use kvmesh_kv::OverlapScores;
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::config::{BusyThresholds, KvRouterConfig, RouterMode};
use crate::core::{PreparedRequest, RouterCore};
use crate::cost::EffectiveKv;
use crate::error::RouteError;
use crate::overlap::OverlapSource;
use crate::request::{Decision, RouteOutcome, RouteRequest, TerminalPath, Ticket};
use crate::sync::SyncEvent;
use crate::worker::{WorkerInfo, WorkerLoad};
use kvmesh_kv::BlockHashCache;

mod guard;
pub use guard::{QueuedRoute, RouteGuard};

type Waiter = oneshot::Sender<Result<RouteGuard, RouteError>>;

struct State {
    core: RouterCore,
    waiters: HashMap<Ticket, Waiter>,
}

struct Inner {
    state: Mutex<State>,
    sync_sink: OnceLock<mpsc::Sender<SyncEvent>>,
    sync_dropped: AtomicU64,
    clock: Arc<dyn Clock>,
    model: String,
    mode: RouterMode,
    block_size: u32,
    kv: KvRouterConfig,
    source: Option<Arc<dyn OverlapSource>>,
    /// Block hashes of prompt prefixes (kv mode with a cache bound).
    hash_cache: Option<BlockHashCache>,
}

/// A [`RouterCore`] shared by concurrent requests (see the module docs). Cloning is cheap.
#[derive(Clone)]
pub struct SharedRouter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRouter")
            .field("model", &self.inner.model)
            .field("mode", &self.inner.mode)
            .finish()
    }
}

/// A routed request or a place in the queue.
#[derive(Debug)]
pub enum Admission {
    /// Routed now.
    Routed(RouteGuard),
    /// Parked; await it for the decision.
    Queued(QueuedRoute),
}

impl SharedRouter {
    /// Shares `core`, reading time from `clock`.
    pub fn new(core: RouterCore, clock: Arc<dyn Clock>) -> Self {
        let config = core.config().clone();
        let inner = Inner {
            model: core.model().to_string(),
            mode: config.mode,
            block_size: core.block_size(),
            hash_cache: (config.mode == RouterMode::Kv && config.kv.block_hash_cache_bytes > 0)
                .then(|| BlockHashCache::new(config.kv.block_hash_cache_bytes)),
            kv: config.kv,
            source: core.overlap_source().cloned(),
            clock,
            sync_sink: OnceLock::new(),
            sync_dropped: AtomicU64::new(0),
            state: Mutex::new(State {
                core,
                waiters: HashMap::new(),
            }),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The router's current time.
    pub fn now(&self) -> Duration {
        self.inner.clock.now()
    }

    /// Routes a request, waiting in the queue if it parks. Dropping the future while it waits
    /// removes the request from the queue.
    pub async fn route(&self, request: &RouteRequest<'_>) -> Result<RouteGuard, RouteError> {
        match self.try_route(request)? {
            Admission::Routed(guard) => Ok(guard),
            Admission::Queued(queued) => queued.await,
        }
    }

    /// Routes a request without waiting: a guard, or a queue place to await.
    pub fn try_route(&self, request: &RouteRequest<'_>) -> Result<Admission, RouteError> {
        let prepared = self.prepare(request);
        self.try_route_prepared(prepared, None)
    }

    /// Hashes a request as this router's mode needs (only `kv` mode hashes), reusing the hashes
    /// of a prompt prefix seen before; the router's lock is not taken.
    pub fn prepare(&self, request: &RouteRequest<'_>) -> PreparedRequest {
        let inner = &self.inner;
        PreparedRequest::hashed_with(
            request,
            inner.block_size,
            inner.mode == RouterMode::Kv,
            inner.hash_cache.as_ref(),
        )
    }

    /// Counters and size of the block-hash cache (`None` when there is none).
    pub fn hash_cache_stats(&self) -> Option<kvmesh_core::prefix::PrefixStats> {
        self.inner.hash_cache.as_ref().map(BlockHashCache::stats)
    }

    /// Whether a decision for `prepared` reads the event-fed index (kv mode, KV events on,
    /// overlap credit above zero after the request's override, a prompt of at least one block):
    /// callers with a remote index query it only then.
    pub fn needs_overlap(&self, prepared: &PreparedRequest) -> bool {
        let inner = &self.inner;
        inner.mode == RouterMode::Kv
            && inner.kv.use_kv_events
            && !prepared.local_hashes.is_empty()
            && EffectiveKv::new(&inner.kv, prepared.hints.config_override.as_ref()).queries_index()
    }

    /// Routes a prepared request, waiting in the queue if it parks. `primary` is the overlap the
    /// caller read from a remote index; `None` queries the attached source (if any).
    pub async fn route_prepared(
        &self,
        prepared: PreparedRequest,
        primary: Option<OverlapScores>,
    ) -> Result<RouteGuard, RouteError> {
        match self.try_route_prepared(prepared, primary)? {
            Admission::Routed(guard) => Ok(guard),
            Admission::Queued(queued) => queued.await,
        }
    }

    /// Routes a prepared request without waiting (see [`Self::route_prepared`]).
    pub fn try_route_prepared(
        &self,
        prepared: PreparedRequest,
        primary: Option<OverlapScores>,
    ) -> Result<Admission, RouteError> {
        let primary = primary.or_else(|| self.query_primary(&prepared));
        let (result, undelivered) =
            self.locked(
                |state, now| match state.core.route_prepared(prepared, primary, now)? {
                    RouteOutcome::Routed(decision) => Ok(Admission::Routed(self.guard(decision))),
                    RouteOutcome::Queued(ticket) => {
                        let (tx, rx) = oneshot::channel();
                        state.waiters.insert(ticket, tx);
                        Ok(Admission::Queued(QueuedRoute {
                            router: self.clone(),
                            ticket,
                            rx,
                            is_done: false,
                        }))
                    }
                },
            );
        drop(undelivered);
        result
    }

    /// Runs `f` on the core at the current time, then hands out any requests that left the
    /// queue. For discovery, load and sync updates and for introspection.
    pub fn with_core<R>(&self, f: impl FnOnce(&mut RouterCore, Duration) -> R) -> R {
        let (result, undelivered) = self.locked(|state, now| f(&mut state.core, now));
        drop(undelivered);
        result
    }

    /// Adds or replaces a discovered worker.
    pub fn upsert_worker(&self, info: WorkerInfo) {
        self.with_core(|core, now| core.upsert_worker(info, now));
    }

    /// Forgets a worker that left discovery.
    pub fn remove_worker(&self, worker_id: u64) {
        self.with_core(|core, now| core.remove_worker(worker_id, now));
    }

    /// Records load a rank published.
    pub fn update_load(&self, load: WorkerLoad) {
        self.with_core(|core, now| core.update_load(load, now));
    }

    /// Applies a replica's tracker change.
    pub fn apply_sync_event(&self, event: &SyncEvent) {
        self.with_core(|core, now| core.apply_sync_event(event, now));
    }

    /// Tracker changes to publish since the last call (only without a sync sink: once one is
    /// attached every change goes to it as it happens).
    pub fn take_sync_events(&self) -> Vec<SyncEvent> {
        self.with_core(|core, _| core.take_sync_events())
    }

    /// Sends every later tracker change to a channel as it happens (replica sync publishes from
    /// it). At most one sink; `None` when one is already attached. Changes that do not fit in the
    /// channel are dropped and counted ([`Self::num_sync_dropped`]): sync is best effort and
    /// replicas heal lost events by expiry.
    pub fn attach_sync_sink(&self, capacity: usize) -> Option<mpsc::Receiver<SyncEvent>> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.inner.sync_sink.set(tx).ok()?;
        Some(rx)
    }

    /// Publishes a change made on behalf of another replica (a request it routed, reported
    /// here because it is gone), through the attached sink.
    pub fn publish_sync(&self, event: SyncEvent) {
        self.send_sync(std::iter::once(event));
    }

    /// Tracker changes dropped because the sync channel was full.
    pub fn num_sync_dropped(&self) -> u64 {
        self.inner.sync_dropped.load(Ordering::Relaxed)
    }

    /// The id this router signs its sync events with.
    pub fn router_id(&self) -> String {
        self.with_core(|core, _| core.router_id().to_string())
    }

    /// The model this router routes.
    pub fn model(&self) -> &str {
        &self.inner.model
    }

    fn send_sync(&self, events: impl IntoIterator<Item = SyncEvent>) {
        let Some(sink) = self.inner.sync_sink.get() else {
            return;
        };
        for event in events {
            if sink.try_send(event).is_err() {
                self.inner.sync_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The busy thresholds in force (`GET /busy_threshold`).
    pub fn busy_thresholds(&self) -> BusyThresholds {
        self.with_core(|core, _| core.busy_thresholds())
    }

    /// Replaces the busy thresholds (`POST /busy_threshold`).
    pub fn set_busy_thresholds(&self, thresholds: BusyThresholds) {
        self.with_core(|core, _| core.set_busy_thresholds(thresholds));
    }

    /// Expires stale requests and releases parked ones; call periodically (every few seconds).
    pub fn tick(&self) {
        self.with_core(|core, now| core.tick(now));
    }

    /// Whether the router has its minimum of workers.
    pub fn is_ready(&self) -> bool {
        self.with_core(|core, _| core.is_ready())
    }

    /// Parked requests.
    pub fn queue_len(&self) -> usize {
        self.with_core(|core, _| core.queue_len())
    }

    /// Marks a request's first token, for callers that track a request by id (gRPC `Route`
    /// callers reporting its life) rather than through a guard.
    pub fn mark_prefill_done(&self, request_id: &str) {
        self.with_core(|core, now| core.mark_prefill_done(request_id, now));
    }

    /// Adds generated tokens of a request tracked by id.
    pub fn add_output_tokens(&self, request_id: &str, num_tokens: u64) {
        self.with_core(|core, now| core.add_output_tokens(request_id, num_tokens, now));
    }

    /// Whether output tokens after the first change this router's state
    /// (`--router-track-output-blocks`); callers skip reporting them otherwise, which saves a lock
    /// per streamed token.
    pub fn tracks_output_tokens(&self) -> bool {
        self.inner.kv.track_output_blocks
    }

    /// Frees a request tracked by id. Returns whether it was still tracked.
    pub fn free(&self, request_id: &str, path: TerminalPath) -> bool {
        self.with_core(|core, now| core.free(request_id, path, now))
    }

    fn guard(&self, decision: Decision) -> RouteGuard {
        RouteGuard {
            router: self.clone(),
            decision,
            is_armed: true,
            hash_time: Duration::ZERO,
        }
    }

    fn query_primary(&self, prepared: &PreparedRequest) -> Option<OverlapScores> {
        let inner = &self.inner;
        let source = inner.source.as_ref()?;
        if inner.mode != RouterMode::Kv
            || !inner.kv.use_kv_events
            || prepared.local_hashes.is_empty()
        {
            return None;
        }
        let eff = EffectiveKv::new(&inner.kv, prepared.hints.config_override.as_ref());
        eff.queries_index()
            .then(|| source.find_matches(&inner.model, &prepared.local_hashes))
    }

    /// Runs `f` under the lock, then delivers dispatched requests to their waiters. Guards that
    /// could not be delivered (the waiter left) are returned so the caller drops them after the
    /// lock is released, which frees them.
    fn locked<R>(&self, f: impl FnOnce(&mut State, Duration) -> R) -> (R, Vec<RouteGuard>) {
        let mut state = self.lock();
        let now = self.inner.clock.now();
        let result = f(&mut state, now);
        if self.inner.sync_sink.get().is_some() {
            let events = state.core.take_sync_events();
            self.send_sync(events);
        }
        let mut undelivered = Vec::new();
        for dispatched in state.core.take_dispatched() {
            let waiter = state.waiters.remove(&dispatched.ticket);
            let value = dispatched.result.map(|decision| self.guard(decision));
            match waiter {
                Some(tx) => {
                    if let Err(Ok(guard)) = tx.send(value) {
                        undelivered.push(guard);
                    }
                }
                None => undelivered.extend(value.ok()),
            }
        }
        drop(state);
        (result, undelivered)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn release(&self, request_id: &str, path: TerminalPath) {
        self.free(request_id, path);
    }

    fn cancel(&self, ticket: Ticket) {
        let mut state = self.lock();
        state.core.cancel_queued(ticket);
        let waiter = state.waiters.remove(&ticket);
        drop(state);
        drop(waiter);
    }
}

#[cfg(test)]
#[path = "shared_tests.rs"]
mod tests;
