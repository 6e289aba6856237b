//! The accept side of the edge's TLS: connections of a TCP listener, each handshaken in a task of
//! its own (a client that stalls its handshake holds only its own task, and for at most
//! [`HANDSHAKE_TIMEOUT`]), handed to the server as [`TlsConn`]s once encrypted.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{EdgeProtocol, EdgeTls};

/// Longest a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes in progress at once; past it, accepting waits.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Pause after a failed `accept` (out of file descriptors, say) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// One accepted, handshaken connection.
#[derive(Debug)]
pub struct TlsConn {
    stream: TlsStream<TcpStream>,
    local: Option<SocketAddr>,
    remote: SocketAddr,
}

impl TlsConn {
    /// The client's address.
    pub fn remote_addr(&self) -> SocketAddr {
        self.remote
    }

    /// The ALPN protocol the handshake selected, if any (`h2`, `http/1.1`).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.stream.get_ref().1.alpn_protocol()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.remote),
        }
    }
}

/// Accepts `listener`'s connections (TCP_NODELAY set) and handshakes each with the
/// configuration `tls` holds for `protocol` at that moment, so a reloaded certificate serves the
/// next connection. The finished ones arrive on the returned channel; accepting stops when the
/// receiver is dropped. A failed handshake is logged at debug level only: it is the client's.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<EdgeTls>,
    protocol: EdgeProtocol,
) -> mpsc::Receiver<TlsConn> {
    incoming_with(listener, move || Some(tls.config(protocol)))
}

/// [`incoming`] with the configuration `current` returns for each new connection (the mesh's
/// internal gRPC servers use their own, [`super::mesh::MeshTls`]); a connection for which it
/// returns none is closed.
pub fn incoming_with(
    listener: TcpListener,
    current: impl Fn() -> Option<Arc<ServerConfig>> + Send + Sync + 'static,
) -> mpsc::Receiver<TlsConn> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, current, tx));
    rx
}

async fn accept_loop(
    listener: TcpListener,
    current: impl Fn() -> Option<Arc<ServerConfig>> + Send + Sync + 'static,
    tx: mpsc::Sender<TlsConn>,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    let local = listener.local_addr().ok();
    loop {
        let permit = tokio::select! {
            _ = tx.closed() => return,
            permit = pending.clone().acquire_owned() => permit,
        };
        let Ok(permit) = permit else { return };
        let (stream, remote) = tokio::select! {
            _ = tx.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let Some(config) = current() else {
            continue;
        };
        let acceptor = TlsAcceptor::from(config);
        let tx = tx.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            drop(permit);
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = tx
                        .send(TlsConn {
                            stream,
                            local,
                            remote,
                        })
                        .await;
                }
                Ok(Err(error)) => tracing::debug!(%remote, %error, "tls handshake failed"),
                Err(_) => tracing::debug!(%remote, "tls handshake timed out"),
            }
        });
    }
}
