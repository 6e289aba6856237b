//! Where a router's time comes from: the real monotonic clock, or one moved by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the router's `now` comes from.
pub trait Clock: Send + Sync + 'static {
    /// Time since the clock's origin; never decreases.
    fn now(&self) -> Duration;
}

/// Real monotonic time since the clock was made (the router's start).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock starting now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock moved by hand (tests, and a simulator that wants the shared wrapper).
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Duration) -> Self {
        Self {
            nanos: AtomicU64::new(start.as_nanos() as u64),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}
