//! The W3C trace context (`traceparent`, `tracestate`) read from and written to whatever carries
//! it: HTTP headers, gRPC metadata, message fields.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The W3C header naming the caller's trace and span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying vendors' trace state along.
pub const TRACESTATE: &str = "tracestate";

/// The carrier's values live for `'a`, which outlives any borrow of the extractor.
struct Get<'a, F>(F, std::marker::PhantomData<&'a str>);

impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for Get<'a, F> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

struct Put<F>(F);

impl<F: FnMut(&'static str, String)> Injector for Put<F> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only these two keys.
        let key = if key == TRACEPARENT {
            TRACEPARENT
        } else {
            TRACESTATE
        };
        (self.0)(key, value);
    }
}

/// The caller's span as a parent context; an empty context (a new trace) when `traceparent` is
/// missing or malformed.
pub(super) fn extract<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Context {
    TraceContextPropagator::new()
        .extract_with_context(&Context::new(), &Get(get, std::marker::PhantomData))
}

/// Writes `cx`'s span as `traceparent` (and `tracestate` when it has one).
pub(super) fn inject(cx: &Context, put: impl FnMut(&'static str, String)) {
    TraceContextPropagator::new().inject_context(cx, &mut Put(put));
}
