//! The processor path's latency series.

use crate::generate::TextDelta;

/// Time to first token and between tokens of a processor's answer, from its chunks as they
/// arrive (a chunk is the processor's unit of output, as a worker response is on the built-in
/// path), into the model's `time_to_first_token_seconds` and `inter_token_latency_seconds`.
pub(super) struct TokenClock {
    /// When the request started.
    pub(super) begin: std::time::Instant,
    /// When the last output arrived.
    pub(super) last: Option<std::time::Instant>,
    /// The model's histograms.
    pub(super) metrics: crate::metrics::ModelMetrics,
}

impl TokenClock {
    /// Whether a delta carries output (text, reasoning or a tool call), not only a finish.
    pub(super) fn carries_output(delta: &TextDelta) -> bool {
        !delta.text.is_empty() || !delta.reasoning.is_empty() || !delta.tool_calls.is_empty()
    }

    /// One chunk of output arrived now.
    pub(super) fn output(&mut self) {
        let now = std::time::Instant::now();
        match self.last {
            None => self
                .metrics
                .ttft
                .observe(now.duration_since(self.begin).as_secs_f64()),
            Some(previous) => self
                .metrics
                .itl
                .observe(now.duration_since(previous).as_secs_f64()),
        }
        self.last = Some(now);
    }
}
