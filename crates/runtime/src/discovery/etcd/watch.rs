//! etcd watches: list with a revision, then watch from the next one. A broken stream resumes
//! from the last revision seen; a revision compacted away, or a store whose revision went back
//! (an etcd restored from a backup or started empty), re-lists and reports only the difference.
//!
//! After an outage (a resumed or re-listed watch) keys of other processes may vanish and come
//! back within seconds: their leases expired while etcd was away and they are re-registering.
//! For [`SETTLE`] after such a watch came back, a delete is held back and reported only if the
//! key is still gone when it ends; a key put back with the same value is reported as nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use super::{REQUEST_TIMEOUT, call};
use crate::Result;
use crate::discovery::WatchEvent;

/// How long after an outage deletes wait for their key to come back (a re-registering process
/// puts its keys back within a lease TTL of etcd's return).
pub(crate) const SETTLE: Duration = Duration::from_secs(15);

/// Longest pause between two attempts to re-open a broken watch.
const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(2);

/// Key → (mod revision, value) under `prefix`, with the store revision it was read at.
pub(super) type Listing = (i64, BTreeMap<String, (i64, Bytes)>);

/// Reads every key under `prefix` at one revision.
pub(super) async fn list_with_revision(client: &Client, prefix: &str) -> Result<Listing> {
    let mut kv = client.kv_client();
    let response = call("get", kv.get(prefix, Some(GetOptions::new().with_prefix()))).await?;
    let revision = response.header().map_or(0, |header| header.revision());
    let mut entries = BTreeMap::new();
    for kv in response.kvs() {
        match kv.key_str() {
            Ok(key) => {
                let value = Bytes::copy_from_slice(kv.value());
                entries.insert(key.to_owned(), (kv.mod_revision(), value));
            }
            Err(_) => tracing::warn!(prefix = %prefix, "skipping non-utf8 etcd key"),
        }
    }
    Ok((revision, entries))
}

/// One watch: resumes after errors and reconciles after compaction or a store reset.
pub(super) struct PrefixWatcher {
    client: Client,
    prefix: String,
    /// Every event up to this revision has been reported.
    revision: i64,
    /// Reported live keys, with the mod revision and value they were reported at.
    known: BTreeMap<String, (i64, Bytes)>,
    /// Deletes held back after an outage, with when they are reported.
    pending_deletes: BTreeMap<String, Instant>,
    /// Until when deletes are held back.
    settle_until: Option<Instant>,
    events_tx: mpsc::UnboundedSender<WatchEvent>,
}

/// Why a watch stream ended.
enum Ended {
    /// The consumer dropped the stream: stop.
    Closed,
    /// The start revision was compacted: re-list.
    Compacted,
    /// The store's revision is behind the one seen (a restore or an empty etcd): re-list.
    Reset,
    /// The stream broke: resume from the last revision.
    Broken(String),
}

impl PrefixWatcher {
    /// A watcher that already reported `known` as of `revision`.
    pub(super) fn new(
        client: Client,
        prefix: &str,
        revision: i64,
        known: BTreeMap<String, (i64, Bytes)>,
        events_tx: mpsc::UnboundedSender<WatchEvent>,
    ) -> Self {
        Self {
            client,
            prefix: prefix.to_owned(),
            revision,
            known,
            pending_deletes: BTreeMap::new(),
            settle_until: None,
            events_tx,
        }
    }

    pub(super) async fn run(mut self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let ended = self.watch_once().await;
            if !self.report_due_deletes() {
                return;
            }
            match ended {
                Ended::Closed => return,
                Ended::Compacted | Ended::Reset => {
                    let is_reset = matches!(ended, Ended::Reset);
                    tracing::info!(prefix = %self.prefix, revision = self.revision, is_reset, "etcd watch re-listing");
                    if is_reset {
                        self.settle();
                    }
                    match self.relist(is_reset).await {
                        Ok(()) => {
                            backoff = Duration::from_millis(100);
                            continue;
                        }
                        Err(error) => {
                            tracing::warn!(prefix = %self.prefix, error = %error, "etcd re-list failed");
                        }
                    }
                }
                Ended::Broken(error) => {
                    tracing::warn!(prefix = %self.prefix, error = %error, "etcd watch broke, resuming");
                    self.settle();
                }
            }
            tokio::select! {
                () = self.events_tx.closed() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_WATCH_BACKOFF);
        }
    }

    /// Holds deletes back for [`SETTLE`] from now.
    fn settle(&mut self) {
        self.settle_until = Some(Instant::now() + SETTLE);
    }

    /// Watches from `revision + 1` until the stream ends.
    async fn watch_once(&mut self) -> Ended {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.revision + 1);
        let mut watch_client = self.client.watch_client();
        let opened = tokio::select! {
            () = self.events_tx.closed() => return Ended::Closed,
            opened = timeout(REQUEST_TIMEOUT, watch_client.watch(self.prefix.as_str(), Some(options))) => opened,
        };
        let mut stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Ended::Broken(error.to_string()),
            Err(_) => return Ended::Broken("timed out opening watch".into()),
        };
        loop {
            let next_due = self.pending_deletes.values().min().copied();
            let message = tokio::select! {
                () = self.events_tx.closed() => return Ended::Closed,
                () = sleep_until_some(next_due) => {
                    if !self.report_due_deletes() {
                        return Ended::Closed;
                    }
                    continue;
                }
                message = stream.message() => message,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Ended::Broken("watch stream closed".into()),
                Err(error) => return Ended::Broken(error.to_string()),
            };
            if response.compact_revision() > 0 {
                return Ended::Compacted;
            }
            if response.canceled() {
                return Ended::Broken(format!("watch cancelled: {}", response.cancel_reason()));
            }
            if response
                .header()
                .is_some_and(|header| header.revision() < self.revision)
            {
                return Ended::Reset;
            }
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                let revision = kv.mod_revision();
                let reported = match event.event_type() {
                    EventType::Put => self.report_put(key, revision, kv.value()),
                    EventType::Delete => self.report_delete(key),
                };
                if !reported {
                    return Ended::Closed;
                }
                self.revision = self.revision.max(revision);
            }
        }
    }

    /// Reports a put unless the consumer already has that value; `false` once it is gone.
    fn report_put(&mut self, key: &str, mod_revision: i64, value: &[u8]) -> bool {
        self.pending_deletes.remove(key);
        if let Some((seen, old)) = self.known.get_mut(key) {
            if *seen >= mod_revision {
                return true;
            }
            if old.as_ref() == value {
                *seen = mod_revision;
                return true;
            }
        }
        let value = Bytes::copy_from_slice(value);
        self.known
            .insert(key.to_owned(), (mod_revision, value.clone()));
        let event = WatchEvent::Put {
            key: key.to_owned(),
            value,
        };
        self.events_tx.send(event).is_ok()
    }

    /// Reports (or, while settling, holds back) a delete of a key the consumer knows; `false`
    /// once the consumer is gone.
    fn report_delete(&mut self, key: &str) -> bool {
        if !self.known.contains_key(key) {
            return true;
        }
        if let Some(until) = self.settle_until.filter(|until| *until > Instant::now()) {
            self.pending_deletes.entry(key.to_owned()).or_insert(until);
            return true;
        }
        self.known.remove(key);
        self.pending_deletes.remove(key);
        let event = WatchEvent::Delete {
            key: key.to_owned(),
        };
        self.events_tx.send(event).is_ok()
    }

    /// Reports the held-back deletes whose time came; `false` once the consumer is gone.
    fn report_due_deletes(&mut self) -> bool {
        let now = Instant::now();
        let due: Vec<String> = self
            .pending_deletes
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            self.pending_deletes.remove(&key);
            if self.known.remove(&key).is_some() {
                let event = WatchEvent::Delete { key };
                if self.events_tx.send(event).is_err() {
                    return false;
                }
            }
        }
        true
    }

    /// Re-lists the prefix and reports only what changed since the last reported state; after
    /// a store reset the old revisions mean nothing, so values decide.
    async fn relist(&mut self, is_reset: bool) -> Result<()> {
        let (revision, entries) = list_with_revision(&self.client, &self.prefix).await?;
        if is_reset {
            for (seen, _) in self.known.values_mut() {
                *seen = 0;
            }
        }
        let vanished: Vec<String> = self
            .known
            .keys()
            .filter(|key| !entries.contains_key(*key))
            .cloned()
            .collect();
        for key in vanished {
            self.report_delete(&key);
        }
        for (key, (mod_revision, value)) in entries {
            self.report_put(&key, mod_revision, &value);
        }
        self.revision = revision;
        Ok(())
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
