//! The frontend's listeners: binding them, serving HTTP on them in plaintext or over TLS, and
//! the edge's TLS and key files, loaded at start and re-read while serving.

mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kvmesh_runtime::lifecycle::ServiceLifecycle;
use kvmesh_runtime::reload::watch_files;
use kvmesh_runtime::tls::{EdgeProtocol, EdgeTls};

pub(crate) use self::serve::ConnLimits;
use crate::auth::{KeyKind, Keys};
use crate::opts::HttpOpts;

/// Binds `host:port` (`flag` names the port in the error).
pub(crate) async fn bind(
    host: &str,
    port: u16,
    flag: &str,
) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    // A name (`localhost`) resolves; its first IPv4 address is bound (the one clients that
    // resolve the name try on every host), else its first address.
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map(Iterator::collect)
        .unwrap_or_default();
    let address = addresses
        .iter()
        .find(|address| address.is_ipv4())
        .or(addresses.first())
        .copied()
        .with_context(|| format!("--http-host {host} / {flag} {port}: not an address"))?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("bind {flag} on {address}"))?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves `app` on `listener` until the lifecycle stops: over TLS when `tls` is set (HTTP/2 or
/// HTTP/1.1 as ALPN chose), else in plaintext (TCP_NODELAY on every connection either way),
/// within the connection limits of `limits`.
pub(crate) fn serve_http(
    lifecycle: &mut ServiceLifecycle,
    listener: tokio::net::TcpListener,
    app: axum::Router,
    tls: Option<&Arc<EdgeTls>>,
    limits: ConnLimits,
) {
    let stop = lifecycle.stop_token();
    match tls {
        None => lifecycle.spawn(serve::serve(listener, app, limits, stop)),
        Some(tls) => {
            let conns = kvmesh_runtime::tls::incoming(listener, tls.clone(), EdgeProtocol::Http);
            lifecycle.spawn(serve::serve(conns, app, limits, stop));
        }
    }
}

/// What the edge serves with: its TLS configuration and its key sets, each watched for changes
/// for the life of `lifecycle`.
pub(crate) struct EdgeSecurity {
    /// The edge's TLS, when `--tls-cert-path` is given.
    pub tls: Option<Arc<EdgeTls>>,
    /// `--http-api-keys-file`.
    pub api_keys: Option<Arc<Keys>>,
    /// `--http-admin-keys-file`.
    pub admin_keys: Option<Arc<Keys>>,
}

impl EdgeSecurity {
    /// Loads the files the options name (an error names the flag) and watches them.
    pub(crate) fn load(
        runtime: &kvmesh_runtime::config::RuntimeOpts,
        http: &HttpOpts,
        lifecycle: &mut ServiceLifecycle,
    ) -> anyhow::Result<Self> {
        let tls = match runtime.tls.edge_files() {
            Some(files) => {
                let (tls, watched) = EdgeTls::open(files).map_err(anyhow::Error::msg)?;
                let reloaded = tls.clone();
                lifecycle.spawn(watch_files(
                    "edge tls certificate",
                    watched,
                    lifecycle.stop_token(),
                    move |contents| reloaded.apply(contents),
                ));
                Some(tls)
            }
            None => None,
        };
        let api_keys = keys(
            lifecycle,
            KeyKind::Api,
            "--http-api-keys-file (DYN_HTTP_API_KEYS_FILE)",
            http.http_api_keys_file.as_ref(),
        )?;
        let admin_keys = keys(
            lifecycle,
            KeyKind::Admin,
            "--http-admin-keys-file (DYN_HTTP_ADMIN_KEYS_FILE)",
            http.http_admin_keys_file.as_ref(),
        )?;
        Ok(Self {
            tls,
            api_keys,
            admin_keys,
        })
    }
}

fn keys(
    lifecycle: &mut ServiceLifecycle,
    kind: KeyKind,
    flag: &str,
    path: Option<&std::path::PathBuf>,
) -> anyhow::Result<Option<Arc<Keys>>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let (keys, watched) = Keys::open(kind, flag, path.clone()).map_err(anyhow::Error::msg)?;
    let reloaded = keys.clone();
    let what = match kind {
        KeyKind::Api => "api keys",
        KeyKind::Admin => "admin keys",
    };
    lifecycle.spawn(watch_files(
        what,
        watched,
        lifecycle.stop_token(),
        move |contents| reloaded.apply(contents),
    ));
    Ok(Some(keys))
}
