//! Files a process re-reads while it runs (the edge's certificate and key, key lists): they are
//! read again every [`RELOAD_INTERVAL`] and handed on only when their contents changed, so a
//! certificate renewed in place, a Kubernetes secret swapped through its symlink, or a key added
//! to a list takes effect without a restart.
//!
//! Polling rather than file notifications: it sees every way a file can be replaced (rename,
//! symlink swap, write in place, a mount remounted) at the cost of reading a few small files
//! every couple of seconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use tokio_util::sync::CancellationToken;

/// How often watched files are read again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// A set of files and a digest of what they held when last read.
#[derive(Debug)]
pub struct WatchedFiles {
    paths: Vec<PathBuf>,
    last: Option<u64>,
}

impl WatchedFiles {
    /// The files at `paths`, not read yet.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self { paths, last: None }
    }

    /// Reads every file: their contents when they differ from the last read (always on the
    /// first), `Ok(None)` when nothing changed. A read error counts as a change of its own, so
    /// the same error is reported once rather than on every read.
    pub fn read_if_changed(&mut self) -> Result<Option<Vec<Vec<u8>>>, String> {
        let read: Result<Vec<Vec<u8>>, String> = self
            .paths
            .iter()
            .map(|path| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display())))
            .collect();
        let digest = match &read {
            Ok(contents) => {
                let mut hasher = xxhash_rust::xxh3::Xxh3::new();
                for content in contents {
                    hasher.update(&(content.len() as u64).to_le_bytes());
                    hasher.update(content);
                }
                hasher.digest()
            }
            Err(error) => xxhash_rust::xxh3::xxh3_64(error.as_bytes()) ^ u64::MAX,
        };
        if self.last == Some(digest) {
            return Ok(None);
        }
        self.last = Some(digest);
        read.map(Some)
    }
}

/// What a set of files describes (the edge's or the mesh's TLS configurations), built from their
/// contents at start and built again when they change; a rebuild that fails keeps the last one.
pub struct Reloaded<F, S> {
    files: F,
    state: ArcSwap<S>,
    build: fn(&F, &[Vec<u8>]) -> Result<S, String>,
}

impl<F: std::fmt::Debug, S> std::fmt::Debug for Reloaded<F, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloaded")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<F, S> Reloaded<F, S> {
    /// Reads `watched` (the files `files` names, in the order `build` expects) and builds the
    /// state; the returned [`WatchedFiles`] remember what was read, for [`watch_files`].
    pub fn open(
        files: F,
        mut watched: WatchedFiles,
        build: fn(&F, &[Vec<u8>]) -> Result<S, String>,
    ) -> Result<(Self, WatchedFiles), String> {
        let contents = watched.read_if_changed()?.unwrap_or_default();
        let state = build(&files, &contents)?;
        let reloaded = Self {
            files,
            state: ArcSwap::from_pointee(state),
            build,
        };
        Ok((reloaded, watched))
    }

    /// Replaces the state with one built from `contents` (the files' new contents); on an error
    /// the current one stays.
    pub fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        let state = (self.build)(&self.files, contents)?;
        self.state.store(Arc::new(state));
        Ok(())
    }

    /// The current state.
    pub fn load(&self) -> Guard<Arc<S>> {
        self.state.load()
    }

    /// The files.
    pub fn files(&self) -> &F {
        &self.files
    }
}

/// Reads `files` every [`RELOAD_INTERVAL`] until `stop` and hands changed contents to `apply`;
/// an error (unreadable files, or `apply` refusing the new contents, which then leaves the old
/// state in place) is logged once per distinct contents. `what` names the files in the logs.
pub async fn watch_files(
    what: &'static str,
    mut files: WatchedFiles,
    stop: CancellationToken,
    mut apply: impl FnMut(&[Vec<u8>]) -> Result<(), String> + Send,
) -> Result<(), std::convert::Infallible> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(RELOAD_INTERVAL) => {}
        }
        match files.read_if_changed().and_then(|changed| match changed {
            Some(contents) => apply(&contents).map(|()| true),
            None => Ok(false),
        }) {
            Ok(true) => tracing::info!(what, "reloaded"),
            Ok(false) => {}
            Err(error) => tracing::error!(what, %error, "reload failed; keeping the loaded ones"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_errors_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "a").unwrap();
        let mut files = WatchedFiles::new(vec![path.clone()]);
        assert_eq!(files.read_if_changed().unwrap(), Some(vec![b"a".to_vec()]));
        assert_eq!(files.read_if_changed().unwrap(), None);
        std::fs::remove_file(&path).unwrap();
        assert!(files.read_if_changed().is_err());
        assert_eq!(files.read_if_changed().unwrap(), None);
        std::fs::write(&path, "a").unwrap();
        assert_eq!(files.read_if_changed().unwrap(), Some(vec![b"a".to_vec()]));
        std::fs::write(&path, "b").unwrap();
        assert_eq!(files.read_if_changed().unwrap(), Some(vec![b"b".to_vec()]));
    }
}
