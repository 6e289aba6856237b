//! Tests of the routing-quality simulation: determinism, accounting, the reference policy's cap,
//! kv routing against round-robin, and the workload builders.

use clap::Parser;

use super::handler::{Policy, greedy_pick};
use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: RoutingBench,
}

/// A small synthetic workload with shared system prompts: 4 workers, 8 k tokens of KV each,
/// 48 sessions of 4 turns.
const SMALL: &[&str] = &[
    "--synthetic",
    "--workers",
    "4",
    "--cache-blocks",
    "512",
    "--block-size",
    "16",
    "--system-prompts",
    "4",
    "--system-prompt-tokens",
    "128",
    "--sessions",
    "48",
    "--turns",
    "4",
    "--user-tokens",
    "128",
    "--output-tokens",
    "16",
    "--session-rate",
    "8",
    "--think-time",
    "2",
    "--seed",
    "7",
];

fn parse(args: &[&str]) -> RoutingBench {
    Cli::parse_from(std::iter::once("bench").chain(args.iter().copied())).bench
}

fn run(args: &[&str], modes: &[ModeArg]) -> Report {
    let args = parse(args);
    let (source, items) = load_workload(&args).unwrap();
    let settings = Settings::from_args(&args).unwrap();
    run_modes(source, &items, &settings, &ModeArg::expand(modes)).unwrap()
}

#[test]
fn same_inputs_give_identical_json() {
    let first = serde_json::to_string(&run(SMALL, &[ModeArg::All])).unwrap();
    let second = serde_json::to_string(&run(SMALL, &[ModeArg::All])).unwrap();
    assert_eq!(first, second);
    for field in [
        "hit_rate",
        "prefill_tokens",
        "ttft_mean_ms",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_mean_ms",
        "e2e_p99_ms",
        "throughput_tok_s",
        "req_imbalance",
        "work_imbalance",
    ] {
        assert!(first.contains(&format!("\"{field}\":")), "{field} missing");
    }
}

#[test]
fn every_mode_places_every_request_once() {
    let report = run(SMALL, &[ModeArg::All]);
    assert_eq!(report.modes.len(), ModeArg::CONCRETE.len());
    let num_requests = report.workload.requests;
    assert_eq!(num_requests, 192);
    for (mode, figures) in &report.modes {
        assert_eq!(figures.requests, num_requests, "{mode}");
        assert_eq!(
            figures.requests_per_worker.iter().sum::<u64>(),
            num_requests,
            "{mode}"
        );
        assert_eq!(figures.requests_per_worker.len(), 4, "{mode}");
        assert_eq!((figures.errors, figures.route_errors), (0, 0), "{mode}");
        assert_eq!(
            figures.prompt_tokens, report.workload.prompt_tokens,
            "{mode}"
        );
        assert_eq!(
            figures.output_tokens, report.workload.output_tokens,
            "{mode}"
        );
        assert!(figures.ttft_p50_ms <= figures.ttft_p99_ms, "{mode}");
        assert!(figures.ttft_mean_ms <= figures.e2e_mean_ms, "{mode}");
    }
}

#[test]
fn kv_beats_round_robin_on_shared_prefixes() {
    let report = run(
        SMALL,
        &[ModeArg::RoundRobin, ModeArg::Kv, ModeArg::KvApprox],
    );
    let rr = &report.modes["round-robin"];
    let kv = &report.modes["kv"];
    let approx = &report.modes["kv-approx"];
    assert!(
        kv.hit_rate > 1.2 * rr.hit_rate,
        "kv {} vs round-robin {}",
        kv.hit_rate,
        rr.hit_rate
    );
    assert!(kv.prefill_tokens < rr.prefill_tokens);
    assert!(approx.hit_rate > rr.hit_rate);
}

#[test]
fn load_capped_greedy_respects_its_cap() {
    let report = run(SMALL, &[ModeArg::LoadCappedGreedy]);
    let greedy = &report.modes["load-capped-greedy"];
    let ratio = greedy.greedy_cap_ratio.unwrap();
    assert!(ratio > 0.0 && ratio <= 1.25, "{ratio}");

    // Worker 0 caches the most but is over the cap (mean 100, cap 125).
    assert_eq!(greedy_pick(&[9, 5, 5, 0], &[130, 90, 80, 100], 1.25), 2);
    // Within the cap the longest prefix wins, then the least work.
    assert_eq!(greedy_pick(&[9, 5, 5, 0], &[120, 90, 80, 110], 1.25), 0);
    assert_eq!(greedy_pick(&[0, 0, 0, 0], &[3, 1, 2, 1], 1.25), 1);
    // A cap below 1 can exclude everyone: the least-loaded worker then.
    assert_eq!(greedy_pick(&[1, 1], &[5, 4], 0.5), 1);
    assert_eq!(greedy_pick(&[], &[], 1.25), 0);
}

#[test]
fn modes_expand_and_knobs_reach_the_router() {
    assert_eq!(ModeArg::expand(&[ModeArg::All]), ModeArg::CONCRETE.to_vec());
    assert_eq!(
        ModeArg::expand(&[ModeArg::Kv, ModeArg::RoundRobin, ModeArg::Kv]),
        vec![ModeArg::Kv, ModeArg::RoundRobin]
    );
    let args = parse(&[
        "--trace",
        "t.jsonl",
        "--mode",
        "kv,kv-approx",
        "--router-temperature",
        "0.5",
        "--router-predicted-ttl-secs",
        "3",
    ]);
    assert_eq!(args.mode, vec![ModeArg::Kv, ModeArg::KvApprox]);
    let settings = Settings::from_args(&args).unwrap();
    assert_eq!(settings.kv.temperature, 0.5);
    assert_eq!(settings.kv.predicted_ttl, Some(Duration::from_secs(3)));
    assert_eq!((settings.workers, settings.engine.block_size), (8, 64));
    let Policy::Router(config) = ModeArg::KvApprox.policy(&settings) else {
        panic!("kv-approx is a router mode");
    };
    assert!(!config.kv.use_kv_events && config.kv.predicted_ttl.is_none());
    assert!(
        Cli::try_parse_from(["bench", "--trace", "t", "--synthetic"]).is_err(),
        "a trace and the synthetic workload exclude each other"
    );
    assert!(Cli::try_parse_from(["bench", "--synthetic", "--speed", "0"]).is_err());
    assert!(Cli::try_parse_from(["bench", "--synthetic", "--greedy-cap", "0.9"]).is_err());
}

#[test]
fn trace_lines_become_prompts_sharing_their_blocks() {
    let path = std::env::temp_dir().join(format!(
        "kvmesh-bench-routing-{}-trace.jsonl",
        std::process::id()
    ));
    std::fs::write(
        &path,
        "{\"timestamp\": 2000, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n\
         \n\
         {\"timestamp\": 1000, \"input_length\": 1536, \"output_length\": 0, \"hash_ids\": [1, 2, 3]}\n\
         {\"timestamp\": 1500, \"input_length\": 600, \"output_length\": 7, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let items = workload::load_trace(&path, None).unwrap();
    assert_eq!(
        items.iter().map(|i| i.arrival_us).collect::<Vec<_>>(),
        vec![1_000_000, 1_500_000, 2_000_000]
    );
    assert_eq!(
        items[0].output_length, 1,
        "an output length of 0 counts as 1"
    );
    let full = items[0].prompt(0);
    let partial = items[2].prompt(2);
    assert_eq!((full.len(), partial.len()), (1536, 1100));
    // Equal hash ids give equal tokens; a partial last block is a prefix of the full block.
    assert_eq!(&full[..1100], &partial[..]);
    // A prompt longer than its blocks is padded with tokens private to the request.
    let padded = items[1].prompt(1);
    assert_eq!(padded.len(), 600);
    assert_eq!(&padded[..512], &full[..512]);
    assert_ne!(&padded[512..], &full[512..600]);
    assert_eq!(items[1].engine_request(1).request_id, "req-1");

    std::fs::write(&path, "{\"timestamp\": 0, \"hash_ids\": [1]}\nnot json\n").unwrap();
    let error = format!("{:#}", workload::load_trace(&path, None).unwrap_err());
    assert!(error.contains("trace line 2"), "{error}");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 0, \"hash_ids\": []}\n",
    )
    .unwrap();
    let error = format!("{:#}", workload::load_trace(&path, None).unwrap_err());
    assert!(
        error.contains("line 1") && error.contains("input_length"),
        "{error}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn synthetic_turns_extend_the_previous_prompt() {
    let args = parse(&[
        "--synthetic",
        "--sessions",
        "1",
        "--turns",
        "3",
        "--think-time",
        "1",
    ]);
    let items = synthetic::generate(&args.synthetic_args, 3);
    assert_eq!(items.len(), 3);
    for pair in items.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(after.arrival_us >= before.arrival_us);
        let (short, long) = (before.prompt(0), after.prompt(1));
        assert!(long.len() > short.len() + before.output_length as usize);
        assert_eq!(&long[..short.len()], &short[..]);
    }
    let many = parse(&["--synthetic", "--sessions", "20"]);
    let a = synthetic::generate(&many.synthetic_args, 1);
    assert_eq!(a, synthetic::generate(&many.synthetic_args, 1));
    assert_ne!(a, synthetic::generate(&many.synthetic_args, 2));
    assert!(a.windows(2).all(|p| p[0].arrival_us <= p[1].arrival_us));
}

#[test]
fn goodput_counts_requests_within_a_calibrated_slo() {
    let report = run(
        SMALL,
        &[ModeArg::RoundRobin, ModeArg::KvAuto, ModeArg::Lmetric],
    );
    let slo = report.slo;
    assert!(
        slo.calibrated && slo.ttft_ms > 0.0 && slo.itl_ms > 0.0,
        "{slo:?}"
    );
    for (mode, m) in &report.modes {
        assert!(m.goodput_rps > 0.0, "{mode}");
        assert!(m.slo_attainment > 0.0 && m.slo_attainment <= 1.0, "{mode}");
        let all_rps = m.requests as f64 / m.makespan_s;
        assert!(m.goodput_rps <= all_rps + 1e-9, "{mode}");
        assert!(m.itl_p50_ms > 0.0 && m.itl_p50_ms <= m.itl_p99_ms, "{mode}");
        let stalled = m.decode_steps_beside_prefill;
        assert!(stalled > 0.0 && stalled < 1.0, "{mode}: {stalled}");
    }
    // Every prefill on one worker stalls every decode: a larger share of the steps than when
    // round-robin spreads the same requests over four.
    let one_worker: Vec<&str> = SMALL
        .iter()
        .enumerate()
        .map(|(i, arg)| {
            if i > 0 && SMALL[i - 1] == "--workers" {
                "1"
            } else {
                *arg
            }
        })
        .collect();
    let alone =
        run(&one_worker, &[ModeArg::RoundRobin]).modes["round-robin"].decode_steps_beside_prefill;
    let spread = report.modes["round-robin"].decode_steps_beside_prefill;
    assert!(alone > spread, "{alone} vs {spread}");
    let learned = report.modes["kv-auto"].learned_weights.unwrap();
    assert!(learned.num_observations > 0);
    assert!(report.modes["lmetric"].learned_weights.is_none());

    let strict: Vec<&str> = SMALL
        .iter()
        .copied()
        .chain(["--slo-ttft-ms", "0.001", "--slo-itl-ms", "0.001"])
        .collect();
    let report = run(&strict, &[ModeArg::RoundRobin]);
    assert!(!report.slo.calibrated);
    assert_eq!(report.modes["round-robin"].goodput_rps, 0.0);
    assert!(
        Cli::try_parse_from(["bench", "--synthetic", "--slo-ttft-ms", "5"]).is_err(),
        "both objectives or neither"
    );
}

#[test]
fn sweep_picks_the_best_grid_point_and_checks_the_targets() {
    let args = parse(SMALL);
    let (source, items) = load_workload(&args).unwrap();
    let settings = Settings::from_args(&args).unwrap();
    let report = sweep::run(source, &items, &settings).unwrap();
    assert_eq!(
        report.grid.len(),
        sweep::CREDITS.len() * sweep::SCALES.len()
    );
    assert!(report.grid.contains(&report.best));
    for p in &report.grid {
        assert!(
            p.goodput_rps < report.best.goodput_rps
                || (p.goodput_rps == report.best.goodput_rps
                    && p.ttft_mean_ms >= report.best.ttft_mean_ms),
            "{p:?} beats {:?}",
            report.best
        );
    }
    for mode in ["round-robin", "kv", "kv-auto", "lmetric"] {
        assert!(report.modes.contains_key(mode), "{mode}");
    }
    assert_eq!(report.checks.len(), 7);
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("\"best\":") && json.contains("\"checks\":"));
}

#[test]
fn tool_agent_sessions_share_long_tool_prefixes() {
    let args = parse(&["--tool-agent", "--seed", "3"]);
    let (source, items) = load_workload(&args).unwrap();
    assert_eq!(source, "tool-agent");
    let shape = synthetic::SyntheticArgs::tool_agent();
    assert_eq!(items.len(), (shape.sessions * shape.turns) as usize);
    assert!(
        items
            .iter()
            .all(|i| i.input_length > shape.system_prompt_tokens)
    );
    let tools: std::collections::BTreeSet<u64> = items.iter().map(|i| i.segments[0].id).collect();
    assert!(tools.len() <= shape.system_prompts as usize);
    assert!(Cli::try_parse_from(["bench", "--tool-agent", "--synthetic"]).is_err());
    assert!(Cli::try_parse_from(["bench", "--tool-agent", "--trace", "t"]).is_err());
}
