//! Flag names, environment names, parsing rules and resolution of the router flags.

use clap::{CommandFactory, Parser};

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    router: RouterArgs,
}

fn parse(args: &[&str]) -> Result<RouterConfig, String> {
    let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    cli.router
        .to_config_with_env(|_| None)
        .map_err(|e| e.to_string())
}

fn error(args: &[&str]) -> String {
    parse(args).unwrap_err()
}

#[test]
fn defaults_are_the_spec_defaults() {
    assert_eq!(parse(&[]).unwrap(), RouterConfig::default());
}

#[test]
fn flags_and_environment_names_match_the_spec() {
    let expected = [
        ("router-mode", "DYN_ROUTER_MODE"),
        ("use-remote-indexer", "DYN_USE_REMOTE_INDEXER"),
        ("serve-indexer", "DYN_SERVE_INDEXER"),
        ("router-tracking-hash", "DYN_ROUTER_TRACKING_HASH"),
        ("router-tracking-key-file", "DYN_ROUTER_TRACKING_KEY_FILE"),
        ("router-tracking-key-id", "DYN_ROUTER_TRACKING_KEY_ID"),
        ("decode-fallback", "DYN_DECODE_FALLBACK"),
        ("router-durable-kv-events", "DYN_ROUTER_DURABLE_KV_EVENTS"),
        ("router-prefill-load-model", "DYN_ROUTER_PREFILL_LOAD_MODEL"),
        (
            "router-min-initial-workers",
            "DYN_ROUTER_MIN_INITIAL_WORKERS",
        ),
        (
            "router-session-affinity-ttl-secs",
            "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS",
        ),
        (
            "router-session-affinity-mode",
            "DYN_ROUTER_SESSION_AFFINITY_MODE",
        ),
        ("load-aware", "DYN_ROUTER_LOAD_AWARE"),
        (
            "router-kv-overlap-score-credit",
            "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT",
        ),
        (
            "router-kv-overlap-score-credit-decay",
            "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY",
        ),
        ("router-prefill-load-scale", "DYN_ROUTER_PREFILL_LOAD_SCALE"),
        (
            "router-host-cache-hit-weight",
            "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT",
        ),
        (
            "router-disk-cache-hit-weight",
            "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT",
        ),
        ("router-temperature", "DYN_ROUTER_TEMPERATURE"),
        (
            "router-kv-overlap-score-weight",
            "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT",
        ),
        ("router-kv-events", "DYN_ROUTER_USE_KV_EVENTS"),
        ("router-ttl-secs", "DYN_ROUTER_TTL_SECS"),
        ("router-max-tree-size", "DYN_ROUTER_MAX_TREE_SIZE"),
        ("router-prune-target-ratio", "DYN_ROUTER_PRUNE_TARGET_RATIO"),
        (
            "router-approximate-cache-policy",
            "DYN_ROUTER_APPROXIMATE_CACHE_POLICY",
        ),
        ("router-predicted-ttl-secs", "DYN_ROUTER_PREDICTED_TTL_SECS"),
        ("router-event-threads", "DYN_ROUTER_EVENT_THREADS"),
        ("router-replica-sync", "DYN_ROUTER_REPLICA_SYNC"),
        (
            "router-track-active-blocks",
            "DYN_ROUTER_TRACK_ACTIVE_BLOCKS",
        ),
        ("router-assume-kv-reuse", "DYN_ROUTER_ASSUME_KV_REUSE"),
        (
            "router-track-output-blocks",
            "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
        ),
        (
            "router-decode-active-request-weight",
            "DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT",
        ),
        (
            "router-track-prefill-tokens",
            "DYN_ROUTER_TRACK_PREFILL_TOKENS",
        ),
        ("router-queue-threshold", "DYN_ROUTER_QUEUE_THRESHOLD"),
        ("router-queue-policy", "DYN_ROUTER_QUEUE_POLICY"),
        ("router-queue-max-len", "KVMESH_ROUTER_QUEUE_MAX_LEN"),
        (
            "router-queue-max-wait-ms",
            "KVMESH_ROUTER_QUEUE_MAX_WAIT_MS",
        ),
        (
            "active-decode-blocks-threshold",
            "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
        ),
        (
            "active-prefill-tokens-threshold",
            "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD",
        ),
        (
            "active-prefill-tokens-threshold-frac",
            "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC",
        ),
        (
            "router-active-request-expiry-secs",
            "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS",
        ),
        (
            "router-overlap-refresh-after-secs",
            "DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS",
        ),
        ("encoder-cuda-to-cpu-ratio", "DYN_ENCODER_CUDA_TO_CPU_RATIO"),
    ];
    let command = Cli::command();
    for (long, env) in expected {
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .unwrap_or_else(|| panic!("--{long} missing"));
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(env),
            "--{long}"
        );
    }
    kvmesh_core::flags::check_unique_env(&command).unwrap();
}

#[test]
fn queue_bounds_default_to_production_limits_and_zero_wait_means_none() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.queue_max_len, crate::config::DEFAULT_QUEUE_MAX_LEN);
    assert_eq!(
        config.queue_max_wait,
        Some(crate::config::DEFAULT_QUEUE_MAX_WAIT)
    );
    let config = parse(&[
        "--router-queue-max-len",
        "7",
        "--router-queue-max-wait-ms",
        "250",
    ])
    .unwrap();
    assert_eq!(config.queue_max_len, 7);
    assert_eq!(config.queue_max_wait, Some(Duration::from_millis(250)));
    assert_eq!(
        parse(&["--router-queue-max-wait-ms", "0"])
            .unwrap()
            .queue_max_wait,
        None
    );
    assert!(parse(&["--router-queue-max-len", "0"]).is_err());
}

#[test]
fn booleans_are_strict_and_negatable() {
    assert!(!parse(&["--no-router-kv-events"]).unwrap().kv.use_kv_events);
    assert!(!parse(&["--router-kv-events=off"]).unwrap().kv.use_kv_events);
    assert!(
        parse(&["--router-track-output-blocks"])
            .unwrap()
            .kv
            .track_output_blocks
    );
    assert!(
        !parse(&["--no-router-track-prefill-tokens"])
            .unwrap()
            .kv
            .track_prefill_tokens
    );
    assert!(parse(&["--router-replica-sync=YES"]).unwrap().replica_sync);
    let e = error(&["--router-assume-kv-reuse=maybe"]);
    assert!(e.contains("--router-assume-kv-reuse"), "{e}");
}

#[test]
fn deprecated_aliases_work_and_warn() {
    let config = parse(&[
        "--no-kv-events",
        "--router-ttl",
        "7",
        "--no-track-active-blocks",
        "--no-assume-kv-reuse",
        "--track-output-blocks",
    ])
    .unwrap();
    assert!(!config.kv.use_kv_events);
    assert_eq!(config.kv.ttl, Duration::from_secs(7));
    assert!(!config.kv.track_active_blocks && !config.kv.assume_kv_reuse);
    assert!(config.kv.track_output_blocks);
    let cli = Cli::try_parse_from(["x", "--kv-overlap-score-weight", "2"]).unwrap();
    let warnings =
        cli.router
            .deprecation_warnings(["x", "--kv-overlap-score-weight", "2", "--router-ttl=3"]);
    assert_eq!(warnings.len(), 3, "{warnings:?}");
}

#[test]
fn legacy_overlap_weight_maps_and_wins() {
    let config = parse(&[
        "--router-kv-overlap-score-weight",
        "2",
        "--router-prefill-load-scale",
        "5",
    ])
    .unwrap();
    assert_eq!(
        (config.kv.prefill_load_scale, config.kv.overlap_score_credit),
        (2.0, 1.0)
    );
    let config = parse(&["--kv-overlap-score-weight", "0"]).unwrap();
    assert_eq!(
        (config.kv.prefill_load_scale, config.kv.overlap_score_credit),
        (0.0, 0.0)
    );
    let cli = Cli::try_parse_from(["x"]).unwrap();
    let env = |name: &str| (name == LEGACY_OVERLAP_WEIGHT_ENV).then(|| "3".to_string());
    assert_eq!(
        cli.router
            .to_config_with_env(env)
            .unwrap()
            .kv
            .prefill_load_scale,
        3.0
    );
    let bad = |name: &str| (name == LEGACY_OVERLAP_WEIGHT_ENV).then(|| "-1".to_string());
    let e = cli.router.to_config_with_env(bad).unwrap_err().to_string();
    assert!(e.contains("DYN_OVERLAP_SCORE_WEIGHT"), "{e}");
}

#[test]
fn nullable_thresholds_accept_none() {
    let config = parse(&[
        "--active-decode-blocks-threshold",
        "0.9",
        "--active-prefill-tokens-threshold",
        "None",
        "--active-prefill-tokens-threshold-frac",
        "1.5",
    ])
    .unwrap();
    assert_eq!(config.busy.active_decode_blocks_threshold, Some(0.9));
    assert_eq!(config.busy.active_prefill_tokens_threshold, None);
    assert_eq!(config.busy.active_prefill_tokens_threshold_frac, Some(1.5));
    assert!(
        error(&["--active-decode-blocks-threshold", "1.5"])
            .contains("--active-decode-blocks-threshold")
    );
    assert!(
        error(&["--active-prefill-tokens-threshold", "-3"])
            .contains("--active-prefill-tokens-threshold")
    );
}

#[test]
fn invalid_values_name_the_flag() {
    for (args, flag) in [
        (&["--router-temperature", "-1"][..], "--router-temperature"),
        (
            &["--router-kv-overlap-score-credit", "inf"][..],
            "--router-kv-overlap-score-credit",
        ),
        (
            &["--router-host-cache-hit-weight", "1.1"][..],
            "--router-host-cache-hit-weight",
        ),
        (
            &["--router-disk-cache-hit-weight", "-0.1"][..],
            "--router-disk-cache-hit-weight",
        ),
        (
            &["--router-prune-target-ratio", "0"][..],
            "--router-prune-target-ratio",
        ),
        (
            &["--router-max-tree-size", "0"][..],
            "--router-max-tree-size",
        ),
        (&["--router-ttl-secs", "0"][..], "--router-ttl-secs"),
        (
            &["--router-event-threads", "0"][..],
            "--router-event-threads",
        ),
        (
            &["--router-session-affinity-ttl-secs", "0"][..],
            "--router-session-affinity-ttl-secs",
        ),
        (
            &["--router-queue-threshold", "-1"][..],
            "--router-queue-threshold",
        ),
        (
            &["--router-queue-policy", "lcfs"][..],
            "--router-queue-policy",
        ),
        (&["--router-mode", "fastest"][..], "--router-mode"),
        (
            &["--router-predicted-ttl-secs", "5", "--no-router-kv-events"][..],
            "--router-predicted-ttl-secs",
        ),
        (
            &["--router-predicted-ttl-secs", "5", "--load-aware"][..],
            "--router-predicted-ttl-secs",
        ),
    ] {
        let e = error(args);
        assert!(e.contains(flag), "{args:?}: {e}");
    }
}

#[test]
fn load_aware_resolves_through_the_flags() {
    let config = parse(&["--load-aware", "--router-kv-overlap-score-credit", "0.5"]).unwrap();
    assert_eq!(config.mode, RouterMode::Kv);
    assert_eq!(config.kv.overlap_score_credit, 0.0);
    assert!(!config.kv.use_kv_events && !config.kv.assume_kv_reuse);
}

#[test]
fn env_only_options_convert() {
    let config = parse(&[
        "--router-active-request-expiry-secs",
        "30",
        "--router-overlap-refresh-after-secs",
        "0",
        "--encoder-cuda-to-cpu-ratio",
        "2",
    ])
    .unwrap();
    assert_eq!(config.kv.active_request_expiry, Duration::from_secs(30));
    assert_eq!(config.kv.overlap_refresh_after, None);
    assert_eq!(config.encoder_cuda_to_cpu_ratio, 2.0);
}

#[test]
fn features_of_later_releases_are_refused_naming_the_flag() {
    assert!(parse(&["--router-tracking-hash", "public-xxh3-v1"]).is_ok());
    assert!(parse(&["--router-prefill-load-model", "none", "--decode-fallback"]).is_ok());
    assert!(parse(&["--router-durable-kv-events"]).is_ok());
    for (args, flag) in [
        (
            &["--router-tracking-hash", "keyed-xxh3-v1"][..],
            "--router-tracking-hash",
        ),
        (
            &["--router-tracking-hash", "sha"][..],
            "--router-tracking-hash",
        ),
        (
            &["--router-tracking-key-id", "k"][..],
            "--router-tracking-key-id",
        ),
        (
            &["--router-prefill-load-model", "aic"][..],
            "--router-prefill-load-model",
        ),
        (
            &["--router-prefill-load-model", "x"][..],
            "--router-prefill-load-model",
        ),
        (
            &[
                "--router-mode",
                "kv",
                "--serve-indexer",
                "--use-remote-indexer",
            ][..],
            "--serve-indexer",
        ),
        (&["--serve-indexer"][..], "--serve-indexer"),
    ] {
        let message = error(args);
        assert!(message.contains(flag), "{args:?}: {message}");
    }
}

fn later_warnings(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>, String> {
    let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    let lookup = |name: &str| {
        env.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_string())
    };
    cli.router
        .to_config_with_env(lookup)
        .map_err(|e| e.to_string())?;
    cli.router.later_notices(&lookup).map_err(|e| e.to_string())
}

#[test]
fn later_flags_start_with_one_warning_each_and_validate_their_values() {
    assert_eq!(later_warnings(&[], &[]).unwrap(), Vec::<String>::new());
    let warned = later_warnings(
        &[
            "--router-conditional-disagg",
            "--router-conditional-disagg-config",
            r#"{"policy":"x","eff_isl_threshold":4}"#,
            "--enable-session-prefix-index",
            "--shared-cache-type",
            "hicache",
            "--router-active-sequence-stride",
            "4",
            "--router-prefill-policy",
            "default",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(warned.len(), 5, "{warned:?}");
    assert!(warned.iter().all(|w| w.contains("not implemented yet")));
    assert!(warned[0].contains("--router-prefill-policy"), "{warned:?}");
    let message = later_warnings(
        &["--router-conditional-disagg-config", r#"{"nope":1}"#],
        &[],
    )
    .unwrap_err();
    assert!(
        message.contains("--router-conditional-disagg-config"),
        "{message}"
    );
    let message = later_warnings(&["--shared-cache-multiplier", "2"], &[]).unwrap_err();
    assert!(message.contains("--shared-cache-multiplier"), "{message}");
    let message = later_warnings(&["--router-policy-config", "/no/such.yaml"], &[]).unwrap_err();
    assert!(message.contains("--router-policy-config"), "{message}");
}

#[test]
fn aic_prefill_model_needs_its_options_and_reads_the_older_spelling() {
    let kv = ["--router-mode", "kv", "--router-prefill-load-model", "aic"];
    let message = later_warnings(&kv, &[]).unwrap_err();
    assert!(message.contains("--ais-backend"), "{message}");
    let legacy = [
        ("DYN_AIC_BACKEND", "vllm"),
        ("DYN_AIC_SYSTEM", "h200_sxm"),
        ("DYN_AIC_MODEL_PATH", "m"),
    ];
    let warned = later_warnings(&kv, &legacy).unwrap();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("--router-prefill-load-model aic is not implemented yet"),
        "{warned:?}"
    );
    let ais = ["--router-mode", "kv", "--router-prefill-load-model", "ais"];
    let warned = later_warnings(&ais, &legacy).unwrap();
    assert!(
        warned[0].starts_with("--router-prefill-load-model ais is not implemented yet"),
        "{warned:?}"
    );
    let mut aliased = kv.to_vec();
    aliased.extend([
        "--aic-backend",
        "vllm",
        "--ais-system",
        "s",
        "--aic-model-path",
        "m",
    ]);
    assert!(later_warnings(&aliased, &[]).is_ok());
    let message = later_warnings(&["--router-prefill-load-model", "aic"], &legacy).unwrap_err();
    assert!(message.contains("--router-mode kv"), "{message}");
    let message = later_warnings(
        &[
            "--ais-tp-size",
            "2",
            "--aic-moe-tp-size",
            "3",
            "--ais-moe-ep-size",
            "1",
        ],
        &[],
    )
    .unwrap_err();
    assert!(message.contains("moe"), "{message}");
    let message = later_warnings(&[], &[("DYN_AIC_TP_SIZE", "zero")]).unwrap_err();
    assert!(message.contains("DYN_AIC_TP_SIZE"), "{message}");
}
