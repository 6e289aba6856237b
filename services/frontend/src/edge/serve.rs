//! The HTTP edge's connection loop: accepting under a connection cap, serving each connection
//! with hyper's HTTP/1.1 and HTTP/2 under a header-read timeout and an idle timeout, and closing
//! every connection gracefully when the service stops.
//!
//! axum's own `serve` offers none of these limits, so the edge serves connections itself with
//! the same hyper builder axum uses.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// Pause after a failed `accept` (out of file descriptors, say) before the next one, so a
/// persistent failure does not spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a connection told to close gracefully (idle, or at shutdown with nothing in flight)
/// may take before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The edge's limits on connections (`--http-header-read-timeout-secs`,
/// `--http-idle-timeout-secs`, `--http-max-connections`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// Longest wait for a complete request head: HTTP/1.1 headers from the moment the server
    /// waits for them (a new connection, or the end of the previous response), and the first
    /// request of a connection of any protocol (HTTP/2's preface included).
    pub header_read_timeout: Duration,
    /// Longest a connection stays open with no request in flight after its first request.
    pub idle_timeout: Duration,
    /// Most connections served at once; past it, new connections wait in the listen backlog
    /// (and their TLS handshakes in the accept queue) until one closes.
    pub max_connections: usize,
}

/// Where the edge's connections come from: a TCP listener, or handshaken TLS connections.
pub(crate) trait Accept: Send + 'static {
    /// The connection type.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection; `None` when no more will come.
    fn accept(&mut self) -> impl Future<Output = Option<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> Option<Self::Io> {
        loop {
            match tokio::net::TcpListener::accept(self).await {
                Ok((stream, _)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "cannot set TCP_NODELAY");
                    }
                    return Some(stream);
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

impl Accept for tokio::sync::mpsc::Receiver<kvmesh_runtime::tls::TlsConn> {
    type Io = kvmesh_runtime::tls::TlsConn;

    async fn accept(&mut self) -> Option<Self::Io> {
        self.recv().await
    }
}

/// Serves `app` on the connections of `incoming` within `limits` until `stop` fires, then lets
/// each connection finish its requests and waits for all of them.
pub(crate) async fn serve<A: Accept>(
    mut incoming: A,
    app: axum::Router,
    limits: ConnLimits,
    stop: CancellationToken,
) -> Result<(), Infallible> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let conns = TaskTracker::new();
    loop {
        let Some(permit) = acquire(&slots, &stop).await else {
            break;
        };
        let io = tokio::select! {
            io = incoming.accept() => io,
            () = stop.cancelled() => None,
        };
        let Some(io) = io else {
            break;
        };
        conns.spawn(serve_conn(io, app.clone(), limits, stop.clone(), permit));
    }
    drop(incoming);
    conns.close();
    conns.wait().await;
    Ok(())
}

async fn acquire(slots: &Arc<Semaphore>, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        permit = slots.clone().acquire_owned() => permit.ok(),
        () = stop.cancelled() => None,
    }
}

/// One connection, until the client closes it, a limit closes it, or shutdown drains it.
async fn serve_conn<I>(
    io: I,
    app: axum::Router,
    limits: ConnLimits,
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let guard = tracked.enter();
        let call = app.clone().oneshot(request.map(Body::new));
        async move {
            let response = call.await?;
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(TrackedBody {
                    body,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().enable_connect_protocol();
    let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
    let mut closing_since: Option<Instant> = None;
    loop {
        let deadline = match closing_since {
            Some(since) => Some(since + CLOSE_GRACE),
            None => activity.idle_deadline(limits),
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::trace!(%error, "connection ended with an error");
                }
                return;
            }
            () = stop.cancelled(), if closing_since.is_none() => {}
            () = activity.changed.notified() => continue,
            () = tokio::time::sleep_until(deadline.unwrap_or_else(far_future)) => {
                if closing_since.is_some() {
                    return;
                }
                if !activity.is_idle_past(limits) {
                    continue;
                }
                conn.as_mut().graceful_shutdown();
                closing_since = Some(Instant::now());
                continue;
            }
        }
        // Shutdown: finish what is in flight, take nothing new.
        conn.as_mut().graceful_shutdown();
        let result = conn.as_mut().await;
        if let Err(error) = result {
            tracing::trace!(%error, "connection ended with an error");
        }
        return;
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// Requests in flight on a connection and since when it has had none.
struct Activity {
    inflight: AtomicUsize,
    has_served: AtomicBool,
    idle_since: Mutex<Instant>,
    /// Wakes the connection's loop when a request ends, to arm the idle deadline.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            inflight: AtomicUsize::new(0),
            has_served: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }
    }

    fn enter(self: &Arc<Self>) -> RequestGuard {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        self.has_served.store(true, Ordering::SeqCst);
        RequestGuard {
            activity: self.clone(),
        }
    }

    /// The limit in force while nothing is in flight: before the first request the client has
    /// the header-read timeout to send one, afterwards the idle timeout.
    fn limit(&self, limits: ConnLimits) -> Duration {
        if self.has_served.load(Ordering::SeqCst) {
            limits.idle_timeout
        } else {
            limits.header_read_timeout
        }
    }

    /// When the connection becomes idle for too long, if nothing starts meanwhile; `None` while
    /// a request is in flight.
    fn idle_deadline(&self, limits: ConnLimits) -> Option<Instant> {
        if self.inflight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.idle_since() + self.limit(limits))
    }

    fn is_idle_past(&self, limits: ConnLimits) -> bool {
        self.inflight.load(Ordering::SeqCst) == 0
            && self.idle_since().elapsed() >= self.limit(limits)
    }

    fn idle_since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request in flight, from its head to the end (or drop) of its response body.
struct RequestGuard {
    activity: Arc<Activity>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        *self.activity.idle_since() = Instant::now();
        self.activity.inflight.fetch_sub(1, Ordering::SeqCst);
        self.activity.changed.notify_one();
    }
}

/// A response body that holds its request's place in the connection's activity until it ends.
struct TrackedBody {
    body: Body,
    _guard: RequestGuard,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
