use clap::{CommandFactory, Parser};

use super::*;

#[derive(Parser)]
struct TestOpts {
    #[command(flatten)]
    runtime: RuntimeOpts,
    #[arg(long, env = "KVMESH_TEST_ONLY_PORT", default_value_t = 8000)]
    port: u16,
}

#[test]
fn bools_are_strict() {
    assert_eq!(parse_bool("YES"), Ok(true));
    assert_eq!(parse_bool("off"), Ok(false));
    assert!(parse_bool("maybe").is_err());
    assert!(is_truthy("1"));
    assert!(!is_truthy("nope"));
}

#[test]
fn env_names_are_unique() {
    check_unique_env(&TestOpts::command()).unwrap();
}

#[test]
fn dump_reports_sources() {
    let command = TestOpts::command();
    let matches = command
        .clone()
        .try_get_matches_from(["x", "--port", "9000", "--discovery-backend", "mem"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    dump_config(&command, &matches, &path).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["port"]["value"], "9000");
    assert_eq!(json["port"]["source"], "cli");
    assert_eq!(json["discovery-backend"]["value"], "mem");
    assert_eq!(json["kv-partitions"]["source"], "default");
    assert_eq!(json["kv-partitions"]["value"], "16");
    assert_eq!(json["etcd-endpoints"]["env"], "ETCD_ENDPOINTS");
}

#[test]
fn tls_options_are_checked_in_pairs_and_with_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("cert.pem");
    std::fs::write(&pem, "x").unwrap();
    let pem = pem.to_str().unwrap();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tls/");
    let cert = format!("{data}server.pem");
    let key = format!("{data}server.key");
    let ca = format!("{data}ca.pem");
    let error = |args: &[&str]| {
        let opts = TestOpts::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        opts.runtime.validate().map_err(|e| e.to_string())
    };
    assert!(error(&[]).is_ok());
    let missing = error(&["--tls-cert-path", "/no/such.pem"]).unwrap_err();
    assert!(missing.contains("--tls-cert-path"), "{missing}");
    let unpaired = error(&["--tls-cert-path", pem]).unwrap_err();
    assert!(unpaired.contains("needs --tls-key-path"), "{unpaired}");
    let unreadable = error(&["--tls-cert-path", pem, "--tls-key-path", &key]).unwrap_err();
    assert!(unreadable.contains("--tls-cert-path"), "{unreadable}");
    assert!(error(&["--tls-cert-path", &cert, "--tls-key-path", &key]).is_ok());
    let with_ca = [
        "--tls-cert-path",
        &cert,
        "--tls-key-path",
        &key,
        "--tls-client-ca-cert-path",
        &ca,
    ];
    assert!(error(&with_ca).is_ok());
    let unreadable = error(&["--tcp-tls-cert-path", pem, "--tcp-tls-key-path", &key]).unwrap_err();
    assert!(unreadable.contains("--tcp-tls-cert-path"), "{unreadable}");
    let mesh = [
        "--tcp-tls-cert-path",
        &cert,
        "--tcp-tls-key-path",
        &key,
        "--tcp-tls-client-ca-cert-path",
        &ca,
        "--tcp-tls-ca-cert-path",
        &ca,
        "--tcp-tls-client-cert-path",
        &cert,
        "--tcp-tls-client-key-path",
        &key,
    ];
    assert!(error(&mesh).is_ok());
    let alone = error(&["--tcp-tls-client-ca-cert-path", &ca]).unwrap_err();
    assert!(alone.contains("needs --tcp-tls-cert-path"), "{alone}");
    let unverified = error(&[
        "--tcp-tls-client-cert-path",
        &cert,
        "--tcp-tls-client-key-path",
        &key,
    ])
    .unwrap_err();
    assert!(
        unverified.contains("needs --tcp-tls-ca-cert-path"),
        "{unverified}"
    );
    assert!(error(&["--nats-tls-insecure"]).is_ok());
    let etcd = error(&[
        "--etcd-tls-client-cert-path",
        &cert,
        "--etcd-tls-client-key-path",
        &key,
    ])
    .unwrap_err();
    assert!(etcd.contains("needs --etcd-tls-ca-cert-path"), "{etcd}");
}

#[test]
fn unsupported_planes_are_refused() {
    let opts = TestOpts::try_parse_from(["x", "--request-plane", "nats"]).unwrap();
    let error = opts.runtime.validate().unwrap_err().to_string();
    assert!(error.contains("--request-plane"), "{error}");
    let opts = TestOpts::try_parse_from(["x", "--response-plane", "quic"]).unwrap();
    let error = opts.runtime.validate().unwrap_err().to_string();
    assert!(error.contains("--response-plane"), "{error}");
    assert!(TestOpts::try_parse_from(["x", "--kv-partitions", "0"]).is_err());
}
