//! Mutual TLS inside the mesh: the internal gRPC servers (workers, router replicas, indexer
//! replicas, processor hosts) and every client of them, from the `--tcp-tls-*` flags.
//!
//! * `--tcp-tls-cert-path`/`--tcp-tls-key-path`: this process's internal gRPC servers speak TLS
//!   with that certificate; with `--tcp-tls-client-ca-cert-path` they also demand a client
//!   certificate chaining to that CA, so only holders of a mesh certificate get in.
//! * `--tcp-tls-ca-cert-path`: this process dials every mesh peer over TLS and checks its
//!   certificate against that CA, for the host of the address the peer registered (an IP
//!   address or a DNS name, which the certificate must name); `--tcp-tls-client-cert-path`/
//!   `--tcp-tls-client-key-path` is the certificate it presents.
//!
//! TLS is a property of the process, not of a discovery record: a record's address stays
//! `host:port`, and a process with a CA dials every peer over TLS, so a forged record cannot
//! talk it down to plaintext. One process has one mesh identity, so the configuration is
//! installed once at start ([`install`]) and read by the one `serve_grpc` and the one mesh
//! client endpoint ([`crate::net::mesh_endpoint`]); the files are re-read every
//! [`crate::reload::RELOAD_INTERVAL`] and a change serves the next connection (new contents that
//! do not load keep the old ones, with one ERROR in the log).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use super::{parse_chain, parse_key, parse_roots, provider, server_config};
use crate::reload::{Reloaded, WatchedFiles};

const CERT_FLAG: &str = "--tcp-tls-cert-path (DYN_TCP_TLS_CERT_PATH)";
const KEY_FLAG: &str = "--tcp-tls-key-path (DYN_TCP_TLS_KEY_PATH)";
const CLIENT_CA_FLAG: &str = "--tcp-tls-client-ca-cert-path (DYN_TCP_TLS_CLIENT_CA_CERT_PATH)";
const CA_FLAG: &str = "--tcp-tls-ca-cert-path (DYN_TCP_TLS_CA_CERT_PATH)";
const CLIENT_CERT_FLAG: &str = "--tcp-tls-client-cert-path (DYN_TCP_TLS_CLIENT_CERT_PATH)";
const CLIENT_KEY_FLAG: &str = "--tcp-tls-client-key-path (DYN_TCP_TLS_CLIENT_KEY_PATH)";

/// HTTP/2 is all the mesh speaks.
const ALPN_H2: &[u8] = b"h2";

/// The PEM files of the mesh's TLS (see the module docs); every part is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshTlsFiles {
    /// Certificate chain and key of this process's internal gRPC servers.
    pub server: Option<(PathBuf, PathBuf)>,
    /// CA the servers verify client certificates with (then required).
    pub client_ca: Option<PathBuf>,
    /// CA this process verifies the servers it dials with (then it dials over TLS).
    pub ca: Option<PathBuf>,
    /// Certificate chain and key this process presents when it dials.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl MeshTlsFiles {
    /// The files with their flags, in a fixed order.
    fn flagged(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        if let Some((cert, key)) = &self.server {
            files.push((CERT_FLAG, cert.clone()));
            files.push((KEY_FLAG, key.clone()));
        }
        files.extend(self.client_ca.clone().map(|ca| (CLIENT_CA_FLAG, ca)));
        files.extend(self.ca.clone().map(|ca| (CA_FLAG, ca)));
        if let Some((cert, key)) = &self.client {
            files.push((CLIENT_CERT_FLAG, cert.clone()));
            files.push((CLIENT_KEY_FLAG, key.clone()));
        }
        files
    }

    /// Whether any part is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

#[derive(Default)]
struct Configs {
    server: Option<Arc<ServerConfig>>,
    client: Option<Arc<ClientConfig>>,
}

/// The mesh's current TLS configurations (see the module docs).
#[derive(Debug)]
pub struct MeshTls(Reloaded<MeshTlsFiles, Configs>);

impl MeshTls {
    /// Reads and checks the files; the error names the flag whose file is wrong. The returned
    /// [`WatchedFiles`] remember what was read, for [`crate::reload::watch_files`].
    pub fn open(files: MeshTlsFiles) -> Result<(Arc<Self>, WatchedFiles), String> {
        let watched = WatchedFiles::new(files.flagged().into_iter().map(|(_, p)| p).collect());
        let (configs, watched) = Reloaded::open(files, watched, build)?;
        Ok((Arc::new(Self(configs)), watched))
    }

    /// Replaces the configurations with ones built from `contents` (the files' new contents);
    /// on an error the current ones stay.
    pub fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        self.0.apply(contents)
    }

    /// The configuration a new server connection gets; `None`: servers speak plaintext.
    pub fn server_config(&self) -> Option<Arc<ServerConfig>> {
        self.0.load().server.clone()
    }

    /// The configuration a new client connection gets; `None`: clients dial plaintext.
    pub fn client_config(&self) -> Option<Arc<ClientConfig>> {
        self.0.load().client.clone()
    }

    /// Whether this process dials its peers over TLS.
    pub fn dials_tls(&self) -> bool {
        self.0.files().ca.is_some()
    }
}

/// The configurations from the files' contents (in [`MeshTlsFiles::flagged`] order).
fn build(files: &MeshTlsFiles, contents: &[Vec<u8>]) -> Result<Configs, String> {
    let flagged = files.flagged();
    if contents.len() != flagged.len() {
        return Err("--tcp-tls-*: the files were not read".into());
    }
    let mut read = flagged.iter().zip(contents);
    let mut next = || read.next().map(|((flag, path), pem)| (*flag, path, pem));
    let mut configs = Configs::default();
    if files.server.is_some() {
        let (flag, path, pem) = next().ok_or("--tcp-tls-cert-path: not read")?;
        let chain = parse_chain(pem, flag, path)?;
        let (flag, path, pem) = next().ok_or("--tcp-tls-key-path: not read")?;
        let key = parse_key(pem, flag, path)?;
        let client_roots = match &files.client_ca {
            Some(_) => {
                let (flag, path, pem) = next().ok_or("--tcp-tls-client-ca-cert-path: not read")?;
                Some(parse_roots(pem, flag, path)?)
            }
            None => None,
        };
        let mut config = server_config(chain, key, &client_roots)
            .map_err(|e| format!("{CERT_FLAG}, {KEY_FLAG}: {e}"))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        configs.server = Some(Arc::new(config));
    }
    if files.ca.is_some() {
        let (flag, path, pem) = next().ok_or("--tcp-tls-ca-cert-path: not read")?;
        let roots = parse_roots(pem, flag, path)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("{CA_FLAG}: {e}"))?
            .with_root_certificates(roots);
        let mut config = match &files.client {
            Some(_) => {
                let (flag, path, pem) = next().ok_or("--tcp-tls-client-cert-path: not read")?;
                let chain = parse_chain(pem, flag, path)?;
                let (flag, path, pem) = next().ok_or("--tcp-tls-client-key-path: not read")?;
                let key = parse_key(pem, flag, path)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("{CLIENT_CERT_FLAG}, {CLIENT_KEY_FLAG}: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        configs.client = Some(Arc::new(config));
    }
    Ok(configs)
}

static CURRENT: OnceLock<Arc<MeshTls>> = OnceLock::new();

/// Makes `files` this process's mesh TLS (the first call wins; later ones are ignored, as in
/// `kvmesh up`, whose services share one process) and, inside a tokio runtime, re-reads them
/// for the life of the process. Nothing is installed when `files` is empty.
pub fn install(files: MeshTlsFiles) -> Result<(), String> {
    if files.is_empty() || CURRENT.get().is_some() {
        return Ok(());
    }
    let (tls, watched) = MeshTls::open(files)?;
    if CURRENT.set(tls.clone()).is_err() {
        return Ok(());
    }
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(crate::reload::watch_files(
                "internal gRPC certificates",
                watched,
                CancellationToken::new(),
                move |contents| tls.apply(contents),
            ));
        }
        Err(_) => tracing::warn!("no async runtime: internal gRPC certificates are not reloaded"),
    }
    Ok(())
}

/// This process's mesh TLS, when `--tcp-tls-*` configured one.
pub fn current() -> Option<Arc<MeshTls>> {
    CURRENT.get().cloned()
}

/// The connector of mesh clients that dial over TLS: TCP (`TCP_NODELAY`), then a handshake with
/// the client configuration current at that moment, checking the certificate against the
/// address's host. tonic calls it for every new connection, so a reconnect after a certificate
/// change presents the new one.
#[derive(Clone, Debug)]
pub struct MeshConnector {
    tls: Arc<MeshTls>,
}

impl MeshConnector {
    /// A connector with `tls`'s client configuration.
    pub fn new(tls: Arc<MeshTls>) -> Self {
        Self { tls }
    }
}

impl tower::Service<http::Uri> for MeshConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = self.tls.client_config();
        Box::pin(async move {
            let config = config.ok_or_else(|| {
                std::io::Error::other("no --tcp-tls-ca-cert-path to verify the peer with")
            })?;
            let host = uri
                .host()
                .map(|host| host.trim_start_matches('[').trim_end_matches(']'))
                .ok_or_else(|| std::io::Error::other(format!("{uri}: no host")))?
                .to_owned();
            let port = uri
                .port_u16()
                .ok_or_else(|| std::io::Error::other(format!("{uri}: no port")))?;
            let name = ServerName::try_from(host.clone())
                .map_err(|e| std::io::Error::other(format!("{host}: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}

#[cfg(test)]
#[path = "mesh_tests.rs"]
mod tests;
