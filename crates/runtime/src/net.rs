//! Socket helpers shared by every gRPC server and client of the mesh.

use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;

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
/// TCP gives up.
pub fn mesh_endpoint(
    address: &str,
    connect_timeout: Duration,
) -> Result<Endpoint, tonic::transport::Error> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    Ok(Endpoint::from_shared(uri)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_stream_window_size(STREAM_WINDOW)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
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
