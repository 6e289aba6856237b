use std::collections::HashMap;

use super::{Settings, Trace, env};

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_env(|name| vars.get(name).cloned())
}

#[test]
fn off_by_default() {
    assert!(!settings(&[]).unwrap().is_enabled);
}

#[test]
fn turned_on_by_an_endpoint_the_exporter_or_dynamo_switch() {
    for vars in [
        [(env::EXPORTER_OTLP_ENDPOINT, "http://127.0.0.1:4317")],
        [(env::EXPORTER_OTLP_TRACES_ENDPOINT, "http://collector:4317")],
        [(env::TRACES_EXPORTER, "otlp")],
        [(env::EXPORT_ENABLED, "true")],
        [(env::EXPORT_ENABLED, "1")],
    ] {
        assert!(settings(&vars).unwrap().is_enabled, "{vars:?}");
    }
}

#[test]
fn turned_off_by_sdk_disabled_or_exporter_none() {
    let endpoint = (env::EXPORTER_OTLP_ENDPOINT, "http://127.0.0.1:4317");
    assert!(
        !settings(&[endpoint, (env::SDK_DISABLED, "true")])
            .unwrap()
            .is_enabled
    );
    assert!(
        !settings(&[endpoint, (env::TRACES_EXPORTER, "none")])
            .unwrap()
            .is_enabled
    );
    assert!(
        !settings(&[(env::EXPORT_ENABLED, "false")])
            .unwrap()
            .is_enabled
    );
}

#[test]
fn unsupported_exporters_and_protocols_fail_with_the_variable_name() {
    let error = settings(&[(env::TRACES_EXPORTER, "zipkin")]).unwrap_err();
    assert!(error.contains("OTEL_TRACES_EXPORTER"), "{error}");
    let error = settings(&[
        (env::EXPORT_ENABLED, "true"),
        (env::EXPORTER_OTLP_PROTOCOL, "http/protobuf"),
    ])
    .unwrap_err();
    assert!(error.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{error}");
    let error = settings(&[(env::EXPORT_ENABLED, "maybe")]).unwrap_err();
    assert!(error.contains("OTEL_EXPORT_ENABLED"), "{error}");
    // The traces' own protocol wins over the generic one.
    assert!(
        settings(&[
            (env::EXPORT_ENABLED, "true"),
            (env::EXPORTER_OTLP_TRACES_PROTOCOL, "grpc"),
            (env::EXPORTER_OTLP_PROTOCOL, "http/protobuf"),
        ])
        .unwrap()
        .is_enabled
    );
}

#[test]
fn an_untraced_context_does_nothing() {
    // No `init` in unit tests: tracing is off, so nothing is extracted or made.
    let cx = Trace::from_fields(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "",
    );
    assert!(!cx.is_active());
    let child = cx.internal("route");
    assert!(!child.is_active());
    assert_eq!(child.to_fields(), (String::new(), String::new()));
    assert_eq!(child.trace_id(), None);
}
