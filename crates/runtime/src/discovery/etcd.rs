//! etcd discovery: every key of a process is bound to one lease, kept alive while it runs.
//!
//! The lease id is the instance id (docs/discovery.md, "Instance ids and leases"). A crash stops
//! the keep-alive, the lease expires and etcd deletes the keys for everyone. A lease that etcd
//! reports gone while the process lives (an outage longer than the TTL between the two, an etcd
//! restored from a backup) is granted again with the same id and every key is put back, so the
//! instance id never changes. Watches are in [`watch`].

mod watch;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseGrantOptions, PutOptions, Txn, TxnOp,
};
use tokio::sync::{mpsc, watch as state_watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_stream::wrappers::UnboundedReceiverStream;

use self::watch::{PrefixWatcher, list_with_revision};
use super::{Discovery, KeyValue, RegistrationState, RegistrationStatus, WatchEvent, WatchStream};
use crate::{Error, Result};

/// The endpoint used when `ETCD_ENDPOINTS` is not set.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:2379";

/// Lease TTL (docs/discovery.md, "Instance ids and leases").
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Bound on any single etcd request, so a dead server surfaces as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

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
    lease: Arc<Lease>,
    keepalive: JoinHandle<()>,
}

/// This process's lease and what it holds, shared with the keep-alive task.
struct Lease {
    client: Client,
    id: i64,
    ttl: Duration,
    /// Every key this process put, with its value: what re-registration puts back.
    records: Mutex<BTreeMap<String, Bytes>>,
    status: state_watch::Sender<RegistrationStatus>,
    is_revoked: AtomicBool,
}

impl std::fmt::Debug for EtcdDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDiscovery")
            .field("lease_id", &format_args!("{:x}", self.lease.id))
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
        let granted = call("lease grant", lease_client.grant(ttl_secs, None)).await?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let lease = Arc::new(Lease {
            client,
            id: granted.id(),
            ttl,
            records: Mutex::new(BTreeMap::new()),
            status: state_watch::Sender::new(RegistrationStatus::held()),
            is_revoked: AtomicBool::new(false),
        });
        let keepalive = tokio::spawn(keep_alive(lease.clone()));
        tracing::info!(lease_id = %format_args!("{:x}", lease.id), ttl_s = ttl.as_secs(), "etcd lease granted");
        Ok(Self { lease, keepalive })
    }

    /// The underlying client, for tools that need raw etcd access (inspection, tests).
    pub fn client(&self) -> &Client {
        &self.lease.client
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

impl Lease {
    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self, state: RegistrationState) {
        RegistrationStatus::enter(&self.status, state);
    }

    /// Grants the lease again under the same id and puts every record back on it, until the
    /// records put match the records held (a put or delete may race with this).
    async fn reregister(&self) -> Result<()> {
        let ttl_secs = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX).max(1);
        let mut lease_client = self.client.lease_client();
        let grant = lease_client.grant(ttl_secs, Some(LeaseGrantOptions::new().with_id(self.id)));
        match call("lease grant", grant).await {
            Ok(_) => {}
            // An earlier attempt got through and only its answer was lost.
            Err(Error::Discovery(message)) if message.contains("already exists") => {}
            Err(error) => return Err(error),
        }
        let mut put_back = BTreeMap::new();
        loop {
            let records = self.records().clone();
            if records == put_back {
                return Ok(());
            }
            for key in put_back.keys().filter(|key| !records.contains_key(*key)) {
                self.delete_owned(key).await?;
            }
            let mut kv = self.client.kv_client();
            for (key, value) in &records {
                let options = PutOptions::new().with_lease(self.id);
                call("put", kv.put(key.as_str(), value.to_vec(), Some(options))).await?;
            }
            put_back = records;
        }
    }

    /// Deletes `key` if it is still bound to this lease.
    async fn delete_owned(&self, key: &str) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, self.id)])
            .and_then([TxnOp::delete(key, None)]);
        let mut kv = self.client.kv_client();
        call("delete", kv.txn(txn)).await?;
        Ok(())
    }
}

/// Keeps the lease alive every TTL/3. An etcd that cannot be reached is asked again, however
/// long (a restarted etcd renews every lease it held); an etcd that says the lease is gone (not
/// found, or renewed with a TTL of 0) gets it granted again with every record put back.
async fn keep_alive(lease: Arc<Lease>) {
    let lease_id = lease.id;
    let ttl = lease.ttl;
    let period = (ttl / 3).max(Duration::from_millis(300));
    let mut last_ok = Instant::now();
    let mut session = None;
    loop {
        tokio::time::sleep(period).await;
        if lease.is_revoked.load(Ordering::SeqCst) {
            return;
        }
        let result = match session.as_mut() {
            None => {
                let mut lease_client = lease.client.lease_client();
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
            Ok(true) => {
                last_ok = Instant::now();
                lease.enter(RegistrationState::Held);
            }
            Ok(false) => {
                tracing::error!(lease_id = %format_args!("{lease_id:x}"), "etcd lease lost; re-registering");
                lease.enter(RegistrationState::Lost);
                session = None;
                reregister_until_done(&lease, period).await;
                last_ok = Instant::now();
            }
            Err(error) => {
                // Unreachable is not expired: only etcd's answer ends the lease. Until then the
                // process keeps serving and keeps asking.
                session = None;
                lease.enter(RegistrationState::Unreachable);
                if last_ok.elapsed() >= ttl {
                    tracing::error!(lease_id = %format_args!("{lease_id:x}"), error = %error, unreachable_for = ?last_ok.elapsed(), "etcd unreachable for longer than the lease ttl; still trying");
                } else {
                    tracing::warn!(lease_id = %format_args!("{lease_id:x}"), error = %error, "etcd keep-alive failed");
                }
            }
        }
    }
}

/// Re-registers every `period` until it works (or the lease is revoked).
async fn reregister_until_done(lease: &Lease, period: Duration) {
    loop {
        if lease.is_revoked.load(Ordering::SeqCst) {
            return;
        }
        match lease.reregister().await {
            Ok(()) => {
                let num_keys = lease.records().len();
                tracing::info!(lease_id = %format_args!("{:x}", lease.id), num_keys, "etcd lease granted again; records put back");
                lease.enter(RegistrationState::Held);
                return;
            }
            Err(error) => {
                tracing::warn!(lease_id = %format_args!("{:x}", lease.id), %error, "re-registration failed; retrying");
                tokio::time::sleep(period).await;
            }
        }
    }
}

#[async_trait]
impl Discovery for EtcdDiscovery {
    fn instance_id(&self) -> u64 {
        self.lease.id as u64
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let lease = &self.lease;
        if lease.is_revoked.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost);
        }
        lease.records().insert(key.to_owned(), value.clone());
        let mut kv = lease.client.kv_client();
        let options = PutOptions::new().with_lease(lease.id);
        match call("put", kv.put(key, value.to_vec(), Some(options))).await {
            Ok(_) => Ok(()),
            // Held in `records`: re-registration puts it back with the others.
            Err(Error::LeaseLost) => {
                tracing::debug!(key = %key, "put while the lease is lost; kept for re-registration");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        // Only a key still bound to this lease is ours to delete.
        self.lease.records().remove(key);
        self.lease.delete_owned(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(list_with_revision(&self.lease.client, prefix)
            .await?
            .1
            .into_iter()
            .map(|(key, (_, value))| KeyValue { key, value })
            .collect())
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        let (revision, entries) = list_with_revision(&self.lease.client, prefix).await?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let mut known = BTreeMap::new();
        for (key, (mod_revision, value)) in entries {
            let _ = events_tx.send(WatchEvent::Put {
                key: key.clone(),
                value: value.clone(),
            });
            known.insert(key, (mod_revision, value));
        }
        let watcher = PrefixWatcher::new(
            self.lease.client.clone(),
            prefix,
            revision,
            known,
            events_tx,
        );
        tokio::spawn(watcher.run());
        Ok(Box::pin(UnboundedReceiverStream::new(events_rx)))
    }

    async fn revoke(&self) -> Result<()> {
        let lease = &self.lease;
        lease.is_revoked.store(true, Ordering::SeqCst);
        self.keepalive.abort();
        lease.records().clear();
        let mut lease_client = lease.client.lease_client();
        match call("lease revoke", lease_client.revoke(lease.id)).await {
            Ok(_) | Err(Error::LeaseLost) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn registration(&self) -> state_watch::Receiver<RegistrationStatus> {
        self.lease.status.subscribe()
    }
}

#[cfg(test)]
#[path = "etcd_tests.rs"]
mod tests;
