//! The spans received, in memory, oldest dropped first past a bound.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use serde::Serialize;

/// One received span as `GET /v1/traces/{trace_id}` answers it: ids in lower-case hex (the
/// parent empty for a root), times in Unix nanoseconds, attributes as JSON values.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StoredSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// When it started.
    pub start_unix_nano: u64,
    /// When it ended.
    pub end_unix_nano: u64,
    /// Its attributes.
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

/// The bounded span store the gRPC receiver writes and the HTTP side reads.
pub struct SpanStore {
    spans: Mutex<VecDeque<StoredSpan>>,
    max_spans: usize,
    num_received: AtomicU64,
}

impl SpanStore {
    /// An empty store keeping at most `max_spans` (at least one).
    pub fn new(max_spans: usize) -> Self {
        Self {
            spans: Mutex::new(VecDeque::new()),
            max_spans: max_spans.max(1),
            num_received: AtomicU64::new(0),
        }
    }

    /// Stores every span of one OTLP export.
    pub fn add(&self, request: ExportTraceServiceRequest) {
        let mut received = Vec::new();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| kv.value.as_ref())
                .map(|v| match to_json(v) {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push(StoredSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        start_unix_nano: span.start_time_unix_nano,
                        end_unix_nano: span.end_time_unix_nano,
                        attributes: attributes(&span.attributes),
                    });
                }
            }
        }
        self.num_received
            .fetch_add(received.len() as u64, Ordering::Relaxed);
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        for span in received {
            if spans.len() == self.max_spans {
                spans.pop_front();
            }
            spans.push_back(span);
        }
    }

    /// The stored spans of trace `trace_id` (lower-case hex), in arrival order.
    pub fn trace(&self, trace_id: &str) -> Vec<StoredSpan> {
        let spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans
            .iter()
            .filter(|span| span.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Spans received since start, evicted ones included.
    pub fn num_received(&self) -> u64 {
        self.num_received.load(Ordering::Relaxed)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn attributes(attributes: &[KeyValue]) -> serde_json::Map<String, serde_json::Value> {
    attributes
        .iter()
        .map(|kv| {
            let value = kv.value.as_ref().map_or(serde_json::Value::Null, to_json);
            (kv.key.clone(), value)
        })
        .collect()
}

fn to_json(value: &AnyValue) -> serde_json::Value {
    use serde_json::Value;
    match &value.value {
        None => Value::Null,
        Some(any_value::Value::StringValue(s)) => Value::String(s.clone()),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(*b),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::ArrayValue(array)) => {
            Value::Array(array.values.iter().map(to_json).collect())
        }
        Some(any_value::Value::KvlistValue(list)) => Value::Object(attributes(&list.values)),
        Some(any_value::Value::BytesValue(bytes)) => Value::String(hex(bytes)),
        Some(any_value::Value::StringValueStrindex(index)) => Value::from(*index),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    use super::*;

    fn export(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(service.into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn span(trace: u8, id: u8, parent: Option<u8>) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: format!("span {id}"),
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            attributes: vec![KeyValue {
                key: "worker_id".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(7)),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn keeps_spans_by_trace_with_hex_ids_and_service() {
        let store = SpanStore::new(10);
        store.add(export(
            "kvmesh-frontend",
            vec![span(1, 1, None), span(2, 2, None)],
        ));
        store.add(export("kvmesh-mocker", vec![span(1, 3, Some(1))]));
        let trace = store.trace(&"01".repeat(16));
        assert_eq!(trace.len(), 2);
        assert_eq!(trace[0].service, "kvmesh-frontend");
        assert_eq!(trace[0].parent_span_id, "");
        assert_eq!(trace[1].service, "kvmesh-mocker");
        assert_eq!(trace[1].span_id, "03".repeat(8));
        assert_eq!(trace[1].parent_span_id, "01".repeat(8));
        assert_eq!(trace[1].attributes["worker_id"], serde_json::json!(7));
        assert_eq!(store.num_received(), 3);
    }

    #[test]
    fn drops_the_oldest_past_its_bound() {
        let store = SpanStore::new(2);
        store.add(export(
            "a",
            vec![span(1, 1, None), span(1, 2, None), span(1, 3, None)],
        ));
        let ids: Vec<_> = store
            .trace(&"01".repeat(16))
            .into_iter()
            .map(|s| s.span_id)
            .collect();
        assert_eq!(ids, vec!["02".repeat(8), "03".repeat(8)]);
        assert_eq!(store.num_received(), 3);
    }
}
