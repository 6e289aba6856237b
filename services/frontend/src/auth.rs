//! Client and admin keys (kvmesh additions; docs/security.md): with `--http-api-keys-file` every
//! inference route of the HTTP edge and the inference RPCs of the KServe edge need one of the
//! file's keys, and with `--http-admin-keys-file` so does `/busy_threshold`.
//!
//! A key file holds one key per line; blank lines and lines starting with `#` are skipped. Only
//! the SHA-256 digests of the keys are kept, and a presented key is hashed and compared with every
//! digest in constant time, so neither the time an answer takes nor a log line says anything
//! about a key. The file is re-read when it changes ([`kvmesh_runtime::reload`]); contents that
//! hold no valid key leave the loaded keys in place.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use kvmesh_runtime::reload::WatchedFiles;
use subtle::ConstantTimeEq;

use crate::error::FrontendError;
use crate::http::AppState;

/// Why a request was refused (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// An inference request without an API key.
    MissingApiKey,
    /// An inference request with a key that is not in the API key file.
    InvalidApiKey,
    /// An admin request without an admin key.
    MissingAdminKey,
    /// An admin request with a key that is not in the admin key file.
    InvalidAdminKey,
}

impl std::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MissingApiKey => "no API key: send it as `Authorization: Bearer <key>`",
            Self::InvalidApiKey => "invalid API key",
            Self::MissingAdminKey => "no admin key: send it as `Authorization: Bearer <key>`",
            Self::InvalidAdminKey => "invalid admin key",
        })
    }
}

impl AuthFailure {
    /// The OpenAI error `code` field: OpenAI's own for a wrong key.
    pub fn openai_code(self) -> Option<&'static str> {
        match self {
            Self::InvalidApiKey | Self::InvalidAdminKey => Some("invalid_api_key"),
            Self::MissingApiKey | Self::MissingAdminKey => None,
        }
    }
}

/// The digests of one key file's keys.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    digests: Vec<[u8; 32]>,
}

impl KeySet {
    /// The keys of a key file. An error names the line, never the key; a file without a key is
    /// an error (it would lock every client out).
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
        let mut digests = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let key = line.trim();
            if key.is_empty() || key.starts_with('#') {
                continue;
            }
            if !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {}: a key is printable ASCII without spaces",
                    number + 1
                ));
            }
            digests.push(digest(key));
        }
        if digests.is_empty() {
            return Err("no key in the file".into());
        }
        Ok(Self { digests })
    }

    /// How many keys the file held.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `key` is one of the set's, compared with every key in constant time.
    pub fn contains(&self, key: &str) -> bool {
        let presented = digest(key);
        let found = self
            .digests
            .iter()
            .fold(subtle::Choice::from(0), |found, digest| {
                found | digest.ct_eq(&presented)
            });
        found.into()
    }
}

fn digest(key: &str) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, key.as_bytes()).as_ref());
    out
}

/// Whose keys a [`Keys`] holds, which picks the failure a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// `--http-api-keys-file`: inference.
    Api,
    /// `--http-admin-keys-file`: `/busy_threshold`.
    Admin,
}

/// One key file's current keys, replaced when the file changes.
pub struct Keys {
    kind: KeyKind,
    set: ArcSwap<KeySet>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("kind", &self.kind)
            .field("num_keys", &self.set.load().len())
            .finish()
    }
}

impl Keys {
    /// Reads the key file at `path`; the error names `flag`. The returned [`WatchedFiles`]
    /// remember what was read, for [`kvmesh_runtime::reload::watch_files`].
    pub fn open(
        kind: KeyKind,
        flag: &str,
        path: PathBuf,
    ) -> Result<(Arc<Self>, WatchedFiles), String> {
        let mut watched = WatchedFiles::new(vec![path.clone()]);
        let contents = watched
            .read_if_changed()
            .map_err(|e| format!("{flag}: {e}"))?
            .unwrap_or_default();
        let set = KeySet::parse(contents.first().map_or(&[][..], Vec::as_slice))
            .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
        let keys = Arc::new(Self {
            kind,
            set: ArcSwap::from_pointee(set),
        });
        Ok((keys, watched))
    }

    /// Replaces the keys with those of the file's new contents; on an error the loaded ones stay.
    pub fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        let set = KeySet::parse(contents.first().map_or(&[][..], Vec::as_slice))?;
        self.set.store(Arc::new(set));
        Ok(())
    }

    /// Accepts a request that presented `key`, else says why not.
    pub fn check(&self, key: Option<&str>) -> Result<(), AuthFailure> {
        let (missing, invalid) = match self.kind {
            KeyKind::Api => (AuthFailure::MissingApiKey, AuthFailure::InvalidApiKey),
            KeyKind::Admin => (AuthFailure::MissingAdminKey, AuthFailure::InvalidAdminKey),
        };
        match key {
            None => Err(missing),
            Some(key) if self.set.load().contains(key) => Ok(()),
            Some(_) => Err(invalid),
        }
    }
}

/// The key of an `Authorization: Bearer <key>` value (the scheme in any case).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

fn bearer_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer)
}

/// Middleware of the OpenAI inference routes: a valid API key or a 401 in OpenAI's shape.
pub(crate) async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    match check(state.api_keys.as_deref(), bearer_header(request.headers())) {
        Ok(()) => next.run(request).await,
        Err(error) => state.error_response(error),
    }
}

/// Middleware of the Anthropic routes: a valid API key in `x-api-key` (the Anthropic SDK's
/// header) or `Authorization: Bearer`, or a 401 in Anthropic's shape.
pub(crate) async fn require_anthropic_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let key = headers
        .get("x-api-key")
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .or_else(|| bearer_header(headers));
    match check(state.api_keys.as_deref(), key) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_anthropic_response_with(state.settings.overload_status),
    }
}

/// Middleware of `/busy_threshold`: a valid admin key or a 401.
pub(crate) async fn require_admin_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    match check(
        state.admin_keys.as_deref(),
        bearer_header(request.headers()),
    ) {
        Ok(()) => next.run(request).await,
        Err(error) => state.error_response(error),
    }
}

/// The KServe edge's check: the `authorization` metadata of an inference call.
pub(crate) fn check_grpc(
    keys: Option<&Keys>,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<(), tonic::Status> {
    let key = metadata
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(bearer);
    check(keys, key).map_err(|error| error.to_status())
}

fn check(keys: Option<&Keys>, key: Option<&str>) -> Result<(), FrontendError> {
    match keys {
        Some(keys) => keys.check(key).map_err(FrontendError::Unauthenticated),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_skip_comments_and_blanks_and_name_bad_lines() {
        let set = KeySet::parse(b"# clients\n\n  sk-one  \nsk-two\r\n# sk-three\n").unwrap();
        assert_eq!(set.len(), 2);
        assert!(set.contains("sk-one"));
        assert!(set.contains("sk-two"));
        assert!(!set.contains("sk-three"));
        assert!(!set.contains("sk-on"));
        assert!(!set.contains(""));
        let error = KeySet::parse(b"sk-one\nsk two\n").unwrap_err();
        assert!(
            error.contains("line 2") && !error.contains("two"),
            "{error}"
        );
        assert!(KeySet::parse(b"# only comments\n\n").is_err());
        assert!(KeySet::parse(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn comparison_sees_whole_keys_only() {
        let set = KeySet::parse(b"abcdef\n").unwrap();
        // Prefixes, extensions and one-byte changes all fail; the comparison is of digests, so
        // every candidate costs the same whatever it shares with a key.
        for candidate in ["abcde", "abcdefg", "abcdeF", "bbcdef", "abcdef "] {
            assert!(!set.contains(candidate), "{candidate}");
        }
        assert!(set.contains("abcdef"));
    }

    #[test]
    fn keys_check_and_reload_keep_the_old_set_on_bad_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "old\n").unwrap();
        let (keys, _) = Keys::open(KeyKind::Api, "--http-api-keys-file", path.clone()).unwrap();
        assert_eq!(keys.check(None), Err(AuthFailure::MissingApiKey));
        assert_eq!(keys.check(Some("new")), Err(AuthFailure::InvalidApiKey));
        assert_eq!(keys.check(Some("old")), Ok(()));
        assert!(keys.apply(&[b"# emptied\n".to_vec()]).is_err());
        assert_eq!(keys.check(Some("old")), Ok(()));
        keys.apply(&[b"new\n".to_vec()]).unwrap();
        assert_eq!(keys.check(Some("new")), Ok(()));
        assert_eq!(keys.check(Some("old")), Err(AuthFailure::InvalidApiKey));
        let (admin, _) = Keys::open(KeyKind::Admin, "--http-admin-keys-file", path).unwrap();
        assert_eq!(admin.check(Some("x")), Err(AuthFailure::InvalidAdminKey));
        std::fs::write(dir.path().join("empty"), "").unwrap();
        let error = Keys::open(
            KeyKind::Api,
            "--http-api-keys-file",
            dir.path().join("empty"),
        )
        .unwrap_err();
        assert!(error.contains("--http-api-keys-file"), "{error}");
    }

    #[test]
    fn bearer_takes_the_scheme_in_any_case() {
        assert_eq!(bearer("Bearer sk-1"), Some("sk-1"));
        assert_eq!(bearer("bearer  sk-1 "), Some("sk-1"));
        assert_eq!(bearer("Basic c2stMQ=="), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("sk-1"), None);
    }
}
