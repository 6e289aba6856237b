//! Socket helpers shared by every gRPC server.

use futures::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};

/// Accepted connections of `listener` with `TCP_NODELAY` set.
///
/// tonic's `Server::tcp_nodelay` only applies to listeners tonic binds itself; servers that bind
/// their own listener (to learn the port before registering) must set it on each accepted socket,
/// or small streamed messages wait for delayed ACKs (about 40 ms each).
pub fn nodelay_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        if let Ok(stream) = &accepted
            && let Err(error) = stream.set_nodelay(true)
        {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        accepted
    })
}
