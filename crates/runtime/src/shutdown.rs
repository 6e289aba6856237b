//! One way for every process to stop: signals become a cancellation, in-flight work drains within a
//! limit, and a second signal forces the exit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGINT or SIGTERM. A second signal exits the process at
/// once with status 130, for operators who do not want to wait for draining.
pub fn signal_token() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received, draining");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second shutdown signal, exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM, only SIGINT stops this process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Counts in-flight requests so shutdown can wait for them to finish.
///
/// Cloning shares the count. Each request holds an [`InflightGuard`] for its whole life, including
/// the time its response streams.
#[derive(Clone, Default)]
pub struct Inflight {
    inner: Arc<InflightInner>,
}

#[derive(Default)]
struct InflightInner {
    count: AtomicUsize,
    idle: Notify,
}

impl Inflight {
    /// Creates a counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks one request in flight until the guard drops.
    pub fn enter(&self) -> InflightGuard {
        self.inner.count.fetch_add(1, Ordering::AcqRel);
        InflightGuard {
            inner: self.inner.clone(),
        }
    }

    /// Requests currently in flight.
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::Acquire)
    }

    /// Waits until no request is in flight or `limit` passes. Returns whether everything drained.
    pub async fn drain(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.inner.idle.notified();
                if self.count() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

/// Held by one in-flight request; dropping it ends the request's count.
pub struct InflightGuard {
    inner: Arc<InflightInner>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.inner.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_guards() {
        let inflight = Inflight::new();
        let guard = inflight.enter();
        assert_eq!(inflight.count(), 1);
        assert!(!inflight.drain(Duration::from_millis(20)).await);
        let waiter = {
            let inflight = inflight.clone();
            tokio::spawn(async move { inflight.drain(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(inflight.count(), 0);
    }
}
