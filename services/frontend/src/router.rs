//! Choosing a worker for a request. Policies sit behind [`Router`] so the KV-aware router can
//! replace them without touching the HTTP edge.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::opts::RouterMode;

/// What a routing policy may look at for one request.
#[derive(Debug, Clone, Copy)]
pub struct RouteContext<'a> {
    /// Prompt token ids.
    pub token_ids: &'a [u32],
}

/// A routing policy over a model's current workers.
pub trait Router: Send + Sync + 'static {
    /// Index into `worker_ids` of the chosen worker, or `None` when there is none.
    fn select(&self, worker_ids: &[u64], request: &RouteContext<'_>) -> Option<usize>;
}

/// Builds the policy for a mode. Only modes accepted by `FrontendOpts::validate` reach here.
pub fn build_router(mode: RouterMode, seed: u64) -> Box<dyn Router> {
    match mode {
        RouterMode::Random => Box::new(RandomRouter::new(seed)),
        _ => Box::new(RoundRobinRouter::default()),
    }
}

/// Each worker in turn.
#[derive(Debug, Default)]
pub struct RoundRobinRouter {
    next: AtomicUsize,
}

impl Router for RoundRobinRouter {
    fn select(&self, worker_ids: &[u64], _request: &RouteContext<'_>) -> Option<usize> {
        if worker_ids.is_empty() {
            return None;
        }
        Some(self.next.fetch_add(1, Ordering::Relaxed) % worker_ids.len())
    }
}

/// A uniformly random worker, from a lock-free SplitMix64 sequence.
#[derive(Debug)]
pub struct RandomRouter {
    state: AtomicU64,
}

impl RandomRouter {
    /// Creates the policy with a seed (equal seeds give equal choices).
    pub fn new(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }
}

impl Router for RandomRouter {
    fn select(&self, worker_ids: &[u64], _request: &RouteContext<'_>) -> Option<usize> {
        if worker_ids.is_empty() {
            return None;
        }
        let mut z = self
            .state
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Some((z % worker_ids.len() as u64) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles() {
        let router = RoundRobinRouter::default();
        let ctx = RouteContext { token_ids: &[] };
        let picks: Vec<_> = (0..6)
            .map(|_| router.select(&[7, 8, 9], &ctx).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(router.select(&[], &ctx), None);
    }

    #[test]
    fn random_spreads_evenly() {
        let router = RandomRouter::new(42);
        let ctx = RouteContext { token_ids: &[] };
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[router.select(&[1, 2, 3, 4], &ctx).unwrap()] += 1;
        }
        for count in counts {
            assert!((800..1200).contains(&count), "{counts:?}");
        }
    }
}
