//! File discovery only: what the shared conformance suite cannot say about a backend whose
//! liveness is a file's mtime.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use kvmesh_runtime::Result;
use kvmesh_runtime::discovery::conformance as suite;
use kvmesh_runtime::discovery::file::FileDiscovery;
use kvmesh_runtime::discovery::{Discovery, WatchEvent};

use super::registration_recovers;

/// Two file handles on one root: the watcher sees a value written by the other "process" even
/// when the file changes in place several times between scans.
#[tokio::test]
async fn file_watch_values_only_move_forward_through_quick_rewrites() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let writer = FileDiscovery::new(dir.path())?;
    let reader = FileDiscovery::new(dir.path())?;
    let prefix = suite::unique_prefix("file-rewrite");
    let key = format!("{prefix}k");
    let mut watch = reader.watch(&prefix).await?;
    for index in 0..20 {
        writer.put(&key, Bytes::from(format!("v{index}"))).await?;
    }
    // Each reported value must be newer than the last, ending at v19.
    let mut last = -1;
    while last < 19 {
        match suite::next_event(&mut watch, "rewrite").await {
            WatchEvent::Put { value, .. } => {
                let text = String::from_utf8_lossy(&value).to_string();
                let index: i32 = text.trim_start_matches('v').parse().unwrap_or(-1);
                assert!(
                    index > last,
                    "values must move forward: {text} after v{last}"
                );
                last = index;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    Ok(())
}

/// File only: a file whose mtime is older than the TTL is not listed, and a watcher reports it
/// as gone and removes it.
#[tokio::test]
async fn file_expired_files_are_not_listed_and_watchers_remove_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let discovery = FileDiscovery::with_ttl(dir.path(), Duration::from_secs(5))?;
    let prefix = suite::unique_prefix("file-expired");
    let (stale, fresh) = (format!("{prefix}a"), format!("{prefix}b"));
    discovery.put(&stale, Bytes::from_static(b"1")).await?;
    discovery.put(&fresh, Bytes::from_static(b"2")).await?;
    let path = dir.path().join(stale.trim_start_matches('/'));
    let old = SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&path)?
        .set_modified(old)?;
    let listed: Vec<String> = discovery
        .list(&prefix)
        .await?
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(listed, vec![fresh.clone()]);
    let mut watch = discovery.watch(&prefix).await?;
    assert_eq!(
        suite::next_event(&mut watch, "fresh key").await.key(),
        fresh
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expired file not removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// File only: when another process removes an owned file (it judged it expired), the owner's
/// next heartbeat reports the registration lost and writes its files again.
#[tokio::test]
async fn file_losing_an_owned_file_writes_it_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let discovery = FileDiscovery::with_ttl(dir.path(), Duration::from_secs(3))?;
    let key = format!("{}k", suite::unique_prefix("file-lost"));
    discovery.put(&key, Bytes::from_static(b"1")).await?;
    let path = dir.path().join(key.trim_start_matches('/'));
    std::fs::remove_file(&path)?;
    registration_recovers(&discovery, 1, Duration::from_secs(15)).await?;
    assert_eq!(std::fs::read(&path)?, b"1");
    discovery.put(&key, Bytes::from_static(b"2")).await?;
    assert_eq!(&discovery.list(&key).await?[0].value[..], b"2");
    Ok(())
}
