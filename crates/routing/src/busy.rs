//! Busy detection (docs/routing.md, "Busy detection and overload"): which ranks are too loaded to
//! receive more work.

use crate::config::BusyThresholds;

/// What the busy checks read about one (worker, dp_rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BusyInputs {
    /// Prefill tokens in flight: the larger of the tracker's and the engine's published
    /// `waiting_prefill_tokens`.
    pub prefill_tokens: u64,
    /// The rank's scheduler token budget, when advertised.
    pub max_num_batched_tokens: Option<u64>,
    /// KV blocks the engine reports in use, when it has published load.
    pub kv_used_blocks: Option<u64>,
    /// The router's projection of the rank's decode blocks.
    pub active_decode_blocks: u64,
    /// KV blocks of the rank, when known (runtime config, else published load).
    pub total_kv_blocks: Option<u64>,
}

/// Evaluates the checks that are on; `latch` is the rank's decode latch, which sets when either
/// decode signal exceeds `threshold · total_kv_blocks` and clears only when both are at or
/// below it.
pub(crate) fn evaluate(thresholds: &BusyThresholds, input: &BusyInputs, latch: &mut bool) -> bool {
    let mut busy = false;
    if let Some(limit) = thresholds.active_prefill_tokens_threshold {
        busy |= input.prefill_tokens > limit;
    }
    if let (Some(frac), Some(mnbt)) = (
        thresholds.active_prefill_tokens_threshold_frac,
        input.max_num_batched_tokens,
    ) {
        busy |= input.prefill_tokens as f64 > frac * mnbt as f64;
    }
    match (
        thresholds.active_decode_blocks_threshold,
        input.total_kv_blocks.filter(|&total| total > 0),
    ) {
        (Some(threshold), Some(total)) => {
            let limit = threshold * total as f64;
            let used_over = input.kv_used_blocks.is_some_and(|used| used as f64 > limit);
            let projected_over = input.active_decode_blocks as f64 > limit;
            if used_over || projected_over {
                *latch = true;
            } else {
                // Both at or below the limit (an unpublished engine count reads as below).
                *latch = false;
            }
            busy |= *latch;
        }
        _ => *latch = false,
    }
    busy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds(decode: Option<f64>, tokens: Option<u64>, frac: Option<f64>) -> BusyThresholds {
        BusyThresholds {
            active_decode_blocks_threshold: decode,
            active_prefill_tokens_threshold: tokens,
            active_prefill_tokens_threshold_frac: frac,
        }
    }

    #[test]
    fn checks_are_off_unless_set() {
        let input = BusyInputs {
            prefill_tokens: 1 << 40,
            max_num_batched_tokens: Some(1),
            kv_used_blocks: Some(1000),
            active_decode_blocks: 1000,
            total_kv_blocks: Some(10),
        };
        let mut latch = false;
        assert!(!evaluate(&BusyThresholds::default(), &input, &mut latch));
    }

    #[test]
    fn prefill_absolute_and_fraction() {
        let mut latch = false;
        let mut input = BusyInputs {
            prefill_tokens: 100,
            ..BusyInputs::default()
        };
        assert!(!evaluate(
            &thresholds(None, Some(100), None),
            &input,
            &mut latch
        ));
        assert!(evaluate(
            &thresholds(None, Some(99), None),
            &input,
            &mut latch
        ));
        // The fraction check is skipped without mnbt.
        assert!(!evaluate(
            &thresholds(None, None, Some(0.5)),
            &input,
            &mut latch
        ));
        input.max_num_batched_tokens = Some(199);
        assert!(evaluate(
            &thresholds(None, None, Some(0.5)),
            &input,
            &mut latch
        ));
        input.max_num_batched_tokens = Some(200);
        assert!(!evaluate(
            &thresholds(None, None, Some(0.5)),
            &input,
            &mut latch
        ));
    }

    #[test]
    fn decode_latch_sets_on_either_signal_and_clears_on_both() {
        let t = thresholds(Some(0.5), None, None);
        let mut latch = false;
        let mut input = BusyInputs {
            kv_used_blocks: Some(60),
            active_decode_blocks: 10,
            total_kv_blocks: Some(100),
            ..BusyInputs::default()
        };
        assert!(evaluate(&t, &input, &mut latch));
        input.kv_used_blocks = Some(10);
        input.active_decode_blocks = 51;
        assert!(evaluate(&t, &input, &mut latch));
        input.active_decode_blocks = 50;
        assert!(!evaluate(&t, &input, &mut latch));
        assert!(!latch);
        // Skipped without total_kv_blocks.
        input.total_kv_blocks = None;
        input.kv_used_blocks = Some(1_000_000);
        assert!(!evaluate(&t, &input, &mut latch));
    }
}
