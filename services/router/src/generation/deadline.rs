//! The default deadlines of a worker's responses (docs/routing.md, "Deadlines"): a worker that
//! is alive and answers pings but produces nothing is given up at these, its request migrated
//! and the worker counted as failing. `DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS` replaces both.

use std::time::Duration;

/// The prompt length the default first-response deadline allows a prefill of (docs/routing.md,
/// "Deadlines"): any prompt a worker serves fits, so only a stuck worker misses it.
pub const DEADLINE_PREFILL_TOKENS: u64 = 100_000;

/// Prefill speed assumed for a worker whose card publishes none
/// (`runtime_config.prefill_tokens_per_second`): slow enough for any engine on one accelerator.
pub const DEFAULT_PREFILL_TOKENS_PER_SECOND: u64 = 1_000;

/// The shortest default first-response deadline, however fast the worker says it is: queueing
/// behind other requests takes time too.
pub const MIN_FIRST_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// The default longest silence between two responses of a stream that has started: a decode
/// step, even behind a preemption, takes far less.
pub const DEFAULT_INTER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// The default deadline for a worker's first response: a [`DEADLINE_PREFILL_TOKENS`] prefill at
/// its published speed (or [`DEFAULT_PREFILL_TOKENS_PER_SECOND`]), at least
/// [`MIN_FIRST_RESPONSE_TIMEOUT`].
pub fn first_response_timeout(prefill_tokens_per_second: Option<u64>) -> Duration {
    let rate = prefill_tokens_per_second
        .filter(|&rate| rate > 0)
        .unwrap_or(DEFAULT_PREFILL_TOKENS_PER_SECOND);
    Duration::from_secs_f64(DEADLINE_PREFILL_TOKENS as f64 / rate as f64)
        .max(MIN_FIRST_RESPONSE_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_response_waits_for_a_100k_token_prefill_at_the_published_speed() {
        // 2 000 tokens/s: 100 000 tokens take 50 s.
        assert_eq!(first_response_timeout(Some(2_000)), Duration::from_secs(50));
        // Without a published speed, the documented 1 000 tokens/s: 100 s.
        assert_eq!(first_response_timeout(None), Duration::from_secs(100));
        assert_eq!(first_response_timeout(Some(0)), Duration::from_secs(100));
        // A slow engine gets longer still.
        assert_eq!(first_response_timeout(Some(500)), Duration::from_secs(200));
    }

    #[test]
    fn a_fast_engine_still_gets_the_minimum() {
        assert_eq!(
            first_response_timeout(Some(48_000)),
            MIN_FIRST_RESPONSE_TIMEOUT
        );
        assert_eq!(
            first_response_timeout(Some(u64::MAX)),
            MIN_FIRST_RESPONSE_TIMEOUT
        );
    }

    #[test]
    fn the_silence_between_responses_has_a_fixed_default() {
        assert_eq!(DEFAULT_INTER_RESPONSE_TIMEOUT, Duration::from_secs(60));
    }
}
