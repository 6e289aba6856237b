//! Reading a prefix of file discovery from disk: which key files are live, which expired.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::TMP_DIR;

/// Whether a key file last touched at `modified` has outlived its TTL at `now`.
pub(super) fn is_expired(modified: SystemTime, now: SystemTime, ttl: Duration) -> bool {
    now.duration_since(modified).is_ok_and(|age| age > ttl)
}

/// What one scan of a prefix found.
#[derive(Default)]
pub(super) struct Scan {
    pub(super) live: BTreeMap<String, Bytes>,
    pub(super) expired: Vec<PathBuf>,
}

/// Reads every live key under `prefix` (blocking). Files vanishing mid-scan are skipped.
pub(super) fn scan(root: &Path, prefix: &str, ttl: Duration) -> Scan {
    let mut out = Scan::default();
    // Walk from the deepest directory the prefix names; keys are filtered by prefix below.
    let dir_part = prefix.rfind('/').map_or("", |end| &prefix[..end]);
    let mut base = root.to_path_buf();
    let mut base_key = String::new();
    for segment in dir_part.split('/').filter(|s| !s.is_empty()) {
        if segment == "." || segment == ".." {
            return out;
        }
        base.push(segment);
        base_key.push('/');
        base_key.push_str(segment);
    }
    let now = SystemTime::now();
    let mut pending = vec![(base, base_key)];
    while let Some((dir, dir_key)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if dir_key.is_empty() && name.starts_with(TMP_DIR) {
                continue;
            }
            let key = format!("{dir_key}/{name}");
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                // Descend only where keys under the prefix can be.
                if key.starts_with(prefix) || prefix.starts_with(&format!("{key}/")) {
                    pending.push((entry.path(), key));
                }
                continue;
            }
            if !file_type.is_file() || !key.starts_with(prefix) {
                continue;
            }
            let path = entry.path();
            match std::fs::metadata(&path).and_then(|meta| meta.modified()) {
                Ok(modified) if is_expired(modified, now, ttl) => out.expired.push(path),
                Ok(_) => {
                    if let Ok(value) = std::fs::read(&path) {
                        out.live.insert(key, Bytes::from(value));
                    }
                }
                Err(_) => {}
            }
        }
    }
    out
}

/// Removes expired files, re-checking each just before so a fresh touch is not undone.
pub(super) fn remove_expired(paths: &[PathBuf], ttl: Duration) {
    for path in paths {
        let is_still_expired = std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .is_ok_and(|modified| is_expired(modified, SystemTime::now(), ttl));
        if is_still_expired && std::fs::remove_file(path).is_ok() {
            tracing::debug!(path = %path.display(), "removed expired discovery file");
        }
    }
}
