//! Runs the discovery conformance suite against every backend: memory, files (a temp dir) and a
//! real etcd from `ETCD_ENDPOINTS`. Without `ETCD_ENDPOINTS` the etcd tests fail, unless
//! `KVMESH_SKIP_EXTERNAL=1` says to skip them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvmesh_runtime::discovery::conformance::{self as suite, Crash};
use kvmesh_runtime::discovery::etcd::{EtcdDiscovery, parse_endpoints};
use kvmesh_runtime::discovery::file::FileDiscovery;
use kvmesh_runtime::discovery::mem::MemStore;
use kvmesh_runtime::discovery::{Discovery, RegistrationState, RegistrationStatus, WatchEvent};
use kvmesh_runtime::{Error, Result};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Open = Box<dyn Fn() -> BoxFuture<Result<Arc<dyn Discovery>>> + Send + Sync>;
type OpenCrashable = Box<dyn Fn() -> BoxFuture<Result<(Arc<dyn Discovery>, Crash)>> + Send + Sync>;

/// Deadline for a crashed handle's keys to disappear: TTL (2-3 s) plus generous slack.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(15);

/// The etcd endpoints, `None` to skip, or a panic when etcd is required but not configured.
fn etcd_endpoints() -> Option<Vec<String>> {
    match std::env::var("ETCD_ENDPOINTS") {
        Ok(list) if !list.trim().is_empty() => Some(parse_endpoints(&list)),
        _ if std::env::var("KVMESH_SKIP_EXTERNAL").as_deref() == Ok("1") => {
            eprintln!("skipping etcd test: ETCD_ENDPOINTS not set and KVMESH_SKIP_EXTERNAL=1");
            None
        }
        _ => panic!(
            "ETCD_ENDPOINTS is not set: the etcd conformance tests need a real etcd \
             (e.g. ETCD_ENDPOINTS=http://127.0.0.1:2379), or set KVMESH_SKIP_EXTERNAL=1 to skip them"
        ),
    }
}

fn mem_open() -> Option<Open> {
    let store = MemStore::new();
    Some(Box::new(move || {
        let handle: Arc<dyn Discovery> = Arc::new(store.handle());
        Box::pin(async move { Ok(handle) })
    }))
}

fn mem_open_crashable() -> Option<OpenCrashable> {
    let store = MemStore::new();
    Some(Box::new(move || {
        let handle = Arc::new(store.handle());
        let crashing = Arc::clone(&handle);
        let crash: Crash = Box::new(move || crashing.abort_keepalive());
        Box::pin(async move { Ok((handle as Arc<dyn Discovery>, crash)) })
    }))
}

fn file_open() -> Option<Open> {
    let dir = Arc::new(tempfile::tempdir().ok()?);
    Some(Box::new(move || {
        let dir = Arc::clone(&dir);
        Box::pin(async move {
            let handle: Arc<dyn Discovery> = Arc::new(FileDiscovery::new(dir.path())?);
            Ok(handle)
        })
    }))
}

fn file_open_crashable() -> Option<OpenCrashable> {
    let dir = Arc::new(tempfile::tempdir().ok()?);
    Some(Box::new(move || {
        let dir = Arc::clone(&dir);
        Box::pin(async move {
            let handle = Arc::new(FileDiscovery::with_ttl(dir.path(), Duration::from_secs(2))?);
            let crashing = Arc::clone(&handle);
            let crash: Crash = Box::new(move || crashing.abort_keepalive());
            Ok((handle as Arc<dyn Discovery>, crash))
        })
    }))
}

fn etcd_open() -> Option<Open> {
    let endpoints = etcd_endpoints()?;
    Some(Box::new(move || {
        let endpoints = endpoints.clone();
        Box::pin(async move {
            let handle: Arc<dyn Discovery> = Arc::new(EtcdDiscovery::connect(&endpoints).await?);
            Ok(handle)
        })
    }))
}

fn etcd_open_crashable() -> Option<OpenCrashable> {
    let endpoints = etcd_endpoints()?;
    Some(Box::new(move || {
        let endpoints = endpoints.clone();
        Box::pin(async move {
            let ttl = Duration::from_secs(3);
            let handle = Arc::new(EtcdDiscovery::connect_with_ttl(&endpoints, ttl).await?);
            let crashing = Arc::clone(&handle);
            let crash: Crash = Box::new(move || crashing.abort_keepalive());
            Ok((handle as Arc<dyn Discovery>, crash))
        })
    }))
}

macro_rules! discovery_suite {
    ($backend:ident, $open:ident, $open_crashable:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn put_list_delete() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                suite::put_list_delete(open, &suite::unique_prefix(stringify!($backend))).await
            }

            #[tokio::test]
            async fn values_round_trip() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                suite::values_round_trip(open, &suite::unique_prefix(stringify!($backend))).await
            }

            #[tokio::test]
            async fn watch_existing_then_changes() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                let prefix = suite::unique_prefix(stringify!($backend));
                suite::watch_existing_then_changes(open, &prefix).await
            }

            #[tokio::test]
            async fn burst_of_puts_is_seen_once() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                let prefix = suite::unique_prefix(stringify!($backend));
                suite::burst_of_puts_is_seen_once(open, &prefix).await
            }

            #[tokio::test]
            async fn revoke_removes_all_keys() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                let prefix = suite::unique_prefix(stringify!($backend));
                suite::revoke_removes_all_keys(open, &prefix).await
            }

            #[tokio::test]
            async fn expiry_after_crash() -> Result<()> {
                let Some(open) = $open_crashable() else {
                    return Ok(());
                };
                let prefix = suite::unique_prefix(stringify!($backend));
                suite::expiry_after_crash(open, &prefix, EXPIRY_DEADLINE).await
            }

            #[tokio::test]
            async fn registry_round_trip() -> Result<()> {
                let Some(open) = $open() else { return Ok(()) };
                let namespace = suite::unique_namespace(stringify!($backend));
                suite::registry_round_trip(open, &namespace).await
            }
        }
    };
}

discovery_suite!(mem, mem_open, mem_open_crashable);
discovery_suite!(file, file_open, file_open_crashable);
discovery_suite!(etcd, etcd_open, etcd_open_crashable);

/// Waits until `discovery`'s registration is in `state`.
async fn registration_reaches(
    discovery: &dyn Discovery,
    state: RegistrationState,
    within: Duration,
) -> Result<RegistrationStatus> {
    registration_where(discovery, within, |status| status.state == state).await
}

/// Waits until `discovery`'s registration is held again after `num_losses` losses.
async fn registration_recovers(
    discovery: &dyn Discovery,
    num_losses: u64,
    within: Duration,
) -> Result<RegistrationStatus> {
    registration_where(discovery, within, |status| {
        status.state == RegistrationState::Held && status.num_losses == num_losses
    })
    .await
}

/// Waits until `discovery`'s registration satisfies `wanted`.
async fn registration_where(
    discovery: &dyn Discovery,
    within: Duration,
    wanted: impl Fn(&RegistrationStatus) -> bool,
) -> Result<RegistrationStatus> {
    let mut registration = discovery.registration();
    tokio::time::timeout(within, async {
        loop {
            let status = *registration.borrow_and_update();
            if wanted(&status) {
                return status;
            }
            if registration.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    })
    .await
    .map_err(|_| Error::Discovery(format!("registration not as wanted within {within:?}")))
}

/// etcd only: when the lease is revoked behind the process's back, the registration turns
/// `Lost` and then `Held` again: the lease is granted again under the same id and every key is
/// put back, so the instance id and the records stay the same.
#[tokio::test]
async fn etcd_lease_revoked_elsewhere_is_granted_again_with_its_records() -> Result<()> {
    let Some(endpoints) = etcd_endpoints() else {
        return Ok(());
    };
    let discovery = EtcdDiscovery::connect_with_ttl(&endpoints, Duration::from_secs(3)).await?;
    let prefix = suite::unique_prefix("etcd-lost");
    let (key, gone) = (format!("{prefix}k"), format!("{prefix}gone"));
    discovery.put(&key, Bytes::from_static(b"v")).await?;
    discovery.put(&gone, Bytes::from_static(b"g")).await?;
    discovery.delete(&gone).await?;
    let mut lease_client = discovery.client().lease_client();
    let lease_id =
        i64::try_from(discovery.instance_id()).map_err(|e| Error::Discovery(e.to_string()))?;
    lease_client
        .revoke(lease_id)
        .await
        .map_err(|e| Error::Discovery(e.to_string()))?;
    assert!(
        discovery.list(&prefix).await?.is_empty(),
        "revoked: keys gone"
    );
    registration_recovers(&discovery, 1, Duration::from_secs(15)).await?;
    let listed = discovery.list(&prefix).await?;
    assert_eq!(listed.len(), 1, "only the live key comes back: {listed:?}");
    assert_eq!(
        (listed[0].key.as_str(), &listed[0].value[..]),
        (key.as_str(), &b"v"[..])
    );
    let leases = lease_client
        .leases()
        .await
        .map_err(|e| Error::Discovery(e.to_string()))?;
    assert!(
        leases.leases().iter().any(|lease| lease.id() == lease_id),
        "the same lease id is granted again"
    );
    discovery.put(&key, Bytes::from_static(b"w")).await?;
    assert_eq!(&discovery.list(&key).await?[0].value[..], b"w");
    discovery.revoke().await?;
    Ok(())
}

/// A private etcd on free ports that a test can kill and restart, on the same data directory or
/// on a fresh one (an etcd restored from nothing).
struct PrivateEtcd {
    client_port: u16,
    peer_port: u16,
    process: Option<tokio::process::Child>,
}

impl PrivateEtcd {
    fn new() -> Result<Self> {
        Ok(Self {
            client_port: free_port()?,
            peer_port: free_port()?,
            process: None,
        })
    }

    fn endpoints(&self) -> Vec<String> {
        vec![format!("http://127.0.0.1:{}", self.client_port)]
    }

    fn start(&mut self, data: &std::path::Path) -> Result<()> {
        let (client, peer) = (self.client_port, self.peer_port);
        let process = tokio::process::Command::new("etcd")
            .arg("--data-dir")
            .arg(data)
            .args([
                "--name",
                "restart",
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("restart=http://127.0.0.1:{peer}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Discovery(format!("etcd must be installed: {e}")))?;
        self.process = Some(process);
        Ok(())
    }

    async fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.start_kill();
            let _ = process.wait().await;
        }
    }

    /// A client of the private etcd once it answers; an error when it exited (its port taken)
    /// or did not answer within 30 s.
    async fn connect(&mut self, ttl: Duration) -> Result<EtcdDiscovery> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(discovery) = EtcdDiscovery::connect_with_ttl(&self.endpoints(), ttl).await {
                return Ok(discovery);
            }
            let exited = match self.process.as_mut() {
                Some(process) => process.try_wait()?.is_some(),
                None => true,
            };
            if exited || tokio::time::Instant::now() > deadline {
                return Err(Error::Discovery(format!(
                    "the private etcd on port {} is not serving (exited: {exited})",
                    self.client_port
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A port below the kernel's ephemeral range (where outgoing connections take theirs, so one
/// picked there can be taken before etcd binds it) that is free now.
fn free_port() -> Result<u16> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos())
        ^ std::process::id().wrapping_mul(7919);
    (0..1000u32)
        .map(|i| 20_000 + (seed.wrapping_add(i.wrapping_mul(104_729)) % 12_000) as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .ok_or_else(|| Error::Discovery("no free port below the ephemeral range".into()))
}

/// etcd only: an etcd that restarts after being down for longer than the lease TTL still holds
/// the lease (it renews every lease when it comes back), so the process keeps its registration
/// instead of giving up while etcd was unreachable. Runs a private etcd it can kill.
#[tokio::test]
async fn etcd_down_longer_than_the_ttl_then_back_keeps_the_lease() -> Result<()> {
    if etcd_endpoints().is_none() {
        return Ok(());
    }
    let data = tempfile::tempdir()?;
    let mut etcd = PrivateEtcd::new()?;
    etcd.start(data.path())?;
    let discovery = etcd.connect(Duration::from_secs(2)).await?;
    discovery
        .put("/restart/k", Bytes::from_static(b"v"))
        .await?;
    etcd.kill().await;
    registration_reaches(
        &discovery,
        RegistrationState::Unreachable,
        Duration::from_secs(5),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await; // 2.5 TTLs without etcd
    etcd.start(data.path())?;
    // Back: the lease was renewed by the restart and the keep-alive resumes on it.
    let listed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(entries) = discovery.list("/restart/").await {
                return entries;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .map_err(|_| Error::Discovery("etcd did not come back".into()))?;
    assert_eq!(listed.len(), 1, "the key of the live lease is still there");
    let status =
        registration_reaches(&discovery, RegistrationState::Held, Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_secs(5)).await; // more than a TTL of keep-alives
    assert_eq!(status.num_losses, 0, "the lease was given up");
    assert_eq!(
        discovery.registration().borrow().state,
        RegistrationState::Held
    );
    assert_eq!(discovery.list("/restart/").await?.len(), 1);
    Ok(())
}

/// etcd only: an etcd that comes back empty (restored from nothing, its revision back at the
/// start) has lost every lease: each process grants its lease again under the same id and puts
/// its keys back, and a watcher of another process re-lists without reporting the keys that
/// came back as deleted, while a key whose owner never came back is reported deleted once the
/// settling time is over.
#[tokio::test]
async fn etcd_restored_empty_gets_every_registration_back_without_watchers_seeing_a_gap()
-> Result<()> {
    if etcd_endpoints().is_none() {
        return Ok(());
    }
    let (first, second) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut etcd = PrivateEtcd::new()?;
    etcd.start(first.path())?;
    let owner = etcd.connect(Duration::from_secs(2)).await?;
    let crashed = etcd.connect(Duration::from_secs(2)).await?;
    let watcher = etcd.connect(Duration::from_secs(2)).await?;
    owner.put("/restore/a", Bytes::from_static(b"1")).await?;
    crashed.put("/restore/b", Bytes::from_static(b"2")).await?;
    // Revisions the empty etcd will not reach before the watcher resumes.
    for index in 0..50 {
        owner
            .put("/other/k", Bytes::from(format!("{index}")))
            .await?;
    }
    let mut watch = watcher.watch("/restore/").await?;
    for _ in 0..2 {
        suite::next_event(&mut watch, "initial key").await;
    }
    crashed.abort_keepalive();
    etcd.kill().await;
    etcd.start(second.path())?;
    // The lease was lost and granted again.
    registration_recovers(&owner, 1, Duration::from_secs(30)).await?;
    let listed = owner.list("/restore/").await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, "/restore/a");
    // Only the key of the process that never came back goes, after settling.
    let event = tokio::time::timeout(
        Duration::from_secs(30),
        futures::StreamExt::next(&mut watch),
    )
    .await
    .map_err(|_| Error::Discovery("no delete within 30 s".into()))?;
    assert_eq!(
        event,
        Some(WatchEvent::Delete {
            key: "/restore/b".into()
        })
    );
    owner.put("/restore/c", Bytes::from_static(b"3")).await?;
    assert_eq!(
        suite::next_event(&mut watch, "a later put").await,
        WatchEvent::Put {
            key: "/restore/c".into(),
            value: Bytes::from_static(b"3")
        }
    );
    Ok(())
}

#[path = "discovery_conformance/file_only.rs"]
mod file_only;
