//! The pass-duration model of docs/mocker.md, "Timing" (Dynamo's polynomial defaults).
//!
//! Both terms are unscaled milliseconds; drivers divide by `--speedup-ratio` (and the decode term by
//! `--decode-speedup-ratio`). Plain f64 arithmetic without fused multiply-add, so every machine
//! computes the same bits.

/// Milliseconds a pass spends on prefill of `uncached_tokens` prompt tokens.
///
/// Exists so the real-time driver and the virtual-time simulator charge prefill identically.
pub fn prefill_ms(uncached_tokens: usize) -> f64 {
    let t = uncached_tokens as f64;
    4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142
}

/// Milliseconds a pass spends on decode when `kv_usage` (blocks in use / total blocks) of the cache
/// is occupied; never below 1 ms.
///
/// Exists so decode slows down as the KV cache fills, as on a real GPU.
pub fn decode_ms(kv_usage: f64) -> f64 {
    let u = kv_usage;
    (-25.74 * u * u + 54.01 * u + 5.74).max(1.0)
}

/// Whole microseconds a pass lasts once the speedup ratios are applied; 0 when `speedup_ratio` is
/// 0 (infinitely fast) or not a positive number.
///
/// Exists so the virtual-time simulator rounds every pass the same way (docs/mocker.md,
/// "Virtual time").
pub fn pass_duration_us(
    prefill_ms: f64,
    decode_ms: f64,
    speedup_ratio: f64,
    decode_speedup_ratio: f64,
) -> u64 {
    if speedup_ratio.is_nan() || speedup_ratio <= 0.0 {
        return 0;
    }
    let decode = if decode_speedup_ratio.is_nan() || decode_speedup_ratio <= 0.0 {
        0.0
    } else {
        decode_ms / decode_speedup_ratio
    };
    let micros = ((prefill_ms + decode) / speedup_ratio * 1000.0).round();
    if micros.is_finite() && micros > 0.0 {
        micros as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_matches_spec_example() {
        assert!((prefill_ms(1000) - 32.1059).abs() < 1e-3);
        assert!((prefill_ms(0) - 16.50142).abs() < 1e-9);
        assert!(prefill_ms(8192) > prefill_ms(4096));
    }

    #[test]
    fn decode_matches_spec_example_and_floor() {
        assert!((decode_ms(0.5) - 26.31).abs() < 1e-3);
        assert!((decode_ms(0.0) - 5.74).abs() < 1e-9);
        // The polynomial goes negative far outside [0, 1]; the floor keeps passes positive.
        assert_eq!(decode_ms(10.0), 1.0);
    }

    #[test]
    fn pass_duration_rounds_and_scales() {
        // 32.1058589 ms of prefill, 26.31 ms of decode halved: 45.2608589 ms.
        assert_eq!(
            pass_duration_us(prefill_ms(1000), decode_ms(0.5), 1.0, 2.0),
            45261
        );
        assert_eq!(pass_duration_us(10.0, 0.0, 2.0, 1.0), 5000);
        assert_eq!(pass_duration_us(10.0, 5.0, 0.0, 1.0), 0);
        assert_eq!(pass_duration_us(0.0, 0.0, 1.0, 1.0), 0);
    }
}
