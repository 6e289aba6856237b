//! File discovery: one file per key under a shared directory, for many processes on one host.
//!
//! A key `/kvmesh/...` is the file `{root}/kvmesh/...` (docs/discovery.md, "Instance ids and
//! leases"). Writes go to a temp file under `{root}/.kvmesh-tmp/` renamed into place, so readers
//! never see half a value. Liveness is the file's mtime: the owner touches its files every TTL/3
//! (at least 1 s), and a file older than the TTL is expired, which watchers report as a delete
//! (and then remove the file).
//! Watchers combine filesystem notifications with a rescan every second, diffing each scan
//! against what they already reported, so they never report a change twice; a key that appears
//! and vanishes between two scans may go unseen.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;

use self::scan::{is_expired, remove_expired, scan};
use super::mem::random_instance_id;
use super::{Discovery, KeyValue, RegistrationState, RegistrationStatus, WatchEvent, WatchStream};
use crate::{Error, Result};

/// How long a key file lives without being touched (docs/discovery.md, "Instance ids and
/// leases").
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// How often watchers rescan even without filesystem notifications.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// The shortest heartbeat period, whatever the TTL.
const MIN_HEARTBEAT: Duration = Duration::from_secs(1);

/// Directory under the root holding temp files before they are renamed into place.
const TMP_DIR: &str = ".kvmesh-tmp";

/// The root used when `DYN_FILE_KV` is not set: `$TMPDIR/dynamo_store_kv`, as Dynamo.
pub fn default_root() -> PathBuf {
    std::env::temp_dir().join("dynamo_store_kv")
}

/// Maps a key to its file, rejecting keys that could escape the root or are not file paths.
fn key_path(root: &Path, key: &str) -> Result<PathBuf> {
    let invalid = |why: &str| Err(Error::Discovery(format!("invalid key {key:?}: {why}")));
    let Some(rest) = key.strip_prefix('/') else {
        return invalid("must start with '/'");
    };
    let mut path = root.to_path_buf();
    for (index, segment) in rest.split('/').enumerate() {
        if segment.is_empty() || segment == "." || segment == ".." || segment.contains('\0') {
            return invalid("empty, '.', '..' or NUL segment");
        }
        if index == 0 && segment.starts_with(TMP_DIR) {
            return invalid("reserved segment");
        }
        path.push(segment);
    }
    Ok(path)
}

fn io_error(what: &str, path: &Path, error: &std::io::Error) -> Error {
    Error::Discovery(format!("{what} {}: {error}", path.display()))
}

struct Shared {
    root: PathBuf,
    ttl: Duration,
    instance_id: u64,
    /// Keys this process owns, with their values; held while writing or removing their files.
    owned: Mutex<BTreeMap<String, Bytes>>,
    is_revoked: AtomicBool,
    registration: tokio::sync::watch::Sender<RegistrationStatus>,
    next_tmp: AtomicU64,
}

impl Shared {
    fn write(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_revoked.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost);
        }
        self.write_file(key, value)?;
        owned.insert(key.to_owned(), Bytes::copy_from_slice(value));
        Ok(())
    }

    /// Writes every owned file again (after others judged this process gone and removed them).
    fn rewrite_all(&self) -> Result<()> {
        let owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, value) in owned.iter() {
            self.write_file(key, value)?;
        }
        Ok(())
    }

    /// Writes `value` at `key`'s path through a temporary file; the caller holds `owned`.
    fn write_file(&self, key: &str, value: &[u8]) -> Result<()> {
        let path = key_path(&self.root, key)?;
        let tmp_dir = self.root.join(TMP_DIR);
        std::fs::create_dir_all(&tmp_dir).map_err(|e| io_error("create", &tmp_dir, &e))?;
        let tmp = tmp_dir.join(format!(
            "{:x}-{}",
            self.instance_id,
            self.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&tmp, value).map_err(|e| io_error("write", &tmp, &e))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error("create", parent, &e))?;
        }
        if let Err(error) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_error("rename into", &path, &error));
        }
        Ok(())
    }

    fn remove(&self, key: &str) -> Result<()> {
        let path = key_path(&self.root, key)?;
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        if owned.remove(key).is_some() {
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != ErrorKind::NotFound => {
                    return Err(io_error("remove", &path, &error));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn remove_all(&self) -> Result<()> {
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        self.is_revoked.store(true, Ordering::SeqCst);
        let mut first_error = None;
        for key in std::mem::take(&mut *owned).into_keys() {
            let Ok(path) = key_path(&self.root, &key) else {
                continue;
            };
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != ErrorKind::NotFound => {
                    first_error.get_or_insert(io_error("remove", &path, &error));
                }
                _ => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Touches every owned file. `false` if one had vanished or had already expired: others
    /// have then seen this process as gone, so its lease is lost.
    fn touch_all(&self) -> bool {
        let owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        let now = SystemTime::now();
        for key in owned.keys() {
            let Ok(path) = key_path(&self.root, key) else {
                continue;
            };
            let touched = std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|file| {
                    let modified = file.metadata()?.modified()?;
                    if is_expired(modified, now, self.ttl) {
                        return Err(std::io::Error::new(ErrorKind::TimedOut, "expired"));
                    }
                    file.set_modified(SystemTime::now())
                });
            match touched {
                Ok(()) => {}
                Err(error) if matches!(error.kind(), ErrorKind::NotFound | ErrorKind::TimedOut) => {
                    tracing::error!(key = %key, error = %error, "discovery file lost, lease lost");
                    return false;
                }
                Err(error) => {
                    tracing::warn!(key = %key, error = %error, "failed to touch discovery file");
                }
            }
        }
        true
    }
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::Discovery(format!("file discovery task failed: {error}")))
}

/// Discovery through files in a directory shared by the processes of one host.
pub struct FileDiscovery {
    shared: Arc<Shared>,
    heartbeat: JoinHandle<()>,
}

impl std::fmt::Debug for FileDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDiscovery")
            .field("root", &self.shared.root)
            .field("ttl", &self.shared.ttl)
            .field("instance_id", &self.shared.instance_id)
            .finish()
    }
}

impl FileDiscovery {
    /// Opens the store at `root` with the default TTL; must run inside a tokio runtime.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        Self::with_ttl(root, DEFAULT_TTL)
    }

    /// Opens the store at `root` with a custom TTL (short ones make expiry tests fast). Every
    /// process sharing a root must use the same TTL.
    pub fn with_ttl(root: impl Into<PathBuf>, ttl: Duration) -> Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| io_error("create", &root, &e))?;
        let shared = Arc::new(Shared {
            root,
            ttl,
            instance_id: random_instance_id(),
            owned: Mutex::new(BTreeMap::new()),
            is_revoked: AtomicBool::new(false),
            registration: tokio::sync::watch::Sender::new(RegistrationStatus::held()),
            next_tmp: AtomicU64::new(0),
        });
        let heartbeat = tokio::spawn(heartbeat(Arc::clone(&shared)));
        Ok(Self { shared, heartbeat })
    }

    /// The directory holding the key files.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    /// Stops touching this process's files, as if it had crashed, for tests: its keys expire
    /// after the TTL.
    #[doc(hidden)]
    pub fn abort_keepalive(&self) {
        self.heartbeat.abort();
    }
}

impl Drop for FileDiscovery {
    fn drop(&mut self) {
        // Without revoke the files stay until they expire, as after a crash.
        self.heartbeat.abort();
    }
}

async fn heartbeat(shared: Arc<Shared>) {
    let period = (shared.ttl / 3).max(MIN_HEARTBEAT);
    loop {
        tokio::time::sleep(period).await;
        if shared.is_revoked.load(Ordering::SeqCst) {
            return;
        }
        let touched = blocking({
            let shared = Arc::clone(&shared);
            move || shared.touch_all()
        })
        .await;
        if matches!(touched, Ok(true)) {
            continue;
        }
        tracing::error!(instance_id = %format!("{:x}", shared.instance_id), "file discovery lease lost; writing the files again");
        RegistrationStatus::enter(&shared.registration, RegistrationState::Lost);
        let rewritten = blocking({
            let shared = Arc::clone(&shared);
            move || shared.rewrite_all()
        })
        .await;
        match rewritten {
            Ok(Ok(())) => RegistrationStatus::enter(&shared.registration, RegistrationState::Held),
            Ok(Err(error)) | Err(error) => {
                tracing::warn!(%error, "rewriting discovery files failed; retrying");
            }
        }
    }
}

#[async_trait]
impl Discovery for FileDiscovery {
    fn instance_id(&self) -> u64 {
        self.shared.instance_id
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let key = key.to_owned();
        blocking(move || shared.write(&key, &value)).await?
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let key = key.to_owned();
        blocking(move || shared.remove(&key)).await?
    }

    async fn list(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let root = self.shared.root.clone();
        let ttl = self.shared.ttl;
        let prefix = prefix.to_owned();
        let found = blocking(move || scan(&root, &prefix, ttl)).await?;
        Ok(found
            .live
            .into_iter()
            .map(|(key, value)| KeyValue { key, value })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        tokio::spawn(watch_loop(
            self.shared.root.clone(),
            self.shared.ttl,
            prefix.to_owned(),
            events_tx,
        ));
        Ok(Box::pin(UnboundedReceiverStream::new(events_rx)))
    }

    async fn revoke(&self) -> Result<()> {
        self.heartbeat.abort();
        let shared = Arc::clone(&self.shared);
        blocking(move || shared.remove_all()).await?
    }

    fn registration(&self) -> tokio::sync::watch::Receiver<RegistrationStatus> {
        self.shared.registration.subscribe()
    }
}

/// Starts filesystem notifications for the directory a prefix lives in; `None` (rescans only)
/// when the platform refuses, e.g. out of inotify instances.
fn start_notify(
    root: &Path,
    prefix: &str,
    wake_tx: mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    let mut dir = root.to_path_buf();
    let dir_part = prefix.rfind('/').map_or("", |end| &prefix[..end]);
    for segment in dir_part
        .split('/')
        .filter(|s| !s.is_empty() && *s != "." && *s != "..")
    {
        dir.push(segment);
    }
    if let Err(error) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %error, "cannot create watch directory");
        return None;
    }
    let handler = move |event: notify::Result<notify::Event>| {
        let is_relevant = event.is_ok_and(|event| {
            !matches!(
                event.kind,
                notify::EventKind::Access(_)
                    | notify::EventKind::Modify(notify::event::ModifyKind::Metadata(_))
            )
        });
        if is_relevant {
            let _ = wake_tx.try_send(());
        }
    };
    let started = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(&dir, notify::RecursiveMode::Recursive)?;
        Ok(watcher)
    });
    match started {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), error = %error, "file notifications unavailable, rescanning only");
            None
        }
    }
}

async fn watch_loop(
    root: PathBuf,
    ttl: Duration,
    prefix: String,
    events_tx: mpsc::UnboundedSender<WatchEvent>,
) {
    let (wake_tx, mut wake_rx) = mpsc::channel(1);
    let _notify = start_notify(&root, &prefix, wake_tx);
    let mut reported: BTreeMap<String, Bytes> = BTreeMap::new();
    loop {
        let found = {
            let (root, prefix) = (root.clone(), prefix.clone());
            blocking(move || scan(&root, &prefix, ttl)).await
        };
        let Ok(found) = found else {
            return;
        };
        let mut events = Vec::new();
        reported.retain(|key, _| {
            let is_live = found.live.contains_key(key);
            if !is_live {
                events.push(WatchEvent::Delete { key: key.clone() });
            }
            is_live
        });
        for (key, value) in found.live {
            if reported.get(&key) != Some(&value) {
                reported.insert(key.clone(), value.clone());
                events.push(WatchEvent::Put { key, value });
            }
        }
        for event in events {
            if events_tx.send(event).is_err() {
                return;
            }
        }
        if !found.expired.is_empty() {
            let _ = blocking(move || remove_expired(&found.expired, ttl)).await;
        }
        tokio::select! {
            () = events_tx.closed() => return,
            _ = wake_rx.recv() => {}
            () = tokio::time::sleep(RESCAN_INTERVAL) => {}
        }
    }
}

mod scan;

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
