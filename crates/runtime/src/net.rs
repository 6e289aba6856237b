//! Socket helpers shared by every gRPC server and client of the mesh.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Channel, Endpoint};

use crate::tls::mesh::{MeshConnector, MeshTls};

/// How often a connection to another mesh process is probed with an HTTP/2 PING.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a PING may go unanswered before the connection (and every call on it) fails.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 connection window of every mesh client. The h2 crate lets at most half of it go to the
/// bookkeeping of small unread DATA frames before it closes the connection, so it is sized for
/// many concurrent streams of small messages (tokens, routing answers), not for bulk transfer.
pub const CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;

/// HTTP/2 stream window of every mesh client: what one stream may have in flight unread.
pub const STREAM_WINDOW: u32 = 2 * 1024 * 1024;

/// The gRPC endpoint of another mesh process at `address` (`host:port` or a URI), with
/// `TCP_NODELAY`, `connect_timeout`, the windows above, and HTTP/2 keepalive: a peer that stops
/// answering without closing its socket (frozen, partitioned) fails the streams open to it within
/// [`KEEPALIVE_INTERVAL`] + [`KEEPALIVE_TIMEOUT`], so callers fail over instead of hanging until
/// TCP gives up. It dials over TLS when this process's mesh TLS says so
/// ([`crate::tls::mesh::current`]).
pub fn mesh_endpoint(
    address: &str,
    connect_timeout: Duration,
) -> Result<MeshEndpoint, tonic::transport::Error> {
    mesh_endpoint_with(address, connect_timeout, crate::tls::mesh::current())
}

/// [`mesh_endpoint`] with an explicit mesh TLS (`None`: plaintext), for tests and tools.
pub fn mesh_endpoint_with(
    address: &str,
    connect_timeout: Duration,
    tls: Option<Arc<MeshTls>>,
) -> Result<MeshEndpoint, tonic::transport::Error> {
    let tls = tls.filter(|tls| tls.dials_tls());
    let uri = match address.split_once("://") {
        // The scheme is only HTTP/2's `:scheme` here: the connector decides on TLS.
        Some(("https", rest)) if tls.is_some() => format!("http://{rest}"),
        Some(_) => address.to_string(),
        None => format!("http://{address}"),
    };
    let endpoint = Endpoint::from_shared(uri)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_stream_window_size(STREAM_WINDOW)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    Ok(MeshEndpoint { endpoint, tls })
}

/// A peer's endpoint with the transport to reach it (plaintext or the mesh's TLS): the only way
/// mesh clients get a channel, so none can dial around the TLS configuration.
#[derive(Debug, Clone)]
pub struct MeshEndpoint {
    endpoint: Endpoint,
    tls: Option<Arc<MeshTls>>,
}

impl MeshEndpoint {
    /// Overrides the HTTP/2 connection window ([`CONNECTION_WINDOW`]).
    pub fn initial_connection_window_size(mut self, window: u32) -> Self {
        self.endpoint = self.endpoint.initial_connection_window_size(window);
        self
    }

    /// Overrides the HTTP/2 stream window ([`STREAM_WINDOW`]).
    pub fn initial_stream_window_size(mut self, window: u32) -> Self {
        self.endpoint = self.endpoint.initial_stream_window_size(window);
        self
    }

    /// A channel that connects on first use and reconnects after failures.
    pub fn connect_lazy(&self) -> Channel {
        match &self.tls {
            Some(tls) => self
                .endpoint
                .connect_with_connector_lazy(MeshConnector::new(tls.clone())),
            None => self.endpoint.connect_lazy(),
        }
    }

    /// A channel connected now.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => {
                self.endpoint
                    .connect_with_connector(MeshConnector::new(tls.clone()))
                    .await
            }
            None => self.endpoint.connect().await,
        }
    }

    /// Whether the channel speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// Pause after a failed `accept` (out of file descriptors, say) before the next one: tonic's
/// server retries at once, which spins a core for as long as the failure lasts.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepted connections of `listener` with `TCP_NODELAY` set; a failed accept is logged and
/// retried after [`ACCEPT_BACKOFF`], never passed on.
///
/// tonic's `Server::tcp_nodelay` only applies to listeners tonic binds itself; servers that bind
/// their own listener (to learn the port before registering) must set it on each accepted socket,
/// or small streamed messages wait for delayed ACKs (about 40 ms each).
pub fn nodelay_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "cannot set TCP_NODELAY");
                    }
                    return Some((Ok(stream), listener));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    })
}
