//! Unit tests of the etcd backend against a real etcd (the conformance suite covers the rest).

use super::*;

#[test]
fn endpoints_parse_from_a_comma_list() {
    assert_eq!(
        parse_endpoints(" http://a:1, ,http://b:2 "),
        vec!["http://a:1".to_owned(), "http://b:2".to_owned()]
    );
    assert!(parse_endpoints("").is_empty());
}

/// A watcher whose revision was compacted away re-lists and reports only the difference.
#[tokio::test]
async fn compacted_watch_relists_the_difference() {
    let endpoints = match std::env::var("ETCD_ENDPOINTS") {
        Ok(list) if !list.trim().is_empty() => parse_endpoints(&list),
        _ if std::env::var("KVMESH_SKIP_EXTERNAL").as_deref() == Ok("1") => return,
        _ => panic!(
            "ETCD_ENDPOINTS is not set: this test needs a real etcd (or set KVMESH_SKIP_EXTERNAL=1 to skip it)"
        ),
    };
    let mut client = Client::connect(&endpoints, None).await.unwrap();
    let id = super::super::mem::random_instance_id();
    let prefix = format!("/kvmesh/conformance-compact-{id:x}/");
    let key = |name: &str| format!("{prefix}{name}");
    let put = |name: &str, value: &'static str| WatchEvent::Put {
        key: key(name),
        value: Bytes::from_static(value.as_bytes()),
    };
    let mut known = BTreeMap::new();
    for (name, value) in [("same", "s"), ("changed", "old"), ("gone", "g")] {
        let response = client.put(key(name), value, None).await.unwrap();
        let revision = response.header().unwrap().revision();
        known.insert(key(name), (revision, Bytes::from_static(value.as_bytes())));
    }
    let seen_revision = known[&key("gone")].0;
    client.put(key("changed"), "new", None).await.unwrap();
    client.delete(key("gone"), None).await.unwrap();
    let latest = client.put(key("added"), "a", None).await.unwrap();
    let latest = latest.header().unwrap().revision();
    client.compact(latest, None).await.unwrap();

    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let (client2, prefix2) = (client.clone(), prefix.clone());
    let revision = seen_revision;
    let watcher = PrefixWatcher::new(client2, &prefix2, revision, known, events_tx);
    tokio::spawn(watcher.run());
    let mut next = async || {
        let event = timeout(Duration::from_secs(15), events_rx.recv()).await;
        event.unwrap().unwrap()
    };
    assert_eq!(next().await, WatchEvent::Delete { key: key("gone") });
    assert_eq!(next().await, put("added", "a"));
    assert_eq!(next().await, put("changed", "new"));
    // `same` did not change, so the next event is a later put.
    client.put(key("later"), "l", None).await.unwrap();
    assert_eq!(next().await, put("later", "l"));
    let everything = etcd_client::DeleteOptions::new().with_prefix();
    client
        .delete(prefix.as_str(), Some(everything))
        .await
        .unwrap();
}

#[tokio::test]
async fn unreachable_etcd_is_an_error_not_a_hang() {
    let endpoints = vec!["http://127.0.0.1:1".to_owned()];
    let started = Instant::now();
    let result = EtcdDiscovery::connect(&endpoints).await;
    assert!(matches!(result, Err(Error::Discovery(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(25));
}
