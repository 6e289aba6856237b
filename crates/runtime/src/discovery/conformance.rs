//! The discovery conformance suite, written once and run against every backend.
//!
//! Each function takes a factory that opens a new handle (a new simulated process) and a key
//! prefix or namespace unique to the test, and panics with a message when the backend breaks
//! the [`Discovery`] contract. Backend errors are returned. The test files of this crate (and
//! other crates with their own backends or wrappers) call these functions.

#![doc(hidden)]

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kvmesh_proto::v1::{InstanceRecord, LoraInfo, ModelCard, ModelRecord, ModelRuntimeConfig};

use super::mem::random_instance_id;
use super::registry::{NamespaceFilter, RecordEvent, Registry, card_checksum};
use super::{Discovery, KeyValue, WatchEvent, WatchStream};
use crate::Result;
use crate::names::{self, ModelKey};

/// How long a test waits for an event that must come (generous: CI machines are small).
pub const EVENT_DEADLINE: Duration = Duration::from_secs(15);

/// Makes a test's handle stop heartbeating, as if its process crashed.
pub type Crash = Box<dyn FnOnce() + Send>;

/// A fresh key prefix `/kvmesh/conformance-{label}-{random}/`, so parallel tests and reruns
/// against a shared server never collide.
pub fn unique_prefix(label: &str) -> String {
    format!("/kvmesh/conformance-{label}-{:x}/", random_instance_id())
}

/// A fresh namespace name for registry tests.
pub fn unique_namespace(label: &str) -> String {
    format!("conf-{label}-{:x}", random_instance_id())
}

/// The next watch event, or a panic naming what was awaited.
pub async fn next_event(watch: &mut WatchStream, what: &str) -> WatchEvent {
    next_typed(watch, what).await
}

async fn next_typed<T>(watch: &mut (impl futures::Stream<Item = T> + Unpin), what: &str) -> T {
    match tokio::time::timeout(EVENT_DEADLINE, watch.next()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("no event within {EVENT_DEADLINE:?} while waiting for {what}"),
    }
}

/// Asserts that the next event is a put of `value` at `key`.
async fn expect_put(watch: &mut WatchStream, key: &str, value: &'static str) {
    let put = WatchEvent::Put {
        key: key.to_owned(),
        value: b(value),
    };
    assert_eq!(next_event(watch, key).await, put);
}

fn b(text: &'static str) -> Bytes {
    Bytes::from_static(text.as_bytes())
}

async fn listed(handle: &Arc<dyn Discovery>, prefix: &str) -> Result<Vec<String>> {
    Ok(handle
        .list(prefix)
        .await?
        .into_iter()
        .map(|kv| kv.key)
        .collect())
}

/// Put, list (sorted, by prefix), overwrite and delete; a second handle sees the first's keys
/// but cannot delete them.
pub async fn put_list_delete<F, Fut>(open: F, prefix: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    let (first, second) = (open().await?, open().await?);
    assert_ne!(first.instance_id(), 0);
    assert_ne!(first.instance_id(), second.instance_id(), "ids must differ");
    let [x1, x2, y1] = ["x/1", "x/2", "y/1"].map(|name| format!("{prefix}{name}"));
    first.put(&x2, b("two")).await?;
    first.put(&x1, b("one")).await?;
    first.put(&y1, b("three")).await?;
    let all = first.list(prefix).await?;
    assert_eq!(
        listed(&first, prefix).await?,
        [x1.clone(), x2.clone(), y1.clone()],
        "sorted by key"
    );
    assert_eq!(all[0].value, b("one"));
    assert_eq!(
        listed(&first, &format!("{prefix}x/")).await?,
        [x1.clone(), x2.clone()]
    );
    assert!(first.list(&format!("{prefix}none/")).await?.is_empty());

    first.put(&x1, b("uno")).await?;
    assert_eq!(first.list(&x1).await?[0].value, b("uno"));
    first.delete(&x1).await?;
    first.delete(&x1).await?; // deleting a missing key is fine
    assert_eq!(listed(&first, prefix).await?, [x2.clone(), y1.clone()]);
    assert_eq!(
        listed(&second, prefix).await?,
        [x2.clone(), y1.clone()],
        "other handle sees keys"
    );
    second.delete(&x2).await?;
    let after = listed(&first, prefix).await?;
    assert_eq!(
        after,
        [x2.clone(), y1.clone()],
        "a handle must not delete another's key"
    );
    first.revoke().await?;
    second.revoke().await?;
    Ok(())
}

/// Arbitrary bytes come back unchanged through list and watch.
pub async fn values_round_trip<F, Fut>(open: F, prefix: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    let handle = open().await?;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut xorshift = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state.to_le_bytes()[0]
    };
    let large: Vec<u8> = (0..64 * 1024).map(|_| xorshift()).collect();
    let mut expected = vec![
        (
            format!("{prefix}bytes"),
            Bytes::from((0..=255).collect::<Vec<u8>>()),
        ),
        (format!("{prefix}empty"), Bytes::new()),
        (format!("{prefix}json"), b("{\"name\":\"漢字 ü\"}")),
        (format!("{prefix}large"), Bytes::from(large)),
    ]
    .into_iter()
    .map(|(key, value)| KeyValue { key, value })
    .collect::<Vec<_>>();
    for kv in &expected {
        handle.put(&kv.key, kv.value.clone()).await?;
    }
    expected.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        handle.list(prefix).await?,
        expected,
        "list returns the exact bytes"
    );
    let mut watch = handle.watch(prefix).await?;
    for kv in expected {
        let put = WatchEvent::Put {
            key: kv.key.clone(),
            value: kv.value,
        };
        assert_eq!(next_event(&mut watch, &kv.key).await, put);
    }
    handle.revoke().await?;
    Ok(())
}

/// A watch reports existing keys (sorted) first, then puts, updates and deletes in order, and
/// nothing outside its prefix.
pub async fn watch_existing_then_changes<F, Fut>(open: F, prefix: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    let (writer, reader) = (open().await?, open().await?);
    let key = |name: &str| format!("{prefix}w/{name}");
    // Shares the prefix as text but not as a directory: `{prefix}w-sibling/k` vs `{prefix}w/`.
    let outside = format!("{prefix}w-sibling/k");
    writer.put(&key("b"), b("2")).await?;
    writer.put(&key("a"), b("1")).await?;
    writer.put(&outside, b("x")).await?;

    let mut watch = reader.watch(&format!("{prefix}w/")).await?;
    expect_put(&mut watch, &key("a"), "1").await;
    expect_put(&mut watch, &key("b"), "2").await;
    writer.put(&key("c"), b("3")).await?;
    expect_put(&mut watch, &key("c"), "3").await;
    writer.put(&key("a"), b("1b")).await?;
    expect_put(&mut watch, &key("a"), "1b").await;
    writer.delete(&key("b")).await?;
    let deleted = WatchEvent::Delete { key: key("b") };
    assert_eq!(next_event(&mut watch, "delete of b").await, deleted);

    // Changes outside the prefix are not reported; the sentinel must be the very next event,
    // which also proves nothing above was reported twice.
    writer.put(&outside, b("y")).await?;
    writer.delete(&outside).await?;
    writer.put(&key("sentinel"), b("s")).await?;
    expect_put(&mut watch, &key("sentinel"), "s").await;
    writer.revoke().await?;
    reader.revoke().await?;
    Ok(())
}

/// Many quick puts are each reported exactly once with their value.
pub async fn burst_of_puts_is_seen_once<F, Fut>(open: F, prefix: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    const NUM_KEYS: usize = 40;
    let writer = open().await?;
    let mut watch = writer.watch(prefix).await?;
    for index in 0..NUM_KEYS {
        let key = format!("{prefix}k{index:03}");
        writer.put(&key, Bytes::from(index.to_string())).await?;
    }
    let mut seen = BTreeSet::new();
    while seen.len() < NUM_KEYS {
        match next_event(&mut watch, "burst put").await {
            WatchEvent::Put { key, value } => {
                let index = key.trim_start_matches(&format!("{prefix}k"));
                let index = index.parse::<usize>().unwrap_or(usize::MAX);
                assert_eq!(value, Bytes::from(index.to_string()), "value of {key}");
                assert!(seen.insert(key.clone()), "{key} reported twice");
            }
            other => panic!("unexpected {other:?} during a burst of puts"),
        }
    }
    let sentinel = format!("{prefix}zz-sentinel");
    writer.put(&sentinel, b("s")).await?;
    expect_put(&mut watch, &sentinel, "s").await;
    writer.revoke().await?;
    Ok(())
}

/// Awaits one delete for each of `expected` (in any order).
async fn expect_deletes(watch: &mut WatchStream, expected: &[&str], what: &str) {
    let mut pending: BTreeSet<&str> = expected.iter().copied().collect();
    while !pending.is_empty() {
        match next_event(watch, what).await {
            WatchEvent::Delete { key } => {
                assert!(
                    pending.remove(key.as_str()),
                    "unexpected delete of {key} ({what})"
                );
            }
            other => panic!("expected deletes ({what}), got {other:?}"),
        }
    }
}

/// Revoke deletes every key of the handle (and only those); watchers see the deletes and the
/// revoked handle can no longer put.
pub async fn revoke_removes_all_keys<F, Fut>(open: F, prefix: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    let (leaving, staying) = (open().await?, open().await?);
    let [k1, k2, kept] = ["a/1", "b/2", "c/kept"].map(|name| format!("{prefix}{name}"));
    leaving.put(&k1, b("1")).await?;
    leaving.put(&k2, b("2")).await?;
    staying.put(&kept, b("k")).await?;
    let mut watch = staying.watch(prefix).await?;
    for _ in 0..3 {
        let event = next_event(&mut watch, "existing key").await;
        assert!(matches!(event, WatchEvent::Put { .. }), "{event:?}");
    }
    leaving.revoke().await?;
    expect_deletes(&mut watch, &[&k1, &k2], "revoked keys").await;
    let sentinel = format!("{prefix}d/sentinel");
    staying.put(&sentinel, b("s")).await?;
    expect_put(&mut watch, &sentinel, "s").await;
    assert_eq!(
        listed(&staying, prefix).await?,
        [kept.clone(), sentinel.clone()]
    );
    let put_again = leaving.put(&k1, b("again")).await;
    assert!(
        put_again.is_err(),
        "a revoked handle must not register keys"
    );
    staying.revoke().await?;
    Ok(())
}

/// A handle that stops heartbeating (crashes) loses its keys within `deadline`, and watchers
/// see the deletes. `open` must give every handle the same (short) TTL.
pub async fn expiry_after_crash<F, Fut>(open: F, prefix: &str, deadline: Duration) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(Arc<dyn Discovery>, Crash)>>,
{
    let (crashing, crash) = open().await?;
    let (watching, _) = open().await?;
    let (k1, k2) = (format!("{prefix}e/1"), format!("{prefix}e/2"));
    crashing.put(&k1, b("1")).await?;
    crashing.put(&k2, b("2")).await?;
    let mut watch = watching.watch(prefix).await?;
    expect_put(&mut watch, &k1, "1").await;
    expect_put(&mut watch, &k2, "2").await;
    crash();
    let started = tokio::time::Instant::now();
    let keys = [k1.as_str(), k2.as_str()];
    let expired = expect_deletes(&mut watch, &keys, "expired keys");
    if tokio::time::timeout(deadline, expired).await.is_err() {
        panic!("crashed handle's keys still present after {deadline:?}");
    }
    tracing::info!(elapsed_ms = started.elapsed().as_millis(), "keys expired");
    assert!(
        watching.list(prefix).await?.is_empty(),
        "expired keys must not be listed"
    );
    watching.revoke().await?;
    Ok(())
}

fn sample_card(name: &str) -> Result<ModelCard> {
    let json = |text: &str| {
        serde_json::from_str(text).map_err(|e| crate::Error::Discovery(format!("sample: {e}")))
    };
    Ok(ModelCard {
        display_name: name.to_owned(),
        source_path: "Qwen/Qwen3-0.6B".into(),
        tokenizer: Some("/models/tokenizer.json".into()),
        context_length: 40960,
        kv_cache_block_size: 16,
        model_type: 3,
        model_input: "Tokens".into(),
        lora: Some(LoraInfo {
            name: "my-lora".into(),
            max_gpu_lora_count: Some(2),
        }),
        user_data: Some(json(r#"{"b":[1,"two",null],"a":{"nested":true},"c":1.5}"#)?),
        runtime_config: Some(ModelRuntimeConfig {
            total_kv_blocks: Some(u64::MAX),
            exclude_tools_when_tool_choice_none: Some(false),
            data_parallel_size: 2,
            runtime_data: Some(json(r#"{"stream_interval":4}"#)?),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Typed records round-trip through the registry, watches honour the namespace filter, and
/// undecodable values are skipped without ending the watch.
pub async fn registry_round_trip<F, Fut>(open: F, namespace: &str) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Discovery>>>,
{
    let (worker, watcher) = (Registry::new(open().await?), Registry::new(open().await?));
    let id = worker.instance_id();
    let exact = || NamespaceFilter::Exact(namespace.into());
    let sub_namespace = format!("{namespace}-sub");
    let mut instances = watcher.watch_instances(exact()).await?;
    let mut models = watcher
        .watch_models(NamespaceFilter::Prefix(namespace.into()))
        .await?;

    let instance = InstanceRecord {
        namespace: namespace.into(),
        component: "backend".into(),
        endpoint: "generate".into(),
        address: "127.0.0.1:9000".into(),
        transport: "grpc".into(),
        device_type: "cpu".into(),
        metadata: [("kv_partitions".to_owned(), "16".to_owned())].into(),
        version: "0.1.0".into(),
        started_at_ms: u64::MAX - 1,
        ..Default::default()
    };
    let instance_key = worker.register_instance(&instance).await?;
    assert_eq!(instance_key.instance_id, id, "id 0 means this process");
    let stored = InstanceRecord {
        instance_id: id,
        ..instance.clone()
    };
    let added = next_typed(&mut instances, "instance added").await;
    assert_eq!(added, RecordEvent::Added(stored.clone()));
    let elsewhere = InstanceRecord {
        namespace: sub_namespace.clone(),
        ..instance.clone()
    };
    worker.register_instance(&elsewhere).await?;
    let foreign = InstanceRecord {
        instance_id: id ^ 1,
        ..instance.clone()
    };
    assert!(
        worker.register_instance(&foreign).await.is_err(),
        "another process's id"
    );

    let card = sample_card("Qwen/Qwen3-0.6B")?;
    let model = ModelRecord {
        namespace: namespace.into(),
        model: "Qwen/Qwen3-0.6B".into(),
        component: "backend".into(),
        endpoint: "generate".into(),
        card: Some(card.clone()),
        card_checksum: "stale".into(),
        ..Default::default()
    };
    let model_key = worker.register_model(&model).await?;
    let checksum = card_checksum(&card);
    let stored_model = ModelRecord {
        instance_id: id,
        card_checksum: checksum,
        ..model.clone()
    };
    let added = next_typed(&mut models, "model added").await;
    assert_eq!(added, RecordEvent::Added(stored_model.clone()));

    // An undecodable value is skipped; the next good record still arrives.
    let broken = names::model_key(namespace, "broken", id);
    worker.discovery().put(&broken, b("{not json")).await?;
    let sub_model = ModelRecord {
        namespace: sub_namespace.clone(),
        model: "m2".into(),
        ..model
    };
    worker.register_model(&sub_model).await?;
    match next_typed(&mut models, "model in prefixed namespace").await {
        RecordEvent::Added(record) => assert_eq!(
            (record.namespace, record.model.as_str()),
            (sub_namespace, "m2")
        ),
        other => panic!("expected the m2 model, got {other:?}"),
    }

    assert_eq!(watcher.list_instances(&exact()).await?, [stored]);
    let prefixed = watcher
        .list_instances(&NamespaceFilter::Prefix(namespace.into()))
        .await?;
    assert_eq!(prefixed.len(), 2, "both namespaces start with {namespace}");
    let all_models = watcher.list_models(&NamespaceFilter::All).await?;
    assert!(
        all_models.contains(&stored_model),
        "list_models(All) has the model"
    );
    assert_eq!(watcher.list_models(&exact()).await?, [stored_model]);

    worker.unregister_model(&model_key).await?;
    let model = "Qwen/Qwen3-0.6B".to_owned();
    let removed = ModelKey {
        namespace: namespace.into(),
        model,
        instance_id: id,
    };
    let event = next_typed(&mut models, "model removed").await;
    assert_eq!(event, RecordEvent::Removed(removed));
    worker.unregister_instance(&instance_key).await?;
    let event = next_typed(&mut instances, "instance removed").await;
    assert_eq!(event, RecordEvent::Removed(instance_key));

    // The instance in the other namespace never reached the exact-namespace watcher.
    let sentinel = InstanceRecord {
        endpoint: "sentinel".into(),
        ..instance
    };
    worker.register_instance(&sentinel).await?;
    match next_typed(&mut instances, "sentinel instance").await {
        RecordEvent::Added(record) => assert_eq!(record.endpoint, "sentinel"),
        other => panic!("expected the sentinel instance, got {other:?}"),
    }
    worker.discovery().revoke().await?;
    watcher.discovery().revoke().await?;
    Ok(())
}
