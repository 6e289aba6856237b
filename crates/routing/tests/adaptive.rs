//! The adaptive KV cost weights (`--router-kv-weights auto`) through the routing core: they
//! converge on the exchange rates of a workload whose time to first token is a known function of
//! the load, follow a change midway, two replicas fed each other's sync events end with the
//! same weights, and full caches in the event-fed index raise the credit.

#[path = "support/helpers.rs"]
mod helpers;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use helpers::{B, config, prompt, stored, worker};
use kvmesh_kv::{ConcurrentIndex, Tier, WorkerKey};
use kvmesh_routing::{
    DECODE_STALL_WEIGHT, LearnedWeights, Rng, RouteOutcome, RouteRequest, RouterCore, TerminalPath,
};

/// Time to first token as a function of the chosen rank's load at routing time, s per block.
#[derive(Debug, Clone, Copy)]
struct Truth {
    /// Per block of prefill already queued on the rank.
    queued: f64,
    /// Per block of the request's own uncached prompt.
    uncached: f64,
    /// Per active decode block on the rank.
    decode: f64,
}

impl Truth {
    /// The credit and scale that make the cost proportional to the time this TTFT costs the
    /// request and, through its own prefill, the `queued_behind` requests that wait behind it.
    fn optimum(&self, queued_behind: f64) -> (f64, f64) {
        (
            self.uncached / self.queued * (1.0 + queued_behind),
            self.queued / self.decode,
        )
    }
}

/// Queued prefill blocks over own prefill blocks, summed over the requests of the learner's
/// memory (about the last 2048): how many requests' prefill a request waits behind.
#[derive(Debug, Default)]
struct Queueing {
    recent: std::collections::VecDeque<(f64, f64)>,
}

impl Queueing {
    fn observe(&mut self, queued: f64, own: f64) {
        self.recent.push_back((queued, own));
        if self.recent.len() > 2048 {
            self.recent.pop_front();
        }
    }

    fn queued_behind(&self) -> f64 {
        let (queued, own) = self
            .recent
            .iter()
            .fold((0.0, 0.0), |(q, u), (dq, du)| (q + dq, u + du));
        queued / own
    }
}

const WORKERS: u64 = 4;

fn router(id: &str, seed: u64, sync: bool) -> RouterCore {
    let mut args = vec!["--router-mode", "kv", "--router-kv-weights", "auto"];
    if sync {
        args.push("--router-replica-sync");
    }
    let mut core = RouterCore::new(config(&args), "m", B, seed)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_router_id(id);
    for w in 1..=WORKERS {
        core.upsert_worker(worker(w, None, None), Duration::ZERO);
    }
    core
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    FirstToken,
    End,
    /// The client gave up mid-decode: not a completed request's decode time.
    Cancel,
}

/// Replays `n` requests from `first_id` over `routers` in turn (each replica routes its share),
/// in spells of one every 4 ms and one every 14 ms on average, with first tokens at the time
/// `truth` gives (±5 % noise) and each request decoding for 0.5–3.5 s after it; every sync event
/// one router emits reaches the others at once. Returns the queueing the requests met.
fn drive(
    routers: &mut [RouterCore],
    rng: &mut Rng,
    now_us: &mut u64,
    first_id: u64,
    n: u64,
    truth: Truth,
) -> Queueing {
    drive_cancelling(routers, rng, now_us, first_id, n, truth, 0)
}

/// [`drive`], with every `cancel_every`-th request (0: none) cancelled a quarter of the way
/// into its decode.
fn drive_cancelling(
    routers: &mut [RouterCore],
    rng: &mut Rng,
    now_us: &mut u64,
    first_id: u64,
    n: u64,
    truth: Truth,
    cancel_every: u64,
) -> Queueing {
    let mut due: Due = BinaryHeap::new();
    let mut queueing = Queueing::default();
    for i in first_id..first_id + n {
        // Busy and quiet spells, so queued prefill and decode load vary.
        let mean_gap = if (i / 300) % 2 == 0 { 4_000 } else { 14_000 };
        *now_us += mean_gap / 2 + rng.below(mean_gap as usize) as u64;
        run_due(routers, &mut due, *now_us);
        let owner = (i % routers.len() as u64) as usize;
        let now = Duration::from_micros(*now_us);
        let tokens: Vec<u32> = (0..B as usize * (1 + rng.below(32)))
            .map(|_| rng.next_u64() as u32)
            .collect();
        let id = format!("req-{i}");
        let core = &mut routers[owner];
        let before: Vec<_> = (1..=WORKERS)
            .map(|w| core.load(WorkerKey::new(w, 0)))
            .collect();
        let Ok(RouteOutcome::Routed(decision)) = core.route(&RouteRequest::new(&id, &tokens), now)
        else {
            panic!("request {i} not routed");
        };
        let load = before[(decision.worker_id - 1) as usize];
        let block = f64::from(B);
        queueing.observe(
            load.prefill_tokens as f64 / block,
            tokens.len() as f64 / block,
        );
        let ttft = 0.002
            + truth.queued * load.prefill_tokens as f64 / block
            + truth.uncached * tokens.len() as f64 / block
            + truth.decode * load.active_blocks as f64;
        let noise = 0.95 + 0.1 * rng.next_f64();
        let first = *now_us + (ttft * noise * 1e6) as u64;
        due.push(Reverse((first, Step::FirstToken, owner, id.clone())));
        let decode = 500_000 + rng.below(3_000_000) as u64;
        if cancel_every > 0 && i % cancel_every == 0 {
            due.push(Reverse((first + decode / 4, Step::Cancel, owner, id)));
        } else {
            due.push(Reverse((first + decode, Step::End, owner, id)));
        }
        forward(routers, owner, now);
    }
    run_due(routers, &mut due, u64::MAX);
    queueing
}

type Due = BinaryHeap<Reverse<(u64, Step, usize, String)>>;

/// Delivers every first token and end due by `until`, in time order.
fn run_due(routers: &mut [RouterCore], due: &mut Due, until: u64) {
    while due.peek().is_some_and(|Reverse((at, ..))| *at <= until) {
        let Some(Reverse((at, step, owner, id))) = due.pop() else {
            break;
        };
        let now = Duration::from_micros(at);
        let core = &mut routers[owner];
        match step {
            Step::FirstToken => {
                core.mark_prefill_done(&id, now);
            }
            Step::End => {
                core.free(&id, TerminalPath::Completed, now);
            }
            Step::Cancel => {
                core.free(&id, TerminalPath::Cancelled, now);
            }
        }
        forward(routers, owner, now);
    }
}

/// Hands `routers[from]`'s sync events to every other router.
fn forward(routers: &mut [RouterCore], from: usize, now: Duration) {
    let events = routers[from].take_sync_events();
    for (index, core) in routers.iter_mut().enumerate() {
        if index != from {
            for event in &events {
                core.apply_sync_event(event, now);
            }
        }
    }
}

fn weights(core: &RouterCore) -> (f64, f64) {
    let LearnedWeights {
        overlap_score_credit,
        prefill_load_scale,
        ..
    } = core
        .learned_weights()
        .unwrap_or_else(|| panic!("auto mode learns"));
    (overlap_score_credit, prefill_load_scale)
}

/// Within one quarter-octave step of `expected`.
fn near(got: (f64, f64), expected: (f64, f64)) -> bool {
    let close = |a: f64, b: f64| (a.log2() - b.log2()).abs() <= 0.25 + 1e-9;
    close(got.0, expected.0) && close(got.1, expected.1)
}

#[test]
fn weights_converge_on_a_known_optimum_and_follow_a_change() {
    let first = Truth {
        queued: 0.001,
        uncached: 0.0005,
        decode: 0.001 / 16.0,
    };
    let second = Truth {
        queued: 0.001,
        uncached: 0.0002,
        decode: 0.001 / 64.0,
    };
    let mut routers = [router("a", 1, false)];
    assert_eq!(weights(&routers[0]), (1.0, 1.0), "starts from the flags");
    let (mut rng, mut now_us) = (Rng::new(11), 0);
    let queueing = drive(&mut routers, &mut rng, &mut now_us, 0, 4000, first);
    let (learned, optimum) = (
        weights(&routers[0]),
        first.optimum(queueing.queued_behind()),
    );
    assert!(near(learned, optimum), "{learned:?} vs {optimum:?}");
    let after_first = learned;
    let queueing = drive(&mut routers, &mut rng, &mut now_us, 4000, 12_000, second);
    let (learned, optimum) = (
        weights(&routers[0]),
        second.optimum(queueing.queued_behind()),
    );
    assert!(near(learned, optimum), "{learned:?} vs {optimum:?}");
    assert!(
        learned.0 < after_first.0 && learned.1 > after_first.1,
        "{learned:?} after {after_first:?}"
    );
    assert_eq!(routers[0].num_tracked(), 0);
}

#[test]
fn replicas_with_sync_end_with_the_same_weights() {
    let truth = Truth {
        queued: 0.001,
        uncached: 0.0004,
        decode: 0.001 / 32.0,
    };
    let mut routers = [router("a", 1, true), router("b", 2, true)];
    let (mut rng, mut now_us) = (Rng::new(5), 0);
    // Every fifth request is cancelled: its short decode is not a decode time the owner fits,
    // and the replica, told how it ended, drops it too.
    let queueing = drive_cancelling(&mut routers, &mut rng, &mut now_us, 0, 6000, truth, 5);
    let (a, b) = (weights(&routers[0]), weights(&routers[1]));
    assert_eq!(a, b);
    let optimum = truth.optimum(queueing.queued_behind());
    assert!(near(a, optimum), "{a:?} vs {optimum:?}");
    let observed = |core: &RouterCore| core.learned_weights().map(|w| w.num_observations);
    assert_eq!(
        observed(&routers[0]),
        Some(6000),
        "own and synced first tokens"
    );
    assert_eq!(observed(&routers[0]), observed(&routers[1]));
    let decodes = |core: &RouterCore| core.learned_weights().map(|w| w.num_decodes);
    assert_eq!(decodes(&routers[0]), Some(4800), "completed decodes only");
    assert_eq!(decodes(&routers[0]), decodes(&routers[1]));
    // Without sync each replica learns from its own half only.
    let mut alone = [router("c", 1, false), router("d", 2, false)];
    let (mut rng, mut now_us) = (Rng::new(5), 0);
    drive(&mut alone, &mut rng, &mut now_us, 0, 600, truth);
    assert_eq!(observed(&alone[0]), Some(300));
}

/// A router whose workers have `total_kv_blocks` each and an event-fed index in which every
/// worker already holds `held` blocks (of a prompt no request of these tests sends: theirs are
/// random tokens).
fn router_with_caches(total_kv_blocks: u64, held: u64) -> RouterCore {
    let index = ConcurrentIndex::new(1);
    for w in 1..=WORKERS {
        let base = u32::try_from(w).unwrap_or(0) * 1_000_000;
        let tokens = prompt(base, held as usize * B as usize);
        index
            .apply(stored(w, Tier::Device, &tokens, 0))
            .unwrap_or_else(|e| panic!("{e:?}"));
    }
    index.flush().unwrap_or_else(|e| panic!("{e:?}"));
    let args = ["--router-mode", "kv", "--router-kv-weights", "auto"];
    let mut core = RouterCore::new(config(&args), "m", B, 1)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_overlap_source(Arc::new(index));
    for w in 1..=WORKERS {
        core.upsert_worker(worker(w, None, Some(total_kv_blocks)), Duration::ZERO);
    }
    core
}

/// `core` after the same 4000 requests and times as every cache test's.
fn driven(core: RouterCore) -> RouterCore {
    let truth = Truth {
        queued: 0.001,
        uncached: 0.0005,
        decode: 0.001 / 16.0,
    };
    let mut routers = [core];
    let (mut rng, mut now_us) = (Rng::new(11), 0);
    drive(&mut routers, &mut rng, &mut now_us, 0, 4000, truth);
    let [core] = routers;
    core
}

#[test]
fn full_caches_in_the_index_raise_the_learned_credit() {
    let learned = |core: RouterCore| weights(&driven(core));
    // The same requests and times: caches with room, then caches full (≥ 95 % of their blocks).
    let with_room = learned(router_with_caches(1000, 100));
    let full = learned(router_with_caches(100, 100));
    let tripled = (3.0 * with_room.0, with_room.1);
    assert!(near(full, tripled), "{full:?} vs {tripled:?}");
}

#[test]
fn running_sequences_filling_the_caches_fade_the_decode_stall_term() {
    let stall = |total_kv_blocks: u64| {
        driven(router_with_caches(total_kv_blocks, 1))
            .learned_weights()
            .map(|w| w.decode_stall_weight)
            .unwrap_or(f64::NAN)
    };
    // The same requests and times: caches far larger than what runs, then caches that the
    // running requests alone fill.
    let with_room = stall(10_000_000);
    assert!(
        (with_room - DECODE_STALL_WEIGHT).abs() < 1e-3,
        "{with_room}"
    );
    assert_eq!(stall(1), 0.0);
}
