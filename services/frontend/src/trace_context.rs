//! W3C trace context (`traceparent`) of an HTTP request, so code the request reaches (a chat
//! processor's `Context.trace_id`, `span_id`, `parent_span_id`) can join the caller's trace.
//!
//! `traceparent` is `version-trace_id-parent_id-flags` in lowercase hex (2-32-16-2 digits); a
//! trace id or parent id of all zeros is invalid. A request without a valid header starts no
//! trace: every id is empty. While the process exports spans (docs/tracing.md), the ids are
//! those of the frontend's own span of the request, a new trace's when the client sent none.

use axum::http::HeaderMap;

/// The trace a request belongs to and the span the frontend serves it in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 hex digits of the caller's trace; empty without one.
    pub trace_id: String,
    /// 16 hex digits of the frontend's span for this request; empty without a trace.
    pub span_id: String,
    /// 16 hex digits of the caller's span; empty without a trace.
    pub parent_span_id: String,
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceContext {
    /// The context a request's `traceparent` header carries, with the span id of `span` (the
    /// frontend's span of the request) or, while tracing is off, a new one for the frontend's
    /// work; empty when tracing is off and the header is absent or malformed.
    pub fn from_headers(headers: &HeaderMap, span: &kvmesh_runtime::otel::Trace) -> Self {
        let mut context = Self::from_header(headers);
        if let (Some(trace_id), Some(span_id)) = (span.trace_id(), span.span_id()) {
            if trace_id != context.trace_id {
                context.parent_span_id.clear();
            }
            context.trace_id = trace_id;
            context.span_id = span_id;
        }
        context
    }

    fn from_header(headers: &HeaderMap) -> Self {
        let Some(value) = headers.get("traceparent").and_then(|v| v.to_str().ok()) else {
            return Self::default();
        };
        let mut parts = value.trim().split('-');
        let (Some(version), Some(trace_id), Some(parent), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Self::default();
        };
        let valid = is_hex(version, 2)
            && version != "ff"
            && is_hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && is_hex(parent, 16)
            && parent.bytes().any(|b| b != b'0')
            && is_hex(flags, 2)
            && (version != "00" || parts.next().is_none());
        if !valid {
            return Self::default();
        }
        let span_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        Self {
            trace_id: trace_id.to_owned(),
            span_id,
            parent_span_id: parent.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> TraceContext {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", value.parse().unwrap());
        TraceContext::from_headers(&headers, &kvmesh_runtime::otel::Trace::off())
    }

    #[test]
    fn a_valid_header_gives_its_trace_and_a_new_span() {
        let context = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(context.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.parent_span_id, "00f067aa0ba902b7");
        assert!(is_hex(&context.span_id, 16));
        assert_ne!(context.span_id, context.parent_span_id);
    }

    #[test]
    fn malformed_or_missing_headers_give_no_trace() {
        assert_eq!(
            TraceContext::from_headers(&HeaderMap::new(), &kvmesh_runtime::otel::Trace::off()),
            TraceContext::default()
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parse(bad), TraceContext::default(), "{bad}");
        }
    }
}
