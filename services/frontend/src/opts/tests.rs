//! Tests of the frontend's options.

use clap::CommandFactory;

use super::*;

#[test]
fn env_names_are_unique() {
    kvmesh_runtime::config::check_unique_env(&FrontendOpts::command()).unwrap();
}

#[test]
fn cli_wins_and_invalid_values_name_the_flag() {
    let opts = FrontendOpts::try_parse_from(["f", "--http-port", "9100"]).unwrap();
    assert_eq!(opts.frontend.http.http_port, 9100);
    let error = FrontendOpts::try_parse_from(["f", "--http-port", "x"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--http-port"), "{error}");
    let error = FrontendOpts::try_parse_from(["f", "--model-path", "/definitely/missing"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--model-path"), "{error}");
    let opts = FrontendOpts::try_parse_from(["f", "--router-mode", "kv"]).unwrap();
    let config = opts.frontend.router_config().unwrap();
    assert_eq!(config.mode, kvmesh_routing::RouterMode::Kv);
    let error = FrontendOpts::try_parse_from(["f", "--router-mode", "nope"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--router-mode"), "{error}");
    let error = FrontendOpts::try_parse_from(["f", "--router-temperature", "-1"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--router-temperature"), "{error}");
}

#[test]
fn kserve_modes_exclude_each_other_and_windows_are_bounded() {
    let opts = FrontendOpts::try_parse_from(["f", "--kserve-grpc-server"]).unwrap();
    assert!(opts.frontend.kserve.kserve_grpc_server);
    assert_eq!(opts.frontend.kserve.grpc_metrics_port, 8788);
    assert_eq!(opts.frontend.kserve.kserve_stream_concurrency, 64);
    let opts =
        FrontendOpts::try_parse_from(["f", "--kserve-grpc-server", "--kserve-grpc-port", "9"])
            .unwrap();
    let error = opts.frontend.validate().unwrap_err();
    assert!(error.contains("--kserve-grpc-port"), "{error}");
    let error = FrontendOpts::try_parse_from(["f", "--grpc-initial-stream-window-size", "100"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("window"), "{error}");
    let error = FrontendOpts::try_parse_from(["f", "--kserve-stream-concurrency", "0"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--kserve-stream-concurrency"), "{error}");
}

#[test]
fn a_processor_config_warns_only_without_a_custom_processor() {
    let warned = |args: &[&str]| {
        let opts = FrontendOpts::try_parse_from(std::iter::once(&"f").chain(args)).unwrap();
        let notices = opts.frontend.chat.notices();
        notices
            .iter()
            .filter(|notice| notice.starts_with("--dyn-chat-processor-config"))
            .count()
    };
    assert_eq!(warned(&[]), 0);
    assert_eq!(warned(&["--dyn-chat-processor-config", "{ }"]), 0);
    let options = r#"{"temperature": 0.5}"#;
    assert_eq!(warned(&["--dyn-chat-processor-config", options]), 1);
    let custom = ["--dyn-chat-processor", "my_processor:factory"];
    assert_eq!(
        warned(&[custom[0], custom[1], "--dyn-chat-processor-config", options]),
        0
    );
}

#[test]
fn key_files_are_checked_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# none yet\n").unwrap();
    let keys = keys.to_str().unwrap();
    for flag in ["--http-api-keys-file", "--http-admin-keys-file"] {
        let opts = FrontendOpts::try_parse_from(["f", flag, keys]).unwrap();
        let error = opts.frontend.validate().unwrap_err();
        assert!(error.contains(flag) && error.contains("no key"), "{error}");
    }
    std::fs::write(dir.path().join("keys"), "sk-1\n").unwrap();
    let opts = FrontendOpts::try_parse_from(["f", "--http-api-keys-file", keys]).unwrap();
    assert!(opts.frontend.validate().is_ok());
    let error = FrontendOpts::try_parse_from(["f", "--http-api-keys-file", "/no/such"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--http-api-keys-file"), "{error}");
}

#[test]
fn overload_status_falls_back() {
    assert_eq!(overload_status("503"), Ok(503));
    assert_eq!(overload_status("42"), Ok(529));
    assert_eq!(overload_status("nope"), Ok(529));
}
