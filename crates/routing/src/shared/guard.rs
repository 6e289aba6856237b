//! The handles a routed request holds: [`RouteGuard`] (its load, released exactly once) and
//! [`QueuedRoute`] (its place in the queue until it is routed).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;

use super::SharedRouter;
use crate::error::RouteError;
use crate::request::{Decision, TerminalPath, Ticket};

/// A routed request's hold on its worker's load: released exactly once, by [`Self::finish`] or
/// on drop (reported as a client disconnect).
#[derive(Debug)]
pub struct RouteGuard {
    pub(super) router: SharedRouter,
    pub(super) decision: Decision,
    pub(super) is_armed: bool,
    pub(super) hash_time: Duration,
}

impl RouteGuard {
    /// Records how long hashing the prompt took (stage timings).
    pub fn with_hash_time(mut self, hash_time: Duration) -> Self {
        self.hash_time = hash_time;
        self
    }

    /// How long hashing the prompt took, as recorded by [`Self::with_hash_time`].
    pub fn hash_time(&self) -> Duration {
        self.hash_time
    }

    /// Where the request goes.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The first token arrived: prefill load is released.
    pub fn first_token(&self) {
        self.router.mark_prefill_done(&self.decision.request_id);
    }

    /// Whether reporting tokens after the first changes anything (see
    /// [`SharedRouter::tracks_output_tokens`]).
    pub fn tracks_output_tokens(&self) -> bool {
        self.router.tracks_output_tokens()
    }

    /// More tokens were generated (the first call also marks the first token).
    pub fn add_output_tokens(&self, num_tokens: u64) {
        self.router
            .add_output_tokens(&self.decision.request_id, num_tokens);
    }

    /// Ends the request by `path`, releasing its load.
    pub fn finish(mut self, path: TerminalPath) {
        self.is_armed = false;
        self.router.release(&self.decision.request_id, path);
    }

    /// Disarms the guard and returns the decision: the caller takes over releasing the request
    /// through [`SharedRouter::free`] (the gRPC `Route` flow, where the request's life is reported
    /// in later calls).
    pub fn detach(mut self) -> Decision {
        self.is_armed = false;
        std::mem::replace(
            &mut self.decision,
            Decision {
                request_id: String::new(),
                worker_id: 0,
                dp_rank: None,
                overlap_blocks: 0,
                cached_tokens: 0,
                required_blocks: 0,
            },
        )
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if self.is_armed {
            self.is_armed = false;
            self.router
                .release(&self.decision.request_id, TerminalPath::Disconnected);
        }
    }
}

/// A parked request; resolves to its guard when it leaves the queue. Dropping it first removes
/// the request from the queue (client disconnect).
#[derive(Debug)]
pub struct QueuedRoute {
    pub(super) router: SharedRouter,
    pub(super) ticket: Ticket,
    pub(super) rx: oneshot::Receiver<Result<RouteGuard, RouteError>>,
    pub(super) is_done: bool,
}

impl QueuedRoute {
    /// The queue ticket.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }
}

impl Future for QueuedRoute {
    type Output = Result<RouteGuard, RouteError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(result) => {
                self.is_done = true;
                Poll::Ready(result.unwrap_or(Err(RouteError::Cancelled)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for QueuedRoute {
    fn drop(&mut self) {
        if !self.is_done {
            self.router.cancel(self.ticket);
        }
    }
}
