//! Deterministic virtual-time driver (docs/mocker.md, "Virtual time"): one integer-microsecond
//! clock, K engines, and a discrete-event loop that reports each pass's tokens, KV events and load
//! at the pass's end time, before anything later happens.
//!
//! Events are ordered by `(time, kind, worker index, arrival index)` with kinds in the order pass
//! end, arrival, pass start: an arrival at the instant a pass ends sees that pass's events, and a
//! worker that becomes busy at an instant batches every request arriving at that instant. Nothing
//! iterates a hash map, so the same inputs give bit-identical results on any machine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::timing::pass_duration_us;
use super::types::{
    EngineRequest, FinishKind, KvCacheEvent, LoadSnapshot, StepOutput, TokenOutput,
};
use super::{DpEngine, EngineConfig};

const KIND_PASS_END: u8 = 0;
const KIND_ARRIVAL: u8 = 1;
const KIND_PASS_START: u8 = 2;

/// Speedup ratios of the timing model (`--speedup-ratio`, `--decode-speedup-ratio`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Divides every pass duration; 0 makes passes instantaneous.
    pub speedup_ratio: f64,
    /// Further divides the decode term; 0 drops it.
    pub decode_speedup_ratio: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            speedup_ratio: 1.0,
            decode_speedup_ratio: 1.0,
        }
    }
}

/// Something a worker reported at the end of a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum SimEvent {
    /// A generated token or a finish.
    Token {
        /// End time of the pass, in µs.
        at_us: u64,
        /// Worker index.
        worker: usize,
        /// The output.
        output: TokenOutput,
    },
    /// The pass's KV events, in order (only when there are some).
    KvEvents {
        /// End time of the pass, in µs.
        at_us: u64,
        /// Worker index.
        worker: usize,
        /// The events.
        events: Vec<KvCacheEvent>,
    },
    /// The worker's load after the pass (after every pass).
    Load {
        /// End time of the pass, in µs.
        at_us: u64,
        /// Worker index.
        worker: usize,
        /// The load.
        snapshot: LoadSnapshot,
    },
}

/// What a benchmark needs to know about one request after a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The request's key.
    pub key: u64,
    /// The request's id.
    pub request_id: String,
    /// Worker index it ran on.
    pub worker: usize,
    /// When it arrived, in µs.
    pub arrival_us: u64,
    /// When its first token was reported, in µs.
    pub first_token_us: Option<u64>,
    /// When its finish was reported, in µs.
    pub finish_us: Option<u64>,
    /// Prompt tokens found cached at admission.
    pub cached_tokens: u32,
    /// Tokens it produced.
    pub num_output_tokens: u32,
    /// Tokens after its first that came out of a pass which also prefilled a prompt: decode
    /// steps that a prefill in the same pass lengthened (what moves its inter-token latency).
    pub num_steps_beside_prefill: u32,
    /// How it ended; `None` while unfinished.
    pub finish: Option<FinishKind>,
}

/// The state a router may look at when it places a request: the clock and each worker's load as
/// last reported (at its latest pass end), not the engines' live internals.
#[derive(Debug, Clone, Copy)]
pub struct SimView<'a> {
    now_us: u64,
    loads: &'a [LoadSnapshot],
}

impl SimView<'_> {
    /// Current virtual time, in µs.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Number of workers.
    pub fn num_workers(&self) -> usize {
        self.loads.len()
    }

    /// A worker's load as of its latest pass end (idle before its first pass).
    pub fn load(&self, worker: usize) -> Option<&LoadSnapshot> {
        self.loads.get(worker)
    }
}

/// A router and observer driven by [`Simulation::run_with`]: one object for both, so routing
/// decisions can depend on the KV events and loads it has observed.
pub trait SimHandler {
    /// Picks the worker index for `request` arriving now (taken modulo the number of workers).
    fn route(&mut self, view: &SimView<'_>, request: &EngineRequest) -> usize;
    /// Observes one reported event, in simulation order.
    fn on_event(&mut self, event: SimEvent);
}

struct FnHandler<R, E> {
    route: R,
    on_event: E,
}

impl<R, E> SimHandler for FnHandler<R, E>
where
    R: FnMut(&SimView<'_>, &EngineRequest) -> usize,
    E: FnMut(SimEvent),
{
    fn route(&mut self, view: &SimView<'_>, request: &EngineRequest) -> usize {
        (self.route)(view, request)
    }

    fn on_event(&mut self, event: SimEvent) {
        (self.on_event)(event)
    }
}

/// K mock engines sharing one virtual clock.
///
/// Exists for the routing benchmark and tests: it replays request streams against simulated
/// workers with the real engine core, without sleeping and with bit-identical results.
pub struct Simulation {
    engines: Vec<DpEngine>,
    config: SimConfig,
    now_us: u64,
    queue: BinaryHeap<Reverse<(u64, u8, usize, u64)>>,
    /// Requests given to [`Self::submit`], by arrival index (looked up, never iterated).
    submitted: HashMap<u64, (usize, EngineRequest)>,
    in_flight: Vec<Option<StepOutput>>,
    is_start_queued: Vec<bool>,
    reported: Vec<LoadSnapshot>,
    records: Vec<RequestRecord>,
    record_by_key: HashMap<u64, usize>,
    num_arrivals: u64,
}

impl Simulation {
    /// `num_workers` (at least 1) identical engines, each with dp rank 0.
    pub fn new(engine_config: EngineConfig, num_workers: usize, config: SimConfig) -> Self {
        let engines = (0..num_workers.max(1))
            .map(|_| DpEngine::new(engine_config.clone(), 0))
            .collect();
        Self::with_engines(engines, config)
    }

    /// Simulates the given engines (worker index = position); `None` when there are none.
    pub fn from_engines(engines: Vec<DpEngine>, config: SimConfig) -> Option<Self> {
        (!engines.is_empty()).then(|| Self::with_engines(engines, config))
    }

    fn with_engines(engines: Vec<DpEngine>, config: SimConfig) -> Self {
        let num_workers = engines.len();
        Self {
            reported: engines.iter().map(DpEngine::load).collect(),
            engines,
            config,
            now_us: 0,
            queue: BinaryHeap::new(),
            submitted: HashMap::new(),
            in_flight: (0..num_workers).map(|_| None).collect(),
            is_start_queued: vec![false; num_workers],
            records: Vec::new(),
            record_by_key: HashMap::new(),
            num_arrivals: 0,
        }
    }

    /// Current virtual time, in µs.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Number of workers.
    pub fn num_workers(&self) -> usize {
        self.engines.len()
    }

    /// A worker's engine, for inspection.
    pub fn engine(&self, worker: usize) -> Option<&DpEngine> {
        self.engines.get(worker)
    }

    /// One record per arrived request, in arrival order. Request keys must be unique.
    pub fn records(&self) -> &[RequestRecord] {
        &self.records
    }

    /// Schedules `request` to arrive at `at_us` (no earlier than now) on worker `worker` (taken
    /// modulo the number of workers).
    pub fn submit(&mut self, at_us: u64, worker: usize, request: EngineRequest) {
        let worker = worker % self.engines.len();
        let index = self.num_arrivals;
        self.num_arrivals += 1;
        self.submitted.insert(index, (worker, request));
        self.queue.push(Reverse((
            at_us.max(self.now_us),
            KIND_ARRIVAL,
            worker,
            index,
        )));
    }

    /// Runs submitted requests until every worker is idle.
    pub fn run_until_idle(&mut self, on_event: impl FnMut(SimEvent)) {
        let mut handler = FnHandler {
            route: |_: &SimView<'_>, _: &EngineRequest| 0,
            on_event,
        };
        self.drive(&mut std::iter::empty(), &mut handler);
    }

    /// Runs `arrivals` (sorted by time; an earlier time counts as now), placing each with `route`
    /// at its arrival time, together with submitted requests, until every worker is idle.
    pub fn run<I, R, E>(&mut self, arrivals: I, route: R, on_event: E)
    where
        I: IntoIterator<Item = (u64, EngineRequest)>,
        R: FnMut(&SimView<'_>, &EngineRequest) -> usize,
        E: FnMut(SimEvent),
    {
        let mut handler = FnHandler { route, on_event };
        self.drive(&mut arrivals.into_iter(), &mut handler);
    }

    /// [`Self::run`] with one handler that both routes and observes.
    pub fn run_with<I, H>(&mut self, arrivals: I, handler: &mut H)
    where
        I: IntoIterator<Item = (u64, EngineRequest)>,
        H: SimHandler,
    {
        self.drive(&mut arrivals.into_iter(), handler);
    }

    fn drive(
        &mut self,
        arrivals: &mut dyn Iterator<Item = (u64, EngineRequest)>,
        handler: &mut dyn SimHandler,
    ) {
        let mut next_arrival = arrivals.next();
        loop {
            let arrival_key = next_arrival.as_ref().map(|(at_us, _)| {
                (
                    (*at_us).max(self.now_us),
                    KIND_ARRIVAL,
                    0,
                    self.num_arrivals,
                )
            });
            let queued_key = self.queue.peek().map(|Reverse(key)| *key);
            let is_arrival_next = match (arrival_key, queued_key) {
                (Some(arrival), Some(queued)) => arrival < queued,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if is_arrival_next {
                let Some((at_us, request)) = next_arrival.take() else {
                    break;
                };
                next_arrival = arrivals.next();
                self.now_us = at_us.max(self.now_us);
                self.num_arrivals += 1;
                let view = SimView {
                    now_us: self.now_us,
                    loads: &self.reported,
                };
                let worker = handler.route(&view, &request) % self.engines.len();
                self.arrive(worker, request);
                continue;
            }
            let Some(Reverse((at_us, kind, worker, index))) = self.queue.pop() else {
                break;
            };
            self.now_us = at_us;
            match kind {
                KIND_PASS_END => self.end_pass(worker, handler),
                KIND_ARRIVAL => {
                    if let Some((worker, request)) = self.submitted.remove(&index) {
                        self.arrive(worker, request);
                    }
                }
                _ => self.start_pass(worker),
            }
        }
    }

    fn arrive(&mut self, worker: usize, request: EngineRequest) {
        self.record_by_key.insert(request.key, self.records.len());
        self.records.push(RequestRecord {
            key: request.key,
            request_id: request.request_id.clone(),
            worker,
            arrival_us: self.now_us,
            first_token_us: None,
            finish_us: None,
            cached_tokens: 0,
            num_output_tokens: 0,
            num_steps_beside_prefill: 0,
            finish: None,
        });
        self.engines[worker].add_request(request);
        self.wake(worker);
    }

    /// Queues a pass start now if the worker is idle and has work.
    fn wake(&mut self, worker: usize) {
        if self.in_flight[worker].is_none()
            && !self.is_start_queued[worker]
            && self.engines[worker].has_work()
        {
            self.is_start_queued[worker] = true;
            self.queue
                .push(Reverse((self.now_us, KIND_PASS_START, worker, 0)));
        }
    }

    fn start_pass(&mut self, worker: usize) {
        self.is_start_queued[worker] = false;
        if self.in_flight[worker].is_some() || !self.engines[worker].has_work() {
            return;
        }
        let output = self.engines[worker].step();
        let duration_us = pass_duration_us(
            output.prefill_ms,
            output.decode_ms,
            self.config.speedup_ratio,
            self.config.decode_speedup_ratio,
        );
        self.in_flight[worker] = Some(output);
        self.queue.push(Reverse((
            self.now_us + duration_us,
            KIND_PASS_END,
            worker,
            0,
        )));
    }

    fn end_pass(&mut self, worker: usize, handler: &mut dyn SimHandler) {
        let Some(output) = self.in_flight[worker].take() else {
            return;
        };
        let at_us = self.now_us;
        let prefilled = output.num_prefill_tokens > 0;
        for token in output.outputs {
            if let Some(record) = self
                .record_by_key
                .get(&token.key)
                .and_then(|&index| self.records.get_mut(index))
            {
                if !matches!(token.finish, Some(FinishKind::Error(_))) {
                    record.num_output_tokens += 1;
                    if prefilled && !token.is_first {
                        record.num_steps_beside_prefill += 1;
                    }
                }
                if token.is_first {
                    record.first_token_us = Some(at_us);
                    record.cached_tokens = token.cached_tokens;
                }
                if token.finish.is_some() {
                    record.finish_us = Some(at_us);
                    record.finish = token.finish.clone();
                }
            }
            handler.on_event(SimEvent::Token {
                at_us,
                worker,
                output: token,
            });
        }
        if !output.kv_events.is_empty() {
            handler.on_event(SimEvent::KvEvents {
                at_us,
                worker,
                events: output.kv_events,
            });
        }
        let snapshot = self.engines[worker].load();
        self.reported[worker] = snapshot;
        handler.on_event(SimEvent::Load {
            at_us,
            worker,
            snapshot,
        });
        self.wake(worker);
    }
}

#[cfg(test)]
mod tests;
