//! etcd discovery: every key of a process is bound to one lease, kept alive while it runs.
//!
//! The lease id is the instance id (docs/discovery.md, "Instance ids and leases"). A crash stops
//! the keep-alive, the lease expires and etcd deletes the keys for everyone. Watches list with a
//! revision and then watch from the next one; on a broken stream they resume from the last
//! revision seen, and when that revision was compacted away they re-list and report only the
//! difference.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{Discovery, KeyValue, WatchEvent, WatchStream};
use crate::{Error, Result};

/// The endpoint used when `ETCD_ENDPOINTS` is not set.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:2379";

/// Lease TTL (docs/discovery.md, "Instance ids and leases").
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Bound on any single etcd request, so a dead server surfaces as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest pause between two attempts to re-open a broken watch.
const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(2);

/// Splits an `ETCD_ENDPOINTS` value (comma list) into endpoints, ignoring blanks.
pub fn parse_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|endpoint| !endpoint.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Runs one etcd request under [`REQUEST_TIMEOUT`], mapping its error.
async fn call<T>(
    what: &str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T> {
    match timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) if error.to_string().contains("lease not found") => Err(Error::LeaseLost),
        Ok(Err(error)) => Err(Error::Discovery(format!("etcd {what}: {error}"))),
        Err(_) => Err(Error::Discovery(format!("etcd {what}: timed out"))),
    }
}

/// TLS and credentials of the etcd client. With a CA, endpoints without a scheme are dialed over
/// TLS and `http://` ones are refused; the files are read when the client connects.
#[derive(Clone, Default)]
pub struct EtcdSecurity {
    /// PEM CA that verifies the servers (`ETCD_AUTH_CA`).
    pub ca: Option<std::path::PathBuf>,
    /// PEM certificate and key presented to the servers (`ETCD_AUTH_CLIENT_CERT`/`_KEY`).
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// User name and password (`ETCD_AUTH_USERNAME`/`ETCD_AUTH_PASSWORD`).
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl EtcdSecurity {
    fn apply(&self, mut options: ConnectOptions) -> Result<ConnectOptions> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path)
                .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))
        };
        if let Some((user, password)) = &self.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(ca) = &self.ca {
            let ca = read(ca, "--etcd-tls-ca-cert-path (ETCD_AUTH_CA)")?;
            let mut tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(ca));
            if let Some((cert, key)) = &self.client {
                let cert = read(cert, "--etcd-tls-client-cert-path (ETCD_AUTH_CLIENT_CERT)")?;
                let key = read(key, "--etcd-tls-client-key-path (ETCD_AUTH_CLIENT_KEY)")?;
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        Ok(options)
    }
}

/// Discovery backed by an etcd cluster.
pub struct EtcdDiscovery {
    client: Client,
    lease_id: i64,
    lease_lost: CancellationToken,
    keepalive: JoinHandle<()>,
    is_revoked: AtomicBool,
}

impl std::fmt::Debug for EtcdDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDiscovery")
            .field("lease_id", &format_args!("{:x}", self.lease_id))
            .finish()
    }
}

impl EtcdDiscovery {
    /// Connects to `endpoints` and grants this process's lease with the default TTL.
    pub async fn connect(endpoints: &[String]) -> Result<Self> {
        Self::connect_with_ttl(endpoints, DEFAULT_LEASE_TTL).await
    }

    /// Connects with a custom lease TTL (whole seconds, at least 1; short ones for tests).
    pub async fn connect_with_ttl(endpoints: &[String], ttl: Duration) -> Result<Self> {
        Self::connect_secured(endpoints, ttl, &EtcdSecurity::default()).await
    }

    /// [`connect_with_ttl`](Self::connect_with_ttl) with TLS and credentials.
    pub async fn connect_secured(
        endpoints: &[String],
        ttl: Duration,
        security: &EtcdSecurity,
    ) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::Discovery("no etcd endpoints given".into()));
        }
        let options = security.apply(
            ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
                .with_keep_alive_while_idle(true),
        )?;
        let client = call("connect", Client::connect(endpoints, Some(options)))
            .await
            .map_err(|error| Error::Discovery(format!("{error} ({})", endpoints.join(","))))?;
        let ttl_secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX).max(1);
        let mut lease_client = client.lease_client();
        let lease = call("lease grant", lease_client.grant(ttl_secs, None)).await?;
        let lease_id = lease.id();
        let ttl = Duration::from_secs(u64::try_from(lease.ttl()).unwrap_or(1).max(1));
        let lease_lost = CancellationToken::new();
        let keepalive = tokio::spawn(keep_alive(
            client.clone(),
            lease_id,
            ttl,
            lease_lost.clone(),
        ));
        tracing::info!(lease_id = %format_args!("{lease_id:x}"), ttl_s = ttl.as_secs(), "etcd lease granted");
        Ok(Self {
            client,
            lease_id,
            lease_lost,
            keepalive,
            is_revoked: AtomicBool::new(false),
        })
    }

    /// The underlying client, for tools that need raw etcd access (inspection, tests).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Stops the keep-alive as if the process had crashed, for tests: the keys disappear when
    /// the lease expires.
    #[doc(hidden)]
    pub fn abort_keepalive(&self) {
        self.keepalive.abort();
    }
}

impl Drop for EtcdDiscovery {
    fn drop(&mut self) {
        // Without revoke the lease runs out after its TTL, as after a crash.
        self.keepalive.abort();
    }
}

/// Keeps the lease alive every TTL/3; cancels `lost` once etcd says the lease is gone (not
/// found, or renewed with a TTL of 0). An etcd that cannot be reached is asked again, however
/// long: a restarted etcd renews every lease it held.
async fn keep_alive(client: Client, lease_id: i64, ttl: Duration, lost: CancellationToken) {
    let period = (ttl / 3).max(Duration::from_millis(300));
    let mut last_ok = Instant::now();
    let mut session = None;
    loop {
        tokio::time::sleep(period).await;
        let result = match session.as_mut() {
            None => {
                let mut lease_client = client.lease_client();
                match timeout(period, lease_client.keep_alive(lease_id)).await {
                    Ok(Ok(opened)) => {
                        session = Some(opened);
                        Ok(true)
                    }
                    Ok(Err(etcd_client::Error::LeaseKeepAliveError(message)))
                        if message.contains("not found") =>
                    {
                        Ok(false)
                    }
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(_) => Err("timed out".to_owned()),
                }
            }
            Some((keeper, responses)) => {
                let round = async {
                    keeper.keep_alive().await?;
                    responses.message().await
                };
                match timeout(period, round).await {
                    Ok(Ok(Some(response))) => Ok(response.ttl() > 0),
                    Ok(Ok(None)) => Err("stream closed".to_owned()),
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(_) => Err("timed out".to_owned()),
                }
            }
        };
        match result {
            Ok(true) => last_ok = Instant::now(),
            Ok(false) => {
                tracing::error!(lease_id = %format_args!("{lease_id:x}"), "etcd lease expired, lease lost");
                lost.cancel();
                return;
            }
            Err(error) => {
                // Unreachable is not expired: etcd renews every lease when it restarts or elects a
                // leader, so only its answer (lease not found, or a TTL of 0) ends the
                // registration. Until then the process keeps serving and keeps asking.
                session = None;
                if last_ok.elapsed() >= ttl {
                    tracing::error!(lease_id = %format_args!("{lease_id:x}"), error = %error, unreachable_for = ?last_ok.elapsed(), "etcd unreachable for longer than the lease ttl; still trying");
                } else {
                    tracing::warn!(lease_id = %format_args!("{lease_id:x}"), error = %error, "etcd keep-alive failed");
                }
            }
        }
    }
}

#[async_trait]
impl Discovery for EtcdDiscovery {
    fn instance_id(&self) -> u64 {
        self.lease_id as u64
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        if self.is_revoked.load(Ordering::SeqCst) || self.lease_lost.is_cancelled() {
            return Err(Error::LeaseLost);
        }
        let mut kv = self.client.kv_client();
        let options = PutOptions::new().with_lease(self.lease_id);
        call("put", kv.put(key, value.to_vec(), Some(options))).await?;
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        // Only a key still bound to this lease is ours to delete.
        let txn = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, self.lease_id)])
            .and_then([TxnOp::delete(key, None)]);
        let mut kv = self.client.kv_client();
        call("delete", kv.txn(txn)).await?;
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(list_with_revision(&self.client, prefix)
            .await?
            .1
            .into_iter()
            .map(|(key, (_, value))| KeyValue { key, value })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        let (revision, entries) = list_with_revision(&self.client, prefix).await?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let mut known = BTreeMap::new();
        for (key, (mod_revision, value)) in entries {
            let _ = events_tx.send(WatchEvent::Put {
                key: key.clone(),
                value,
            });
            known.insert(key, mod_revision);
        }
        let watcher = PrefixWatcher {
            client: self.client.clone(),
            prefix: prefix.to_owned(),
            revision,
            known,
            events_tx,
        };
        tokio::spawn(watcher.run());
        Ok(Box::pin(UnboundedReceiverStream::new(events_rx)))
    }

    async fn revoke(&self) -> Result<()> {
        self.is_revoked.store(true, Ordering::SeqCst);
        self.keepalive.abort();
        let mut lease_client = self.client.lease_client();
        match call("lease revoke", lease_client.revoke(self.lease_id)).await {
            Ok(_) | Err(Error::LeaseLost) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn lease_lost(&self) -> CancellationToken {
        self.lease_lost.clone()
    }
}

/// Key → (mod revision, value) under `prefix`, with the store revision it was read at.
type Listing = (i64, BTreeMap<String, (i64, Bytes)>);

async fn list_with_revision(client: &Client, prefix: &str) -> Result<Listing> {
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

/// One watch: resumes after errors and reconciles after compaction.
struct PrefixWatcher {
    client: Client,
    prefix: String,
    /// Every event up to this revision has been reported.
    revision: i64,
    /// Reported live keys and the mod revision they were reported at.
    known: BTreeMap<String, i64>,
    events_tx: mpsc::UnboundedSender<WatchEvent>,
}

/// Why a watch stream ended.
enum Ended {
    /// The consumer dropped the stream: stop.
    Closed,
    /// The start revision was compacted: re-list.
    Compacted,
    /// The stream broke: resume from the last revision.
    Broken(String),
}

impl PrefixWatcher {
    async fn run(mut self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.watch_once().await {
                Ended::Closed => return,
                Ended::Compacted => {
                    tracing::info!(prefix = %self.prefix, revision = self.revision, "etcd watch revision compacted, re-listing");
                    if let Err(error) = self.relist().await {
                        tracing::warn!(prefix = %self.prefix, error = %error, "etcd re-list failed");
                    } else {
                        backoff = Duration::from_millis(100);
                        continue;
                    }
                }
                Ended::Broken(error) => {
                    tracing::warn!(prefix = %self.prefix, error = %error, "etcd watch broke, resuming");
                }
            }
            tokio::select! {
                () = self.events_tx.closed() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_WATCH_BACKOFF);
        }
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
            let message = tokio::select! {
                () = self.events_tx.closed() => return Ended::Closed,
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

    /// Reports a put unless it was already reported; `false` once the consumer is gone.
    fn report_put(&mut self, key: &str, mod_revision: i64, value: &[u8]) -> bool {
        if self
            .known
            .get(key)
            .is_some_and(|seen| *seen >= mod_revision)
        {
            return true;
        }
        self.known.insert(key.to_owned(), mod_revision);
        let event = WatchEvent::Put {
            key: key.to_owned(),
            value: Bytes::copy_from_slice(value),
        };
        self.events_tx.send(event).is_ok()
    }

    /// Reports a delete of a key the consumer knows; `false` once the consumer is gone.
    fn report_delete(&mut self, key: &str) -> bool {
        if self.known.remove(key).is_none() {
            return true;
        }
        let event = WatchEvent::Delete {
            key: key.to_owned(),
        };
        self.events_tx.send(event).is_ok()
    }

    /// Re-lists the prefix and reports only what changed since the last reported state.
    async fn relist(&mut self) -> Result<()> {
        let (revision, entries) = list_with_revision(&self.client, &self.prefix).await?;
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

#[cfg(test)]
#[path = "etcd_tests.rs"]
mod tests;
