//! Tests of the discovered-records join.

use kvmesh_runtime::discovery::WatchEvent;

use super::*;

fn put(key: &str, value: &impl serde::Serialize) -> WatchEvent {
    WatchEvent::Put {
        key: key.to_string(),
        value: serde_json::to_vec(value).unwrap_or_default().into(),
    }
}

/// Feeds one raw watch event through the registry's decoding, as a watch delivers it.
fn feed(records: &mut DiscoveredRecords, event: WatchEvent, filter: &NamespaceFilter) {
    if let Some(change) = RecordChange::from_watch(event, filter) {
        records.apply(change);
    }
}

#[test]
fn a_worker_serves_once_both_records_exist() {
    let filter = NamespaceFilter::default();
    let mut records = DiscoveredRecords::default();
    let instance = InstanceRecord {
        namespace: "ns".into(),
        component: "backend".into(),
        endpoint: "generate".into(),
        instance_id: 7,
        ..Default::default()
    };
    let model = ModelRecord {
        namespace: "ns".into(),
        model: "m".into(),
        instance_id: 7,
        ..Default::default()
    };
    feed(&mut records, put("/kvmesh/ns/models/m/7", &model), &filter);
    assert!(records.serving().is_empty());
    feed(
        &mut records,
        put("/kvmesh/ns/instances/backend/generate/7", &instance),
        &filter,
    );
    assert_eq!(records.serving().get("m").map(Vec::len), Some(1));
    feed(
        &mut records,
        WatchEvent::Delete {
            key: "/kvmesh/ns/instances/backend/generate/7".into(),
        },
        &filter,
    );
    assert!(records.serving().is_empty());
}

#[test]
fn other_namespaces_are_ignored() {
    let filter = NamespaceFilter::Exact("mine".into());
    let mut records = DiscoveredRecords::default();
    for ns in ["mine", "other"] {
        let instance = InstanceRecord {
            namespace: ns.into(),
            component: "b".into(),
            endpoint: "g".into(),
            instance_id: 1,
            ..Default::default()
        };
        let model = ModelRecord {
            namespace: ns.into(),
            model: format!("m-{ns}"),
            instance_id: 1,
            ..Default::default()
        };
        feed(
            &mut records,
            put(&format!("/kvmesh/{ns}/instances/b/g/1"), &instance),
            &filter,
        );
        feed(
            &mut records,
            put(&format!("/kvmesh/{ns}/models/m-{ns}/1"), &model),
            &filter,
        );
    }
    let serving = records.serving();
    assert!(serving.contains_key("m-mine"));
    assert!(!serving.contains_key("m-other"));
}
