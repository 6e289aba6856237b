//! The property test: random interleavings of requests over every routing mode with
//! random terminal paths (done, error, cancel, disconnect, migration). Afterwards every worker's
//! tracked blocks, prefill tokens and in-flight counts are zero — on the router and on a replica
//! fed its sync events — and with identical idle workers no worker receives more than 1.25× its
//! share of requests. Each holds with the adaptive weights (`--router-kv-weights auto`) too.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ValueEnum;
use kvmesh_routing::{
    BusyThresholds, Decision, KvWeightsMode, RankLoadSnapshot, Rng, RouteOutcome, RouteRequest,
    RouterConfig, RouterCore, RouterMode, RoutingHints, RuntimeConfig, SessionAffinityMode,
    TerminalPath, Ticket, WorkerInfo, WorkerLoad,
};
use proptest::prelude::*;

/// Every routing mode (a new one is covered without editing this test).
fn modes() -> &'static [RouterMode] {
    RouterMode::value_variants()
}

#[derive(Debug, Clone)]
struct Knobs {
    mode: RouterMode,
    workers: u64,
    ranks: u32,
    output_blocks: bool,
    no_kv_reuse: bool,
    queue: bool,
    sessions: Option<SessionAffinityMode>,
    busy: bool,
    approx: bool,
    predicted: bool,
    temperature: bool,
    shared_prefixes: bool,
    pins: bool,
    /// Failing workers ejected (the default); requests end by random paths, failures included.
    ejection: bool,
    /// `--router-kv-weights auto`: the weights are learned while requests run.
    adaptive: bool,
}

impl Knobs {
    fn from_bits(mode: usize, workers: u64, bits: &[bool]) -> Self {
        Self {
            mode: modes()[mode],
            workers,
            ranks: if bits[0] { 2 } else { 1 },
            output_blocks: bits[1],
            no_kv_reuse: bits[2],
            queue: bits[3],
            sessions: match (bits[4], bits[5]) {
                (false, _) => None,
                (true, false) => Some(SessionAffinityMode::Hard),
                (true, true) => Some(SessionAffinityMode::Soft),
            },
            busy: bits[6],
            approx: bits[7],
            predicted: bits[8] && !bits[7],
            temperature: bits[9],
            shared_prefixes: bits[10],
            pins: bits[11],
            ejection: true,
            adaptive: bits[12],
        }
    }

    /// Identical idle workers and independent requests: the balance scenario. Requests end by
    /// random paths, worker failures among them, which would eject healthy workers at random:
    /// ejection is off here (its own tests are in `faults.rs`).
    fn balanced(mode: usize, workers: u64, adaptive: bool) -> Self {
        Self {
            ejection: false,
            adaptive,
            ..Self::from_bits(mode, workers, &[false; 13])
        }
    }

    fn config(&self) -> RouterConfig {
        let mut config = RouterConfig::with_mode(self.mode);
        config.replica_sync = true;
        config.kv.track_output_blocks = self.output_blocks;
        config.kv.assume_kv_reuse = !self.no_kv_reuse;
        config.kv.use_kv_events = !self.approx;
        config.kv.predicted_ttl = self.predicted.then(|| Duration::from_secs(5));
        config.kv.temperature = if self.temperature { 0.5 } else { 0.0 };
        config.queue_threshold = self.queue.then_some(1.0);
        config.session_affinity_ttl = self.sessions.map(|_| Duration::from_secs(10));
        config.session_affinity_mode = self.sessions.unwrap_or_default();
        if self.adaptive {
            config.kv.weights = KvWeightsMode::Auto;
        }
        if !self.ejection {
            config.ejection.consecutive_failures = 0;
        }
        if self.busy {
            config.busy = BusyThresholds {
                active_decode_blocks_threshold: Some(0.9),
                active_prefill_tokens_threshold: Some(400),
                active_prefill_tokens_threshold_frac: None,
            };
        }
        config
    }
}

fn make_core(knobs: &Knobs, seed: u64, router_id: &str) -> RouterCore {
    let mut core = RouterCore::new(knobs.config(), "m", 4, seed)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_router_id(router_id);
    for id in 1..=knobs.workers {
        let info = WorkerInfo::new(id).with_runtime(RuntimeConfig {
            total_kv_blocks: Some(200),
            max_num_batched_tokens: Some(256),
            data_parallel_start_rank: 0,
            data_parallel_size: knobs.ranks,
        });
        core.upsert_worker(info, Duration::ZERO);
    }
    core
}

struct Sim {
    knobs: Knobs,
    rng: Rng,
    core: RouterCore,
    replica: RouterCore,
    now: Duration,
    /// Routed requests: id → prompt.
    active: BTreeMap<String, Vec<u32>>,
    parked: BTreeMap<Ticket, (String, Vec<u32>)>,
    prompts: BTreeMap<String, Vec<u32>>,
    per_worker: BTreeMap<u64, u64>,
    next_id: u64,
}

impl Sim {
    fn new(knobs: Knobs, seed: u64) -> Self {
        Self {
            core: make_core(&knobs, seed, "primary"),
            replica: make_core(&knobs, seed ^ 1, "replica"),
            rng: Rng::new(seed),
            knobs,
            now: Duration::ZERO,
            active: BTreeMap::new(),
            parked: BTreeMap::new(),
            prompts: BTreeMap::new(),
            per_worker: BTreeMap::new(),
            next_id: 0,
        }
    }

    fn prompt(&mut self) -> Vec<u32> {
        let len = 4 + self.rng.below(76);
        let mut tokens = Vec::with_capacity(len + 32);
        if self.knobs.shared_prefixes {
            let system = self.rng.below(3) as u32;
            tokens.extend((0..32).map(|i| system * 1000 + i));
        }
        tokens.extend((0..len).map(|_| self.rng.next_u64() as u32));
        tokens
    }

    fn hints(&mut self) -> RoutingHints {
        let mut hints = RoutingHints {
            priority: self.rng.below(5) as i32 - 1,
            strict_priority: u32::from(self.rng.below(10) == 0),
            ..RoutingHints::default()
        };
        if self.rng.below(3) == 0 {
            hints.expected_output_tokens = Some(1 + self.rng.below(40) as u32);
        }
        if self.knobs.sessions.is_some() && self.rng.below(2) == 0 {
            hints.session_id = Some(format!("s{}", self.rng.below(6)));
        }
        let pin =
            self.knobs.mode == RouterMode::Direct || (self.knobs.pins && self.rng.below(4) == 0);
        if pin {
            hints.backend_instance_id =
                Some(1 + self.rng.below(self.knobs.workers as usize + 1) as u64);
            if self.knobs.pins && self.rng.below(2) == 0 {
                hints.dp_rank = Some(self.rng.below(3) as u32);
            }
        }
        hints
    }

    fn arrive(&mut self, id: String, tokens: Vec<u32>, hints: RoutingHints) {
        let request = RouteRequest::new(id.clone(), &tokens).with_hints(hints);
        match self.core.route(&request, self.now) {
            Ok(RouteOutcome::Routed(decision)) => self.routed(decision, tokens),
            Ok(RouteOutcome::Queued(ticket)) => {
                self.parked.insert(ticket, (id, tokens));
            }
            Err(_) => {}
        }
    }

    fn routed(&mut self, decision: Decision, tokens: Vec<u32>) {
        *self.per_worker.entry(decision.worker_id).or_insert(0) += 1;
        self.active.insert(decision.request_id, tokens);
    }

    fn pick_active(&mut self) -> Option<String> {
        if self.active.is_empty() {
            return None;
        }
        let index = self.rng.below(self.active.len());
        self.active.keys().nth(index).cloned()
    }

    fn terminate(&mut self, id: String) {
        let path = TerminalPath::ALL[self.rng.below(TerminalPath::ALL.len())];
        let Some(mut tokens) = self.active.remove(&id) else {
            return;
        };
        self.core.free(&id, path, self.now);
        if path == TerminalPath::Migrated && self.rng.below(3) > 0 {
            // The frontend routes the request again with what was generated appended.
            tokens.extend((0..1 + self.rng.below(8)).map(|_| self.rng.next_u64() as u32));
            let hints = self.hints();
            self.arrive(format!("{id}~m"), tokens, hints);
        }
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(self.rng.below(20) as u64);
        match self.rng.below(100) {
            0..45 => {
                let id = format!("r{}", self.next_id);
                self.next_id += 1;
                let tokens = self.prompt();
                let hints = self.hints();
                self.prompts.insert(id.clone(), tokens.clone());
                self.arrive(id, tokens, hints);
            }
            45..65 => {
                if let Some(id) = self.pick_active() {
                    let n = 1 + self.rng.below(20) as u64;
                    self.core.add_output_tokens(&id, n, self.now);
                }
            }
            65..96 => {
                if let Some(id) = self.pick_active() {
                    self.terminate(id);
                }
            }
            96..98 => {
                if !self.parked.is_empty() {
                    let index = self.rng.below(self.parked.len());
                    if let Some(&ticket) = self.parked.keys().nth(index) {
                        self.core.cancel_queued(ticket);
                        self.parked.remove(&ticket);
                    }
                }
            }
            _ => {
                let worker = 1 + self.rng.below(self.knobs.workers as usize) as u64;
                let load = WorkerLoad {
                    worker: kvmesh_kv::WorkerKey::new(worker, 0),
                    kv_used_blocks: self.rng.below(200) as u64,
                    kv_total_blocks: 200,
                    ..WorkerLoad::default()
                };
                self.core.update_load(load, self.now);
            }
        }
        self.collect();
    }

    /// Takes parked requests that left the queue and forwards sync events to the replica.
    fn collect(&mut self) {
        for dispatched in self.core.take_dispatched() {
            let Some((id, tokens)) = self.parked.remove(&dispatched.ticket) else {
                panic!("dispatched an unknown ticket: {dispatched:?}");
            };
            if let Ok(decision) = dispatched.result {
                assert_eq!(decision.request_id, id);
                self.routed(decision, tokens);
            }
        }
        for event in self.core.take_sync_events() {
            self.replica.apply_sync_event(&event, self.now);
        }
    }

    /// Ends everything still running, by random paths, until nothing is tracked or parked.
    fn finish(&mut self) {
        for _ in 0..100_000 {
            self.now += Duration::from_millis(1);
            match self.pick_active() {
                Some(id) => self.terminate(id),
                None if self.parked.is_empty() => break,
                None => self.core.tick(self.now),
            }
            self.collect();
        }
        assert!(
            self.active.is_empty() && self.parked.is_empty(),
            "requests left behind"
        );
    }

    fn assert_idle(&self) {
        for core in [&self.core, &self.replica] {
            assert_eq!(core.num_tracked(), 0, "{}", core.router_id());
            assert_eq!(core.queue_len(), 0);
            for worker in 1..=self.knobs.workers {
                assert_eq!(core.inflight(worker), 0, "worker {worker} in flight");
                for rank in 0..self.knobs.ranks {
                    let key = kvmesh_kv::WorkerKey::new(worker, rank);
                    assert_eq!(core.load(key), RankLoadSnapshot::default(), "{key:?}");
                }
            }
            for key in core.tracked_ranks() {
                assert_eq!(core.load(key), RankLoadSnapshot::default(), "{key:?}");
            }
        }
    }

    fn assert_balanced(&self) {
        let total: u64 = self.per_worker.values().sum();
        let share = total as f64 / self.knobs.workers as f64;
        let max = self.per_worker.values().copied().max().unwrap_or(0);
        assert!(
            max as f64 <= 1.25 * share,
            "{:?}: max {max} > 1.25 × share {share:.1} ({:?})",
            self.knobs.mode,
            self.per_worker
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_terminal_path_releases_all_load(
        mode in 0..modes().len(),
        workers in 1u64..=5,
        bits in proptest::collection::vec(any::<bool>(), 13),
        seed in any::<u64>(),
        steps in 200usize..1500,
    ) {
        let mut sim = Sim::new(Knobs::from_bits(mode, workers, &bits), seed);
        for _ in 0..steps {
            sim.step();
        }
        sim.finish();
        sim.assert_idle();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn identical_idle_workers_share_requests_evenly(workers in 2u64..=6, seed in any::<u64>()) {
        for (mode, adaptive) in (0..modes().len()).flat_map(|m| [(m, false), (m, true)]) {
            let mut sim = Sim::new(Knobs::balanced(mode, workers, adaptive), seed);
            while sim.next_id < 400 * workers {
                sim.step();
            }
            sim.finish();
            sim.assert_idle();
            sim.assert_balanced();
        }
    }
}

#[test]
fn equal_seeds_give_equal_decisions() {
    for mode in 0..modes().len() {
        let knobs = Knobs::from_bits(mode, 4, &[true; 13]);
        let run = |seed| {
            let mut sim = Sim::new(knobs.clone(), seed);
            for _ in 0..1500 {
                sim.step();
            }
            (
                sim.per_worker.clone(),
                sim.active.keys().cloned().collect::<Vec<_>>(),
            )
        };
        assert_eq!(run(42), run(42), "{:?}", knobs.mode);
    }
}
