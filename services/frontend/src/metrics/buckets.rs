//! Histogram bucket layouts an operator may override with Dynamo's
//! `DYN_METRICS_<SERIES>_{MIN,MAX,COUNT}` variables: `COUNT` buckets spaced evenly on a log scale
//! from `MIN` to `MAX`. A series with none of its three variables set keeps kvmesh's layout; one
//! with some set takes the rest from that layout.

/// The bucket boundaries of the request histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramBuckets {
    /// `request_duration_seconds` (`DYN_METRICS_REQUEST_DURATION_*`).
    pub request_duration: Vec<f64>,
    /// `input_sequence_tokens` (`DYN_METRICS_INPUT_SEQUENCE_*`).
    pub input_sequence: Vec<f64>,
    /// `output_sequence_tokens` (`DYN_METRICS_OUTPUT_SEQUENCE_*`).
    pub output_sequence: Vec<f64>,
    /// `time_to_first_token_seconds` (`DYN_METRICS_TTFT_*`).
    pub ttft: Vec<f64>,
    /// `inter_token_latency_seconds` (`DYN_METRICS_ITL_*`).
    pub itl: Vec<f64>,
}

/// The layout kvmesh uses for a series when nothing overrides it: `count` buckets from `min`
/// doubling each time.
#[derive(Debug, Clone, Copy)]
struct Layout {
    min: f64,
    count: u32,
}

impl Layout {
    const LATENCY: Layout = Layout {
        min: 0.0005,
        count: 18,
    };
    const TOKENS: Layout = Layout {
        min: 1.0,
        count: 18,
    };

    fn max(self) -> f64 {
        self.min * 2f64.powi(self.count as i32 - 1)
    }

    fn buckets(self) -> Vec<f64> {
        prometheus::exponential_buckets(self.min, 2.0, self.count as usize).unwrap_or_default()
    }
}

/// `count` boundaries from `min` to `max`, evenly spaced on a log scale.
fn log_spaced(min: f64, max: f64, count: u32) -> Vec<f64> {
    if count == 1 {
        return vec![min];
    }
    let ratio = (max / min).powf(1.0 / f64::from(count - 1));
    (0..count).map(|i| min * ratio.powi(i as i32)).collect()
}

impl Default for HistogramBuckets {
    fn default() -> Self {
        Self {
            request_duration: Layout::LATENCY.buckets(),
            input_sequence: Layout::TOKENS.buckets(),
            output_sequence: Layout::TOKENS.buckets(),
            ttft: Layout::LATENCY.buckets(),
            itl: Layout::LATENCY.buckets(),
        }
    }
}

impl HistogramBuckets {
    /// The layouts the `DYN_METRICS_*` variables `env` returns ask for; an invalid value or
    /// range is an error naming the variable.
    pub fn from_env(env: &impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let series = |name: &str, layout: Layout| -> Result<Vec<f64>, String> {
            let read = |suffix: &str| {
                let var = format!("DYN_METRICS_{name}_{suffix}");
                env(&var)
                    .filter(|value| !value.trim().is_empty())
                    .map(|value| (var, value))
            };
            let (min, max, count) = (read("MIN"), read("MAX"), read("COUNT"));
            if min.is_none() && max.is_none() && count.is_none() {
                return Ok(layout.buckets());
            }
            let number = |entry: Option<(String, String)>, default: f64| match entry {
                None => Ok(default),
                Some((var, value)) => match value.trim().parse::<f64>() {
                    Ok(number) if number.is_finite() && number > 0.0 => Ok(number),
                    _ => Err(format!("{var}: {value:?} is not a positive number")),
                },
            };
            let count_var = count.as_ref().map(|(var, _)| var.clone());
            let count = number(count, f64::from(layout.count))?;
            if count.fract() != 0.0 || !(1.0..=1000.0).contains(&count) {
                return Err(format!(
                    "{}: the bucket count must be a whole number from 1 to 1000",
                    count_var.unwrap_or_default()
                ));
            }
            let min = number(min, layout.min)?;
            let max = number(max, layout.max())?;
            if max <= min && count > 1.0 {
                return Err(format!(
                    "DYN_METRICS_{name}_MAX: {max} must be above DYN_METRICS_{name}_MIN ({min})"
                ));
            }
            Ok(log_spaced(min, max, count as u32))
        };
        Ok(Self {
            request_duration: series("REQUEST_DURATION", Layout::LATENCY)?,
            input_sequence: series("INPUT_SEQUENCE", Layout::TOKENS)?,
            output_sequence: series("OUTPUT_SEQUENCE", Layout::TOKENS)?,
            ttft: series("TTFT", Layout::LATENCY)?,
            itl: series("ITL", Layout::LATENCY)?,
        })
    }

    /// [`Self::from_env`] over the process environment.
    pub fn from_process_env() -> Result<Self, String> {
        Self::from_env(&|name: &str| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<HistogramBuckets, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HistogramBuckets::from_env(&|name: &str| vars.get(name).cloned())
    }

    #[test]
    fn unset_keeps_the_doubling_layouts() {
        let buckets = from(&[]).unwrap();
        assert_eq!(buckets, HistogramBuckets::default());
        assert_eq!(
            buckets.input_sequence,
            prometheus::exponential_buckets(1.0, 2.0, 18).unwrap()
        );
        assert_eq!(
            buckets.ttft,
            prometheus::exponential_buckets(0.0005, 2.0, 18).unwrap()
        );
    }

    #[test]
    fn min_max_count_give_log_spaced_bounds() {
        let buckets = from(&[
            ("DYN_METRICS_TTFT_MIN", "0.01"),
            ("DYN_METRICS_TTFT_MAX", "10"),
            ("DYN_METRICS_TTFT_COUNT", "4"),
        ])
        .unwrap();
        let expected = [0.01, 0.1, 1.0, 10.0];
        assert_eq!(buckets.ttft.len(), 4);
        for (got, want) in buckets.ttft.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{:?}", buckets.ttft);
        }
        assert_eq!(buckets.itl, HistogramBuckets::default().itl);
        let partial = from(&[("DYN_METRICS_OUTPUT_SEQUENCE_COUNT", "5")]).unwrap();
        assert_eq!(partial.output_sequence.len(), 5);
        assert_eq!(partial.output_sequence[0], 1.0);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let error = from(&[("DYN_METRICS_ITL_MIN", "nope")]).unwrap_err();
        assert!(error.contains("DYN_METRICS_ITL_MIN"), "{error}");
        let error = from(&[("DYN_METRICS_ITL_COUNT", "2.5")]).unwrap_err();
        assert!(error.contains("DYN_METRICS_ITL_COUNT"), "{error}");
        let error = from(&[
            ("DYN_METRICS_INPUT_SEQUENCE_MIN", "100"),
            ("DYN_METRICS_INPUT_SEQUENCE_MAX", "10"),
        ])
        .unwrap_err();
        assert!(error.contains("DYN_METRICS_INPUT_SEQUENCE_MAX"), "{error}");
    }
}
