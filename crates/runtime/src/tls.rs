//! TLS of the servers a process offers to clients outside the mesh (the frontend's HTTP edge and
//! its KServe gRPC edge), with rustls and the ring provider.
//!
//! [`EdgeTls`] holds one server configuration per protocol, built from the PEM files of
//! `--tls-cert-path`, `--tls-key-path` and, when given, `--tls-client-ca-cert-path` (then every
//! client must present a certificate chaining to that CA). [`EdgeTls::apply`] replaces them when
//! the files change ([`crate::reload::watch_files`]); new contents that do not make a valid
//! configuration leave the old one serving. [`accept`] turns a TCP listener into a stream of
//! finished handshakes.

pub mod accept;
pub mod mesh;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};

use crate::reload::{Reloaded, WatchedFiles};

pub use self::accept::{TlsConn, incoming, incoming_with};

const CERT_FLAG: &str = "--tls-cert-path (DYN_TLS_CERT_PATH)";
const KEY_FLAG: &str = "--tls-key-path (DYN_TLS_KEY_PATH)";
const CLIENT_CA_FLAG: &str = "--tls-client-ca-cert-path (DYN_TLS_CLIENT_CA_CERT_PATH)";

/// The PEM files of the edge's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeTlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA client certificates must chain to; `None`: clients are not asked for one.
    pub client_ca: Option<PathBuf>,
}

impl EdgeTlsFiles {
    /// The files in a fixed order: certificate, key, then the client CA if any.
    fn watched(&self) -> WatchedFiles {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.client_ca.clone());
        WatchedFiles::new(paths)
    }
}

/// What a TLS server speaks after the handshake, which fixes the ALPN protocols it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeProtocol {
    /// HTTP/2 or HTTP/1.1 (the OpenAI edge, the side HTTP server).
    Http,
    /// gRPC: HTTP/2 only (gRPC clients refuse a server that does not select `h2`).
    Grpc,
}

impl EdgeProtocol {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Self::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Self::Grpc => vec![b"h2".to_vec()],
        }
    }
}

struct Configs {
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
}

/// The edge's current TLS configurations (see the module docs).
#[derive(Debug)]
pub struct EdgeTls(Reloaded<EdgeTlsFiles, Configs>);

impl EdgeTls {
    /// Reads and checks the files; the error names the flag whose file is wrong. The returned
    /// [`WatchedFiles`] remember what was read, for [`crate::reload::watch_files`].
    pub fn open(files: EdgeTlsFiles) -> Result<(Arc<Self>, WatchedFiles), String> {
        let watched = files.watched();
        let (configs, watched) = Reloaded::open(files, watched, build)?;
        Ok((Arc::new(Self(configs)), watched))
    }

    /// Checks that the files make a valid configuration, without keeping it.
    pub fn check(files: &EdgeTlsFiles) -> Result<(), String> {
        Self::open(files.clone()).map(|_| ())
    }

    /// Replaces the configurations with ones built from `contents` (the files' new contents, in
    /// [`EdgeTlsFiles`] order); on an error the current ones stay.
    pub fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        self.0.apply(contents)
    }

    /// The configuration new connections of `protocol` get.
    pub fn config(&self, protocol: EdgeProtocol) -> Arc<ServerConfig> {
        let configs = self.0.load();
        match protocol {
            EdgeProtocol::Http => configs.http.clone(),
            EdgeProtocol::Grpc => configs.grpc.clone(),
        }
    }
}

/// The configurations for both protocols from the files' contents.
fn build(files: &EdgeTlsFiles, contents: &[Vec<u8>]) -> Result<Configs, String> {
    let [cert, key, rest @ ..] = contents else {
        return Err(format!("{CERT_FLAG}: the files were not read"));
    };
    let chain = parse_chain(cert, CERT_FLAG, &files.cert)?;
    let key = parse_key(key, KEY_FLAG, &files.key)?;
    let client_roots = match (rest.first(), &files.client_ca) {
        (Some(ca), Some(path)) => Some(parse_roots(ca, CLIENT_CA_FLAG, path)?),
        _ => None,
    };
    let one = |protocol: EdgeProtocol| -> Result<Arc<ServerConfig>, String> {
        let mut config = server_config(chain.clone(), key.clone_key(), &client_roots)
            .map_err(|e| format!("{CERT_FLAG}, {KEY_FLAG}: {e}"))?;
        config.alpn_protocols = protocol.alpn();
        Ok(Arc::new(config))
    };
    Ok(Configs {
        http: one(EdgeProtocol::Http)?,
        grpc: one(EdgeProtocol::Grpc)?,
    })
}

/// The crypto provider of every TLS configuration kvmesh builds (ring: no aws-lc build).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The PEM certificate chain in `pem`; errors name `flag` and `path`.
fn parse_chain(
    pem: &[u8],
    flag: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{flag} {}: no PEM certificate", path.display()));
    }
    Ok(chain)
}

/// The PEM private key in `pem` (PKCS#8, PKCS#1 or SEC1); errors name `flag` and `path`.
fn parse_key(pem: &[u8], flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| format!("{flag} {}: no PEM private key ({e})", path.display()))
}

/// The CA certificates in `pem` as trust roots; errors name `flag` and `path`.
fn parse_roots(pem: &[u8], flag: &str, path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{flag} {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{flag} {}: no PEM certificate", path.display()));
    }
    Ok(Arc::new(roots))
}

/// A client configuration that trusts only the CA certificates in the PEM file at `ca` and
/// offers the HTTP/1.1 ALPN: what `kvmesh probe http` dials an `https://` health endpoint with,
/// so a container checks its own HTTPS edge against the mesh's CA; errors name `flag`.
pub fn http1_client_config(ca: &Path, flag: &str) -> Result<Arc<ClientConfig>, String> {
    let pem = std::fs::read(ca).map_err(|e| format!("{flag} {}: {e}", ca.display()))?;
    let roots = parse_roots(&pem, flag, ca)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration presenting `chain`; with `client_roots`, every client must present a
/// certificate chaining to them.
fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: &Option<Arc<RootCertStore>>,
) -> Result<ServerConfig, rustls::Error> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider)
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder.with_single_cert(chain, key)
}

#[cfg(test)]
mod tests;
